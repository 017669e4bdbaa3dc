package conformance

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/lock"
)

// Waiting and fairness (docs/contract.md): shared leases limited to N holders (W7).
func init() {
	register(
		Case{Name: "W7_LimitAdmitsAtMostN", Rule: "W7", Run: w7AdmitsAtMostN},
		Case{Name: "W7_SemaphoreStressAcrossProcesses", Rule: "W7", Run: w7Stress},
		Case{Name: "W7_CrashedHolderSlotFreedWithinTTL", Rule: "W7", Run: w7CrashedHolder},
		Case{Name: "W7_ExclusiveNotStarvedBySemaphoreStream", Rule: "W7", Run: w7WriterNotStarved},
		Case{Name: "W7_FIFOAdmitsSemaphoreWaitersInArrivalOrder", Rule: "W7", Needs: dialect.CapFIFO, Run: w7FIFO},
		Case{Name: "W7_LimitFollowsDialectSupport", Rule: "W7", Run: w7Support},
	)
}

// w7Need skips the case when the dialect has no semaphores (with FIFO,
// when fifo is set).
func w7Need(e *Env, fifo bool) {
	e.T.Helper()
	if !dialect.SupportsLimit(e.Dialect, fifo) {
		stmt := "Acquire"
		if fifo {
			stmt = "AcquireFIFO"
		}
		e.T.Skipf("dialect %q has no semaphores: its %s statement does not take @%s (SPEC W7)", e.Dialect.Name(), stmt, dialect.ParamSharedLimit)
	}
}

// w7Lockers returns n Lockers named prefix-0, prefix-1, ... with opts.
func w7Lockers(e *Env, n int, prefix string, opts ...lock.Option) []*lock.Locker {
	var ls []*lock.Locker
	for i := range n {
		ls = append(ls, e.NewLocker(nil, append([]lock.Option{lock.WithOwner(fmt.Sprintf("%s-%d", prefix, i))}, opts...)...))
	}
	return ls
}

// w7AdmitsAtMostN: with Limit(3), three TryAcquires of separate Lockers are
// granted, each its own lease with a greater token; a fourth is refused
// with a *LockedError listing the three; a request with its own larger
// limit is granted and one without a limit too (each request is checked
// against its own n); once one holder releases, the fourth is granted.
func w7AdmitsAtMostN(e *Env) {
	w7Need(e, false)
	ctx := e.Ctx()
	const key, n = "w7/admit", 3
	ls := w7Lockers(e, n+2, "w7-admit")
	var held []*lock.Lease
	for i := range n {
		le := e.MustTryAcquire(ls[i], key, lock.Shared, lock.Limit(n))
		if i > 0 && le.Token() <= held[i-1].Token() {
			e.T.Errorf("holder %d: token %d, not greater than %d (SPEC S3)", i+1, le.Token(), held[i-1].Token())
		}
		held = append(held, le)
	}
	le, err := ls[n].TryAcquire(ctx, key, lock.Shared, lock.Limit(n))
	var lerr *lock.LockedError
	if !errors.As(err, &lerr) || !errors.Is(err, lock.ErrLocked) {
		if err == nil {
			_ = le.Release(ctx)
		}
		e.T.Fatalf("acquire %d with Limit(%d): want a *LockedError (ErrLocked), got %v", n+1, n, err)
	}
	e.Check(lerr.Limit == n && strings.Contains(lerr.Error(), fmt.Sprintf("at most %d shared holders", n)), "refusal %q (Limit %d): want it to name the limit %d", lerr, lerr.Limit, n)
	for _, h := range held {
		e.Check(slices.ContainsFunc(lerr.Holders, func(x lock.Holder) bool { return x.LeaseID == h.LeaseID() && x.Mode == lock.Shared }), "refusal lists %v, not holder %s", lerr.Holders, h.LeaseID())
	}
	if _, err := ls[n].Acquire(ctx, key, lock.Shared, lock.Limit(n), lock.WaitTimeout(200*time.Millisecond)); !errors.Is(err, lock.ErrLocked) {
		e.T.Errorf("blocking acquire with Limit(%d) on a full key: want ErrLocked after its wait timeout, got %v", n, err)
	}
	if live, err := liveOf(e.Ctx(), ls[0], key, lock.Shared); err != nil || len(live) != n {
		e.T.Errorf("database: %d live shared leases (err %v), want %d", len(live), err, n)
	}
	for _, opts := range [][]lock.AcquireOption{{lock.Limit(n + 1)}, nil} {
		le, err := ls[n+1].TryAcquire(ctx, key, lock.Shared, opts...)
		if err != nil {
			e.T.Errorf("shared acquire with %d options beside %d holders: %v (each request counts against its own limit)", len(opts), n, err)
			continue
		}
		e.CheckErr(le.Release(ctx), "release")
	}
	e.Must(held[1].Release(ctx), "release")
	le = e.MustTryAcquire(ls[n], key, lock.Shared, lock.Limit(n))
	if le.Token() <= held[n-1].Token() {
		e.T.Errorf("token %d after the release, not greater than %d (SPEC S3)", le.Token(), held[n-1].Token())
	}
	e.CheckErr(le.Release(ctx), "release")
}

