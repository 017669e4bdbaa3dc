package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/lock"
)

// Waiting and fairness (docs/contract.md): many readers of one Locker (W5).
func init() {
	register(
		Case{Name: "W5_ManyReadersOfOneLockerHoldTogether", Rule: "W5", Run: w5ManyReaders},
		Case{Name: "W5_WaitingWriterGoesBeforeLaterReaders", Rule: "W5", Run: w5WriterBetweenReaders},
		Case{Name: "W5_ReentrantCombinationsRefused", Rule: "W5", Run: w5Refused},
		Case{Name: "W5_EachReaderReleasesAndLosesAlone", Rule: "W5", Run: w5EachReaderAlone},
	)
}

// w5Readers is a group of goroutines of one Locker that each take a shared
// lease on one key and hold it until release is closed.
type w5Readers struct {
	mu      sync.Mutex
	leases  []*lock.Lease
	granted atomic.Int64
	all     chan struct{} // closed when every reader holds its lease
	release chan struct{}
	wg      sync.WaitGroup
	errs    chan error
	once    sync.Once // closes release
	stopped sync.Once
}

// startW5Readers starts n goroutines of l acquiring key shared (each
// waiting at most wait); each holds its lease until r.release is closed,
// then releases it.
func startW5Readers(e *Env, l *lock.Locker, key string, n int, wait time.Duration) *w5Readers {
	ctx := e.Ctx()
	r := &w5Readers{all: make(chan struct{}), release: make(chan struct{}), errs: make(chan error, n)}
	for i := range n {
		e.Go(&r.wg, func() {
			le, err := l.Acquire(ctx, key, lock.Shared, lock.WaitTimeout(wait))
			if err != nil {
				r.errs <- fmt.Errorf("reader %d: acquire: %w", i, err)
				return
			}
			r.mu.Lock()
			r.leases = append(r.leases, le)
			r.mu.Unlock()
			if r.granted.Add(1) == int64(n) {
				close(r.all)
			}
			<-r.release
			if le.Err() != nil {
				r.errs <- fmt.Errorf("reader %d: lease lost while held: %w", i, le.Err())
			}
			if err := le.Release(ctx); err != nil {
				r.errs <- fmt.Errorf("reader %d: release: %w", i, err)
			}
		})
	}
	return r
}

// stop releases the readers' leases, waits for them and reports their
// errors.
func (r *w5Readers) stop(e *Env) {
	e.T.Helper()
	r.once.Do(func() { close(r.release) })
	r.stopped.Do(func() {
		r.wg.Wait()
		close(r.errs)
		for err := range r.errs {
			e.T.Errorf("%v", err)
		}
	})
}

// waitAll waits until every reader holds its lease (a barrier: none of
// them releases before all are granted).
func (r *w5Readers) waitAll(e *Env, n int, timeout time.Duration) {
	e.T.Helper()
	select {
	case <-r.all:
	case <-time.After(timeout):
		r.once.Do(func() { close(r.release) })
		e.T.Fatalf("only %d of %d readers of one Locker were granted within %s; they should hold together", r.granted.Load(), n, timeout)
	}
}

// liveShared returns the live shared leases of key by owner, as the
// database reports them.
func liveShared(e *Env, l *lock.Locker, key, owner string) []lock.Holder {
	e.T.Helper()
	hs, err := liveOf(e.Ctx(), l, key, lock.Shared)
	e.Must(err, "holders")
	return slices.DeleteFunc(hs, func(h lock.Holder) bool { return h.Owner != owner })
}

