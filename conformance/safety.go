package conformance

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/sqlease/sqlease/lock"
)

// Safety (docs/contract.md): mutual exclusion (S1), the database clock (S2), fencing tokens (S3, S7).
func init() {
	register(
		Case{Name: "S1_ExclusiveExcludesAll", Rule: "S1", Run: s1ExclusiveExcludesAll},
		Case{Name: "S1_SharedCoexistAndExcludeExclusive", Rule: "S1", Run: s1SharedCoexist},
		Case{Name: "S1_StressMixedModesAcrossProcesses", Rule: "S1", Run: func(e *Env) { stressCase(e, 50, 0) }},
		Case{Name: "S1_StressWithCrashedHolders", Rule: "S1", Run: func(e *Env) { stressCase(e, 30, 10) }},
		Case{Name: "S3_TokensIncreasePerKey", Rule: "S3", Run: s3TokensIncrease},
		Case{Name: "S3_TokenStableUnderRenewal", Rule: "S3", Run: s3TokenStable},
		Case{Name: "S2_ExpiryIsDatabaseNowPlusTTL", Rule: "S2", Run: s2ExpiryIsDatabaseNowPlusTTL},
		Case{Name: "S2_WaitedGrantUsesStatementTime", Rule: "S2", Run: s2WaitedGrantUsesStatementTime},
		Case{Name: "S7_TokenIsAtLeastDatabaseClock", Rule: "S7", Run: s7TokenAtLeastClock},
	)
}

func s1ExclusiveExcludesAll(e *Env) {
	ctx := e.Ctx()
	a, b := e.NewLocker(nil), e.NewLocker(nil)
	x := e.MustTryAcquire(a, "k", lock.Exclusive)
	for _, m := range []lock.Mode{lock.Exclusive, lock.Shared} {
		_, err := b.TryAcquire(ctx, "k", m)
		var le *lock.LockedError
		e.Require(errors.As(err, &le) && errors.Is(err, lock.ErrLocked), "%s while exclusive held: want *LockedError matching ErrLocked, got %v", m, err)
		e.Check(len(le.Holders) == 1 && le.Holders[0].Token == x.Token() && le.Holders[0].Mode == lock.Exclusive && le.Holders[0].Owner == a.Owner(), "%s: conflict should name the holder (token %d, owner %q), got %+v", m, x.Token(), a.Owner(), le.Holders)
	}
	e.Must(x.Release(ctx), "release")
	y := e.MustTryAcquire(b, "k", lock.Exclusive)
	_ = y.Release(ctx)
}

func s1SharedCoexist(e *Env) {
	ctx := e.Ctx()
	var shared []*lock.Lease
	for i := 0; i < 3; i++ {
		l := e.NewLocker(nil)
		s := e.MustTryAcquire(l, "k", lock.Shared)
		shared = append(shared, s)
	}
	w := e.NewLocker(nil)
	_, err := w.TryAcquire(ctx, "k", lock.Exclusive)
	var le *lock.LockedError
	e.Require(errors.As(err, &le) && len(le.Holders) == 3, "exclusive while 3 shared held: want LockedError with 3 holders, got %v", err)
	for _, s := range shared[:2] {
		_ = s.Release(ctx)
	}
	if _, err := w.TryAcquire(ctx, "k", lock.Exclusive); !errors.Is(err, lock.ErrLocked) {
		e.T.Fatalf("exclusive while 1 shared held: want ErrLocked, got %v", err)
	}
	_ = shared[2].Release(ctx)
	x := e.MustTryAcquire(w, "k", lock.Exclusive)
	_ = x.Release(ctx)
}

