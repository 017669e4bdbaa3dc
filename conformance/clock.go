package conformance

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sqlease/sqlease/lock"
)

// Cases for SPEC S2: every expiry written and compared is the database's
// clock, evaluated when the statement runs.

func init() {
	register(
		Case{Name: "S2_ExpiryIsDatabaseNowPlusTTL", Rule: "S2", Run: s2ExpiryIsDatabaseNowPlusTTL},
		Case{Name: "S2_WaitedGrantUsesStatementTime", Rule: "S2", Run: s2WaitedGrantUsesStatementTime},
	)
}

// clkResolution absorbs the database clock's resolution (SQLite reports
// milliseconds) and the rounding of times to microseconds.
const clkResolution = 3 * time.Millisecond

// clkKey is the key of the lease a database clock keeps: Locker.Holders
// reports the database's time only alongside a row.
const clkKey = "conformance/clock\x01"

// clkDBClock returns a function reading the database's current time as the
// engine reads it (the now that Locker.Holders reports). It holds a lease on
// clkKey through its own Locker for the rest of the case.
func clkDBClock(e *Env) func() time.Time {
	e.T.Helper()
	l := e.NewLocker(nil, lock.WithOwner("conformance clock"))
	if _, err := l.TryAcquire(e.Ctx(), clkKey, lock.Shared); err != nil {
		e.T.Fatalf("clock lease: %v", err)
	}
	return func() time.Time {
		e.T.Helper()
		hs, now, err := l.Holders(e.Ctx(), clkKey)
		if err != nil {
			e.T.Fatalf("holders: %v", err)
		}
		if len(hs) == 0 || now.IsZero() {
			e.T.Fatalf("holders of %q: no row or no database time (%v, %v)", clkKey, hs, now)
		}
		return now
	}
}

// clkCheckExpiry checks that expiry was written as (database now + ttl) at a
// moment between dbBefore and dbAfter, two database times read around the
// statement that wrote it.
func clkCheckExpiry(e *Env, what string, expiry, dbBefore, dbAfter time.Time, ttl time.Duration) {
	e.T.Helper()
	lo, hi := dbBefore.Add(ttl-clkResolution), dbAfter.Add(ttl+clkResolution)
	if expiry.Before(lo) || expiry.After(hi) {
		e.T.Errorf("%s: expiry %s is not database now + TTL %s: database time was %s before the statement and %s after it, so the expiry must lie in [%s, %s] (off by %s from the statement's start, %s from its end)",
			what, clkFmt(expiry), ttl, clkFmt(dbBefore), clkFmt(dbAfter), clkFmt(lo), clkFmt(hi),
			expiry.Sub(dbBefore.Add(ttl)), expiry.Sub(dbAfter.Add(ttl)))
	}
}

func clkFmt(t time.Time) string { return t.UTC().Format("15:04:05.000000") }

// s2ExpiryIsDatabaseNowPlusTTL: the expiry of a grant and of a renewal is the
// database's time when the statement ran plus the TTL, and the listing shows
// exactly the expiry the handle reports. Nothing the client's clock says
// enters it: the bounds are database times only.
func s2ExpiryIsDatabaseNowPlusTTL(e *Env) {
	ctx := e.Ctx()
	const ttl = 5 * time.Second
	l := e.NewLocker(nil, lock.WithTTL(ttl))
	dbNow := clkDBClock(e)
	for _, mode := range []lock.Mode{lock.Exclusive, lock.Shared} {
		key := "s2/" + mode.String()
		before := dbNow()
		le, err := l.TryAcquire(ctx, key, mode)
		if err != nil {
			e.T.Fatalf("acquire %s: %v", mode, err)
		}
		after := dbNow()
		clkCheckExpiry(e, "grant "+mode.String(), le.Expiry(), before, after, ttl)

		hs, now, err := l.Holders(ctx, key)
		if err != nil {
			e.T.Fatalf("holders: %v", err)
		}
		if len(hs) != 1 || !hs[0].Expiry.Equal(le.Expiry()) {
			e.T.Errorf("%s: the database holds %v, the handle reports expiry %s", mode, hs, clkFmt(le.Expiry()))
		}
		if left := le.Expiry().Sub(now); left <= 0 || left > ttl+clkResolution {
			e.T.Errorf("%s: lease should be live for at most the TTL %s in database time, expiry - now = %s", mode, ttl, left)
		}

		// A renewal writes database now + TTL again, measured when the
		// renewal runs (later than the grant).
		time.Sleep(50 * time.Millisecond)
		before = dbNow()
		if err := le.Renew(ctx); err != nil {
			e.T.Fatalf("renew %s: %v", mode, err)
		}
		after = dbNow()
		clkCheckExpiry(e, "renewal "+mode.String(), le.Expiry(), before, after, ttl)
		if err := le.Release(ctx); err != nil {
			e.T.Fatalf("release: %v", err)
		}
	}
}

