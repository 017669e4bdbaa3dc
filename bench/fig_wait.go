package main

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sqlease/sqlease/lock"
)

// waitForMarker polls until key shows a pending-writer marker: an
// exclusive waiter writes one on its first refused poll, so from then on
// it is blocked in Acquire.
func waitForMarker(ctx context.Context, l *lock.Locker, key string) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		hs, _, err := l.Holders(ctx, key)
		if err != nil {
			return err
		}
		for _, h := range hs {
			if h.Key == key && h.Mode == lock.PendingWriter {
				return nil
			}
		}
		time.Sleep(time.Millisecond)
	}
	return fmt.Errorf("no waiter showed up on %q", key)
}

// settle is how long a handoff sample leaves the waiter blocked before the
// release: 20..40 ms, so that a waiter that relied on polling would be deep
// in its backoff.
func settle() time.Duration { return 20*time.Millisecond + rand.N(20*time.Millisecond) }

// handoffSample measures one handoff: holder takes key, startWaiter starts
// a blocked exclusive Acquire somewhere (another Locker or process) and
// returns a channel that delivers the waiter's grant time (Unix ns), the
// holder releases.
func handoffSample(ctx context.Context, holder *lock.Locker, key string, startWaiter func() (<-chan int64, error)) (handoff, error) {
	le, err := holder.TryAcquire(ctx, key, lock.Exclusive)
	if err != nil {
		return handoff{}, err
	}
	granted, err := startWaiter()
	if err != nil {
		_ = le.Release(ctx)
		return handoff{}, err
	}
	if err := waitForMarker(ctx, holder, key); err != nil {
		_ = le.Release(ctx)
		return handoff{}, err
	}
	time.Sleep(settle())
	t0 := time.Now()
	if err := le.Release(ctx); err != nil {
		return handoff{}, err
	}
	return handoffWait(granted, t0, time.Now())
}

// handoff is one handoff sample.
type handoff struct {
	fromCall   time.Duration // release called -> waiter granted
	fromReturn time.Duration // release returned (committed) -> waiter granted
}

// handoffWait waits for the grant time and makes the sample.
func handoffWait(granted <-chan int64, called, returned time.Time) (handoff, error) {
	select {
	case at, ok := <-granted:
		if !ok {
			return handoff{}, fmt.Errorf("waiter failed")
		}
		return handoff{time.Duration(at - called.UnixNano()), time.Duration(at - returned.UnixNano())}, nil
	case <-time.After(30 * time.Second):
		return handoff{}, fmt.Errorf("waiter not granted within 30s")
	}
}