// w5ManyReaders: 32 goroutines of one Locker acquire one key shared at the
// same time; all are granted without waiting for one another and hold
// together (a barrier they pass only when all are granted), each its own
// lease with its own lease ID and token; the database lists all 32 live at
// once. After they release, the Locker holds nothing of the key: an
// exclusive acquire is granted.
func w5ManyReaders(e *Env) {
	ctx := e.Ctx()
	const (
		key   = "w5/many"
		owner = "w5-readers"
		n     = 32
	)
	l := e.NewLocker(nil, lock.WithOwner(owner), lock.WithMaxBackoff(20*time.Millisecond))
	start := time.Now()
	r := startW5Readers(e, l, key, n, 20*time.Second)
	defer r.stop(e)
	r.waitAll(e, n, 30*time.Second)
	e.T.Logf("%d readers of one Locker granted together within %s", n, time.Since(start).Round(time.Millisecond))
	live := liveShared(e, l, key, owner)
	e.Check(len(live) == n, "database lists %d live shared leases of %q while %d readers hold, want %d: %v", len(live), owner, n, n, live)
	r.mu.Lock()
	ids, tokens := map[string]bool{}, map[int64]bool{}
	for _, le := range r.leases {
		e.Check(le.Mode() == lock.Shared && le.Key() == key, "lease %s: mode %s key %q", le.LeaseID(), le.Mode(), le.Key())
		e.Check(!ids[le.LeaseID()] && !tokens[le.Token()], "lease ID %s or token %d handed to two readers", le.LeaseID(), le.Token())
		ids[le.LeaseID()], tokens[le.Token()] = true, true
		e.Check(slices.ContainsFunc(live, func(h lock.Holder) bool { return h.LeaseID == le.LeaseID() && h.Token == le.Token() }), "reader's lease %s token %d is not live in the database", le.LeaseID(), le.Token())
	}
	r.mu.Unlock()
	// Another Locker's writer is refused while they hold.
	w := e.NewLocker(nil, lock.WithOwner("w5-writer"))
	if x, err := w.TryAcquire(ctx, key, lock.Exclusive); !errors.Is(err, lock.ErrLocked) {
		if err == nil {
			_ = x.Release(ctx)
		}
		e.T.Errorf("S1: exclusive TryAcquire by another Locker while %d readers hold: want ErrLocked, got %v", n, err)
	}
	r.stop(e)
	if live := liveShared(e, l, key, owner); len(live) != 0 {
		e.T.Errorf("%d shared leases left after every reader released: %v", len(live), live)
	}
	x := e.MustTryAcquire(l, key, lock.Exclusive)
	e.CheckErr(x.Release(ctx), "release")
}

