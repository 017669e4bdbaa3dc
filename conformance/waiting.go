package conformance

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/lock"
)

// Waiting and fairness (docs/contract.md): writers are not starved (W1), re-entrant acquires are refused (W4).
func init() {
	register(
		Case{Name: "W1_WriterNotStarvedByReaders", Rule: "W1", Run: w1WriterNotStarved},
		Case{Name: "W1_DeadWaiterStopsBlockingAfterMarkerTTL", Rule: "W1", Run: w1DeadWaiter},
		Case{Name: "W1_GiveUpClearsMarkerAtOnce", Rule: "W1", Run: w1GiveUpClearsMarker},
		Case{Name: "W1_MarkerIsPerKey", Rule: "W1", Run: w1MarkerIsPerKey},
		Case{Name: "W1_SharedHoldersRenewWhileWriterWaits", Rule: "W1", Run: w1SharedHoldersRenew},
		Case{Name: "W1_StressWritersProgressAcrossProcesses", Rule: "W1", Run: w1Stress},
		Case{Name: "W4_ReentrantAcquireRefused", Rule: "W4", Run: w4Reentrant},
	)
	childRoles["w1-waiter"] = w1WaiterChild
	childRoles["w1-stress"] = func(ctx context.Context, db *sql.DB, d dialect.Dialect, spec StressSpec) error {
		return runW1StressWorkers(ctx, db, d, spec, nil)
	}
}

// liveMarker returns the live pending-writer marker of key, if any, as seen
// by l's Holders (database time).
func liveMarker(ctx context.Context, l *lock.Locker, key string) (lock.Holder, bool, error) {
	hs, err := liveOf(ctx, l, key, lock.PendingWriter)
	if err != nil || len(hs) == 0 {
		return lock.Holder{}, false, err
	}
	return hs[0], true, nil
}

// waitForMarker waits until key has a live marker placed by owner.
func waitForMarker(e *Env, l *lock.Locker, key, owner string, timeout time.Duration) lock.Holder {
	e.T.Helper()
	var m lock.Holder
	var lastErr error
	e.Require(Eventually(timeout, func() bool {
		h, ok, err := liveMarker(e.Ctx(), l, key)
		if err != nil {
			lastErr = err
			return false
		}
		m = h
		return ok && h.Owner == owner
	}), "no live pending-writer marker of %q on %q after %s (last seen %+v, err %v)", owner, key, timeout, m, lastErr)
	return m
}

// readerBlocked waits until key has a live marker of owner with at least
// 300 ms left (database time), then checks that a shared TryAcquire by r is
// refused because of it.
func readerBlocked(e *Env, r *lock.Locker, key, owner, what string) {
	e.T.Helper()
	ctx := e.Ctx()
	e.Require(Eventually(5*time.Second, func() bool {
		hs, now, err := r.Holders(ctx, key)
		return err == nil && slices.ContainsFunc(hs, func(h lock.Holder) bool {
			return h.Mode == lock.PendingWriter && h.Owner == owner && h.Expiry.Sub(now) >= 300*time.Millisecond
		})
	}), "%s: no live marker of %q on %q", what, owner, key)
	s, err := r.TryAcquire(ctx, key, lock.Shared)
	if err == nil {
		_ = s.Release(ctx)
	}
	e.Require(errors.Is(err, lock.ErrLocked) && hasPendingWriter(err), "%s: want ErrLocked naming the pending writer, got %v", what, err)
}

// hasPendingWriter reports whether a LockedError names a pending writer.
func hasPendingWriter(err error) bool {
	var le *lock.LockedError
	if !errors.As(err, &le) {
		return false
	}
	return slices.ContainsFunc(le.Holders, func(h lock.Holder) bool { return h.Mode == lock.PendingWriter })
}

