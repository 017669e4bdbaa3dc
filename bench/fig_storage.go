package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/lock"
)

// figRoundTrips: statements sent per operation, counted at the driver by
// faultdb (Count("")), averaged over several repetitions: acquire
// (TryAcquire, granted), renew (Lease.Renew), release, and a refused
// TryAcquire; against the raw lease's statements. On PostgreSQL every
// statement is one round trip and one commit. Targets on PostgreSQL:
// acquire 1, renew 1, release 1. On SQLite statements are in-process calls,
// not round trips; reported for information.
func figRoundTrips(ctx context.Context, e *env) ([]Figure, error) {
	const reps = 10
	db, inj, err := e.openCounting(e.dsn)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	l, err := e.newLocker(ctx, db)
	if err != nil {
		return nil, err
	}
	defer closeLocker(l)
	other, err := e.newLocker(ctx, e.db)
	if err != nil {
		return nil, err
	}
	defer closeLocker(other)
	held, err := other.TryAcquire(ctx, "bench/rt/held", lock.Exclusive)
	if err != nil {
		return nil, err
	}
	defer held.Release(ctx)
	raw, err := newRawLease(ctx, e, db, "raw_rt")
	if err != nil {
		return nil, err
	}
	if ok, err := raw.tryAcquire(ctx, e.db, "held", "other"); err != nil || !ok {
		return nil, fmt.Errorf("raw lease on held: %v", err)
	}
	// counted runs f and returns the statements it sent.
	counted := func(f func() error) (int, error) {
		inj.ResetCounts()
		err := f()
		return inj.Count(""), err
	}
	var acq, ren, rel, fail, racq, rren, rrel, rfail int
	for i := 0; i <= reps; i++ { // i == 0 warms up (prepared statements)
		var le *lock.Lease
		a, err := counted(func() (err error) { le, err = l.TryAcquire(ctx, "bench/rt/k", lock.Exclusive); return err })
		if err != nil {
			return nil, err
		}
		b, err := counted(func() error { return le.Renew(ctx) })
		if err != nil {
			return nil, err
		}
		c, err := counted(func() error { return le.Release(ctx) })
		if err != nil {
			return nil, err
		}
		d, err := counted(func() error {
			_, err := l.TryAcquire(ctx, "bench/rt/held", lock.Exclusive)
			if errors.Is(err, lock.ErrLocked) {
				return nil
			}
			return fmt.Errorf("try on a held key: %v", err)
		})
		if err != nil {
			return nil, err
		}
		owner := raw.newOwner()
		ra, err := counted(func() error { _, err := raw.tryAcquire(ctx, db, "k", owner); return err })
		if err != nil {
			return nil, err
		}
		rb, err := counted(func() error { return raw.renew(ctx, db, "k", owner) })
		if err != nil {
			return nil, err
		}
		rc, err := counted(func() error { return raw.release(ctx, db, "k", owner) })
		if err != nil {
			return nil, err
		}
		rd, err := counted(func() error { _, err := raw.tryAcquire(ctx, db, "held", "me"); return err })
		if err != nil {
			return nil, err
		}
		if i > 0 {
			acq, ren, rel, fail = acq+a, ren+b, rel+c, fail+d
			racq, rren, rrel, rfail = racq+ra, rren+rb, rrel+rc, rfail+rd
		}
	}
	per := func(n int) float64 { return float64(n) / reps }
	want := func() target { return onlyOn("postgres", e.dialect, exactly(1, "stmts")) }
	note := ""
	if e.isMySQL() {
		want = func() target { return exactly(1, "stmts") }
		note = "MySQL: one CALL of a stored procedure"
	} else if !e.isPG() {
		note = "SQLite: BEGIN IMMEDIATE, the script's statements and COMMIT, each an in-process call"
	}
	out := []Figure{
		figure("roundtrips.acquire", e.dialect, per(acq), "stmts", base("raw", per(racq)), want()),
		figure("roundtrips.renew", e.dialect, per(ren), "stmts", base("raw", per(rren)), want()),
		figure("roundtrips.release", e.dialect, per(rel), "stmts", base("raw", per(rrel)), want()),
		figure("roundtrips.failed_try", e.dialect, per(fail), "stmts", base("raw", per(rfail)), info),
	}
	for i := range out {
		out[i].Note = note
	}
	return out, nil
}