// w5WriterBetweenReaders: while 32 readers of one Locker hold a key, a
// writer of another Locker starts waiting (its pending-writer marker is
// placed); then more readers of the same Locker (and of a third Locker)
// arrive. The later readers are not granted while the first ones hold,
// nor while the writer holds: the writer is granted when the first readers
// release, before any later reader (SPEC W1), and the later readers are
// granted together after it releases. Order is checked by tokens and
// database grant times.
func w5WriterBetweenReaders(e *Env) {
	ctx := e.Ctx()
	const (
		key   = "w5/writer"
		owner = "w5-readers"
		n     = 32
		late  = 4
	)
	l := e.NewLocker(nil, lock.WithOwner(owner), lock.WithMaxBackoff(20*time.Millisecond))
	first := startW5Readers(e, l, key, n, 20*time.Second)
	defer first.stop(e)
	first.waitAll(e, n, 30*time.Second)

	w := e.NewLocker(nil, lock.WithOwner("w5-writer"), lock.WithMaxBackoff(20*time.Millisecond))
	type result struct {
		le  *lock.Lease
		err error
	}
	writer := make(chan result, 1)
	go func() {
		le, err := w.Acquire(ctx, key, lock.Exclusive, lock.WaitTimeout(30*time.Second))
		writer <- result{le, err}
	}()
	waitForMarker(e, l, key, "w5-writer", 10*time.Second)

	// Later readers: goroutines of the same Locker, and one other Locker.
	other := e.NewLocker(nil, lock.WithOwner("w5-other-reader"), lock.WithMaxBackoff(20*time.Millisecond))
	later := startW5Readers(e, l, key, late, 30*time.Second)
	defer later.stop(e)
	laterOther := startW5Readers(e, other, key, 1, 30*time.Second)
	defer laterOther.stop(e)

	time.Sleep(300 * time.Millisecond)
	select {
	case r := <-writer:
		e.T.Fatalf("writer ended while %d readers hold: %v", n, r.err)
	default:
	}
	if g := later.granted.Load() + laterOther.granted.Load(); g != 0 {
		e.T.Fatalf("W1: %d readers that arrived after the waiting writer were granted before it", g)
	}

	released := time.Now()
	first.stop(e)
	var wr result
	select {
	case wr = <-writer:
	case <-time.After(20 * time.Second):
		e.T.Fatalf("writer not granted within 20s after the first readers released")
	}
	e.Must(wr.err, "writer")
	e.T.Logf("writer granted %s after the first readers released", time.Since(released).Round(time.Millisecond))
	// The later readers stay out while the writer holds.
	time.Sleep(200 * time.Millisecond)
	if g := later.granted.Load() + laterOther.granted.Load(); g != 0 {
		e.T.Errorf("S1: %d later readers granted while the writer holds", g)
	}
	e.Must(wr.le.Release(ctx), "writer release")
	later.waitAll(e, late, 20*time.Second)
	laterOther.waitAll(e, 1, 20*time.Second)

	first.mu.Lock()
	for _, le := range first.leases {
		e.Check(le.Token() < wr.le.Token(), "first reader token %d not below the writer's %d", le.Token(), wr.le.Token())
	}
	first.mu.Unlock()
	for _, g := range []*w5Readers{later, laterOther} {
		g.mu.Lock()
		for _, le := range g.leases {
			e.Check(le.Token() > wr.le.Token(), "W1: later reader (token %d) granted before the writer (token %d)", le.Token(), wr.le.Token())
			e.Check(!le.GrantedAt().Before(wr.le.GrantedAt()), "W1: later reader granted at %v (database time), before the writer at %v", le.GrantedAt(), wr.le.GrantedAt())
		}
		g.mu.Unlock()
	}
}