// w7Stress: 10 contenders (3 in each of 2 child processes, 4 in this one,
// each its own Locker) take one key for a few seconds, 90% of them as a
// semaphore of 3 and the rest exclusively, 5% of the holders crashing.
// Never more than 3 shared holders: not in the database (polled), not in
// this process's own count of its holds, not in the grant log; exclusive
// grants overlap nothing and tokens increase per grant (SPEC S1, S3).
func w7Stress(e *Env) {
	w7Need(e, false)
	const n = 3
	dur := 3 * time.Second
	if e.Config.Short {
		dur = 1500 * time.Millisecond
	}
	child := e.stressSpec()
	child.Workers, child.Keys, child.SharedPercent, child.CrashPercent, child.Limit = 3, 1, 90, 5, n
	child.Duration, child.TTL, child.Hold, child.WaitTimeout = dur, 400*time.Millisecond, 15*time.Millisecond, time.Second
	var cur, peak, over atomic.Int64
	count := func(d int) {
		c := cur.Add(int64(d))
		if c > n {
			over.Add(1)
		}
		for p := peak.Load(); c > p && !peak.CompareAndSwap(p, c); p = peak.Load() {
		}
	}
	// The database's view, polled while the workers run.
	obs := e.NewLocker(e.OpenDB(), lock.WithOwner("w7-observer"))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var dbPeak atomic.Int64
	var dbErr error
	e.Go(&wg, func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			live, err := liveOf(e.Ctx(), obs, "stress/0", lock.Shared)
			if err != nil {
				dbErr = err
				return
			}
			if c := int64(len(live)); c > dbPeak.Load() {
				dbPeak.Store(c)
			}
		}
	})
	grants := runStress(e, 2, child, func(table string) error {
		spec := child
		spec.LogTable, spec.Worker, spec.Workers = table, "inproc", 4
		return runStressWorkers(e.Ctx(), e.OpenDB(), e.Dialect, spec, e.Config.NewLocker, count)
	})
	close(stop)
	wg.Wait()
	e.Check(dbErr == nil, "observer: %v", dbErr)
	if p := dbPeak.Load(); p > n {
		e.T.Errorf("the database showed %d live shared leases at once, limit %d", p, n)
	}
	if o := over.Load(); o > 0 {
		e.T.Errorf("this process held more than %d shared leases at once %d times (peak %d)", n, o, peak.Load())
	}
	for _, line := range CheckLimit(grants, n) {
		e.T.Errorf("%s", line)
	}
	modes := map[string]int{}
	for _, g := range grants {
		modes[g.Mode]++
	}
	e.T.Logf("%d grants %v; peak shared holders: %d in the database, %d in this process", len(grants), modes, dbPeak.Load(), peak.Load())
	e.Check(modes["shared"] >= 20 && modes["exclusive"] != 0, "grants by mode %v: want at least 20 shared and some exclusive; the stress did not stress", modes)
}

// CheckLimit verifies SPEC W7 on a grant log (see CheckLog): per key, at
// no instant are more than n shared grants live (an interval ends at its
// Released time, and a grant at the instant another ends does not overlap
// it). It returns one line per violation (at most 20).
func CheckLimit(grants []Grant, n int) []string {
	type event struct {
		at    int64
		delta int
		token int64
	}
	byKey := map[string][]event{}
	for _, g := range grants {
		if g.Mode == "shared" {
			byKey[g.Key] = append(byKey[g.Key], event{g.Acquired, 1, g.Token}, event{g.Released, -1, g.Token})
		}
	}
	var bad []string
	for key, evs := range byKey {
		sort.Slice(evs, func(i, j int) bool {
			if evs[i].at != evs[j].at {
				return evs[i].at < evs[j].at
			}
			return evs[i].delta < evs[j].delta // ends first
		})
		live := 0
		for _, ev := range evs {
			live += ev.delta
			if live > n && ev.delta > 0 {
				bad = append(bad, fmt.Sprintf("W7 %s: %d shared grants live at %d (token %d granted), limit %d", key, live, ev.at, ev.token, n))
				if len(bad) >= 20 {
					return bad
				}
			}
		}
	}
	return bad
}