func s3TokensIncrease(e *Env) {
	ctx := e.Ctx()
	l := e.NewLocker(nil, lock.WithTTL(lock.MinTTL))
	other := e.NewLocker(nil, lock.WithTTL(lock.MinTTL))
	var last int64
	check := func(what string, le *lock.Lease) {
		e.T.Helper()
		e.Require(le.Token() > last, "%s: token %d not greater than previous %d", what, le.Token(), last)
		last = le.Token()
	}
	for i := 0; i < 5; i++ {
		m := lock.Exclusive
		if i%2 == 1 {
			m = lock.Shared
		}
		le := e.MustTryAcquire(l, "k", m)
		check(fmt.Sprintf("after release #%d (%s)", i, m), le)
		_ = le.Release(ctx)
	}
	// Concurrent shared grants: all distinct and increasing in grant order.
	s1 := e.MustTryAcquire(l, "k", lock.Shared)
	check("shared 1", s1)
	s2 := e.MustTryAcquire(other, "k", lock.Shared)
	check("shared 2", s2)
	_ = s1.Release(ctx)
	_ = s2.Release(ctx)
	// Across expiry and takeover.
	x := e.MustTryAcquire(l, "k", lock.Exclusive)
	check("before expiry", x)
	x.Orphan()
	y := e.MustAcquire(other, "k", lock.Exclusive, lock.WaitTimeout(5*time.Second))
	check("after takeover", y)
	_ = y.Release(ctx)
	// Across a sweep: every row of the key is gone (SPEC D2).
	if _, err := l.Sweep(ctx, 100); err != nil {
		e.T.Fatalf("sweep: %v", err)
	}
	if n, err := l.RowCount(ctx); err != nil || n != 0 {
		e.T.Fatalf("rows left after release and sweep: %d, %v", n, err)
	}
	z := e.MustTryAcquire(l, "k", lock.Exclusive)
	check("after sweep", z)
	// Concurrently on several keys: tokens per key strictly increase.
	var mu sync.Mutex
	perKey := map[string][]int64{}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		e.Go(&wg, func() {
			lk, err := e.TryNewLocker(nil)
			if err != nil {
				e.T.Errorf("locker: %v", err)
				return
			}
			defer lk.Close(ctx)
			for i := 0; i < 10; i++ {
				key := fmt.Sprintf("c%d", i%2)
				le, err := lk.Acquire(ctx, key, lock.Exclusive, lock.WaitTimeout(10*time.Second))
				if err != nil {
					e.T.Errorf("acquire %s: %v", key, err)
					return
				}
				mu.Lock()
				perKey[key] = append(perKey[key], le.Token())
				mu.Unlock()
				_ = le.Release(ctx)
			}
		})
	}
	wg.Wait()
	for key, ts := range perKey {
		for i := 1; i < len(ts); i++ {
			if ts[i] <= ts[i-1] {
				e.T.Errorf("key %s: grant %d got token %d after %d", key, i, ts[i], ts[i-1])
			}
		}
	}
}

func s3TokenStable(e *Env) {
	ctx := e.Ctx()
	l := e.NewLocker(nil, lock.WithTTL(time.Second))
	le := e.MustTryAcquire(l, "k", lock.Exclusive)
	tok, exp := le.Token(), le.Expiry()
	time.Sleep(1500 * time.Millisecond) // past one TTL: renewed at least once
	e.Must(le.Err(), "lease ended")
	e.Must(le.Renew(ctx), "renew")
	e.Check(le.Expiry().After(exp), "expiry did not move: %v then %v", exp, le.Expiry())
	hs, _, err := l.Holders(ctx, "k")
	e.Must(err, "")
	e.Check(len(hs) == 1 && hs[0].Token == tok && le.Token() == tok, "token changed under renewal: was %d, handle %d, database %+v", tok, le.Token(), hs)
	_ = le.Release(ctx)
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
		e.Must(err, "holders")
		e.Require(len(hs) != 0 && !now.IsZero(), "holders of %q: no row or no database time (%v, %v)", clkKey, hs, now)
		return now
	}
}

