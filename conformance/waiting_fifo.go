package conformance

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/lock"
)

// Waiting and fairness (docs/contract.md): strict arrival order with lock.FIFO (W6).
func init() {
	register(
		Case{Name: "W6_GrantsFollowArrivalOrderAcrossProcesses", Rule: "W6", Needs: dialect.CapFIFO, Run: w6ArrivalOrder},
		Case{Name: "W6_DeadWaiterDelaysQueueAtMostOneTicketTTL", Rule: "W6", Needs: dialect.CapFIFO, Run: w6DeadWaiter},
		Case{Name: "W6_TryNeverJumpsQueueAndGiveUpLeavesIt", Rule: "W6", Needs: dialect.CapFIFO, Run: w6TryAndGiveUp},
		Case{Name: "W6_FIFOAndDefaultOnDifferentKeysDoNotInteract", Rule: "W6", Needs: dialect.CapFIFO, Run: w6DifferentKeys},
		Case{Name: "W6_StressMixedFIFOAndDefaultAcrossProcesses", Rule: "W6", Needs: dialect.CapFIFO, Run: func(e *Env) { stressCaseFIFO(e, 50, 0, 50) }},
		Case{Name: "W6_FIFOOptionFollowsCapability", Rule: "W6", Run: w6Capability},
	)
	childRoles["w6-queue"] = w6QueueChild
	childRoles["w6-waiter"] = w6WaiterChild
}

// w6Modes is the arrival order of w6ArrivalOrder's waiters: runs of shared
// waiters between exclusive ones.
const w6Modes = "xssssxxsssxsssxxssss"

// w6Tickets returns the live tickets of key, in queue order.
func w6Tickets(ctx context.Context, l *lock.Locker, key string) ([]lock.Holder, error) {
	out, err := liveOf(ctx, l, key, lock.Queued)
	sort.Slice(out, func(i, j int) bool { return out[i].Token < out[j].Token })
	return out, err
}

// liveOf returns the live rows of key in mode (leases, markers or
// tickets), as the database sees them.
func liveOf(ctx context.Context, l *lock.Locker, key string, mode lock.Mode) ([]lock.Holder, error) {
	hs, now, err := l.Holders(ctx, key)
	if err != nil {
		return nil, err
	}
	var out []lock.Holder
	for _, h := range hs {
		if h.Key == key && h.Mode == mode && h.Expiry.After(now) {
			out = append(out, h)
		}
	}
	return out, nil
}

func w6Mode(c byte) lock.Mode {
	if c == 'x' {
		return lock.Exclusive
	}
	return lock.Shared
}