// figHandoff: contended handoff latency, from the holder's Release call to
// the waiter's grant. Paths: the waiter in a child process (PostgreSQL:
// woken by LISTEN/NOTIFY; SQLite: by its watch of the database file), and the waiter in
// another Locker of this process (woken by the in-process hub). Baselines on
// PostgreSQL: a session advisory lock, where the server itself hands the
// lock to the blocked pg_advisory_lock, and the hand-rolled LISTEN/NOTIFY
// lease (rawListenHandoff), which like sqlease writes the grant. Targets:
// p50 <= 2 ms on PostgreSQL, <= 5 ms across processes on SQLite.
func figHandoff(ctx context.Context, e *env) ([]Figure, error) {
	holder, err := e.newLocker(ctx, e.db)
	if err != nil {
		return nil, err
	}
	defer closeLocker(holder)
	waiter, err := e.newLocker(ctx, e.db)
	if err != nil {
		return nil, err
	}
	defer closeLocker(waiter)
	ch, err := startChild(ctx, e)
	if err != nil {
		return nil, err
	}
	defer ch.stop()

	var n int
	xproc := func() (handoff, error) {
		n++
		key := "bench/handoff/x" + strconv.Itoa(n)
		return handoffSample(ctx, holder, key, func() (<-chan int64, error) {
			if err := ch.send("acquire " + key); err != nil {
				return nil, err
			}
			out := make(chan int64, 1)
			go func() {
				defer close(out)
				line, err := ch.recv(60 * time.Second)
				f := strings.Fields(line)
				if err != nil || len(f) != 3 || f[0] != "granted" || f[1] != key {
					return
				}
				if at, err := strconv.ParseInt(f[2], 10, 64); err == nil {
					out <- at
				}
			}()
			return out, nil
		})
	}
	inproc := func() (handoff, error) {
		n++
		key := "bench/handoff/i" + strconv.Itoa(n)
		return handoffSample(ctx, holder, key, func() (<-chan int64, error) {
			out := make(chan int64, 1)
			go func() {
				defer close(out)
				le, err := waiter.Acquire(ctx, key, lock.Exclusive, lock.WaitTimeout(30*time.Second))
				at := time.Now().UnixNano()
				if err != nil {
					return
				}
				_ = le.Release(ctx)
				out <- at
			}()
			return out, nil
		})
	}
	type path struct {
		name   string
		sample func() (handoff, error)
	}
	paths := []path{{"xproc", xproc}, {"inproc", inproc}}
	if e.isPG() {
		adv, closeAdv, err := advisoryHandoff(ctx, e)
		if err != nil {
			return nil, err
		}
		defer closeAdv()
		rawl, closeRaw, err := rawListenHandoff(ctx, e)
		if err != nil {
			return nil, err
		}
		defer closeRaw()
		paths = append(paths, path{"advisory", adv}, path{rawListen, rawl})
	}
	got, after := map[string][]time.Duration{}, map[string][]time.Duration{}
	for _, p := range paths { // warm-up: connections, listeners
		if _, err := p.sample(); err != nil {
			return nil, fmt.Errorf("handoff %s warm-up: %w", p.name, err)
		}
	}
	for r := 0; r < e.cfg.rounds; r++ {
		for _, p := range paths {
			for i := 0; i < e.cfg.handoffSamples; i++ {
				d, err := p.sample()
				if err != nil {
					return nil, fmt.Errorf("handoff %s: %w", p.name, err)
				}
				got[p.name] = append(got[p.name], d.fromCall)
				after[p.name] = append(after[p.name], d.fromReturn)
			}
		}
	}
	for _, path := range slices.Sorted(maps.Keys(got)) {
		addSamples("handoff", e.dialect, path, got[path]) // plots.go
	}
	var out []Figure
	for _, path := range []string{"xproc", "inproc"} {
		for _, pc := range []float64{50, 99} {
			v := ms(percentile(got[path], pc))
			t := info
			if pc == 50 {
				t = onlyOn("postgres", e.dialect, atMost(2, "ms"))
				if !e.isPG() && path == "xproc" {
					t = atMost(5, "ms")
				}
			}
			var b *Baseline
			if e.isPG() {
				b = base("advisory", ms(percentile(got["advisory"], pc)))
			}
			name := fmt.Sprintf("handoff.%s.p%.0f", path, pc)
			f := figure(name, e.dialect, v, "ms", b, t)
			f.Note = fmt.Sprintf("%d samples; release call -> waiter granted", len(got[path]))
			if path == "xproc" && e.isMySQL() {
				f.Note += "; MariaDB: the other process's listening session is interrupted by the release (KILL QUERY doorbell, mysqldialect.Listen)"
			}
			if path == "xproc" && !e.isPG() && !e.isMySQL() {
				f.Note += "; SQLite: the other process watches the database file for commits (sqlitedialect.WatchChanges)"
			}
			out = append(out, f)
			if e.isPG() {
				out = append(out, rawListenFigure(e, name, v, got[rawListen], pc))
			}
		}
		var b *Baseline
		if e.isPG() {
			b = base("advisory", ms(percentile(after["advisory"], 50)))
		}
		name := fmt.Sprintf("handoff.%s.after_commit.p50", path)
		v := ms(percentile(after[path], 50))
		f := figure(name, e.dialect, v, "ms", b, info)
		f.Note = "release returned (committed, notification sent) -> waiter granted"
		out = append(out, f)
		if e.isPG() {
			out = append(out, rawListenFigure(e, name, v, after[rawListen], 50))
		}
	}
	return out, nil
}

