package conformance

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/internal/faultdb"
	"github.com/sqlease/sqlease/lock"
)

// The holder's view (docs/contract.md): the exit race (H4) and cancellation while acquiring (H6).
func init() {
	register(
		Case{Name: "H4_ExitRaceKeepsResult", Rule: "H4", Run: h4ExitRaceKeepsResult},
		Case{Name: "H6_CancelWhileAcquiringLeaksNothing", Rule: "H6", Run: h6CancelWhileAcquiring},
		Case{Name: "H6_DoneContextTakesNothing", Rule: "H6", Run: h6DoneContextTakesNothing},
		Case{Name: "H6_CloseEndsWaitingAcquires", Rule: "H6", Run: h6CloseEndsWaitingAcquires},
	)
}

func h4ExitRaceKeepsResult(e *Env) {
	ctx := e.Ctx()
	const ttl = 600 * time.Millisecond
	l := e.NewLocker(nil, lock.WithTTL(ttl), lock.WithRenewTimeout(ttl/3))
	// The first renewal hangs until released; every later one fails.
	release := make(chan struct{})
	var hung atomic.Int64
	lcRenewalFault(e, faultdb.Rule{Action: faultdb.Hang, Release: release, Times: 1, Hits: &hung})
	lcRenewalFault(e, faultdb.Rule{Action: faultdb.Fail, Err: lcTransientError(e)})
	var lease *lock.Lease
	var fnCause error
	err := l.Do(ctx, "k", lock.Exclusive, func(fctx context.Context, le *lock.Lease) error {
		lease = le
		e.Check(Eventually(2*ttl, func() bool { return hung.Load() >= 1 }), "no renewal started within 2 TTLs")
		// Return while that renewal is in flight.
		fnCause = context.Cause(fctx)
		return nil
	})
	close(release)
	e.Require(fnCause == nil, "guarded function's context ended before it returned: %v", fnCause)
	e.Check(err == nil, "Do = %v, want the function's nil: a renewal failing after it returned must not rewrite it", err)
	if hs := holders(e, l, "k"); len(hs) != 0 {
		e.T.Errorf("lease not released after the function returned: %v", hs)
	}
	// Let the released renewal finish and fail, then look again.
	time.Sleep(ttl / 2)
	if err := lease.Err(); !errors.Is(err, lock.ErrReleased) || errors.Is(err, lock.ErrLeaseLost) {
		e.T.Errorf("lease context cause = %v, want ErrReleased: the late renewal failure must not turn it into a loss", err)
	}
	if hs := holders(e, l, "k"); len(hs) != 0 {
		e.T.Errorf("late renewal brought the lease back: %v", hs)
	}
}

func h6CancelWhileAcquiring(e *Env) {
	ctx := e.Ctx()
	const ttl = 900 * time.Millisecond
	l := e.NewLocker(nil, lock.WithTTL(ttl))
	other := e.NewLocker(nil, lock.WithTTL(ttl))
	acq := lcAcquireSQL(e)
	// cancelDuring delays the next acquire statement and cancels the
	// caller's context shortly before the delay ends, so the statement
	// runs (and may commit a grant) after the caller gave up.
	const delay, cancelAfter = 300 * time.Millisecond, 250 * time.Millisecond
	cancelDuring := func(acquire func(ctx context.Context) (*lock.Lease, error)) {
		var hits atomic.Int64
		remove := e.Faults.Add(faultdb.Rule{Match: acq, Action: faultdb.Delay, Delay: delay, Times: 1, Hits: &hits})
		defer remove()
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var wg sync.WaitGroup
		e.Go(&wg, func() {
			e.Check(Eventually(5*time.Second, func() bool { return hits.Load() >= 1 }), "acquire statement never reached the database")
			time.Sleep(cancelAfter)
			cancel()
		})
		le, err := acquire(cctx)
		wg.Wait()
		if le != nil {
			e.T.Errorf("acquire with a cancelled context returned a lease (token %d)", le.Token())
			_ = le.Release(ctx)
		}
		e.Check(errors.Is(err, context.Canceled), "acquire cancelled while in flight = %v, want the context's error", err)
	}

	// The token of a grant just before, to see that the cancelled grant
	// did commit (SPEC S3: tokens of a key strictly increase).
	first, err := l.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "acquire")
	e.Must(first.Release(ctx), "release")
	// A grant that commits after the caller gave up is released before
	// the error is returned.
	cancelDuring(func(c context.Context) (*lock.Lease, error) { return l.TryAcquire(c, "k", lock.Exclusive) })
	if hs := holders(e, l, ""); len(hs) != 0 {
		e.T.Errorf("cancelled acquire left rows: %v", hs)
	}
	o, err := other.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "key not free after a cancelled acquire")
	if o.Token() < first.Token()+2 {
		// Legitimate (the engine may abort the statement instead), but
		// then this run did not see a grant commit after the cancel.
		e.T.Logf("note: token %d follows %d: the cancelled acquire's statement did not commit a grant", o.Token(), first.Token())
	}
	// The Locker forgot the abandoned attempt: no ErrReentrant.
	if _, err := l.TryAcquire(ctx, "k", lock.Exclusive); !errors.Is(err, lock.ErrLocked) {
		e.T.Errorf("acquire after a cancelled one = %v, want ErrLocked (the key is held by another)", err)
	}

	// A blocked writer cancelled during a poll leaves no pending-writer
	// marker behind.
	cancelDuring(func(c context.Context) (*lock.Lease, error) { return l.Acquire(c, "k", lock.Exclusive) })
	hs := holders(e, l, "")
	e.Check(len(hs) == 1 && hs[0].LeaseID == o.LeaseID(), "cancelled waiter left rows: want only the holder's lease, got %v", hs)
	e.CheckErr(o.Release(ctx), "release")
	// Nothing blocks readers now.
	s, err := other.TryAcquire(ctx, "k", lock.Shared)
	e.Must(err, "shared after the cancelled waiter")
	_ = s.Release(ctx)
}

