package conformance

import (
	"context"
	"errors"
	"time"

	"github.com/sqlease/sqlease/internal/faultdb"
	"github.com/sqlease/sqlease/lock"
)

// The holder's view (docs/contract.md): hold at least, hold at most (H10).
func init() {
	register(
		Case{Name: "H10_HoldAtLeastKeepsKeyAfterEarlyRelease", Rule: "H10", Run: h10HoldAtLeastKeepsKey},
		Case{Name: "H10_HoldAtLeastKeptThroughClose", Rule: "H10", Run: h10HoldKeptThroughClose},
		Case{Name: "H10_ReleaseAfterMinimumFreesAtOnce", Rule: "H10", Run: h10ReleaseAfterMinimum},
		Case{Name: "H10_HoldAtMostEndsLeaseAsLoss", Rule: "H10", Run: h10HoldAtMostEndsLease},
		Case{Name: "H10_HoldAtMostShorterThanTTL", Rule: "H10", Run: h10HoldAtMostShort},
		Case{Name: "H10_FailedHoldEndsByExpiry", Rule: "H10", Run: h10FailedHold},
	)
}

// h10TakenUntil checks that another Locker is refused key (ErrLocked) until
// about until in database time, then waits for it and is granted at until
// or later (database time), within lcSlack, with a greater token. It
// releases the new lease.
func h10TakenUntil(e *Env, key string, until time.Time, local time.Time, token int64) {
	e.T.Helper()
	ctx := e.Ctx()
	other := e.NewLocker(nil, lock.WithTTL(2*time.Second), lock.WithMaxBackoff(100*time.Millisecond))
	for time.Until(local) > 100*time.Millisecond {
		le, err := other.TryAcquire(ctx, key, lock.Exclusive)
		if err == nil {
			e.T.Fatalf("another locker got %q (token %d) %s before the minimum hold ended", key, le.Token(), time.Until(local))
		}
		e.Require(errors.Is(err, lock.ErrLocked), "try acquire during the hold: %v, want ErrLocked", err)
		time.Sleep(50 * time.Millisecond)
	}
	le := e.MustAcquire(other, key, lock.Exclusive, lock.WaitTimeout(time.Until(local)+2*lcSlack))
	e.Check(!le.GrantedAt().Before(until), "granted at %s (database time), before the hold's end %s", le.GrantedAt().Format(time.StampMicro), until.Format(time.StampMicro))
	if late := le.GrantedAt().Sub(until); late > lcSlack {
		e.T.Errorf("granted %s after the hold's end, want within %s", late, lcSlack)
	}
	e.Check(le.Token() > token, "token after the hold %d, want above %d", le.Token(), token)
	e.CheckErr(le.Release(ctx), "release")
}

// h10HoldAtLeastKeepsKey: Do's function returns at once; the key stays
// taken until grant + minimum (database time): another Locker is refused,
// then granted right after, with a greater token. The lease counts as
// released, and its row expires at grant + minimum.
func h10HoldAtLeastKeepsKey(e *Env) {
	ctx := e.Ctx()
	const hold = 1200 * time.Millisecond
	l := e.NewLocker(nil, lock.WithTTL(2*time.Second))
	var lease *lock.Lease
	start := time.Now()
	err := l.Do(ctx, "h10/min", lock.Exclusive, func(_ context.Context, le *lock.Lease) error {
		lease = le
		return nil
	}, lock.HoldAtLeast(hold))
	e.Must(err, "Do with HoldAtLeast")
	e.Check(errors.Is(lease.Err(), lock.ErrReleased), "lease after Do: %v, want ErrReleased", lease.Err())
	until := lease.GrantedAt().Add(hold)
	hs := holders(e, l, "h10/min")
	e.Require(len(hs) == 1 && hs[0].LeaseID == lease.LeaseID(), "holders during the hold: %v, want the released lease's row", hs)
	if exp := hs[0].Expiry; exp.Before(until) || exp.Sub(until) > lcSlack {
		e.T.Errorf("held row expires at %s, want at grant + minimum %s", exp.Format(time.StampMicro), until.Format(time.StampMicro))
	}
	h10TakenUntil(e, "h10/min", until, start.Add(hold), lease.Token())
}

// h10HoldKeptThroughClose: Close releases a lease with a minimum hold as
// Release does: the key stays taken until grant + minimum.
func h10HoldKeptThroughClose(e *Env) {
	ctx := e.Ctx()
	const hold = 1 * time.Second
	l := e.NewLocker(nil, lock.WithTTL(2*time.Second))
	start := time.Now()
	le := e.MustTryAcquire(l, "h10/close", lock.Exclusive, lock.HoldAtLeast(hold))
	e.Must(l.Close(ctx), "close")
	h10TakenUntil(e, "h10/close", le.GrantedAt().Add(hold), start.Add(hold), le.Token())
}

// h10ReleaseAfterMinimum: a lease released after its minimum hold is
// deleted as usual: another Locker gets the key at once.
func h10ReleaseAfterMinimum(e *Env) {
	ctx := e.Ctx()
	l := e.NewLocker(nil, lock.WithTTL(2*time.Second))
	le := e.MustTryAcquire(l, "h10/after", lock.Exclusive, lock.HoldAtLeast(300*time.Millisecond))
	time.Sleep(400 * time.Millisecond)
	e.Must(le.Release(ctx), "release after the minimum")
	if hs := holders(e, l, "h10/after"); len(hs) != 0 {
		e.T.Errorf("rows left after a release past the minimum: %v", hs)
	}
	other := e.NewLocker(nil)
	again := e.MustTryAcquire(other, "h10/after", lock.Exclusive)
	e.CheckErr(again.Release(ctx), "release")
}