// figFailedPollWAL (PostgreSQL): WAL written by refused polls. A key is
// held (TTL 10 min, so no renewal falls in the window); another Locker
// polls it with TryAcquire walPolls times per round. Two measures:
//
//   - writes: inserted, updated and deleted tuples on the bench schema's
//     tables (pg_stat_user_tables, after the polling backends flushed their
//     statistics), exact: a poll that writes nothing adds nothing. Target 0.
//   - WAL bytes: the difference of pg_current_wal_lsn() around the polls
//     (pg_wal_lsn_diff; pg_stat_wal's wal_bytes and wal_records deltas are
//     reported too). Both are server-wide, so other sessions' writes are in
//     them; the minimum over rounds is an upper bound of what the polls
//     wrote. Target < 8 KiB per walPolls polls.
//
// (An earlier version read the WAL back with pg_walinspect, which on
// PostgreSQL 15 fails with "cannot accept future start LSN" when the
// insert LSN is ahead of the flushed WAL.) Each window polls through a
// pool of its own, closed at its end, so its backend's statistics are
// flushed before they are read. Baseline: the raw lease's
// refused upsert (ON CONFLICT DO UPDATE ... WHERE locks the conflicting
// row, so it writes), 200 polls per round scaled to walPolls.
func figFailedPollWAL(ctx context.Context, e *env) ([]Figure, error) {
	if !e.isPG() {
		return nil, nil
	}
	polls, rawPolls := e.cfg.walPolls, 200
	holder, err := e.newLocker(ctx, e.db, lock.WithTTL(10*time.Minute))
	if err != nil {
		return nil, err
	}
	defer closeLocker(holder)
	const key = "bench/wal"
	held, err := holder.TryAcquire(ctx, key, lock.Exclusive)
	if err != nil {
		return nil, err
	}
	defer held.Release(ctx)
	raw, err := newRawLease(ctx, e, e.db, "raw_wal")
	if err != nil {
		return nil, err
	}
	raw.ttlUS = (10 * time.Minute).Microseconds()
	if ok, err := raw.tryAcquire(ctx, e.db, key, "holder"); err != nil || !ok {
		return nil, fmt.Errorf("raw lease: %v", err)
	}
	// Each window polls through its own pool, closed at its end: a
	// backend flushes its statistics when it exits.
	sqleasePoll := func(n int) func(*sql.DB) error {
		return func(db *sql.DB) error {
			poller, err := e.newLocker(ctx, db)
			if err != nil {
				return err
			}
			defer closeLocker(poller)
			for i := 0; i < n; i++ {
				if _, err := poller.TryAcquire(ctx, key, lock.Exclusive); !errors.Is(err, lock.ErrLocked) {
					return fmt.Errorf("poll %d: want ErrLocked, got %v", i, err)
				}
			}
			return nil
		}
	}
	rawPoll := func(n int) func(*sql.DB) error {
		return func(db *sql.DB) error {
			for i := 0; i < n; i++ {
				if ok, err := raw.tryAcquire(ctx, db, key, "poller"); err != nil || ok {
					return fmt.Errorf("raw poll %d: ok=%v err=%v", i, ok, err)
				}
			}
			return nil
		}
	}
	if err := sqleasePoll(50)(e.db); err != nil { // warm-up
		return nil, err
	}
	if err := rawPoll(20)(e.db); err != nil {
		return nil, err
	}
	explained, rawExplained, xids, err := explainPolls(ctx, e, raw, key, polls, rawPolls)
	if err != nil {
		return nil, err
	}
	// The writes figure sums every session's writes on the bench schema,
	// so quiet the other writers first: the rows earlier figures left to
	// expire are swept now rather than by a Locker's sweeper during a
	// window, and the main pool's idle backends exit, which flushes the
	// statistics they still hold (an idle backend flushes them up to 10 s
	// late). A first run without this counted 12 tuples in its first
	// window and none in the others.
	for i := 0; i < 3; i++ {
		if n, err := holder.Sweep(ctx, 100000); err != nil {
			return nil, err
		} else if n == 0 {
			break
		}
	}
	e.db.SetMaxIdleConns(0)
	sizePool(e.db)
	time.Sleep(300 * time.Millisecond) // the backends exit after their sockets close
	var writes, rawWrites, wal, rawWAL, records []float64
	var spent time.Duration
	rounds := min(e.cfg.rounds, 3)
	for r := 0; r < rounds; r++ {
		s, err := measureWAL(ctx, e, sqleasePoll(polls))
		if err != nil {
			return nil, err
		}
		spent += s.took
		w, err := measureWAL(ctx, e, rawPoll(rawPolls))
		if err != nil {
			return nil, err
		}
		scale := float64(polls) / float64(rawPolls)
		writes, rawWrites = append(writes, s.tuples), append(rawWrites, w.tuples*scale)
		wal, rawWAL, records = append(wal, s.lsnBytes), append(rawWAL, w.lsnBytes*scale), append(records, s.records)
	}
	x := figure("failedpoll.wal", e.dialect, explained, "bytes", base("raw", rawExplained), below(8*1024, "bytes"))
	x.Note = fmt.Sprintf("WAL bytes of %d refused polls, summed from EXPLAIN (ANALYZE, WAL) of the statement a refused TryAcquire sends (the acquire function, nested statements included); raw: %d of its upserts scaled", polls, rawPolls)
	xi := figure("failedpoll.xids", e.dialect, float64(xids), "polls", nil, exactly(0, "polls"))
	xi.Note = fmt.Sprintf("refused polls (of %d) that took a transaction ID, so that their commit wrote a WAL record", polls)
	f := figure("failedpoll.writes", e.dialect, slices.Max(writes), "tuples", base("raw", medianOf(rawWrites)), exactly(0, "tuples"))
	f.Rounds = writes
	f.Note = fmt.Sprintf("tuples inserted/updated/deleted on the bench schema's tables per %d refused polls (pg_stat_user_tables), maximum over rounds", polls)
	g := figure("failedpoll.wal.server", e.dialect, slices.Min(wal), "bytes", base("raw", slices.Min(rawWAL)), info)
	g.Rounds = wal
	g.Note = fmt.Sprintf("server-wide pg_current_wal_lsn() difference during %d refused polls (every session's writes: an upper bound), minimum over rounds", polls)
	r := figure("failedpoll.wal_records", e.dialect, slices.Min(records), "records", nil, info)
	r.Rounds = records
	r.Note = "server-wide pg_stat_wal.wal_records delta during the polls, minimum over rounds"
	h := figure("failedpoll.latency", e.dialect, ms(spent)/float64(polls*rounds), "ms", nil, info)
	h.Note = "mean time of one refused TryAcquire"
	return []Figure{x, xi, f, g, r, h}, nil
}