func h6DoneContextTakesNothing(e *Env) {
	ctx := e.Ctx()
	l := e.NewLocker(nil, lock.WithTTL(900*time.Millisecond))
	done, cancel := context.WithCancel(ctx)
	cancel()
	if le, err := l.TryAcquire(done, "k", lock.Exclusive); le != nil || !errors.Is(err, context.Canceled) {
		e.T.Errorf("TryAcquire with a done context = %v, %v; want the context's error", le, err)
	}
	if le, err := l.Acquire(done, "k", lock.Exclusive); le != nil || !errors.Is(err, context.Canceled) {
		e.T.Errorf("Acquire with a done context = %v, %v; want the context's error", le, err)
	}
	called := false
	if err := l.Do(done, "k", lock.Shared, func(context.Context, *lock.Lease) error { called = true; return nil }); !errors.Is(err, context.Canceled) {
		e.T.Errorf("Do with a done context = %v, want the context's error", err)
	}
	e.Check(!called, "Do ran its function with a done context")
	if hs := holders(e, l, ""); len(hs) != 0 {
		e.T.Errorf("a done context took something: %v", hs)
	}
	le := e.MustTryAcquire(l, "k", lock.Exclusive)
	_ = le.Release(ctx)
}

// h6CloseEndsWaitingAcquires: Close ends acquires that wait for a key held
// by another Locker: they return ErrClosed before Close returns, having
// removed their pending-writer markers (and FIFO tickets), and no lease is
// granted to the closed Locker when the holder lets go.
func h6CloseEndsWaitingAcquires(e *Env) {
	ctx := e.Ctx()
	const ttl = time.Second
	l, err := e.TryNewLocker(nil, lock.WithTTL(ttl), lock.WithMaxBackoff(50*time.Millisecond))
	e.Must(err, "new locker")
	other := e.NewLocker(nil, lock.WithTTL(ttl))
	keys := []string{"x", "s"}
	fifo := dialect.CapabilitiesOf(e.Dialect).Has(dialect.CapFIFO)
	if fifo {
		keys = append(keys, "q")
	}
	var held []*lock.Lease
	for _, k := range keys {
		le := e.MustTryAcquire(other, k, lock.Exclusive)
		held = append(held, le)
	}
	type result struct {
		key string
		le  *lock.Lease
		err error
	}
	results := make(chan result, len(keys))
	var wg sync.WaitGroup
	start := func(key string, mode lock.Mode, opts ...lock.AcquireOption) {
		e.Go(&wg, func() {
			le, err := l.Acquire(ctx, key, mode, opts...)
			results <- result{key, le, err}
		})
	}
	start("x", lock.Exclusive) // writes a pending-writer marker
	start("s", lock.Shared)
	if fifo {
		start("q", lock.Exclusive, lock.FIFO()) // writes a ticket
	}
	// Wait until the writers' marker (and ticket) are in the table.
	want := 1
	if fifo {
		want = 2
	}
	if !Eventually(5*time.Second, func() bool {
		n := 0
		for _, h := range holders(e, other, "") {
			if h.Mode == lock.PendingWriter || h.Mode == lock.Queued {
				n++
			}
		}
		return n >= want
	}) {
		e.T.Fatalf("waiters never wrote their marker/ticket: %v", holders(e, other, ""))
	}
	time.Sleep(100 * time.Millisecond) // the shared waiter is polling too
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	began := time.Now()
	e.CheckErr(l.Close(cctx), "close")
	took := time.Since(began)
	if limit := 2*time.Second + lcSlack; took > limit {
		e.T.Errorf("close with waiting acquires took %v, want under %v", took, limit)
	}
	// Close waited for the acquires: each has returned, and its goroutine
	// hands the result over at once (the short grace covers only the
	// hand-over between Acquire's return and the send).
	for range keys {
		select {
		case r := <-results:
			if r.le != nil {
				e.T.Errorf("acquire %q on a closing Locker returned a lease (token %d)", r.key, r.le.Token())
				_ = r.le.Release(ctx)
			}
			e.Check(errors.Is(r.err, lock.ErrClosed), "acquire %q waiting during Close = %v, want ErrClosed", r.key, r.err)
		case <-time.After(time.Second):
			e.T.Errorf("Close returned while an acquire was still waiting")
			for _, le := range held {
				_ = le.Release(ctx)
			}
			wg.Wait()
			close(results)
			for r := range results {
				if r.le != nil {
					e.T.Errorf("acquire %q returned a lease after Close (token %d)", r.key, r.le.Token())
					_ = r.le.Release(ctx)
				}
			}
			return
		}
	}
	wg.Wait()
	for _, h := range holders(e, other, "") {
		e.Check(h.Mode != lock.PendingWriter && h.Mode != lock.Queued, "closed Locker's waiter left a row behind: %+v", h)
	}
	// The holder lets go: nothing is granted to the closed Locker.
	for _, le := range held {
		e.Must(le.Release(ctx), "release")
	}
	time.Sleep(300 * time.Millisecond)
	if hs := holders(e, other, ""); len(hs) != 0 {
		e.T.Errorf("rows after the holder released and the waiter's Locker closed: %v", hs)
	}
	if _, err := l.TryAcquire(ctx, "x", lock.Exclusive); !errors.Is(err, lock.ErrClosed) {
		e.T.Errorf("acquire after Close = %v, want ErrClosed", err)
	}
}