// w5Refused: one Locker refuses, with ErrReentrant and at once, exactly
// the acquires that would wait behind itself, in every form: any acquire
// while it holds or waits for the key exclusively, an exclusive acquire
// while it holds or waits for the key shared (SPEC W4). A shared acquire
// while it holds or waits for the key shared is a reader like any other
// (SPEC W5): granted, or waiting behind another Locker's holder.
func w5Refused(e *Env) {
	ctx := e.Ctx()
	l := e.NewLocker(nil, lock.WithOwner("w5-l"), lock.WithMaxBackoff(20*time.Millisecond))
	other := e.NewLocker(nil, lock.WithOwner("w5-other"), lock.WithMaxBackoff(20*time.Millisecond))
	refused := func(what, key string, m lock.Mode) {
		e.T.Helper()
		forms := []struct {
			name string
			f    func() error
		}{
			{"TryAcquire", func() error {
				le, err := l.TryAcquire(ctx, key, m)
				if err == nil {
					_ = le.Release(ctx)
				}
				return err
			}},
			{"Acquire", func() error {
				le, err := l.Acquire(ctx, key, m, lock.WaitTimeout(5*time.Second))
				if err == nil {
					_ = le.Release(ctx)
				}
				return err
			}},
			{"Do", func() error {
				return l.Do(ctx, key, m, func(context.Context, *lock.Lease) error {
					e.T.Errorf("%s: Do ran its function", what)
					return nil
				}, lock.WaitTimeout(5*time.Second))
			}},
		}
		for _, form := range forms {
			start := time.Now()
			err := form.f()
			e.Check(errors.Is(err, lock.ErrReentrant) && !errors.Is(err, lock.ErrLocked), "%s: %s %s: want ErrReentrant, got %v", what, form.name, m, err)
			if took := time.Since(start); took > time.Second {
				e.T.Errorf("%s: %s %s refused after %s, want at once", what, form.name, m, took)
			}
		}
	}

	// Held shared (twice): a third shared acquire is granted, exclusive is
	// refused.
	const heldKey = "w5/refused/held-shared"
	s1 := e.MustTryAcquire(l, heldKey, lock.Shared)
	s2 := e.MustTryAcquire(l, heldKey, lock.Shared)
	e.Check(s1.LeaseID() != s2.LeaseID() && s1.Token() != s2.Token(), "two shared leases share lease ID or token: %s/%d, %s/%d", s1.LeaseID(), s1.Token(), s2.LeaseID(), s2.Token())
	refused("held shared", heldKey, lock.Exclusive)
	e.CheckErr(l.Do(ctx, heldKey, lock.Shared, func(context.Context, *lock.Lease) error { return nil }, lock.WaitTimeout(5*time.Second)), "held shared: Do shared")

	// Waiting shared (behind another Locker's exclusive holder): another
	// shared acquire waits like any reader (ErrLocked after its wait
	// timeout, not ErrReentrant); exclusive is refused.
	const waitKey = "w5/refused/waiting-shared"
	blocker := e.MustTryAcquire(other, waitKey, lock.Exclusive)
	type result struct {
		le  *lock.Lease
		err error
	}
	// The acquire registers the key at its start, before its first poll:
	// once a poll was sent, it is waiting.
	polls := func() int {
		n := e.Faults.Count(lcAcquireSQL(e))
		if p := dialect.FastPathOf(e.Dialect).Probe; p != "" {
			n += e.Faults.Count(lcRendered(e, "Probe", p))
		}
		return n
	}
	before := polls()
	waiting := make(chan result, 1)
	go func() {
		le, err := l.Acquire(ctx, waitKey, lock.Shared, lock.WaitTimeout(20*time.Second))
		waiting <- result{le, err}
	}()
	e.Require(Eventually(10*time.Second, func() bool { return polls() > before }), "the waiting shared acquire sent no poll")
	refused("waiting shared", waitKey, lock.Exclusive)
	if _, err := l.Acquire(ctx, waitKey, lock.Shared, lock.WaitTimeout(200*time.Millisecond)); !errors.Is(err, lock.ErrLocked) || errors.Is(err, lock.ErrReentrant) {
		e.T.Errorf("waiting shared: second shared Acquire: want ErrLocked after its wait timeout, got %v", err)
	}
	e.Must(blocker.Release(ctx), "release blocker")
	var wr result
	select {
	case wr = <-waiting:
	case <-time.After(20 * time.Second):
		e.T.Fatalf("waiting shared acquire not granted after the blocker released")
	}
	e.Must(wr.err, "waiting shared acquire")
	e.CheckErr(wr.le.Release(ctx), "release")

	// Held exclusive: both modes refused.
	const xKey = "w5/refused/held-exclusive"
	x := e.MustTryAcquire(l, xKey, lock.Exclusive)
	refused("held exclusive", xKey, lock.Shared)
	refused("held exclusive", xKey, lock.Exclusive)
	e.Must(x.Release(ctx), "release")

	// Waiting exclusive (behind another Locker's reader): both modes
	// refused, the waiting acquire is not disturbed.
	const wxKey = "w5/refused/waiting-exclusive"
	rb := e.MustTryAcquire(other, wxKey, lock.Shared)
	go func() {
		le, err := l.Acquire(ctx, wxKey, lock.Exclusive, lock.WaitTimeout(20*time.Second))
		waiting <- result{le, err}
	}()
	waitForMarker(e, other, wxKey, "w5-l", 10*time.Second)
	refused("waiting exclusive", wxKey, lock.Shared)
	refused("waiting exclusive", wxKey, lock.Exclusive)
	e.Must(rb.Release(ctx), "release reader blocker")
	select {
	case wr = <-waiting:
	case <-time.After(20 * time.Second):
		e.T.Fatalf("waiting exclusive acquire not granted after the reader released")
	}
	e.Must(wr.err, "waiting exclusive acquire")
	e.CheckErr(wr.le.Release(ctx), "release")

	// Releasing one of two shared leases keeps the key held: exclusive is
	// still refused; after the last one it is granted.
	e.Must(s1.Release(ctx), "release first shared")
	refused("one of two shared leases released", heldKey, lock.Exclusive)
	e.Must(s2.Release(ctx), "release second shared")
	for _, key := range []string{heldKey, waitKey, xKey, wxKey} {
		x, err := l.TryAcquire(ctx, key, lock.Exclusive)
		if err != nil {
			e.T.Errorf("exclusive of %s after everything was released: %v", key, err)
			continue
		}
		_ = x.Release(ctx)
	}
}