// w1WriterNotStarved: two readers take turns so that a shared lease is held
// at every instant; a writer must still get in within about two reader
// hold times, because its marker stops new shared grants.
func w1WriterNotStarved(e *Env) {
	ctx := e.Ctx()
	const (
		key    = "w1/starve"
		hold   = 100 * time.Millisecond
		offset = 60 * time.Millisecond
		pause  = 20 * time.Millisecond
		slack  = 2 * time.Second
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var grants [2]atomic.Int64
	for i := range 2 {
		r := e.NewLocker(nil, lock.WithOwner(fmt.Sprintf("reader%d", i)), lock.WithMaxBackoff(10*time.Millisecond))
		e.Go(&wg, func() {
			time.Sleep(time.Duration(i) * offset)
			for {
				select {
				case <-stop:
					return
				default:
				}
				le, err := r.Acquire(ctx, key, lock.Shared, lock.WaitTimeout(10*time.Second))
				if err != nil {
					e.T.Errorf("reader %d: acquire: %v", i, err)
					return
				}
				grants[i].Add(1)
				time.Sleep(hold)
				if err := le.Release(ctx); err != nil {
					e.T.Errorf("reader %d: release: %v", i, err)
					return
				}
				time.Sleep(pause)
			}
		})
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	if !Eventually(5*time.Second, func() bool { return grants[0].Load() >= 2 && grants[1].Load() >= 2 }) {
		e.T.Fatalf("readers did not get going: grants %d, %d", grants[0].Load(), grants[1].Load())
	}
	w := e.NewLocker(nil, lock.WithOwner("writer"), lock.WithMaxBackoff(20*time.Millisecond), lock.WithPendingWriterTTL(time.Second))
	before := [2]int64{grants[0].Load(), grants[1].Load()}
	start := time.Now()
	x, err := w.Acquire(ctx, key, lock.Exclusive, lock.WaitTimeout(5*time.Second))
	waited := time.Since(start)
	e.Require(err == nil, "writer starved by overlapping readers: %v (waited %s)", err, waited)
	e.T.Logf("writer granted after %s (reader hold %s; readers granted %d, %d times while it waited)",
		waited.Round(time.Millisecond), hold, grants[0].Load()-before[0], grants[1].Load()-before[1])
	if bound := 2*hold + slack; waited > bound {
		e.T.Errorf("writer waited %s, want at most 2 reader holds + slack = %s", waited.Round(time.Millisecond), bound)
	}
	hs, now, err := w.Holders(ctx, key)
	e.Must(err, "holders")
	for _, h := range hs {
		e.Check(h.Mode != lock.Shared || !h.Expiry.After(now), "S1: shared lease live while the writer holds the key: %v", h)
	}
	time.Sleep(30 * time.Millisecond)
	e.Must(x.Release(ctx), "writer release")
	// The readers proceed once the writer is done.
	after := [2]int64{grants[0].Load(), grants[1].Load()}
	if !Eventually(3*time.Second, func() bool { return grants[0].Load() > after[0] && grants[1].Load() > after[1] }) {
		e.T.Errorf("readers did not proceed after the writer released: grants %d->%d, %d->%d", after[0], grants[0].Load(), after[1], grants[1].Load())
	}
}

// childProc is one child process started by startChild.
type childProc struct {
	cmd    *exec.Cmd
	out    *strings.Builder
	once   sync.Once
	result error
}

// startChild starts one child process doing spec's work, like
// SpawnChildren, but hands back the process so a case can kill it. The
// child is killed at cleanup if it still runs.
func startChild(e *Env, spec StressSpec) *childProc {
	e.T.Helper()
	if spec.Worker == "" {
		spec.Worker = "child"
	}
	cmd, out := childCommand(e, spec)
	c := &childProc{cmd: cmd, out: out}
	e.T.Cleanup(func() { c.kill() })
	return c
}

// kill kills the child (a crash: no cleanup runs in it) and reaps it. It
// returns the child's output.
func (c *childProc) kill() string {
	c.once.Do(func() {
		_ = c.cmd.Process.Kill()
		c.result = c.cmd.Wait()
	})
	return c.out.String()
}

// w1WaiterChild waits as a writer on Extra["key"] until it is killed (or its
// WaitTimeout runs out).
func w1WaiterChild(ctx context.Context, db *sql.DB, d dialect.Dialect, spec StressSpec) error {
	markerTTL, err := time.ParseDuration(spec.Extra["marker_ttl"])
	if err != nil {
		return err
	}
	l, err := lock.New(ctx, db, d, lock.WithSchema(spec.Namespace.Schema), lock.WithTablePrefix(spec.Namespace.Prefix),
		lock.WithoutSchemaCheck(), lock.WithOwner(spec.Extra["owner"]), lock.WithLogger(discard),
		lock.WithMaxBackoff(50*time.Millisecond), lock.WithPendingWriterTTL(markerTTL))
	if err != nil {
		return err
	}
	le, err := l.Acquire(ctx, spec.Extra["key"], lock.Exclusive, lock.WaitTimeout(spec.WaitTimeout))
	if err == nil {
		_ = le.Release(ctx)
		return errors.New("waiter was granted, but the parent holds the key shared")
	}
	return err
}

// w1DeadWaiter: a writer process waits (its marker blocks new readers, and
// stays live past one marker TTL while it polls), then dies without
// clearing its marker. Readers are blocked at most one marker TTL (plus a
// poll step) after its death.
func w1DeadWaiter(e *Env) {
	ctx := e.Ctx()
	const (
		key       = "w1/dead-waiter"
		owner     = "w1-dead-waiter"
		markerTTL = time.Second
		slack     = 2 * time.Second
	)
	h := e.NewLocker(nil, lock.WithOwner("w1-holder"))
	held := e.MustTryAcquire(h, key, lock.Shared)
	defer held.Release(ctx)
	child := startChild(e, StressSpec{
		Role: "w1-waiter", Dialect: e.Dialect.Name(), Driver: e.Config.DriverName, DSN: e.DSN, Namespace: e.Namespace,
		WaitTimeout: 60 * time.Second,
		Extra:       map[string]string{"key": key, "owner": owner, "marker_ttl": markerTTL.String()},
	})
	r := e.NewLocker(nil, lock.WithOwner("w1-reader"), lock.WithMaxBackoff(20*time.Millisecond))
	first := waitForMarker(e, r, key, owner, 20*time.Second)
	readerBlocked(e, r, key, owner, "reader while a writer waits")
	// The live waiter keeps refreshing its marker: past one marker TTL it
	// still blocks readers.
	e.Require(Eventually(5*time.Second, func() bool {
		m, ok, err := liveMarker(ctx, r, key)
		return err == nil && ok && m.Expiry.Sub(first.Expiry) >= markerTTL
	}), "the live waiter's marker was not refreshed past one marker TTL (first expiry %v)", first.Expiry)
	readerBlocked(e, r, key, owner, "reader one marker TTL later, waiter alive")
	m, ok, _ := liveMarker(ctx, r, key)
	killed := time.Now()
	out := child.kill()
	if ps := child.cmd.ProcessState; ps != nil && ps.Exited() {
		e.T.Fatalf("waiter child exited by itself before it was killed (%v): %s", child.result, out)
	}
	if ok {
		e.T.Logf("marker %s at kill", m)
	}
	rs, err := r.Acquire(ctx, key, lock.Shared, lock.WaitTimeout(10*time.Second))
	blocked := time.Since(killed)
	e.Require(err == nil, "reader after the waiter died: %v (after %s)", err, blocked)
	defer rs.Release(ctx)
	e.T.Logf("reader blocked %s after the waiter died (marker TTL %s)", blocked.Round(time.Millisecond), markerTTL)
	if bound := markerTTL + 20*time.Millisecond + slack; blocked > bound {
		e.T.Errorf("dead waiter blocked readers for %s, want at most marker TTL + poll step + slack = %s", blocked.Round(time.Millisecond), bound)
	}
}

// w1GiveUpClearsMarker: a writer that stops waiting (wait timeout or
// cancelled context) removes its marker at once, though the marker TTL is
// long: a reader is granted right after.
func w1GiveUpClearsMarker(e *Env) {
	ctx := e.Ctx()
	const key = "w1/give-up"
	h := e.NewLocker(nil, lock.WithOwner("w1-holder"))
	held := e.MustTryAcquire(h, key, lock.Shared)
	defer held.Release(ctx)
	// A marker that would block readers for 10 s if it were left behind.
	w := e.NewLocker(nil, lock.WithOwner("w1-writer"), lock.WithMaxBackoff(20*time.Millisecond), lock.WithPendingWriterTTL(10*time.Second))
	r := e.NewLocker(nil, lock.WithOwner("w1-reader"))
	noMarker := func(what string) {
		e.T.Helper()
		hs, _, err := r.Holders(ctx, key)
		e.Must(err, "holders")
		for _, h := range hs {
			e.Check(h.Mode != lock.PendingWriter, "%s: marker left behind: %v", what, h)
		}
	}
	for _, how := range []string{"wait timeout", "context cancelled"} {
		wctx, cancel := context.WithCancel(ctx)
		opts := []lock.AcquireOption{}
		if how == "wait timeout" {
			opts = append(opts, lock.WaitTimeout(1500*time.Millisecond))
		}
		done := make(chan error, 1)
		go func() {
			le, err := w.Acquire(wctx, key, lock.Exclusive, opts...)
			if err == nil {
				_ = le.Release(ctx)
			}
			done <- err
		}()
		waitForMarker(e, r, key, "w1-writer", 5*time.Second)
		if _, err := r.TryAcquire(ctx, key, lock.Shared); !errors.Is(err, lock.ErrLocked) || !hasPendingWriter(err) {
			cancel()
			e.T.Fatalf("%s: reader while the writer waits: want ErrLocked naming the pending writer, got %v", how, err)
		}
		if how == "context cancelled" {
			cancel()
		}
		var err error
		select {
		case err = <-done:
		case <-time.After(10 * time.Second):
			cancel()
			e.T.Fatalf("%s: writer did not give up", how)
		}
		cancel()
		switch how {
		case "wait timeout":
			var le *lock.LockedError
			e.Require(errors.As(err, &le) && le.Waited > 0, "%s: want *LockedError with Waited > 0, got %v", how, err)
		default:
			e.Require(errors.Is(err, context.Canceled), "%s: want context.Canceled, got %v", how, err)
		}
		rs, err := r.TryAcquire(ctx, key, lock.Shared)
		e.Require(err == nil, "%s: reader right after the writer gave up: %v (marker not cleared)", how, err)
		noMarker(how)
		e.Must(rs.Release(ctx), "release")
	}
}

// w1MarkerIsPerKey: a writer waiting on key A blocks new readers of A only.
func w1MarkerIsPerKey(e *Env) {
	ctx := e.Ctx()
	h := e.NewLocker(nil, lock.WithOwner("w1-holder"))
	held := e.MustTryAcquire(h, "w1/a", lock.Shared)
	w := e.NewLocker(nil, lock.WithOwner("w1-writer"), lock.WithMaxBackoff(20*time.Millisecond), lock.WithPendingWriterTTL(5*time.Second))
	r := e.NewLocker(nil, lock.WithOwner("w1-reader"))
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		le, err := w.Acquire(wctx, "w1/a", lock.Exclusive, lock.WaitTimeout(10*time.Second))
		if err == nil {
			err = le.Release(ctx)
		}
		done <- err
	}()
	waitForMarker(e, r, "w1/a", "w1-writer", 5*time.Second)
	if _, err := r.TryAcquire(ctx, "w1/a", lock.Shared); !errors.Is(err, lock.ErrLocked) || !hasPendingWriter(err) {
		e.T.Errorf("reader of the key the writer waits on: want ErrLocked naming the pending writer, got %v", err)
	}
	for _, k := range []string{"w1/b", "w1/a/b", "w1/"} {
		rs, err := r.TryAcquire(ctx, k, lock.Shared)
		if err != nil {
			e.T.Errorf("reader of %q while a writer waits on %q: %v", k, "w1/a", err)
			continue
		}
		_ = rs.Release(ctx)
	}
	if _, ok, err := liveMarker(ctx, r, "w1/a"); err != nil || !ok {
		e.T.Errorf("writer's marker on w1/a gone while it waits: %v", err)
	}
	e.Must(held.Release(ctx), "release")
	select {
	case err := <-done:
		e.Check(err == nil, "writer after the reader released: %v", err)
	case <-time.After(10 * time.Second):
		e.T.Errorf("writer not granted after the reader released")
	}
}

// w1SharedHoldersRenew: shared leases held when a writer starts waiting are
// still renewed while it waits; the writer does not take them over.
func w1SharedHoldersRenew(e *Env) {
	ctx := e.Ctx()
	const (
		key  = "w1/renew"
		ttl  = time.Second
		wait = 3 * time.Second // three TTLs
	)
	var readers []*lock.Lease
	for i := range 2 {
		r := e.NewLocker(nil, lock.WithTTL(ttl), lock.WithRenewTimeout(ttl/3), lock.WithOwner(fmt.Sprintf("w1-reader%d", i)))
		le := e.MustTryAcquire(r, key, lock.Shared)
		defer le.Release(ctx)
		readers = append(readers, le)
	}
	first := readers[0].Expiry()
	w := e.NewLocker(nil, lock.WithTTL(ttl), lock.WithOwner("w1-writer"), lock.WithMaxBackoff(100*time.Millisecond), lock.WithPendingWriterTTL(600*time.Millisecond))
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		le, err := w.Acquire(ctx, key, lock.Exclusive, lock.WaitTimeout(wait))
		if err == nil {
			_ = le.Release(ctx)
			err = fmt.Errorf("writer granted while two shared leases are held and renewed")
		}
		done <- err
	}()
	waitForMarker(e, w, key, "w1-writer", 2*time.Second)
	err := <-done
	waited := time.Since(start)
	var le *lock.LockedError
	e.Require(errors.As(err, &le), "writer: want *LockedError after its wait timeout, got %v", err)
	ids := map[string]bool{}
	for _, h := range le.Holders {
		if h.Mode == lock.Shared {
			ids[h.LeaseID] = true
		}
	}
	for i, r := range readers {
		e.Check(ids[r.LeaseID()], "writer's LockedError does not name reader %d: %v", i, le)
	}
	hs, now, err := w.Holders(ctx, key)
	e.Must(err, "holders")
	for i, r := range readers {
		e.CheckErr(r.Err(), "reader %d lost its lease while a writer waited %s", i, waited.Round(time.Millisecond))
		live := slices.ContainsFunc(hs, func(h lock.Holder) bool { return h.LeaseID == r.LeaseID() && h.Expiry.After(now) })
		e.Check(live, "reader %d: lease not live in the database after the writer waited: %v", i, hs)
		e.CheckErr(r.Renew(ctx), "reader %d: renew", i)
	}
	if moved := readers[0].Expiry().Sub(first); moved < wait-2*ttl {
		e.T.Errorf("reader expiry moved %s while the writer waited %s: not renewed", moved, waited.Round(time.Millisecond))
	}
}

