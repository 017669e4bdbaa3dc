package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

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
	if !e.isPG() {
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
// polls it with TryAcquire walPolls times per round. pg_current_wal_lsn()
// is server-wide, and other sessions write meanwhile, so the WAL is read
// back with pg_walinspect (installed into the bench schema when the
// server has it, dropped with the schema) and only the records that touch
// the bench schema's relations, plus the commit records of their
// transactions, are counted. Baseline: the raw lease's refused upsert
// (ON CONFLICT DO UPDATE ... WHERE locks the conflicting row, so it
// writes), 200 polls per round scaled to walPolls. Without pg_walinspect
// the headline is the minimum server-wide delta over rounds, an upper
// bound. Target: < 8 KiB per walPolls polls.
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
	poller, err := e.newLocker(ctx, e.db)
	if err != nil {
		return nil, err
	}
	defer closeLocker(poller)
	raw, err := newRawLease(ctx, e, e.db, "raw_wal")
	if err != nil {
		return nil, err
	}
	raw.ttlUS = (10 * time.Minute).Microseconds()
	if ok, err := raw.tryAcquire(ctx, e.db, key, "holder"); err != nil || !ok {
		return nil, fmt.Errorf("raw lease: %v", err)
	}
	meter, meterErr := newWALMeter(ctx, e)
	sqleasePoll := func(n int) func() error {
		return func() error {
			for i := 0; i < n; i++ {
				if _, err := poller.TryAcquire(ctx, key, lock.Exclusive); !errors.Is(err, lock.ErrLocked) {
					return fmt.Errorf("poll %d: want ErrLocked, got %v", i, err)
				}
			}
			return nil
		}
	}
	rawPoll := func(n int) func() error {
		return func() error {
			for i := 0; i < n; i++ {
				if ok, err := raw.tryAcquire(ctx, e.db, key, "poller"); err != nil || ok {
					return fmt.Errorf("raw poll %d: ok=%v err=%v", i, ok, err)
				}
			}
			return nil
		}
	}
	if err := sqleasePoll(50)(); err != nil { // warm-up
		return nil, err
	}
	if err := rawPoll(20)(); err != nil {
		return nil, err
	}
	var own, rawOwn, server []float64
	var spent time.Duration
	rounds := min(e.cfg.rounds, 2) // pg_walinspect attributes WAL exactly; rounds only check stability
	for r := 0; r < rounds; r++ {
		s, err := measureWAL(ctx, e, meter, sqleasePoll(polls))
		if err != nil {
			return nil, err
		}
		spent += s.took
		w, err := measureWAL(ctx, e, meter, rawPoll(rawPolls))
		if err != nil {
			return nil, err
		}
		scale := float64(polls) / float64(rawPolls)
		own, rawOwn, server = append(own, s.own), append(rawOwn, w.own*scale), append(server, s.server)
	}
	var f Figure
	if meter != nil {
		f = figure("failedpoll.wal", e.dialect, medianOf(own), "bytes", base("raw", medianOf(rawOwn)), below(8*1024, "bytes"))
		f.Note = fmt.Sprintf("WAL records on the bench schema's relations (+ their commits) per %d refused polls, pg_walinspect; median over rounds", polls)
	} else {
		f = figure("failedpoll.wal", e.dialect, slices.Min(server), "bytes", nil, below(8*1024, "bytes"))
		f.Note = fmt.Sprintf("pg_walinspect unavailable (%v): minimum server-wide WAL delta over rounds per %d refused polls, an upper bound", meterErr, polls)
	}
	f.Rounds = own
	g := figure("failedpoll.wal.server", e.dialect, medianOf(server), "bytes", nil, info)
	g.Rounds = server
	g.Note = "server-wide WAL during the sqlease polls (every session's writes), median over rounds"
	h := figure("failedpoll.latency", e.dialect, ms(spent)/float64(polls*rounds), "ms", nil, info)
	h.Note = "mean time of one refused TryAcquire"
	return []Figure{f, g, h}, nil
}

// walMeter reads back WAL with pg_walinspect.
type walMeter struct {
	records string // qualified name of pg_get_wal_records_info
}

// newWALMeter finds pg_walinspect, or installs it into the bench schema
// (dropped with it). An error means it is not available.
func newWALMeter(ctx context.Context, e *env) (*walMeter, error) {
	var schema string
	err := e.db.QueryRowContext(ctx, `SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'pg_walinspect'`).Scan(&schema)
	if err != nil {
		if _, err := e.db.ExecContext(ctx, `CREATE EXTENSION pg_walinspect SCHEMA `+e.d.QuoteIdent(e.schema)); err != nil {
			return nil, err
		}
		schema = e.d.QuoteIdent(e.schema)
	}
	return &walMeter{records: schema + ".pg_get_wal_records_info"}, nil
}

// walWindow is what measureWAL saw.
type walWindow struct {
	own, server float64 // bytes: on the bench schema's relations; server-wide
	took        time.Duration
}