// h10MaxLife runs Do with HoldAtMost(life) under a Locker with ttl; the
// function keeps running past its lost context. The lease is lost
// (LossMaxLife) before another Locker is granted the key, which happens
// at grant + life (database time) or within lcSlack after; the lost
// holder's fenced write does not commit.
func h10MaxLife(e *Env, ttl, life time.Duration) {
	ctx := e.Ctx()
	g := newGuarded(e)
	l := e.NewLocker(nil, lock.WithTTL(ttl))
	// other polls at least every 100 ms: the final renewal may bring the
	// row's expiry forward after other's first poll read it.
	other := e.NewLocker(nil, lock.WithTTL(2*time.Second), lock.WithMaxBackoff(100*time.Millisecond))
	type grant struct {
		le  *lock.Lease
		err error
		at  time.Time
	}
	taken := make(chan grant, 1)
	var lostAt time.Time
	start := time.Now()
	err := l.Do(ctx, "h10/max", lock.Exclusive, func(fctx context.Context, lease *lock.Lease) error {
		go func() {
			le, err := other.Acquire(ctx, "h10/max", lock.Exclusive, lock.WaitTimeout(life+2*ttl+lcSlack))
			taken <- grant{le, err, time.Now()}
		}()
		select {
		case <-fctx.Done():
			lostAt = time.Now()
		case <-time.After(life + ttl + lcSlack):
			e.T.Errorf("lease still live %s after the grant, HoldAtMost(%s)", time.Since(start), life)
		}
		if d := time.Since(start); d < life/2 {
			e.T.Errorf("lease ended %s after the grant, want near HoldAtMost(%s)", d, life)
		}
		if lost := wantLost(e, "Do's context cause at the end of life", context.Cause(fctx), lease); lost != nil && lost.Reason != lock.LossMaxLife {
			e.T.Errorf("loss reason %q, want %q", lost.Reason, lock.LossMaxLife)
		}
		if err := lease.RunInTx(ctx, e.DB, nil, g.incIn(lease, nil)); !errors.Is(err, lock.ErrLeaseLost) {
			e.T.Errorf("fenced write after the end of life: %v, want ErrLeaseLost", err)
		}
		// Keep running (a job that ignores its context): the row ends
		// by expiry at grant + life.
		gr := <-taken
		if gr.err != nil {
			e.T.Errorf("another locker's acquire after the end of life: %v", gr.err)
			return nil
		}
		defer gr.le.Release(ctx)
		e.Check(!gr.at.Before(lostAt), "another locker was granted before the holder saw its loss")
		until := lease.GrantedAt().Add(life)
		e.Check(!gr.le.GrantedAt().Before(until), "granted at %s (database time), before grant + HoldAtMost %s", gr.le.GrantedAt().Format(time.StampMicro), until.Format(time.StampMicro))
		if late := gr.le.GrantedAt().Sub(until); late > lcSlack {
			e.T.Errorf("granted %s after grant + HoldAtMost, want within %s", late, lcSlack)
		}
		e.Check(gr.le.Token() > lease.Token(), "token after the end of life %d, want above %d", gr.le.Token(), lease.Token())
		return nil
	}, lock.HoldAtMost(life))
	e.Check(errors.Is(err, lock.ErrLeaseLost), "Do past its maximum life = %v, want ErrLeaseLost", err)
	g.expect(e, "after the lost holder's fenced write", 0, 0)
}

// h10HoldAtMostEndsLeaseAsLoss: a maximum life of several TTLs, reached
// after ordinary renewals.
func h10HoldAtMostEndsLease(e *Env) { h10MaxLife(e, time.Second, 2500*time.Millisecond) }

// h10HoldAtMostShorterThanTTL: a maximum life shorter than the TTL: the
// row's expiry is brought forward from grant + TTL to grant + life.
func h10HoldAtMostShort(e *Env) { h10MaxLife(e, 3*time.Second, 800*time.Millisecond) }

// h10FailedHold: the hold's statement fails until the release deadline.
// Release returns the error, the lease counts as released, and the key
// frees when the row's last expiry passes (one TTL after the grant), not
// at grant + minimum, as after a crash (SPEC H10, H5).
func h10FailedHold(e *Env) {
	ctx := e.Ctx()
	const ttl, hold = 900 * time.Millisecond, 10 * time.Second
	l := e.NewLocker(nil, lock.WithTTL(ttl), lock.WithReleaseTimeout(300*time.Millisecond))
	le := e.MustTryAcquire(l, "h10/failed", lock.Exclusive, lock.HoldAtLeast(hold))
	renew := lcRendered(e, "Renew", e.Dialect.Statements().Renew)
	remove := e.Faults.Add(faultdb.Rule{Match: renew, Action: faultdb.Fail, Err: lcTransientError(e)})
	err := le.Release(ctx)
	remove()
	e.Check(err != nil && !errors.Is(err, lock.ErrNotHeld), "release whose hold fails until its deadline = %v, want the failure", err)
	e.Check(errors.Is(le.Err(), lock.ErrReleased), "lease after a failed hold: %v, want ErrReleased", le.Err())
	other := e.NewLocker(nil)
	again, err := other.Acquire(ctx, "h10/failed", lock.Exclusive, lock.WaitTimeout(ttl+2*lcSlack))
	e.Require(err == nil, "acquire after a failed hold: %v, want the key once the row expired", err)
	e.Check(!again.GrantedAt().After(le.GrantedAt().Add(ttl+lcSlack)), "granted %s after the failed hold's grant, want within one TTL (%s)", again.GrantedAt().Sub(le.GrantedAt()), ttl)
	e.CheckErr(again.Release(ctx), "release")
}