// w7CrashedHolder: of a semaphore of 2, one holder crashes (Orphan: no more
// renewals, no release) and one stays. A waiter blocked on the full key is
// granted within one TTL (plus backoff and slack) of the crash, not before
// the crashed lease expired in database time, while the live holder still
// holds (SPEC W7, W2).
func w7CrashedHolder(e *Env) {
	w7Need(e, false)
	ctx := e.Ctx()
	const key, n, ttl = "w7/crash", 2, 500 * time.Millisecond
	// Only the crashing holder has the short TTL: the live holder's
	// renewals must not miss their window on a loaded machine.
	ls := w7Lockers(e, 2, "w7-crash", lock.WithTTL(5*time.Second), lock.WithMaxBackoff(50*time.Millisecond))
	short := e.NewLocker(nil, lock.WithOwner("w7-crash-short"), lock.WithTTL(ttl))
	stays := e.MustTryAcquire(ls[0], key, lock.Shared, lock.Limit(n))
	defer stays.Release(ctx)
	crashed := e.MustTryAcquire(short, key, lock.Shared, lock.Limit(n))
	crashed.Orphan()
	start := time.Now()
	le, err := ls[1].Acquire(ctx, key, lock.Shared, lock.Limit(n), lock.WaitTimeout(10*time.Second))
	waited := time.Since(start)
	e.Require(err == nil, "waiter: %v after %s", err, waited)
	defer le.Release(ctx)
	if bound := ttl + 2*time.Second; waited > bound {
		e.T.Errorf("waiter granted %s after the crash, want within one TTL (%s) plus slack (%s)", waited, ttl, bound)
	}
	e.Check(!le.GrantedAt().Before(crashed.Expiry()), "waiter granted at %s, before the crashed lease expired at %s (database time)", le.GrantedAt(), crashed.Expiry())
	e.CheckErr(stays.Err(), "the live holder lost its lease")
	if live, err := liveOf(e.Ctx(), ls[0], key, lock.Shared); err != nil || len(live) != n {
		e.T.Errorf("database: %d live shared leases (err %v), want %d", len(live), err, n)
	}
}