// runW1StressWorkers runs spec.Workers readers and Extra["writers"] writers
// (each its own Locker) on spec.Keys keys for spec.Duration and logs every
// grant to spec.LogTable, with worker names "<Worker>/r<i>" and
// "<Worker>/w<i>". Readers hold back to back, so without writer preference
// the writers would starve.
func runW1StressWorkers(ctx context.Context, db *sql.DB, d dialect.Dialect, spec StressSpec, newLocker func(context.Context, *sql.DB, dialect.Dialect, ...lock.Option) (*lock.Locker, error)) error {
	if newLocker == nil {
		newLocker = lock.New
	}
	writers, err := strconv.Atoi(spec.Extra["writers"])
	if err != nil {
		return fmt.Errorf("writers: %w", err)
	}
	insert := grantInsert(d, spec.LogTable)
	deadline := time.Now().Add(spec.Duration)
	var wg sync.WaitGroup
	errs := make(chan error, spec.Workers+writers)
	run := func(name string, mode lock.Mode) {
		defer wg.Done()
		l, err := newLocker(ctx, db, d, lock.WithSchema(spec.Namespace.Schema), lock.WithTablePrefix(spec.Namespace.Prefix),
			lock.WithTTL(spec.TTL), lock.WithoutSchemaCheck(), lock.WithMaxBackoff(20*time.Millisecond),
			lock.WithPendingWriterTTL(500*time.Millisecond), lock.WithOwner(name), lock.WithLogger(discard))
		if err != nil {
			errs <- err
			return
		}
		defer l.Close(context.Background())
		for time.Now().Before(deadline) {
			key := fmt.Sprintf("w1stress/%d", rand.IntN(spec.Keys))
			lease, err := l.Acquire(ctx, key, mode, lock.WaitTimeout(spec.WaitTimeout))
			if errors.Is(err, lock.ErrLocked) {
				continue
			}
			if err != nil {
				errs <- fmt.Errorf("%s: acquire: %w", name, err)
				return
			}
			acquired := lease.GrantedAt().UnixMicro()
			time.Sleep(time.Duration(rand.Int64N(int64(spec.Hold) + 1)))
			released, err := endOfHold(ctx, l, lease)
			if err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
				return
			}
			if err := lease.Release(ctx); err != nil {
				// The release failed (logged; SPEC H5): the lease ends by
				// expiry.
				released = lease.Expiry().UnixMicro()
			}
			if _, err := db.ExecContext(ctx, insert, key, lease.Token(), lease.Mode().String(), acquired, released, name); err != nil {
				errs <- fmt.Errorf("%s: log: %w", name, err)
				return
			}
			if mode == lock.Exclusive {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	for i := range spec.Workers {
		wg.Add(1)
		go run(fmt.Sprintf("%s/r%d", spec.Worker, i), lock.Shared)
	}
	for i := range writers {
		wg.Add(1)
		go run(fmt.Sprintf("%s/w%d", spec.Worker, i), lock.Exclusive)
	}
	wg.Wait()
	return joinErrs(errs)
}

// w1Stress: back-to-back readers and a few writers in this process and two
// children, on two keys. S1 and S3 hold (CheckLog) and every writer is
// granted.
func w1Stress(e *Env) {
	dur := 4 * time.Second
	if e.Config.Short {
		dur = 2 * time.Second
	}
	child := e.stressSpec()
	child.Role, child.Keys, child.Duration, child.TTL, child.Hold, child.WaitTimeout = "w1-stress", 2, dur, 2*time.Second, 60*time.Millisecond, 2*time.Second
	child.Workers, child.Extra = 2, map[string]string{"writers": "1"}
	grants := runStress(e, 2, child, func(table string) error {
		spec := child
		spec.LogTable, spec.Worker, spec.Workers, spec.Extra = table, "inproc", 3, map[string]string{"writers": "2"}
		return runW1StressWorkers(e.Ctx(), e.OpenDB(), e.Dialect, spec, e.Config.NewLocker)
	})
	perWorker := map[string]int{}
	for _, g := range grants {
		perWorker[g.Worker]++
	}
	writers := []string{"inproc/w0", "inproc/w1", "proc0/w0", "proc1/w0"}
	var report []string
	for _, w := range writers {
		report = append(report, fmt.Sprintf("%s=%d", w, perWorker[w]))
		e.Check(perWorker[w] != 0, "writer %s was never granted in %s among back-to-back readers", w, dur)
	}
	var readers []string
	for w, n := range perWorker {
		if strings.Contains(w, "/r") {
			readers = append(readers, fmt.Sprintf("%s=%d", w, n))
		}
	}
	sort.Strings(readers)
	e.T.Logf("%d grants; writers: %s; readers: %s", len(grants), strings.Join(report, " "), strings.Join(readers, " "))
}

// w4Reentrant: one Locker refuses, in every form and at once, an acquire
// that would wait behind itself: any acquire of a key it holds or is
// acquiring exclusively, an exclusive acquire of a key it holds shared. A
// second shared acquire of a key it holds shared is granted (SPEC W5).
// Another Locker is another holder; after Release the key can be acquired
// again.
func w4Reentrant(e *Env) {
	ctx := e.Ctx()
	l := e.NewLocker(nil, lock.WithOwner("w4-l"), lock.WithMaxBackoff(20*time.Millisecond))
	other := e.NewLocker(nil, lock.WithOwner("w4-other"))
	refused := func(what string, f func() error) {
		e.T.Helper()
		start := time.Now()
		err := f()
		took := time.Since(start)
		if !errors.Is(err, lock.ErrReentrant) {
			e.T.Errorf("%s: want ErrReentrant, got %v", what, err)
		} else if errors.Is(err, lock.ErrLocked) {
			e.T.Errorf("%s: ErrReentrant should not match ErrLocked: %v", what, err)
		}
		e.Check(took <= time.Second, "%s: refused after %s, want at once", what, took)
	}
	second := func(key string, held lock.Mode) {
		e.T.Helper()
		for _, m := range []lock.Mode{lock.Exclusive, lock.Shared} {
			if held == lock.Shared && m == lock.Shared {
				// Readers of one Locker share the key (SPEC W5).
				s, err := l.TryAcquire(ctx, key, lock.Shared)
				if err != nil {
					e.T.Errorf("second shared TryAcquire of %s held shared: %v", key, err)
				} else if err := s.Release(ctx); err != nil {
					e.T.Errorf("release second shared lease of %s: %v", key, err)
				}
				continue
			}
			refused(fmt.Sprintf("TryAcquire %s %s", m, key), func() error {
				_, err := l.TryAcquire(ctx, key, m)
				return err
			})
			refused(fmt.Sprintf("Acquire %s %s", m, key), func() error {
				_, err := l.Acquire(ctx, key, m, lock.WaitTimeout(5*time.Second))
				return err
			})
			refused(fmt.Sprintf("Do %s %s", m, key), func() error {
				return l.Do(ctx, key, m, func(context.Context, *lock.Lease) error {
					e.T.Errorf("Do ran its function under a reentrant acquire of %s", key)
					return nil
				}, lock.WaitTimeout(5*time.Second))
			})
		}
	}
	for _, m := range []lock.Mode{lock.Exclusive, lock.Shared} {
		key := "w4/" + m.String()
		held := e.MustTryAcquire(l, key, m)
		second(key, m)
		// Another Locker of the same process is another holder.
		x, err := other.TryAcquire(ctx, key, lock.Exclusive)
		e.Check(errors.Is(err, lock.ErrLocked) && !errors.Is(err, lock.ErrReentrant), "other Locker, exclusive while %s held: want ErrLocked (not ErrReentrant), got %v", m, err)
		if err == nil {
			_ = x.Release(ctx)
		}
		if m == lock.Shared {
			s, err := other.TryAcquire(ctx, key, lock.Shared)
			if err != nil {
				e.T.Errorf("other Locker, shared while shared held: %v", err)
			} else {
				_ = s.Release(ctx)
			}
		}
		e.Must(held.Release(ctx), "release")
		again := e.MustTryAcquire(l, key, m)
		e.Check(again.Token() > held.Token(), "token %d after release not above %d", again.Token(), held.Token())
		_ = again.Release(ctx)
	}
	// While the first acquire is still waiting.
	const key = "w4/waiting"
	blocker := e.MustTryAcquire(other, key, lock.Exclusive)
	type result struct {
		le  *lock.Lease
		err error
	}
	done := make(chan result, 1)
	go func() {
		le, err := l.Acquire(ctx, key, lock.Exclusive, lock.WaitTimeout(10*time.Second))
		done <- result{le, err}
	}()
	waitForMarker(e, other, key, "w4-l", 5*time.Second)
	second(key, lock.Exclusive)
	select {
	case r := <-done:
		e.T.Fatalf("first acquire ended while the key was held: %v", r.err)
	default:
	}
	e.Must(blocker.Release(ctx), "release blocker")
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		e.T.Fatalf("waiting acquire not granted after the blocker released")
	}
	e.Must(r.err, "waiting acquire (not deadlocked behind the refused reentrant calls)")
	second(key, lock.Exclusive)
	e.Must(r.le.Release(ctx), "release")
	err := l.Do(ctx, key, lock.Shared, func(context.Context, *lock.Lease) error { return nil })
	e.Check(err == nil, "Do after Release: %v", err)
}
