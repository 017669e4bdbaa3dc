package conformance

import (
	"context"
	"errors"
	"time"

	"github.com/sqlease/sqlease/lock"
)

// The holder's view (docs/contract.md): a force-released holder learns of its loss (H3); its waiters stay queued (W1).
func init() {
	register(
		Case{Name: "H3_ForceReleaseSignalsLossAndFencesOut", Rule: "H3", Run: h3ForceRelease},
		Case{Name: "W1_ForceReleaseKeepsWaitersAndWakesThem", Rule: "W1", Run: w1ForceReleaseKeepsWaiters},
	)
}

// frTTL is the TTL of the forced-release cases: a renewal every 400ms.
const frTTL = 1200 * time.Millisecond

// frWant checks that removed is exactly the leases want, in any order.
func frWant(e *Env, what string, removed []lock.Holder, want ...*lock.Lease) {
	e.T.Helper()
	e.Require(len(removed) == len(want), "%s: removed %v, want %d leases", what, removed, len(want))
	for _, le := range want {
		found := false
		for _, h := range removed {
			found = found || (h.LeaseID == le.LeaseID() && h.Token == le.Token() && h.Mode == le.Mode() && h.Key == le.Key())
		}
		e.Check(found, "%s: removed %v, missing lease %s token %d", what, removed, le.LeaseID(), le.Token())
	}
}

// h3ForceRelease: an operator's Locker force-releases another Locker's
// exclusive lease. The holder learns within about one renewal interval
// (ErrLeaseLost, LossNotOurs), its fenced transaction commits nothing, the
// next grant has a greater token, a key that only shares the prefix is
// kept, and the holder's Locker takes the key again. A lease of the
// operator's own Locker is marked lost at once; a bad key changes nothing.
func h3ForceRelease(e *Env) {
	ctx := e.Ctx()
	const key = "force/k"
	g := newGuarded(e)
	op, hl, other := e.NewLocker(nil, lock.WithTTL(frTTL)), e.NewLocker(nil, lock.WithTTL(frTTL)), e.NewLocker(nil, lock.WithTTL(frTTL))
	x := e.MustTryAcquire(hl, key, lock.Exclusive)
	neighbour := e.MustTryAcquire(other, key+"2", lock.Exclusive)
	if _, err := op.ForceRelease(ctx, ""); !errors.Is(err, lock.ErrInvalidInput) {
		e.T.Errorf("ForceRelease of an empty key = %v, want ErrInvalidInput", err)
	}
	removed, err := op.ForceRelease(ctx, key)
	e.Must(err, "force release")
	deleted := time.Now()
	frWant(e, "force release", removed, x)
	lost := lcWaitDone(x, frTTL/3+lcSlack)
	if lost.IsZero() {
		e.T.Fatalf("holder's context not ended %s after its lease was force-released", frTTL/3+lcSlack)
	}
	e.T.Logf("holder told %s after the forced release", lost.Sub(deleted).Round(time.Millisecond))
	if lle := wantLost(e, "holder's context cause", context.Cause(x.Context()), x); lle != nil && lle.Reason != lock.LossNotOurs {
		e.T.Errorf("loss reason %q, want %q", lle.Reason, lock.LossNotOurs)
	}
	called := false
	wantLost(e, "RunInTx after the forced release", x.RunInTx(ctx, e.DB, nil, g.incIn(x, &called)), x)
	e.Check(!called, "RunInTx ran the function of a force-released lease")
	g.expect(e, "after the force-released holder's fenced write", 0, 0)
	lcLiveInDatabase(e, other, neighbour)
	y := e.MustTryAcquire(other, key, lock.Exclusive)
	e.Check(y.Token() > x.Token(), "next grant has token %d, want greater than the removed lease's %d (SPEC S3)", y.Token(), x.Token())
	e.Must(y.RunInTx(ctx, e.DB, nil, g.incIn(y, nil)), "successor's fenced write")
	g.expect(e, "after the successor's write", 1, y.Token())
	e.Must(y.Release(ctx), "release")
	again := e.MustTryAcquire(hl, key, lock.Exclusive)
	// The operator's Locker holding the lease itself knows at once.
	removed, err = hl.ForceRelease(ctx, key)
	e.Must(err, "force release of the Locker's own lease")
	frWant(e, "force release of its own lease", removed, again)
	if lle := wantLost(e, "own lease after ForceRelease", again.Err(), again); lle != nil && lle.Reason != lock.LossNotOurs {
		e.T.Errorf("own lease: loss reason %q, want %q", lle.Reason, lock.LossNotOurs)
	}
	if removed, err := op.ForceRelease(ctx, key); err != nil || len(removed) != 0 {
		e.T.Errorf("force release of a free key = %v, %v; want nothing removed, nil", removed, err)
	}
	if _, err := hl.TryAcquire(ctx, key, lock.Exclusive); err != nil {
		e.T.Errorf("acquire after the own lease was force-released: %v", err)
	}
}

// w1ForceReleaseKeepsWaitersAndWakesThem: two shared leases are
// force-released while a writer waits. Both are removed, the writer's
// marker is not; a shared holder's fenced write commits nothing; the
// writer is granted with a greater token, and the other reader is told of
// its loss.
func w1ForceReleaseKeepsWaiters(e *Env) {
	ctx := e.Ctx()
	const key = "force/shared"
	g := newGuarded(e)
	a, b := e.NewLocker(nil, lock.WithTTL(frTTL)), e.NewLocker(nil, lock.WithTTL(frTTL))
	w := e.NewLocker(nil, lock.WithTTL(frTTL), lock.WithOwner("force-writer"), lock.WithMaxBackoff(50*time.Millisecond))
	op := e.NewLocker(nil, lock.WithTTL(frTTL))
	s1 := e.MustTryAcquire(a, key, lock.Shared)
	s2 := e.MustTryAcquire(b, key, lock.Shared)
	type result struct {
		le  *lock.Lease
		err error
	}
	granted := make(chan result, 1)
	go func() {
		le, err := w.Acquire(ctx, key, lock.Exclusive, lock.WaitTimeout(20*time.Second))
		granted <- result{le, err}
	}()
	waitForMarker(e, op, key, "force-writer", 5*time.Second)
	removed, err := op.ForceRelease(ctx, key)
	e.Must(err, "force release")
	frWant(e, "force release of two readers", removed, s1, s2)
	called := false
	wantLost(e, "reader's RunInTx after the forced release", s1.RunInTx(ctx, e.DB, nil, g.incIn(s1, &called)), s1)
	e.Check(!called, "RunInTx ran the function of a force-released shared lease")
	g.expect(e, "after the force-released reader's fenced write", 0, 0)
	var r result
	select {
	case r = <-granted:
	case <-time.After(10 * time.Second):
		e.T.Fatalf("waiting writer not granted 10s after the readers were force-released")
	}
	e.Must(r.err, "waiting writer")
	e.Check(r.le.Token() > max(s1.Token(), s2.Token()), "writer's token %d, want greater than the removed readers' %d and %d", r.le.Token(), s1.Token(), s2.Token())
	if lcWaitDone(s2, frTTL/3+lcSlack).IsZero() {
		e.T.Errorf("reader 2 not told of its loss %s after the forced release", frTTL/3+lcSlack)
	}
	wantLost(e, "reader 2's context cause", context.Cause(s2.Context()), s2)
	e.CheckErr(r.le.Release(ctx), "writer's release")
}