// w7WriterNotStarved: four contenders keep a semaphore of 2 busy (acquire,
// hold 40 ms, release, again). A blocking exclusive acquire is granted
// within a bound: its pending-writer marker stops new semaphore grants and
// the holds in progress end (SPEC W1, W7). While it holds, no shared lease
// is live.
func w7WriterNotStarved(e *Env) {
	w7Need(e, false)
	ctx := e.Ctx()
	const key, n = "w7/writer", 2
	ls := w7Lockers(e, 4, "w7-stream", lock.WithMaxBackoff(20*time.Millisecond))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var grants atomic.Int64
	errs := make(chan error, len(ls))
	for _, l := range ls {
		e.Go(&wg, func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				le, err := l.Acquire(ctx, key, lock.Shared, lock.Limit(n), lock.WaitTimeout(time.Second))
				if errors.Is(err, lock.ErrLocked) {
					continue
				}
				if err != nil {
					errs <- err
					return
				}
				grants.Add(1)
				time.Sleep(40 * time.Millisecond)
				if err := le.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	defer func() {
		close(stop)
		wg.Wait()
		e.CheckErr(joinErrs(errs), "stream")
	}()
	e.Require(Eventually(10*time.Second, func() bool { return grants.Load() >= 8 }), "the stream got %d grants in 10 s", grants.Load())
	w := e.NewLocker(nil, lock.WithOwner("w7-writer"), lock.WithMaxBackoff(50*time.Millisecond))
	start := time.Now()
	x, err := w.Acquire(ctx, key, lock.Exclusive, lock.WaitTimeout(10*time.Second))
	waited := time.Since(start)
	e.Require(err == nil, "writer: %v after %s (starved by the semaphore stream)", err, waited)
	if bound := 3 * time.Second; waited > bound {
		e.T.Errorf("writer granted after %s, want within %s", waited, bound)
	}
	if live, err := liveOf(e.Ctx(), w, key, lock.Shared); err != nil || len(live) != 0 {
		e.T.Errorf("while the writer holds: %d live shared leases (err %v), want none (SPEC S1)", len(live), err)
	}
	before := grants.Load()
	e.CheckErr(x.Release(ctx), "release")
	e.Check(Eventually(10*time.Second, func() bool { return grants.Load() > before }), "the stream got no grant after the writer released")
	e.T.Logf("writer waited %s behind a stream of %d semaphore grants", waited, before)
}

// w7FIFO: a semaphore of 2 is full (H1, H2). FIFO waiters arrive in the
// order A (semaphore), X (exclusive), B (semaphore). H1's release admits
// A only; H2's admits nobody (B has a slot but X is ahead of it); A's
// admits X; X's admits B. Tokens follow the same order (SPEC W6, W7).
func w7FIFO(e *Env) {
	w7Need(e, true)
	ctx := e.Ctx()
	const key, n = "w7/fifo", 2
	opts := []lock.Option{lock.WithMaxBackoff(20 * time.Millisecond)}
	hs := w7Lockers(e, 2, "w7-holder", opts...)
	var held []*lock.Lease
	for _, h := range hs {
		le := e.MustTryAcquire(h, key, lock.Shared, lock.Limit(n), lock.FIFO())
		held = append(held, le)
	}
	type waiter struct {
		name string
		mode lock.Mode
		opts []lock.AcquireOption
		got  chan *lock.Lease
	}
	ws := []*waiter{
		{name: "A", mode: lock.Shared, opts: []lock.AcquireOption{lock.Limit(n)}},
		{name: "X", mode: lock.Exclusive},
		{name: "B", mode: lock.Shared, opts: []lock.AcquireOption{lock.Limit(n)}},
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	for i, w := range ws {
		w.got = make(chan *lock.Lease, 1)
		l := e.NewLocker(nil, append(opts, lock.WithOwner("w7-"+w.name))...)
		e.Go(&wg, func() {
			le, err := l.Acquire(ctx, key, w.mode, append(w.opts, lock.FIFO(), lock.WaitTimeout(20*time.Second))...)
			if err != nil {
				e.T.Errorf("waiter %s: %v", w.name, err)
				close(w.got)
				return
			}
			w.got <- le
		})
		e.Require(Eventually(10*time.Second, func() bool {
			ts, err := w6Tickets(ctx, hs[0], key)
			return err == nil && len(ts) == i+1
		}), "waiter %s queued no ticket", w.name)
	}
	granted := func(w *waiter) *lock.Lease {
		select {
		case le := <-w.got:
			e.Require(le != nil, "waiter %s failed", w.name)
			return le
		case <-time.After(10 * time.Second):
			e.T.Fatalf("waiter %s not granted within 10 s", w.name)
		}
		return nil
	}
	waiting := func(when string, idle ...*waiter) {
		time.Sleep(300 * time.Millisecond)
		for _, w := range idle {
			select {
			case le := <-w.got:
				e.T.Errorf("%s: waiter %s granted out of turn", when, w.name)
				if le != nil {
					_ = le.Release(ctx)
				}
			default:
			}
		}
	}
	a, x, b := ws[0], ws[1], ws[2]
	release := func(le *lock.Lease) {
		e.CheckErr(le.Release(ctx), "release")
	}
	release(held[0])
	la := granted(a)
	waiting("after the first holder's release", x, b)
	release(held[1])
	waiting("after the second holder's release (B behind X)", x, b)
	release(la)
	lx := granted(x)
	waiting("while X holds", b)
	release(lx)
	lb := granted(b)
	release(lb)
	e.Check(la.Token() < lx.Token() && lx.Token() < lb.Token(), "tokens A %d, X %d, B %d: want increasing in arrival order", la.Token(), lx.Token(), lb.Token())
}

// w7Support: a dialect whose acquire statement takes @shared_limit grants
// a Limit acquire; one that does not refuses it with errors.ErrUnsupported
// naming the dialect, and grants the same acquire without Limit.
func w7Support(e *Env) {
	ctx := e.Ctx()
	const key = "w7/support"
	l := e.NewLocker(nil, lock.WithOwner("w7-support"))
	le, err := l.TryAcquire(ctx, key, lock.Shared, lock.Limit(2))
	if !dialect.SupportsLimit(e.Dialect, false) {
		e.Check(errors.Is(err, errors.ErrUnsupported) && strings.Contains(fmt.Sprint(err), e.Dialect.Name()), "Limit on a dialect without semaphores: want errors.ErrUnsupported naming %q, got %v", e.Dialect.Name(), err)
		if err == nil {
			_ = le.Release(ctx)
		}
		le, err = l.TryAcquire(ctx, key, lock.Shared)
	}
	e.Must(err, "acquire")
	e.CheckErr(le.Release(ctx), "release")
}