// w5EachReaderAlone: two shared leases of one Locker on one key are two
// leases: a failed third acquire, the loss of one (orphaned, its trusted
// window ends) and the release of one leave the other held, renewing and
// counted by the Locker; the key is free for an exclusive acquire only
// after the last one ends.
func w5EachReaderAlone(e *Env) {
	ctx := e.Ctx()
	const (
		key = "w5/alone"
		ttl = time.Second
	)
	l := e.NewLocker(nil, lock.WithOwner("w5-l"), lock.WithTTL(ttl), lock.WithMaxBackoff(20*time.Millisecond))
	other := e.NewLocker(nil, lock.WithOwner("w5-writer"), lock.WithTTL(ttl))
	a := e.MustTryAcquire(l, key, lock.Shared)
	b := e.MustTryAcquire(l, key, lock.Shared)
	// A third shared acquire that fails (a writer of another Locker waits,
	// so it waits too, until its timeout) forgets only itself.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wdone := make(chan error, 1)
	go func() {
		le, err := other.Acquire(wctx, key, lock.Exclusive)
		if err == nil {
			err = le.Release(ctx)
			if err == nil {
				err = errors.New("writer granted while shared leases were held")
			}
		}
		wdone <- err
	}()
	waitForMarker(e, l, key, "w5-writer", 10*time.Second)
	if _, err := l.Acquire(ctx, key, lock.Shared, lock.WaitTimeout(100*time.Millisecond)); !errors.Is(err, lock.ErrLocked) {
		e.T.Errorf("third shared behind a waiting writer: want ErrLocked, got %v", err)
	}
	cancel()
	if err := <-wdone; !errors.Is(err, context.Canceled) {
		e.T.Errorf("writer: want context.Canceled, got %v", err)
	}
	if _, err := l.TryAcquire(ctx, key, lock.Exclusive); !errors.Is(err, lock.ErrReentrant) {
		e.T.Errorf("exclusive after a failed third shared acquire, two still held: want ErrReentrant, got %v", err)
	}
	// Lose one: orphaned, it is reported lost when its window ends.
	a.Orphan()
	e.Require(!lcWaitDone(a, 10*ttl).IsZero(), "orphaned lease not reported lost")
	e.Check(errors.Is(a.Err(), lock.ErrLeaseLost), "orphaned lease: want ErrLeaseLost, got %v", a.Err())
	// The other lives on (renewed past several TTLs) and still counts.
	time.Sleep(2 * ttl)
	e.Must(b.Err(), "the other shared lease ended with the lost one")
	if live := liveShared(e, l, key, "w5-l"); !slices.ContainsFunc(live, func(h lock.Holder) bool { return h.LeaseID == b.LeaseID() }) {
		e.T.Errorf("the other shared lease is not live in the database: %v", live)
	}
	if _, err := l.TryAcquire(ctx, key, lock.Exclusive); !errors.Is(err, lock.ErrReentrant) {
		e.T.Errorf("exclusive with one shared lease lost and one held: want ErrReentrant, got %v", err)
	}
	e.Must(b.Release(ctx), "release")
	x := e.MustAcquire(l, key, lock.Exclusive, lock.WaitTimeout(10*time.Second))
	_ = x.Release(ctx)
}