// w6QueueChild runs its share of w6ArrivalOrder's waiters: waiter j (for
// j = its index, + procs, ...) starts when exactly j tickets are queued on
// the key, so the waiters arrive in the order of j across processes. Each
// waiter is its own Locker (owner "w6-NN"), acquires with FIFO, holds
// (hold_s or hold_x) and logs its grant in database time.
func w6QueueChild(ctx context.Context, db *sql.DB, d dialect.Dialect, spec StressSpec) error {
	key, modes := spec.Extra["key"], spec.Extra["modes"]
	procs, err := strconv.Atoi(spec.Extra["procs"])
	if err != nil {
		return err
	}
	index, err := strconv.Atoi(strings.TrimPrefix(spec.Worker, "proc"))
	if err != nil {
		return fmt.Errorf("worker %q: %w", spec.Worker, err)
	}
	holdS, err := time.ParseDuration(spec.Extra["hold_s"])
	if err != nil {
		return err
	}
	holdX, err := time.ParseDuration(spec.Extra["hold_x"])
	if err != nil {
		return err
	}
	// Few connections: the server is shared with the other cases.
	db.SetMaxOpenConns(3)
	db.SetMaxIdleConns(3)
	newLocker := func(owner string) (*lock.Locker, error) {
		return lock.New(ctx, db, d, lock.WithSchema(spec.Namespace.Schema), lock.WithTablePrefix(spec.Namespace.Prefix),
			lock.WithoutSchemaCheck(), lock.WithOwner(owner), lock.WithLogger(discard), lock.WithMaxBackoff(20*time.Millisecond))
	}
	obs, err := newLocker("w6-observer")
	if err != nil {
		return err
	}
	defer obs.Close(context.Background())
	insert := fmt.Sprintf(`INSERT INTO %s (seq, mode, token, granted_us, released_us) VALUES (%s, %s, %s, %s, %s)`,
		spec.LogTable, d.Placeholder(1), d.Placeholder(2), d.Placeholder(3), d.Placeholder(4), d.Placeholder(5))
	var wg sync.WaitGroup
	errs := make(chan error, len(modes))
	for j := index; j < len(modes); j += procs {
		deadline := time.Now().Add(spec.WaitTimeout)
		for {
			ts, err := w6Tickets(ctx, obs, key)
			if err != nil {
				return err
			}
			if len(ts) == j {
				break
			}
			if len(ts) > j || time.Now().After(deadline) {
				return fmt.Errorf("waiter %d: %d tickets queued, want %d before it arrives", j, len(ts), j)
			}
			time.Sleep(5 * time.Millisecond)
		}
		l, err := newLocker(fmt.Sprintf("w6-%02d", j))
		if err != nil {
			return err
		}
		defer l.Close(context.Background())
		mode := w6Mode(modes[j])
		hold := holdX
		if mode == lock.Shared {
			hold = holdS
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			le, err := l.Acquire(ctx, key, mode, lock.FIFO(), lock.WaitTimeout(spec.WaitTimeout))
			if err != nil {
				errs <- fmt.Errorf("waiter %d (%s): %w", j, mode, err)
				return
			}
			time.Sleep(hold)
			_, now, err := l.Holders(ctx, key)
			if err != nil {
				errs <- fmt.Errorf("waiter %d: holders: %w", j, err)
			}
			released := min(now.UnixMicro(), le.Expiry().UnixMicro())
			if err := le.Release(ctx); err != nil {
				errs <- fmt.Errorf("waiter %d: release: %w", j, err)
			}
			if _, err := db.ExecContext(ctx, insert, j, mode.String(), le.Token(), le.GrantedAt().UnixMicro(), released); err != nil {
				errs <- fmt.Errorf("waiter %d: log: %w", j, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return errors.Join(all...)
}

// w6ArrivalOrder: while the key is held, 20 FIFO waiters in 4 processes,
// mixed modes, arrive one after another (each starts when the previous
// one's ticket is queued). The queue lists them in arrival order; after the
// holder releases, grants follow it, checked from database grant times and
// tokens: each run of consecutive shared waiters is granted together (all
// of them hold at one instant), and nothing of a later run is granted
// before every grant of an earlier run, nor while an exclusive one of it
// still holds. S1 and S3 hold over the log.
func w6ArrivalOrder(e *Env) {
	ctx := e.Ctx()
	const (
		key   = "w6/order"
		procs = 4
		holdS = 800 * time.Millisecond
		holdX = 100 * time.Millisecond
	)
	table := e.Table("w6_grants")
	if _, err := e.DB.ExecContext(ctx, `CREATE TABLE `+table+` (seq BIGINT PRIMARY KEY, mode TEXT NOT NULL, token BIGINT NOT NULL, granted_us BIGINT NOT NULL, released_us BIGINT NOT NULL)`); err != nil {
		e.T.Fatalf("create log: %v", err)
	}
	h := e.NewLocker(nil, lock.WithOwner("w6-holder"))
	held := e.MustTryAcquire(h, key, lock.Exclusive)
	wait := SpawnChildren(e, procs, StressSpec{
		Role: "w6-queue", Dialect: e.Dialect.Name(), Driver: e.Config.DriverName, DSN: e.DSN, Namespace: e.Namespace,
		LogTable: table, WaitTimeout: 60 * time.Second,
		Extra: map[string]string{"key": key, "modes": w6Modes, "procs": strconv.Itoa(procs), "hold_s": holdS.String(), "hold_x": holdX.String()},
	})
	var queue []lock.Holder
	var qerr error
	queued := Eventually(60*time.Second, func() bool {
		queue, qerr = w6Tickets(ctx, h, key)
		return qerr == nil && len(queue) == len(w6Modes)
	})
	arrived := time.Now()
	e.CheckErr(held.Release(ctx), "holder release")
	cerr := wait()
	e.Require(queued, "%d of %d waiters queued (err %v); children: %v", len(queue), len(w6Modes), qerr, cerr)
	e.Require(cerr == nil, "waiters: %v", cerr)
	e.T.Logf("queue of %d complete; all granted and done %s after the holder released", len(queue), time.Since(arrived).Round(time.Millisecond))
	for i, t := range queue {
		if want := fmt.Sprintf("w6-%02d", i); t.Owner != want {
			e.T.Errorf("ticket %d of the queue is %q's, want %q's (arrival order)", i, t.Owner, want)
		}
	}

	type row struct {
		seq                        int
		mode                       string
		token, granted, releasedUS int64
	}
	rows, err := e.DB.QueryContext(ctx, `SELECT seq, mode, token, granted_us, released_us FROM `+table+` ORDER BY seq`)
	e.Must(err, "read log")
	var log []row
	var grants []Grant
	for rows.Next() {
		var r row
		e.Must(rows.Scan(&r.seq, &r.mode, &r.token, &r.granted, &r.releasedUS), "scan log")
		log = append(log, r)
		grants = append(grants, Grant{Key: key, Token: r.token, Mode: r.mode, Acquired: r.granted, Released: r.releasedUS, Worker: strconv.Itoa(r.seq)})
	}
	rows.Close()
	e.Require(len(log) == len(w6Modes), "%d grants logged, want %d", len(log), len(w6Modes))
	// Runs: consecutive shared waiters form one run; each exclusive one is
	// a run of its own.
	var runs [][]row
	for i, r := range log {
		if r.seq != i || r.mode != w6Mode(w6Modes[i]).String() {
			e.T.Fatalf("log row %d: %+v, want waiter %d in mode %s", i, r, i, w6Mode(w6Modes[i]))
		}
		if i > 0 && r.mode == "shared" && log[i-1].mode == "shared" {
			runs[len(runs)-1] = append(runs[len(runs)-1], r)
			continue
		}
		runs = append(runs, []row{r})
	}
	for k, run := range runs {
		minG, maxG, minR := run[0].granted, run[0].granted, run[0].releasedUS
		for _, r := range run {
			minG, maxG, minR = min(minG, r.granted), max(maxG, r.granted), min(minR, r.releasedUS)
		}
		if len(run) > 1 && maxG > minR {
			e.T.Errorf("run %d (waiters %d..%d, shared): not granted together: last grant at %d, first release at %d (database µs)",
				k, run[0].seq, run[len(run)-1].seq, maxG, minR)
		}
		if k == 0 {
			continue
		}
		prev := runs[k-1]
		for _, p := range prev {
			for _, r := range run {
				e.Check(r.token > p.token && r.granted >= p.granted, "waiter %d (%s, token %d, granted %d) went before earlier waiter %d (%s, token %d, granted %d)", r.seq, r.mode, r.token, r.granted, p.seq, p.mode, p.token, p.granted)
				e.Check(p.mode != "exclusive" && r.mode != "exclusive" || r.granted >= p.releasedUS, "waiter %d (%s) granted at %d while earlier waiter %d (%s) held until %d", r.seq, r.mode, r.granted, p.seq, p.mode, p.releasedUS)
			}
		}
	}
	for _, line := range CheckLog(grants) {
		e.T.Errorf("%s", line)
	}
}

// w6WaiterChild waits with FIFO in mode Extra["mode"] on Extra["key"] until
// it is killed (or its WaitTimeout runs out); its ticket TTL is
// Extra["ticket_ttl"].
func w6WaiterChild(ctx context.Context, db *sql.DB, d dialect.Dialect, spec StressSpec) error {
	ttl, err := time.ParseDuration(spec.Extra["ticket_ttl"])
	if err != nil {
		return err
	}
	db.SetMaxOpenConns(2)
	db.SetMaxIdleConns(2)
	l, err := lock.New(ctx, db, d, lock.WithSchema(spec.Namespace.Schema), lock.WithTablePrefix(spec.Namespace.Prefix),
		lock.WithoutSchemaCheck(), lock.WithOwner(spec.Extra["owner"]), lock.WithLogger(discard),
		lock.WithMaxBackoff(50*time.Millisecond), lock.WithPendingWriterTTL(ttl))
	if err != nil {
		return err
	}
	le, err := l.Acquire(ctx, spec.Extra["key"], w6Mode(spec.Extra["mode"][0]), lock.FIFO(), lock.WaitTimeout(spec.WaitTimeout))
	if err == nil {
		_ = le.Release(ctx)
		return errors.New("waiter was granted, but the parent holds the key")
	}
	return err
}

// w6DeadWaiter: a key is held shared; an exclusive FIFO waiter in a child
// process queues (it refreshes its ticket: the ticket outlives one ticket
// TTL), and a shared FIFO waiter queues behind it: it is not granted,
// though compatible with the holder, while the exclusive ticket ahead
// lives. The child is killed; the shared waiter is granted no earlier than
// the dead ticket's last expiry and at most one ticket TTL (plus slack)
// after the kill.
func w6DeadWaiter(e *Env) {
	ctx := e.Ctx()
	const (
		key       = "w6/dead"
		owner     = "w6-dead-waiter"
		ticketTTL = time.Second
		slack     = 3 * time.Second // polls and statements on a loaded machine (3.04 s seen with 2 s)
	)
	h := e.NewLocker(nil, lock.WithOwner("w6-holder"))
	held := e.MustTryAcquire(h, key, lock.Shared)
	defer held.Release(ctx)
	child := startChild(e, StressSpec{
		Role: "w6-waiter", Dialect: e.Dialect.Name(), Driver: e.Config.DriverName, DSN: e.DSN, Namespace: e.Namespace,
		WaitTimeout: 60 * time.Second,
		Extra:       map[string]string{"key": key, "owner": owner, "mode": "x", "ticket_ttl": ticketTTL.String()},
	})
	var first lock.Holder
	e.Require(Eventually(20*time.Second, func() bool {
		ts, err := w6Tickets(ctx, h, key)
		if err == nil && len(ts) == 1 && ts[0].Owner == owner {
			first = ts[0]
			return true
		}
		return false
	}), "no ticket of the child waiter on %q", key)
	b := e.NewLocker(nil, lock.WithOwner("w6-behind"), lock.WithMaxBackoff(20*time.Millisecond))
	type result struct {
		le  *lock.Lease
		err error
	}
	behind := make(chan result, 1)
	go func() {
		le, err := b.Acquire(ctx, key, lock.Shared, lock.FIFO(), lock.WaitTimeout(60*time.Second))
		behind <- result{le, err}
	}()
	// The live waiter refreshes its ticket past one TTL; meanwhile the
	// reader behind it stays queued.
	var last lock.Holder
	e.Require(Eventually(10*time.Second, func() bool {
		ts, err := w6Tickets(ctx, h, key)
		if err != nil || len(ts) != 2 || ts[0].Owner != owner || ts[1].Owner != "w6-behind" {
			return false
		}
		last = ts[0]
		return ts[0].Expiry.Sub(first.Expiry) >= ticketTTL
	}), "want the child's ticket refreshed past one TTL with the reader queued behind it; last seen %+v", last)
	select {
	case r := <-behind:
		e.T.Fatalf("W6: a shared FIFO waiter behind a live exclusive ticket ended: %v", r.err)
	default:
	}
	ts, _ := w6Tickets(ctx, h, key)
	if len(ts) > 0 && ts[0].Owner == owner {
		last = ts[0]
	}
	killed := time.Now()
	out := child.kill()
	if ps := child.cmd.ProcessState; ps != nil && ps.Exited() {
		e.T.Fatalf("waiter child exited by itself before it was killed (%v): %s", child.result, out)
	}
	var r result
	select {
	case r = <-behind:
	case <-time.After(ticketTTL + 10*time.Second):
		e.T.Fatalf("the reader behind a dead waiter was not granted")
	}
	blocked := time.Since(killed)
	e.Must(r.err, "reader behind a dead waiter")
	defer r.le.Release(ctx)
	e.T.Logf("reader granted %s after the waiter ahead died (ticket TTL %s)", blocked.Round(time.Millisecond), ticketTTL)
	e.Check(!r.le.GrantedAt().Before(last.Expiry), "reader granted at %v (database time), before the dead waiter's ticket expired at %v", r.le.GrantedAt(), last.Expiry)
	if bound := ticketTTL + slack; blocked > bound {
		e.T.Errorf("dead waiter delayed the queue %s, want at most one ticket TTL + slack = %s", blocked.Round(time.Millisecond), bound)
	}
}

// w6TryAndGiveUp: a key is held shared and an exclusive FIFO waiter
// queues. A shared FIFO try (TryAcquire and Acquire with WaitTimeout(0)),
// though compatible with the holder, is refused with ErrLocked naming the
// queued ticket: it never jumps a non-empty queue, and it leaves no ticket.
// When the waiter gives up (its wait timeout), its ticket is gone at once,
// long before its TTL, and the try is granted.
func w6TryAndGiveUp(e *Env) {
	ctx := e.Ctx()
	const key = "w6/try"
	h := e.NewLocker(nil, lock.WithOwner("w6-holder"))
	held := e.MustTryAcquire(h, key, lock.Shared)
	defer held.Release(ctx)
	w := e.NewLocker(nil, lock.WithOwner("w6-waiter"), lock.WithMaxBackoff(20*time.Millisecond), lock.WithPendingWriterTTL(20*time.Second))
	gaveUp := make(chan error, 1)
	go func() {
		le, err := w.Acquire(ctx, key, lock.Exclusive, lock.FIFO(), lock.WaitTimeout(1500*time.Millisecond))
		if err == nil {
			_ = le.Release(ctx)
		}
		gaveUp <- err
	}()
	e.Require(Eventually(10*time.Second, func() bool {
		ts, err := w6Tickets(ctx, h, key)
		return err == nil && len(ts) == 1 && ts[0].Owner == "w6-waiter"
	}), "no ticket of the waiter on %q", key)
	r := e.NewLocker(nil, lock.WithOwner("w6-try"))
	for _, try := range []struct {
		name string
		f    func() (*lock.Lease, error)
	}{
		{"TryAcquire", func() (*lock.Lease, error) { return r.TryAcquire(ctx, key, lock.Shared, lock.FIFO()) }},
		{"Acquire WaitTimeout(0)", func() (*lock.Lease, error) {
			return r.Acquire(ctx, key, lock.Shared, lock.FIFO(), lock.WaitTimeout(0))
		}},
	} {
		le, err := try.f()
		if err == nil {
			_ = le.Release(ctx)
		}
		var lerr *lock.LockedError
		e.Check(errors.As(err, &lerr) && slices.ContainsFunc(lerr.Holders, func(h lock.Holder) bool { return h.Mode == lock.Queued && h.Owner == "w6-waiter" }), "shared FIFO %s behind a queued writer: want ErrLocked naming its ticket, got %v", try.name, err)
	}
	if ts, err := w6Tickets(ctx, h, key); err != nil || len(ts) != 1 {
		e.T.Errorf("after refused tries: tickets %v (err %v), want only the waiter's", ts, err)
	}
	select {
	case err := <-gaveUp:
		e.Require(errors.Is(err, lock.ErrLocked), "waiter: want ErrLocked after its wait timeout, got %v", err)
	case <-time.After(15 * time.Second):
		e.T.Fatalf("waiter did not give up")
	}
	if ts, err := w6Tickets(ctx, h, key); err != nil || len(ts) != 0 {
		e.T.Errorf("after the waiter gave up: tickets %v (err %v), want none", ts, err)
	}
	le := e.MustTryAcquire(r, key, lock.Shared, lock.FIFO())
	_ = le.Release(ctx)
}

// w6DifferentKeys: while FIFO waiters queue on one key, acquires of other
// keys, FIFO or not, are granted at once, and a default writer waiting on
// another key is granted right after that key's holder releases; the queue
// is left as it was and is served in order once its key is released.
func w6DifferentKeys(e *Env) {
	ctx := e.Ctx()
	const (
		keyA = "w6/keys/a"
		keyB = "w6/keys/b"
	)
	h := e.NewLocker(nil, lock.WithOwner("w6-holder"))
	heldA := e.MustTryAcquire(h, keyA, lock.Exclusive)
	type result struct {
		le  *lock.Lease
		err error
	}
	var wg sync.WaitGroup
	results := make([]result, 2)
	for i, m := range []lock.Mode{lock.Exclusive, lock.Shared} {
		owner := fmt.Sprintf("w6-a%d", i)
		e.Require(i != 1 || Eventually(10*time.Second, func() bool {
			ts, err := w6Tickets(ctx, h, keyA)
			return err == nil && len(ts) == 1
		}), "first FIFO waiter of A not queued")
		l := e.NewLocker(nil, lock.WithOwner(owner), lock.WithMaxBackoff(20*time.Millisecond))
		e.Go(&wg, func() {
			le, err := l.Acquire(ctx, keyA, m, lock.FIFO(), lock.WaitTimeout(30*time.Second))
			results[i] = result{le, err}
			if err == nil {
				time.Sleep(100 * time.Millisecond)
				e.CheckErr(le.Release(ctx), "release A")
			}
		})
	}
	e.Require(Eventually(10*time.Second, func() bool {
		ts, err := w6Tickets(ctx, h, keyA)
		return err == nil && len(ts) == 2
	}), "FIFO waiters of A not queued")
	// Key B: FIFO and default acquires are granted at once.
	o := e.NewLocker(nil, lock.WithOwner("w6-b"), lock.WithMaxBackoff(20*time.Millisecond))
	for _, m := range []lock.Mode{lock.Exclusive, lock.Shared} {
		for _, opts := range [][]lock.AcquireOption{nil, {lock.FIFO()}} {
			start := time.Now()
			le, err := o.Acquire(ctx, keyB, m, append(opts, lock.WaitTimeout(0))...)
			if err != nil {
				e.T.Errorf("%s acquire of B (FIFO %v) while A has a queue: %v", m, len(opts) > 0, err)
				continue
			}
			if took := time.Since(start); took > 2*time.Second {
				e.T.Errorf("%s acquire of B took %s", m, took)
			}
			_ = le.Release(ctx)
		}
	}
	// A default writer waiting on B is granted right after B's holder
	// releases.
	heldB := e.MustTryAcquire(h, keyB, lock.Shared)
	bw := make(chan result, 1)
	go func() {
		le, err := o.Acquire(ctx, keyB, lock.Exclusive, lock.WaitTimeout(30*time.Second))
		bw <- result{le, err}
	}()
	waitForMarker(e, h, keyB, "w6-b", 10*time.Second)
	released := time.Now()
	e.Must(heldB.Release(ctx), "release B")
	select {
	case r := <-bw:
		e.Must(r.err, "default writer of B")
		if took := time.Since(released); took > 2*time.Second {
			e.T.Errorf("default writer of B granted %s after B was released, while A had a queue", took)
		}
		_ = r.le.Release(ctx)
	case <-time.After(20 * time.Second):
		e.T.Fatalf("default writer of B not granted")
	}
	if ts, err := w6Tickets(ctx, h, keyA); err != nil || len(ts) != 2 || ts[0].Owner != "w6-a0" || ts[1].Owner != "w6-a1" {
		e.T.Errorf("A's queue changed meanwhile: %v (err %v)", ts, err)
	}
	// A is served in order once released.
	e.Must(heldA.Release(ctx), "release A")
	wg.Wait()
	for i, r := range results {
		e.Must(r.err, "FIFO waiter %d of A", i)
	}
	x, s := results[0].le, results[1].le
	e.Check(s.Token() > x.Token(), "shared waiter of A (token %d) granted before the exclusive one queued ahead of it (token %d)", s.Token(), x.Token())
}

// w6Capability: on a dialect with CapFIFO a FIFO acquire works; without it,
// it fails at once with errors.ErrUnsupported and holds nothing.
func w6Capability(e *Env) {
	ctx := e.Ctx()
	l := e.NewLocker(nil, lock.WithOwner("w6-cap"))
	le, err := l.TryAcquire(ctx, "w6/cap", lock.Exclusive, lock.FIFO())
	if !dialect.CapabilitiesOf(e.Dialect).Has(dialect.CapFIFO) {
		e.Check(errors.Is(err, errors.ErrUnsupported), "FIFO acquire without CapFIFO: want errors.ErrUnsupported, got %v", err)
		if err == nil {
			_ = le.Release(ctx)
		}
		le, err = l.TryAcquire(ctx, "w6/cap", lock.Exclusive)
	}
	e.Must(err, "acquire")
	e.CheckErr(le.Release(ctx), "release")
}