// clkCheckExpiry checks that expiry was written as (database now + ttl) at a
// moment between dbBefore and dbAfter, two database times read around the
// statement that wrote it.
func clkCheckExpiry(e *Env, what string, expiry, dbBefore, dbAfter time.Time, ttl time.Duration) {
	e.T.Helper()
	lo, hi := dbBefore.Add(ttl-clkResolution), dbAfter.Add(ttl+clkResolution)
	e.Check(!expiry.Before(lo) && !expiry.After(hi), "%s: expiry %s is not database now + TTL %s: database time was %s before the statement and %s after it, so the expiry must lie in [%s, %s] (off by %s from the statement's start, %s from its end)", what, clkFmt(expiry), ttl, clkFmt(dbBefore), clkFmt(dbAfter), clkFmt(lo), clkFmt(hi), expiry.Sub(dbBefore.Add(ttl)), expiry.Sub(dbAfter.Add(ttl)))
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
		le := e.MustTryAcquire(l, key, mode)
		after := dbNow()
		clkCheckExpiry(e, "grant "+mode.String(), le.Expiry(), before, after, ttl)

		hs, now, err := l.Holders(ctx, key)
		e.Must(err, "holders")
		e.Check(len(hs) == 1 && hs[0].Expiry.Equal(le.Expiry()), "%s: the database holds %v, the handle reports expiry %s", mode, hs, clkFmt(le.Expiry()))
		if left := le.Expiry().Sub(now); left <= 0 || left > ttl+clkResolution {
			e.T.Errorf("%s: lease should be live for at most the TTL %s in database time, expiry - now = %s", mode, ttl, left)
		}

		// A renewal writes database now + TTL again, measured when the
		// renewal runs (later than the grant).
		time.Sleep(50 * time.Millisecond)
		before = dbNow()
		e.Must(le.Renew(ctx), "renew %s", mode)
		after = dbNow()
		clkCheckExpiry(e, "renewal "+mode.String(), le.Expiry(), before, after, ttl)
		e.Must(le.Release(ctx), "release")
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
	old := e.MustTryAcquire(a, "s2/k", lock.Exclusive)
	tx, err := e.DB.BeginTx(ctx, nil)
	e.Must(err, "begin")
	defer tx.Rollback()
	e.Must(old.Fence(ctx, tx), "fence")
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
		e.Must(err, "holders")
		for _, h := range hs {
			if h.LeaseID == old.LeaseID() && now.Before(h.Expiry.Add(20*time.Millisecond)) {
				return false
			}
		}
		return !now.Before(old.Expiry().Add(20 * time.Millisecond))
	}
	e.Require(Eventually(5*time.Second, rowExpired), "the orphaned lease did not expire in database time")
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
	e.Must(tx.Rollback(), "rollback")
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		e.T.Fatalf("takeover did not finish 10 s after the fenced transaction ended")
	}
	e.Must(r.err, "takeover after the fenced transaction ended")
	defer r.le.Release(ctx)
	after := dbNow()
	waited := after.Sub(start)
	e.Require(waited >= hold/2, "takeover waited only %s of database time; the case needs it to wait behind the transaction", waited)
	e.Check(r.le.Token() > old.Token(), "takeover token %d not greater than %d", r.le.Token(), old.Token())
	// The expiry is (now + TTL) at the grant, which happened after the
	// transaction ended and before `after`.
	clkCheckExpiry(e, fmt.Sprintf("a grant that waited %s for a transaction (an expiry near %s would mean it was computed when its statement began)", waited, clkFmt(start.Add(newTTL))),
		r.le.Expiry(), ended, after, newTTL)
	e.CheckErr(r.le.Err(), "the new lease ended")
	if err := old.Err(); !errors.Is(err, lock.ErrLeaseLost) {
		e.T.Errorf("the orphaned handle should report ErrLeaseLost after its window, got %v", err)
	}
}

// s7TokenAtLeastClock: every grant, exclusive or shared, first or after a
// release, takes a token no smaller than the database's clock before the
// grant (read just before the acquire, in database time; SPEC S7). The
// grant's own time (GrantedAt) is read later in the statement, so it only
// bounds the token from above under load.
func s7TokenAtLeastClock(e *Env) {
	ctx := e.Ctx()
	l := e.NewLocker(nil)
	dbNow := clkDBClock(e)
	for i, m := range []lock.Mode{lock.Exclusive, lock.Shared, lock.Exclusive} {
		before := dbNow()
		le := e.MustTryAcquire(l, "s7/k", m)
		floor := before.Add(-clkResolution).UnixMicro()
		e.Check(le.Token() >= floor, "grant %d (%s): token %d is below the database clock before the grant, %s = %d µs since the epoch: a server that lost grants could reissue it (SPEC S7)", i, m, le.Token(), before.UTC().Format(time.RFC3339Nano), before.UnixMicro())
		e.Must(le.Release(ctx), "release %d", i)
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