// explainPolls runs the statement of a refused TryAcquire (the acquire
// function with no marker and no watch) polls times under EXPLAIN
// (ANALYZE, WAL) and sums its WAL bytes, the raw upsert rawPolls times
// (scaled to polls), and counts the polls that took a transaction ID.
func explainPolls(ctx context.Context, e *env, raw *rawLease, key string, polls, rawPolls int) (sqlease, rawBytes float64, xids int, err error) {
	fn := e.d.QuoteIdent(e.schema) + "." + e.d.QuoteIdent(dialect.DefaultPrefix+"acquire")
	call := `SELECT * FROM ` + fn + `($1, 'x', $2, 'bench', 60000000::bigint, 0::bigint, 0::bigint)`
	walOf := func(query string, args ...any) (float64, error) {
		var plan string
		if err := e.db.QueryRowContext(ctx, `EXPLAIN (ANALYZE, WAL, FORMAT JSON) `+query, args...).Scan(&plan); err != nil {
			return 0, err
		}
		var p []struct {
			Plan struct {
				WALBytes float64 `json:"WAL Bytes"`
			} `json:"Plan"`
		}
		if err := json.Unmarshal([]byte(plan), &p); err != nil || len(p) == 0 {
			return 0, fmt.Errorf("explain: %v %q", err, plan)
		}
		return p[0].Plan.WALBytes, nil
	}
	for i := 0; i < polls; i++ {
		b, err := walOf(call, key, "poller-"+strconv.Itoa(i))
		if err != nil {
			return 0, 0, 0, err
		}
		sqlease += b
		var xid sql.NullString
		if err := e.db.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM `+fn+`($1, 'x', $2, 'bench', 60000000::bigint, 0::bigint, 0::bigint)), pg_current_xact_id_if_assigned()::text`,
			key, "poller-x"+strconv.Itoa(i)).Scan(new(int), &xid); err != nil {
			return 0, 0, 0, err
		}
		if xid.Valid {
			xids++
		}
	}
	for i := 0; i < rawPolls; i++ {
		b, err := walOf(raw.acquireSQL, key, "poller", raw.ttlUS)
		if err != nil {
			return 0, 0, 0, err
		}
		rawBytes += b
	}
	return sqlease, rawBytes * float64(polls) / float64(rawPolls), xids, nil
}

// walWindow is what measureWAL saw.
type walWindow struct {
	tuples   float64 // tuples written on the bench schema's tables
	lsnBytes float64 // server-wide WAL bytes (LSN difference)
	records  float64 // server-wide WAL records (pg_stat_wal)
	took     time.Duration
}

// walSnapshot reads the counters measureWAL compares.
func walSnapshot(ctx context.Context, e *env) (lsn string, tuples, records float64, err error) {
	err = e.db.QueryRowContext(ctx, `SELECT pg_current_wal_lsn()::text,
    (SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables WHERE schemaname = $1)::float8,
    (SELECT wal_records FROM pg_stat_wal)::float8`, e.schema).Scan(&lsn, &tuples, &records)
	return
}

// measureWAL runs f on a pool opened for it and closed
// after (its backend then flushes its statistics), and returns the writes
// and WAL of the window.
func measureWAL(ctx context.Context, e *env, f func(*sql.DB) error) (walWindow, error) {
	db, err := e.open(e.dsn)
	if err != nil {
		return walWindow{}, err
	}
	db.SetMaxOpenConns(2)
	a, ta, ra, err := walSnapshot(ctx, e)
	if err != nil {
		_ = db.Close()
		return walWindow{}, err
	}
	t := time.Now()
	err = f(db)
	w := walWindow{took: time.Since(t)}
	var b string
	if err == nil {
		err = e.db.QueryRowContext(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&b)
	}
	_ = db.Close()
	if err != nil {
		return w, err
	}
	if err := e.db.QueryRowContext(ctx, `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::float8`, b, a).Scan(&w.lsnBytes); err != nil {
		return w, err
	}
	// The closed backend's statistics reach the shared counters as it
	// exits; give it a moment.
	time.Sleep(500 * time.Millisecond)
	_, tb, rb, err := walSnapshot(ctx, e)
	if err != nil {
		return w, err
	}
	w.tuples, w.records = tb-ta, rb-ra
	return w, nil
}

// figBatchRenewal: a Locker holding batchLeases leases (TTL --batch-ttl,
// default 6 s, so they renew every 2 s), acquired by 8 workers (SQLite: 1).
// On SQLite one counting pool carries acquisitions and renewals (with
// --batch-renew-db, renewals use their own pool, WithRenewDB); on
// PostgreSQL acquisitions use a pool with synchronous_commit=off and
// renewals the counting pool (WithRenewDB).
// Reported: renewal statements per renewal interval in steady state
// (target: O(1), about ceil(N/2500) batches plus one per renewer wake-up
// (TTL/12 slack, so <= 4 per interval)), leases renewed per statement,
// coverage (renewals per lease per interval: 1 when the renewer keeps its
// TTL/3 schedule, less when it falls behind), the batch statement's latency,
// leases lost (target 0), and heap per held lease (HeapAlloc delta after GC
// / N; target < 2 KiB).
func figBatchRenewal(ctx context.Context, e *env) ([]Figure, error) {
	n := e.cfg.batchLeases
	ttl := e.cfg.batchTTL
	interval := ttl / 3
	// A counting pool; while the window is counted, only renewals run.
	db, inj, err := e.openCounting(e.dsn)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	acquireDB, opts := db, []lock.Option{lock.WithTTL(ttl)}
	switch {
	case e.isPG():
		// 10,000 acquisitions with synchronous commits take ~20 s on the
		// test machine: acquire through a pool with
		// synchronous_commit=off (the set-up's durability is not what is
		// measured) and renew through the counting pool, with normal
		// durability. PostgreSQL has no write gate to bypass.
		fast, err := e.open(e.fastDSN())
		if err != nil {
			return nil, err
		}
		defer fast.Close()
		acquireDB, opts = fast, append(opts, lock.WithRenewDB(db))
	case e.cfg.batchRenewDB:
		// Renewals through their own pool (WithRenewDB); count that one.
		renewDB, rinj, err := e.openCounting(e.dsn)
		if err != nil {
			return nil, err
		}
		defer renewDB.Close()
		opts, inj = append(opts, lock.WithRenewDB(renewDB)), rinj
	}
	var renewOK, renewRetry, lost atomic.Int64
	var lmu sync.Mutex
	var batchLat []time.Duration // one sample per renewal event (weighted by leases)
	reasons := map[string]int{}
	var firstRetryErr error
	obs := lock.ObserverFunc(func(ev lock.Event) {
		switch ev.Kind {
		case lock.EventRenewOK:
			renewOK.Add(1)
			lmu.Lock()
			batchLat = append(batchLat, ev.Latency)
			lmu.Unlock()
		case lock.EventRenewRetry:
			if renewRetry.Add(1) == 1 {
				lmu.Lock()
				firstRetryErr = ev.Err
				lmu.Unlock()
			}
		case lock.EventLeaseLost:
			lost.Add(1)
			lmu.Lock()
			reasons[string(ev.Reason)]++
			lmu.Unlock()
		}
	})
	var warns warnLog
	l, err := e.newLocker(ctx, acquireDB, append(opts, lock.WithObserver(obs), lock.WithLogger(warns.logger()))...)
	if err != nil {
		return nil, err
	}
	workers := 8
	if !e.isPG() && !e.isMySQL() {
		workers = 1 // SQLite has one writer
	}
	key := func(i int) string { return "bench/batch/" + strconv.Itoa(i) }
	if err := parallel(ctx, workers, workers*4, func(i int) error { // warm the pools
		le, err := l.TryAcquire(ctx, key(i), lock.Exclusive)
		if err == nil {
			err = le.Release(ctx)
		}
		return err
	}); err != nil {
		return nil, err
	}
	leases := make([]*lock.Lease, n)
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m0)
	t := time.Now()
	err = parallel(ctx, workers, n, func(i int) (err error) {
		// The server is shared: ride out a moment of "too many clients".
		for try := 0; ; try++ {
			leases[i], err = l.TryAcquire(ctx, key(i), lock.Exclusive)
			if err == nil || try == 3 || errors.Is(err, lock.ErrLocked) {
				return err
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
	acquired := time.Since(t)
	defer func() {
		// Releasing N leases would be N notifying commits (PostgreSQL
		// serializes those cluster-wide); orphan them instead: renewal
		// stops, Close leaves them alone, and the rows stay until the
		// bench schema or file is dropped.
		for _, le := range leases {
			if le != nil {
				le.Orphan()
			}
		}
		closeLocker(l)
	}()
	if err != nil {
		return nil, err
	}
	lostAcquiring, retriesAcquiring := lost.Load(), renewRetry.Load()
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m1)
	perLease := (float64(m1.HeapAlloc) - float64(m0.HeapAlloc)) / float64(n)

	time.Sleep(interval) // every lease is now on the renewal schedule
	inj.ResetCounts()
	lmu.Lock()
	ok0, lat0 := renewOK.Load(), len(batchLat)
	lmu.Unlock()
	t, cpu0 := time.Now(), processCPU()
	time.Sleep(2 * interval)
	cpu := processCPU() - cpu0
	stmts := inj.Count("")
	pragmas := inj.Count("PRAGMA busy_timeout")
	lmu.Lock()
	renewed, lat := renewOK.Load()-ok0, slices.Clone(batchLat[lat0:])
	lmu.Unlock()
	elapsed := time.Since(t)
	intervals := float64(elapsed) / float64(interval)
	limit := float64((n+999)/1000 + 10)
	note := fmt.Sprintf("%d leases acquired in %.1fs; %d statements (%d of them PRAGMA busy_timeout around a batch, SQLite: the bound on its lock wait, H9), %d renewals in %.1fs (%.1f intervals of %s)",
		n, acquired.Seconds(), stmts, pragmas, renewed, elapsed.Seconds(), intervals, interval)
	lmu.Lock()
	lostNote := fmt.Sprintf("%d lost while acquiring (%d lease renewal retries meanwhile, first error: %v), %d in all; reasons %v",
		lostAcquiring, retriesAcquiring, firstRetryErr, lost.Load(), reasons)
	lmu.Unlock()
	out := []Figure{
		figure("batchrenew.stmts_per_interval", e.dialect, float64(stmts)/intervals, "stmts", nil, atMost(limit, "stmts")),
		figure("batchrenew.batches_per_interval", e.dialect, float64(stmts-pragmas)/intervals, "stmts", nil, info),
		figure("batchrenew.leases_per_stmt", e.dialect, float64(renewed)/max(float64(stmts-pragmas), 1), "leases", nil, info),
		figure("batchrenew.coverage", e.dialect, float64(renewed)/float64(n)/intervals, "renewals/lease/interval", nil, info),
		figure("batchrenew.batch_latency.p50", e.dialect, ms(percentile(lat, 50)), "ms", nil, info),
		figure("batchrenew.lost", e.dialect, float64(lost.Load()), "leases", nil, exactly(0, "leases")),
		figure("batchrenew.heap_per_lease", e.dialect, perLease, "bytes/lease", nil, below(2048, "bytes/lease")),
		figure("batchrenew.cpu_per_interval", e.dialect, ms(cpu)/intervals, "ms", nil, info),
		figure("batchrenew.falling_behind_warnings", e.dialect, float64(warns.count()), "warnings", nil, info),
	}
	for i := range out {
		out[i].Note = note
	}
	out[5].Note = lostNote
	out[8].Note = "the Locker's warnings that its renewals cannot keep up (at most one a minute), first: " + warns.first()
	out[7].Note = "CPU time (user + system) of the bench process per renewal interval, while only renewals run (getrusage; the database server's CPU is not in it); " + note
	return out, nil
}

// parallel runs f(i) for i in [0, n) on workers goroutines, each taking
// the next i, and returns the first error (or the context's).
func parallel(ctx context.Context, workers, n int, f func(i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := f(i); err != nil {
					mu.Lock()
					first = keepFirst(first, err)
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return keepFirst(first, ctx.Err())
}