// rawListen names the hand-rolled handoff baseline (rawListenHandoff).
const rawListen = "raw+listen"

// rawListenFigure is a handoff figure against the hand-rolled handoff
// (rawListenHandoff) at the same percentile, for information: what an
// application's own LISTEN/NOTIFY lease achieves on the same machine in
// the same run.
func rawListenFigure(e *env, name string, v float64, raw []time.Duration, pc float64) Figure {
	f := figure(name, e.dialect, v, "ms", base(rawListen, ms(percentile(raw, pc))), info)
	f.Note = fmt.Sprintf("baseline: %d samples of %s (its release committed synchronously)", len(raw), legend(rawListen))
	return f
}

// advisoryHandoff returns the baseline sampler: one pinned session holds a
// session advisory lock, another blocks in pg_advisory_lock, the holder
// unlocks; the time from the unlock call to the waiter's return.
func advisoryHandoff(ctx context.Context, e *env) (func() (handoff, error), func(), error) {
	hc, err := e.db.Conn(ctx)
	if err != nil {
		return nil, nil, err
	}
	wc, err := e.db.Conn(ctx)
	if err != nil {
		_ = hc.Close()
		return nil, nil, err
	}
	key := int64(4_000_000)
	sample := func() (handoff, error) {
		key++
		if _, err := hc.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, key); err != nil {
			return handoff{}, err
		}
		granted := make(chan int64, 1)
		go func() {
			defer close(granted)
			if _, err := wc.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, key); err != nil {
				return
			}
			at := time.Now().UnixNano()
			_, _ = wc.ExecContext(ctx, `SELECT pg_advisory_unlock($1)`, key)
			granted <- at
		}()
		deadline := time.Now().Add(10 * time.Second)
		for {
			var waiting int
			if err := e.db.QueryRowContext(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid = 0 AND objid = $1 AND objsubid = 1`, key).Scan(&waiting); err != nil {
				return handoff{}, err
			}
			if waiting > 0 {
				break
			}
			if time.Now().After(deadline) {
				return handoff{}, fmt.Errorf("advisory waiter not blocked")
			}
			time.Sleep(time.Millisecond)
		}
		time.Sleep(settle())
		t0 := time.Now()
		if _, err := hc.ExecContext(ctx, `SELECT pg_advisory_unlock($1)`, key); err != nil {
			return handoff{}, err
		}
		return handoffWait(granted, t0, time.Now())
	}
	return sample, func() { _ = hc.Close(); _ = wc.Close() }, nil
}

// figTakeover: crashed-holder takeover. A holder with TTL 1 s acquires and
// at once Orphan()s its lease (stops renewing, as if the process died); a
// waiter in another Locker is blocked in Acquire. Reported: from the
// holder's last expiry to the grant (both in database time: the grant's
// database time is the new lease's expiry minus the TTL), and from the
// orphaning to the grant (local clock). Four pairs run at once per round.
// Targets: orphan -> grant p99 <= TTL + one backoff step (500 ms);
// expiry -> grant p99 <= one backoff step.
func figTakeover(ctx context.Context, e *env) ([]Figure, error) {
	const ttl, pairs = time.Second, 4
	holder, err := e.newLocker(ctx, e.db, lock.WithTTL(ttl))
	if err != nil {
		return nil, err
	}
	defer closeLocker(holder)
	waiter, err := e.newLocker(ctx, e.db, lock.WithTTL(ttl))
	if err != nil {
		return nil, err
	}
	defer closeLocker(waiter)
	var (
		mu                    sync.Mutex
		afterExpiry, fromOrph []time.Duration
		firstErr              error
	)
	for r := 0; r < e.cfg.rounds; r++ {
		var wg sync.WaitGroup
		for i := 0; i < pairs; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				a, o, err := takeoverSample(ctx, holder, waiter, fmt.Sprintf("bench/takeover/%d/%d", r, i), ttl)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					firstErr = keepFirst(firstErr, err)
					return
				}
				afterExpiry, fromOrph = append(afterExpiry, a), append(fromOrph, o)
			}()
		}
		wg.Wait()
		if firstErr != nil {
			return nil, firstErr
		}
	}
	step := lock.DefaultMaxBackoff
	note := fmt.Sprintf("%d samples, TTL %s, backoff cap %s", len(fromOrph), ttl, step)
	out := []Figure{
		figure("takeover.after_expiry.p50", e.dialect, ms(percentile(afterExpiry, 50)), "ms", nil, info),
		figure("takeover.after_expiry.p99", e.dialect, ms(percentile(afterExpiry, 99)), "ms", nil, atMost(ms(step), "ms")),
		figure("takeover.from_orphan.p50", e.dialect, ms(percentile(fromOrph, 50)), "ms", nil, info),
		figure("takeover.from_orphan.p99", e.dialect, ms(percentile(fromOrph, 99)), "ms", nil, atMost(ms(ttl+step), "ms")),
	}
	for i := range out {
		out[i].Note = note
	}
	return out, nil
}

// keepFirst returns have, or err when have is nil: the first error of
// several goroutines.
func keepFirst(have, err error) error {
	if have != nil {
		return have
	}
	return err
}

// takeoverSample runs one crashed-holder takeover on key.
func takeoverSample(ctx context.Context, holder, waiter *lock.Locker, key string, ttl time.Duration) (afterExpiry, fromOrphan time.Duration, err error) {
	le, err := holder.TryAcquire(ctx, key, lock.Exclusive)
	if err != nil {
		return 0, 0, err
	}
	orphanAt := time.Now()
	le.Orphan()
	expiry := le.Expiry()
	w, err := waiter.Acquire(ctx, key, lock.Exclusive, lock.WaitTimeout(10*ttl))
	grantAt := time.Now()
	if err != nil {
		return 0, 0, err
	}
	defer w.Release(ctx)
	grantDB := w.Expiry().Add(-ttl)
	return grantDB.Sub(expiry), grantAt.Sub(orphanAt), nil
}

// figWaiterLoad: database load of blocked waiters. A holder keeps one key
// for the whole hold; two exclusive and two shared waiters (each its own
// Locker) wait in Acquire meanwhile. Every statement the waiters send goes
// through a counting pool (one per kind). Reported: statements per waiter
// per second over the hold, start-up backoff included (the target), after
// the first 2 s (steady), and acquire attempts per second; on MySQL/MariaDB
// also the statements of the pool's listening session, which are not the
// waiters' (see listenMarks). Targets: <= 1 with push wake-ups
// (PostgreSQL), <= 4 otherwise.
func figWaiterLoad(ctx context.Context, e *env) ([]Figure, error) {
	const key = "bench/waitload"
	hold := e.cfg.waiterHold
	holder, err := e.newLocker(ctx, e.db)
	if err != nil {
		return nil, err
	}
	defer closeLocker(holder)
	le, err := holder.TryAcquire(ctx, key, lock.Exclusive)
	if err != nil {
		return nil, err
	}
	defer le.Release(ctx)
	type kind struct {
		name string
		mode lock.Mode
	}
	kinds := []kind{{"exclusive", lock.Exclusive}, {"shared", lock.Shared}}
	const perKind = 2
	// A poll is one acquire attempt: PostgreSQL's acquire function call,
	// SQLite's Probe read.
	pollMark := "WITH b AS"
	if e.isPG() || e.isMySQL() {
		pollMark = "sqlease_acquire"
	}
	// The statements of the pool's listening session on MariaDB (SPEC W2,
	// migration 00009): its setup (GET_LOCK, SET SESSION, CALL
	// listen_start), then a CALL listen that returns after 10 s or a
	// doorbell and a listen_start refresh every 10 s. The session is one per
	// pool and namespace, shared by all the pool's waiters, so its
	// statements are counted per pool and kept out of the per-waiter
	// figures, which would otherwise depend on how many waiters share the
	// pool (1.5 setup statements each with 2, 3 with 1, 0.3 with 10).
	// PostgreSQL's listener (LISTEN and the waits on the pgx connection
	// itself) never reaches the counting driver.
	var listenMarks []string
	if e.isMySQL() {
		listenMarks = []string{"GET_LOCK('sqlease:listener:", "SET SESSION autocommit = 1, innodb_lock_wait_timeout = 2", "sqlease_listen"}
	}
	type group struct {
		count   func(string) int
		reset   func()
		lockers []*lock.Locker
	}
	groups := make([]group, len(kinds))
	for i := range kinds {
		db, inj, err := e.openCounting(e.dsn)
		if err != nil {
			return nil, err
		}
		defer db.Close()
		g := group{count: inj.Count, reset: inj.ResetCounts}
		for j := 0; j < perKind; j++ {
			l, err := e.newLocker(ctx, db)
			if err != nil {
				return nil, err
			}
			defer closeLocker(l)
			g.lockers = append(g.lockers, l)
		}
		groups[i] = g
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for i, k := range kinds {
		groups[i].reset()
		for _, l := range groups[i].lockers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if w, err := l.Acquire(wctx, key, k.mode); err == nil {
					_ = w.Release(ctx)
				}
			}()
		}
	}
	start := time.Now()
	// Steady state: after the backoff has ramped up from MinBackoff.
	rampUp := min(2*time.Second, hold/2)
	sleep := func(d time.Duration) error {
		select {
		case <-time.After(d):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := sleep(rampUp); err != nil {
		return nil, err
	}
	early := make([]int, len(kinds))
	for i := range kinds {
		early[i] = groups[i].count("")
		for _, m := range listenMarks {
			early[i] -= groups[i].count(m)
		}
	}
	if err := sleep(hold - rampUp); err != nil {
		return nil, err
	}
	counts, polls, listened := make([]int, len(kinds)), make([]int, len(kinds)), make([]int, len(kinds))
	for i := range kinds {
		counts[i], polls[i] = groups[i].count(""), groups[i].count(pollMark)
		for _, m := range listenMarks {
			listened[i] += groups[i].count(m)
		}
		counts[i] -= listened[i]
	}
	elapsed := time.Since(start)
	cancel()
	wg.Wait()
	limit := 4.0
	if e.isPG() {
		limit = 1
	}
	var out []Figure
	for i, k := range kinds {
		v := float64(counts[i]) / perKind / elapsed.Seconds()
		f := figure("waiterload."+k.name, e.dialect, v, "stmts/s/waiter", nil, atMost(limit, "stmts/s/waiter"))
		f.Note = fmt.Sprintf("%d %s waiters, %d statements in %.1fs hold", perKind, k.name, counts[i], elapsed.Seconds())
		p := figure("waiterload."+k.name+".polls", e.dialect, float64(polls[i])/perKind/elapsed.Seconds(), "polls/s/waiter", nil, info)
		p.Note = "acquire attempts per waiter per second"
		st := figure("waiterload."+k.name+".steady", e.dialect, float64(counts[i]-early[i])/perKind/(elapsed-rampUp).Seconds(), "stmts/s/waiter", nil, info)
		st.Note = fmt.Sprintf("statements per waiter per second after the first %s (backoff ramped up)", rampUp)
		out = append(out, f, p, st)
		if listenMarks != nil {
			ls := figure("waiterload."+k.name+".listener", e.dialect, float64(listened[i]), "stmts/pool", nil, info)
			ls.Note = fmt.Sprintf("statements of the pool's listening session (shared by its %d waiters) in the %.1fs hold, each counted when it returns", perKind, elapsed.Seconds())
			out = append(out, ls)
		}
	}
	return out, nil
}

// figCrossKey: cross-key independence under an open transaction. Key B's
// lease is fenced in a transaction held open for 1 s (PostgreSQL: the
// holder row FOR KEY SHARE; SQLite: the fence takes the database write
// lock); meanwhile TryAcquire and Release of key A are timed back to back.
// Control windows (no open transaction, 0.5 s) are interleaved, so the
// wait the open transaction causes is the held p99 minus the control p99;
// commit latency and the machine's noise are in both. Baseline: the raw
// lease on key A while a transaction holds raw row B FOR UPDATE (SQLite:
// has written it). Target on PostgreSQL: acquire wait (median held -
// median control) < 5 ms; the p99 difference is reported too, but on a
// loaded machine it is mostly commit-latency noise.
func figCrossKey(ctx context.Context, e *env) ([]Figure, error) {
	const hold, control = time.Second, 500 * time.Millisecond
	l, err := e.newLocker(ctx, e.db)
	if err != nil {
		return nil, err
	}
	defer closeLocker(l)
	leB, err := l.TryAcquire(ctx, "bench/xk/B", lock.Exclusive)
	if err != nil {
		return nil, err
	}
	defer leB.Release(ctx)
	raw, err := newRawLease(ctx, e, e.db, "raw_xk")
	if err != nil {
		return nil, err
	}
	if ok, err := raw.tryAcquire(ctx, e.db, "B", "holder"); err != nil || !ok {
		return nil, fmt.Errorf("raw lease on B: %v", err)
	}
	lockB := `SELECT 1 FROM ` + e.table("raw_xk") + ` WHERE key = $1 FOR UPDATE`
	if e.isMySQL() {
		lockB = `SELECT 1 FROM ` + e.table("raw_xk") + ` WHERE k = ? FOR UPDATE`
	} else if !e.isPG() {
		lockB = `UPDATE ` + e.table("raw_xk") + ` SET expires_us = expires_us WHERE key = ?1`
	}
	// timings are the latencies of one implementation's steps on key A.
	type timings struct{ acquire, release []time.Duration }
	// window runs acquire/release of A back to back for d, while a
	// transaction opened by begin (nil: none) stays open, and adds the
	// latencies to t.
	window := func(d time.Duration, begin func(tx *sql.Tx) error, acquire func() (func() error, error), t *timings) error {
		ended := make(chan struct{})
		if begin == nil {
			time.AfterFunc(d, func() { close(ended) })
		} else {
			tx, err := e.db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			if err := begin(tx); err != nil {
				_ = tx.Rollback()
				return err
			}
			go func() {
				time.Sleep(d)
				_ = tx.Rollback()
				close(ended)
			}()
		}
		for {
			select {
			case <-ended:
				return nil
			default:
			}
			t0 := time.Now()
			release, err := acquire()
			if err != nil {
				<-ended
				return err
			}
			t1 := time.Now()
			if err := release(); err != nil {
				<-ended
				return err
			}
			t.acquire, t.release = append(t.acquire, t1.Sub(t0)), append(t.release, time.Since(t1))
		}
	}
	sqleaseA := func() (func() error, error) {
		le, err := l.TryAcquire(ctx, "bench/xk/A", lock.Exclusive)
		if err != nil {
			return nil, err
		}
		return func() error { return le.Release(ctx) }, nil
	}
	rawA := func() (func() error, error) {
		owner := raw.newOwner()
		if ok, err := raw.tryAcquire(ctx, e.db, "A", owner); err != nil || !ok {
			return nil, fmt.Errorf("raw acquire A: ok=%v err=%v", ok, err)
		}
		return func() error { return raw.release(ctx, e.db, "A", owner) }, nil
	}
	fenceB := func(tx *sql.Tx) error { return leB.Fence(ctx, tx) }
	lockRawB := func(tx *sql.Tx) error { _, err := tx.ExecContext(ctx, lockB, "B"); return err }
	var sHeld, sCtl, rHeld, rCtl timings
	for r := 0; r < min(e.cfg.rounds, 3); r++ {
		for _, w := range []struct {
			d       time.Duration
			begin   func(*sql.Tx) error
			acquire func() (func() error, error)
			t       *timings
		}{{hold, fenceB, sqleaseA, &sHeld}, {control, nil, sqleaseA, &sCtl}, {hold, lockRawB, rawA, &rHeld}, {control, nil, rawA, &rCtl}} {
			if err := window(w.d, w.begin, w.acquire, w.t); err != nil {
				return nil, err
			}
		}
	}
	p := func(ds []time.Duration, pc float64) float64 { return ms(percentile(ds, pc)) }
	note := fmt.Sprintf("%d sqlease / %d raw acquires of key A while key B is locked for %s by an open transaction; %d / %d in control windows",
		len(sHeld.acquire), len(rHeld.acquire), hold, len(sCtl.acquire), len(rCtl.acquire))
	out := []Figure{
		figure("crosskey.acquire.wait", e.dialect, p(sHeld.acquire, 50)-p(sCtl.acquire, 50), "ms",
			base("raw", p(rHeld.acquire, 50)-p(rCtl.acquire, 50)), crossKeyTarget(e)),
		figure("crosskey.acquire.wait.p99", e.dialect, p(sHeld.acquire, 99)-p(sCtl.acquire, 99), "ms",
			base("raw", p(rHeld.acquire, 99)-p(rCtl.acquire, 99)), info),
		figure("crosskey.acquire.p50", e.dialect, p(sHeld.acquire, 50), "ms", base("raw", p(rHeld.acquire, 50)), info),
		figure("crosskey.acquire.p99", e.dialect, p(sHeld.acquire, 99), "ms", base("raw", p(rHeld.acquire, 99)), info),
		figure("crosskey.acquire.max", e.dialect, p(sHeld.acquire, 100), "ms", base("raw", p(rHeld.acquire, 100)), info),
		figure("crosskey.release.p99", e.dialect, p(sHeld.release, 99), "ms", base("raw", p(rHeld.release, 99)), info),
	}
	out[0].Note = "median acquire with B's transaction open minus median without (an acquire blocked by B would wait out the hold); " + note
	out[1].Note = "p99 with B's transaction open minus p99 without: dominated by commit-latency noise on a loaded machine; " + note
	for i := 2; i < len(out); i++ {
		out[i].Note = note
	}
	return out, nil
}

// crossKeyTarget is the acquire-wait target of figCrossKey: below 5 ms on
// the servers (rule S5: a row lock of key B never delays key A), none on
// SQLite, whose one writer is meant to wait.
func crossKeyTarget(e *env) target {
	if e.isPG() || e.isMySQL() {
		return below(5, "ms")
	}
	return info
}

// rawListenHandoff returns the hand-rolled handoff sampler (PostgreSQL),
// baseline "raw+listen": the raw lease (rawLease) whose release also
// notifies, as sqlease's does (rawLease.releaseNotify, one statement,
// committed synchronously as an application's would be), and a waiter
// written the way an application would write one on a single pgx
// connection: LISTEN on the run's channel, try the upsert, and when it is
// refused, wait for a notification naming the key and try again. The time
// is from the release call to the waiter's granted upsert, as for sqlease.
//
// A sample that fails after it took the key stops the sampler: its waiter
// is cancelled, the holder's lease released (within 5 s), and every later
// sample fails at once, naming the first failure (the handoff figure stops
// at its first error anyway). The waiter's connection is closed at the
// end, never returned to the pool still listening.
func rawListenHandoff(ctx context.Context, e *env) (func() (handoff, error), func(), error) {
	raw, err := newRawLease(ctx, e, e.db, "raw_h")
	if err != nil {
		return nil, nil, err
	}
	conn, err := e.db.Conn(ctx)
	if err != nil {
		return nil, nil, err
	}
	type request struct {
		key     string
		blocked chan struct{} // closed when the waiter's first try was refused
		granted chan int64    // the grant time (Unix ns); closed on failure
	}
	reqs := make(chan request)
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	var waitErr error // why the waiter ended; set before done is closed
	go func() {
		defer close(done)
		_ = conn.Raw(func(dc any) error {
			nc, ok := dc.(interface{ Conn() *pgx.Conn })
			if !ok {
				waitErr = fmt.Errorf("driver connection %T is not pgx", dc)
				return driver.ErrBadConn
			}
			c := nc.Conn()
			// Never reuse the connection: it listens, or is mid-read.
			defer func() { _ = c.Close(context.Background()) }()
			_, err := c.Exec(wctx, `LISTEN `+e.d.QuoteIdent(raw.channel))
			for err == nil {
				var r request
				select {
				case <-wctx.Done():
					err = context.Cause(wctx)
					continue
				case r = <-reqs:
				}
				var at int64
				at, err = rawWaiterAcquire(wctx, c, raw, r.key, r.blocked)
				if err == nil {
					r.granted <- at
				}
				close(r.granted)
			}
			waitErr = err
			return driver.ErrBadConn
		})
	}()
	closeAll := func() { stop(); <-done; _ = conn.Close() }
	var stopped error // the failure that stopped the sampler
	// fail stops the waiter, releases the holder's lease and returns the
	// sample's error, with the waiter's and the release's when they add
	// something.
	fail := func(key, owner string, err error) (handoff, error) {
		stop()
		<-done
		if waitErr != nil && !errors.Is(waitErr, context.Canceled) {
			err = fmt.Errorf("%w (the waiter: %v)", err, waitErr)
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if rerr := raw.release(rctx, e.db, key, owner); rerr != nil {
			err = fmt.Errorf("%w (releasing the holder's lease: %v)", err, rerr)
		}
		stopped = fmt.Errorf("raw+listen handoff: %w", err)
		return handoff{}, stopped
	}
	sample := func() (handoff, error) {
		if stopped != nil {
			return handoff{}, fmt.Errorf("raw+listen handoff: stopped after an earlier failure: %w", stopped)
		}
		key, owner := "bench/handoff/r"+raw.newOwner(), raw.newOwner()
		ok, err := raw.tryAcquire(ctx, e.db, key, owner)
		if err != nil {
			return handoff{}, fmt.Errorf("raw+listen handoff: the holder's acquire: %w", err)
		}
		if !ok {
			return handoff{}, fmt.Errorf("raw+listen handoff: key %s unexpectedly held", key)
		}
		r := request{key: key, blocked: make(chan struct{}), granted: make(chan int64, 1)}
		select {
		case reqs <- r:
		case <-done:
			return fail(key, owner, errors.New("the waiter failed"))
		}
		select {
		case <-r.blocked:
		case _, granted := <-r.granted:
			if granted {
				return fail(key, owner, errors.New("the waiter was granted the key while the holder held it"))
			}
			return fail(key, owner, errors.New("the waiter failed before it blocked"))
		case <-time.After(10 * time.Second):
			return fail(key, owner, errors.New("the waiter's first try did not return within 10s"))
		}
		time.Sleep(settle())
		t0 := time.Now()
		if err := raw.releaseNotify(ctx, e.db, key, owner); err != nil {
			return fail(key, owner, err)
		}
		d, err := handoffWait(r.granted, t0, time.Now())
		if err != nil {
			return fail(key, owner, err)
		}
		return d, nil
	}
	return sample, closeAll, nil
}

// rawWaiterAcquire is the hand-rolled blocking acquire of key on c: the
// raw upsert, then (closing blocked once, after the first refusal) a wait
// for a notification naming key before each new try. It releases the
// lease it got (an error if its row was not there to delete) and returns
// the time it was granted (Unix ns).
func rawWaiterAcquire(ctx context.Context, c *pgx.Conn, raw *rawLease, key string, blocked chan struct{}) (int64, error) {
	owner := raw.newOwner()
	for first := true; ; first = false {
		var got string
		err := c.QueryRow(ctx, raw.acquireSQL, key, owner, raw.ttlUS).Scan(&got)
		if err == nil {
			at := time.Now().UnixNano()
			tag, err := c.Exec(ctx, raw.relSQL, key, owner)
			if err == nil && tag.RowsAffected() != 1 {
				err = fmt.Errorf("the waiter was granted %s but deleted %d rows of it", key, tag.RowsAffected())
			}
			return at, err
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return 0, err
		}
		if first {
			close(blocked)
		}
		for {
			n, err := c.WaitForNotification(ctx)
			if err != nil {
				return 0, err
			}
			if n.Payload == key {
				break
			}
		}
	}
}