// measureWAL runs f and returns the WAL written meanwhile.
func measureWAL(ctx context.Context, e *env, m *walMeter, f func() error) (walWindow, error) {
	var a, b string
	if err := e.db.QueryRowContext(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&a); err != nil {
		return walWindow{}, err
	}
	t := time.Now()
	if err := f(); err != nil {
		return walWindow{}, err
	}
	w := walWindow{took: time.Since(t)}
	if err := e.db.QueryRowContext(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&b); err != nil {
		return w, err
	}
	if err := e.db.QueryRowContext(ctx, `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::float8`, b, a).Scan(&w.server); err != nil {
		return w, err
	}
	if m == nil {
		return w, nil
	}
	// pg_walinspect reads only flushed WAL: wait for the WAL writer.
	for deadline := time.Now().Add(5 * time.Second); ; {
		var flushed bool
		if err := e.db.QueryRowContext(ctx, `SELECT pg_current_wal_flush_lsn() >= $1::pg_lsn`, b).Scan(&flushed); err != nil {
			return w, err
		}
		if flushed || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	q := `WITH rels AS (
    SELECT '/' || d.oid || '/' || pg_relation_filenode(c.oid) || ' ' AS pat
    FROM pg_class c, pg_database d
    WHERE c.relnamespace = $3::text::regnamespace AND d.datname = current_database()
      AND pg_relation_filenode(c.oid) IS NOT NULL
), recs AS (
    SELECT xid, resource_manager, record_length, block_ref FROM ` + m.records + `($1::pg_lsn, $2::pg_lsn)
), mine AS (
    SELECT r.xid, r.record_length FROM recs r
    WHERE EXISTS (SELECT 1 FROM rels WHERE strpos(r.block_ref, rels.pat) > 0)
)
SELECT (coalesce((SELECT sum(record_length) FROM mine), 0)
      + coalesce((SELECT sum(record_length) FROM recs
                  WHERE resource_manager = 'Transaction'
                    AND xid IN (SELECT xid FROM mine WHERE xid <> '0'::xid)), 0))::float8`
	err := e.db.QueryRowContext(ctx, q, a, b, e.d.QuoteIdent(e.schema)).Scan(&w.own)
	return w, err
}

// figBatchRenewal: a Locker holding batchLeases leases (TTL --batch-ttl,
// default 6 s, so they renew every 2 s), acquired by 8 workers (SQLite: 1).
// On SQLite one counting pool carries acquisitions and renewals (with
// --batch-renew-db, renewals use their own pool, WithRenewDB); on
// PostgreSQL acquisitions use a pool with synchronous_commit=off and
// renewals the counting pool (WithRenewDB).
// Reported: renewal statements per renewal interval in steady state
// (target: O(1), at most ceil(N/1000) batches plus one per renewer wake-up
// (TTL/30 slack, so <= 10 per interval)), leases renewed per statement,
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
	l, err := e.newLocker(ctx, acquireDB, append(opts, lock.WithObserver(obs))...)
	if err != nil {
		return nil, err
	}
	workers := 8
	if !e.isPG() {
		workers = 1 // SQLite has one writer
	}
	// parallel runs f(i) for i in [0, n) on workers goroutines.
	parallel := func(n int, f func(i int) error) error {
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
	key := func(i int) string { return "bench/batch/" + strconv.Itoa(i) }
	if err := parallel(workers*4, func(i int) error { // warm the pools
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
	err = parallel(n, func(i int) (err error) {
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
	t = time.Now()
	time.Sleep(2 * interval)
	stmts := inj.Count("")
	lmu.Lock()
	renewed, lat := renewOK.Load()-ok0, slices.Clone(batchLat[lat0:])
	lmu.Unlock()
	elapsed := time.Since(t)
	intervals := float64(elapsed) / float64(interval)
	limit := float64((n+999)/1000 + 10)
	note := fmt.Sprintf("%d leases acquired in %.1fs; %d statements, %d renewals in %.1fs (%.1f intervals of %s)",
		n, acquired.Seconds(), stmts, renewed, elapsed.Seconds(), intervals, interval)
	lmu.Lock()
	lostNote := fmt.Sprintf("%d lost while acquiring (%d lease renewal retries meanwhile, first error: %v), %d in all; reasons %v",
		lostAcquiring, retriesAcquiring, firstRetryErr, lost.Load(), reasons)
	lmu.Unlock()
	out := []Figure{
		figure("batchrenew.stmts_per_interval", e.dialect, float64(stmts)/intervals, "stmts", nil, atMost(limit, "stmts")),
		figure("batchrenew.leases_per_stmt", e.dialect, float64(renewed)/max(float64(stmts), 1), "leases", nil, info),
		figure("batchrenew.coverage", e.dialect, float64(renewed)/float64(n)/intervals, "renewals/lease/interval", nil, info),
		figure("batchrenew.batch_latency.p50", e.dialect, ms(percentile(lat, 50)), "ms", nil, info),
		figure("batchrenew.lost", e.dialect, float64(lost.Load()), "leases", nil, exactly(0, "leases")),
		figure("batchrenew.heap_per_lease", e.dialect, perLease, "bytes/lease", nil, below(2048, "bytes/lease")),
	}
	for i := range out {
		out[i].Note = note
	}
	out[4].Note = lostNote
	return out, nil
}