// s2WaitedGrantUsesStatementTime: a takeover that had to wait ~1-2 s behind a
// fenced transaction (F1) writes the new lease's expiry from the database's
// time when the grant happens, not from when its statement or transaction
// began: the new lease is live for a full TTL after the grant.
func s2WaitedGrantUsesStatementTime(e *Env) {
	ctx := e.Ctx()
	// The fence bounds the transaction's idle time by the old TTL
	// (CapFenceIdleTimeout): 1 s leaves keepBusy's 50 ms pings room on a
	// loaded machine (at 300 ms a race build at load 8 once idled past it,
	// and the server ended the transaction). hold covers the old lease's
	// expiry plus the wait the case measures.
	const (
		oldTTL = time.Second
		newTTL = 3 * time.Second
		hold   = 2400 * time.Millisecond
	)
	a := e.NewLocker(nil, lock.WithTTL(oldTTL))
	b := e.NewLocker(nil, lock.WithTTL(newTTL))
	dbNow := clkDBClock(e)
	old, err := a.TryAcquire(ctx, "s2/k", lock.Exclusive)
	if err != nil {
		e.T.Fatalf("acquire: %v", err)
	}
	tx, err := e.DB.BeginTx(ctx, nil)
	if err != nil {
		e.T.Fatalf("begin: %v", err)
	}
	defer tx.Rollback()
	if err := old.Fence(ctx, tx); err != nil {
		e.T.Fatalf("fence: %v", err)
	}
	stopBusy := keepBusy(ctx, tx) // open longer than the TTL: busy, as a live holder's
	defer stopBusy()
	fencedAt := time.Now()
	// The holder "crashes" while its fenced transaction stays open: the
	// lease expires in the database, and a takeover must wait for the
	// transaction (SPEC F1).
	old.Orphan()
	// Wait on the row's expiry, not the handle's: a renewal the handle
	// gave up on (its reply came too late, SPEC H2) may still have moved
	// the row.
	rowExpired := func() bool {
		hs, now, err := a.Holders(ctx, "s2/k")
		if err != nil {
			e.T.Fatalf("holders: %v", err)
		}
		for _, h := range hs {
			if h.LeaseID == old.LeaseID() && now.Before(h.Expiry.Add(20*time.Millisecond)) {
				return false
			}
		}
		return !now.Before(old.Expiry().Add(20 * time.Millisecond))
	}
	if !Eventually(5*time.Second, rowExpired) {
		e.T.Fatalf("the orphaned lease did not expire in database time")
	}
	type result struct {
		le  *lock.Lease
		err error
	}
	done := make(chan result, 1)
	start := dbNow()
	go func() {
		le, err := b.TryAcquire(context.WithoutCancel(ctx), "s2/k", lock.Exclusive)
		done <- result{le, err}
	}()
	time.Sleep(time.Until(fencedAt.Add(hold)))
	select {
	case r := <-done:
		// Not an S2 matter, but the case proves nothing without the wait.
		e.T.Fatalf("takeover finished while the fenced transaction was open (SPEC F1): %v", r.err)
	default:
	}
	// The grant cannot happen before the transaction ends (read the
	// clock while the transaction is still busy, then end it at once).
	ended := dbNow()
	stopBusy()
	if err := tx.Rollback(); err != nil {
		e.T.Fatalf("rollback: %v", err)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		e.T.Fatalf("takeover did not finish 10 s after the fenced transaction ended")
	}
	if r.err != nil {
		e.T.Fatalf("takeover after the fenced transaction ended: %v", r.err)
	}
	defer r.le.Release(ctx)
	after := dbNow()
	waited := after.Sub(start)
	if waited < hold/2 {
		e.T.Fatalf("takeover waited only %s of database time; the case needs it to wait behind the transaction", waited)
	}
	if r.le.Token() <= old.Token() {
		e.T.Errorf("takeover token %d not greater than %d", r.le.Token(), old.Token())
	}
	// The expiry is (now + TTL) at the grant, which happened after the
	// transaction ended and before `after`.
	clkCheckExpiry(e, fmt.Sprintf("a grant that waited %s for a transaction (an expiry near %s would mean it was computed when its statement began)", waited, clkFmt(start.Add(newTTL))),
		r.le.Expiry(), ended, after, newTTL)
	if err := r.le.Err(); err != nil {
		e.T.Errorf("the new lease ended: %v", err)
	}
	if err := old.Err(); !errors.Is(err, lock.ErrLeaseLost) {
		e.T.Errorf("the orphaned handle should report ErrLeaseLost after its window, got %v", err)
	}
}

// clkWatch reads the database clock every 10 ms until the case ends, then
// logs how many readings it took and each time the database clock fell
// behind the local monotonic clock by more than 1 ms (a step back, from
// NTP or a hypervisor). Each reading is bounded by the local times before
// its send and after its reply, so between readings i and j the database
// clock must advance at least sent_j - recv_i: less is a step back. A
// stress case's overlap that coincides with one is the clock's, not the
// lock's (S1 is stated in database time).
func clkWatch(e *Env) {
	e.T.Helper()
	l := e.NewLocker(nil, lock.WithOwner("conformance clock watch"))
	if _, err := l.TryAcquire(e.Ctx(), clkKey, lock.Shared); err != nil {
		e.T.Fatalf("clock lease: %v", err)
	}
	done, finished := make(chan struct{}), make(chan struct{})
	var summary string
	e.T.Cleanup(func() {
		close(done)
		<-finished
		e.T.Logf("%s", summary)
	})
	go func() {
		defer close(finished)
		var prevRecv, prevDB time.Time
		n, worst := 0, time.Duration(0)
		var steps []string
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				summary = fmt.Sprintf("database clock: %d readings, largest step back %s", n, worst)
				if len(steps) > 0 {
					summary += ": " + strings.Join(steps, "; ")
				}
				return
			case <-t.C:
			}
			sent := time.Now()
			_, now, err := l.Holders(e.Ctx(), clkKey)
			recv := time.Now()
			if err != nil || now.IsZero() {
				continue
			}
			if n > 0 {
				if back := sent.Sub(prevRecv) - now.Sub(prevDB); back > time.Millisecond {
					worst = max(worst, back)
					if len(steps) < 5 {
						steps = append(steps, fmt.Sprintf("back %s between %d and %d", back, prevDB.UnixMicro(), now.UnixMicro()))
					}
				}
			}
			prevRecv, prevDB = recv, now
			n++
		}
	}()
}
