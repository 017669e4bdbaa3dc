package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sqlease/sqlease/internal/pgcluster"
	"github.com/sqlease/sqlease/lock"
)

// The churn figure: --churn-grants grants (TryAcquire + Release) by
// churnClients clients, cycling over churnClients*churnKeys keys, with
// autovacuum on. The shared PostgreSQL server of the bench machine runs
// with autovacuum off, so on PostgreSQL the figure runs on a private
// cluster (internal/pgcluster: PostgreSQL's default autovacuum settings,
// fsync off) when one can be started, else on --dsn (the note says so).
// The run is cut in churnSegments segments; after each, the figure reads
// the lock tables' sizes and the segment's throughput. Targets: the
// median throughput of the last quarter of the segments is at least 0.8x
// that of the first quarter (a quarter, not one segment: on a shared
// machine one segment's rate swings 3x with the load), and the
// largest size of the holders table over the second half of the run is
// at most 1.25x its largest over the first half (bounded, not growing with
// the grants; the largest, as autovacuum makes the size a sawtooth).

const (
	churnClients  = 4
	churnKeys     = 1000
	churnSegments = 20
)

// figChurn runs the churn on a private cluster (PostgreSQL) or e.
func figChurn(ctx context.Context, e *env) ([]Figure, error) {
	where := "the bench database"
	if e.isPG() {
		if why := pgcluster.Unavailable(); why != "" {
			where = "--dsn (autovacuum as the server has it; no private cluster: " + why + ")"
		} else {
			c, err := pgcluster.New(ctx, pgcluster.Config{})
			if err != nil {
				return nil, fmt.Errorf("private cluster: %w", err)
			}
			defer c.Remove()
			pe, err := setup(ctx, config{dsn: c.DSN(), rounds: 1, scale: e.cfg.scale})
			if err != nil {
				return nil, err
			}
			defer pe.close()
			e, where = pe, "a private PostgreSQL cluster (autovacuum on, default settings; fsync off)"
		}
	}
	return churn(ctx, e, where)
}

// churnPoint is the state after one segment.
type churnPoint struct {
	grants     int
	opsPerSec  float64
	load       float64
	total      float64 // bytes: holders with its indexes and TOAST (SQLite: the database file and its WAL)
	heap, idx  float64 // bytes: holders' table and indexes (SQLite: the database's pages and the WAL file)
	otherTotal float64 // bytes: markers, watches, tickets (PostgreSQL)
	vacuums    float64 // autovacuum runs on holders so far (PostgreSQL)
	dead       float64 // holders' dead tuples (PostgreSQL statistics)
	checkpoint string  // SQLite: PRAGMA wal_checkpoint after the segment: busy/log/checkpointed frames
}

// churn runs the grants on e and reports.
func churn(ctx context.Context, e *env, where string) ([]Figure, error) {
	total := e.cfg.scale.churnGrants
	l, err := e.newLocker(ctx, e.db)
	if err != nil {
		return nil, err
	}
	defer closeLocker(l)
	p0, err := churnSizes(ctx, e)
	if err != nil {
		return nil, err
	}
	points := []churnPoint{p0}
	seg := max(total/churnSegments, 1)
	for n := seg; n <= total; n += seg {
		t := time.Now()
		if err := churnGrants(ctx, l, n-seg, seg); err != nil {
			return nil, err
		}
		p, err := churnSizes(ctx, e)
		if err != nil {
			return nil, err
		}
		p.grants, p.opsPerSec, p.load = n, float64(seg)/time.Since(t).Seconds(), loadAverage()
		points = append(points, p)
	}
	return churnFigures(e, where, points), nil
}

// churnGrants grants and releases n keys, from grant number from on, with
// churnClients clients; grant i takes key i modulo churnClients*churnKeys,
// or a key of its own when a client stalled so long that the key is still
// held: by this Locker (ErrReentrant), or in the database by a release
// still under way (ErrLocked; the Locker forgets a key before its release
// deletes the row, SPEC H8).
func churnGrants(ctx context.Context, l *lock.Locker, from, n int) error {
	return parallel(ctx, churnClients, n, func(i int) error {
		le, err := l.TryAcquire(ctx, "bench/churn/"+strconv.Itoa((from+i)%(churnClients*churnKeys)), lock.Exclusive)
		if errors.Is(err, lock.ErrReentrant) || errors.Is(err, lock.ErrLocked) {
			le, err = l.TryAcquire(ctx, "bench/churn/x"+strconv.Itoa(from+i), lock.Exclusive)
		}
		if err != nil {
			return err
		}
		return le.Release(ctx)
	})
}

// churnSizes reads the lock tables' sizes.
func churnSizes(ctx context.Context, e *env) (churnPoint, error) {
	var p churnPoint
	if e.isPG() {
		h := e.ns.Object(e.d, "holders")
		var others []string
		for _, t := range []string{"markers", "watches", "tickets"} {
			others = append(others, "pg_total_relation_size('"+e.ns.Object(e.d, t)+"')")
		}
		err := e.db.QueryRowContext(ctx, `SELECT pg_total_relation_size($1)::float8, pg_relation_size($1)::float8, pg_indexes_size($1)::float8, (`+
			others[0]+" + "+others[1]+" + "+others[2]+`)::float8,
    coalesce((SELECT autovacuum_count::float8 FROM pg_stat_user_tables WHERE relid = $1::regclass), 0),
    coalesce((SELECT n_dead_tup::float8 FROM pg_stat_user_tables WHERE relid = $1::regclass), 0)`, h).Scan(&p.total, &p.heap, &p.idx, &p.otherTotal, &p.vacuums, &p.dead)
		return p, err
	}
	var pages, size float64
	if err := e.db.QueryRowContext(ctx, `SELECT page_count, page_size FROM pragma_page_count(), pragma_page_size()`).Scan(&pages, &size); err != nil {
		return p, err
	}
	p.heap = pages * size // SQLite: the database file's pages
	if st, err := os.Stat(e.dir + "/bench.db-wal"); err == nil {
		p.idx = float64(st.Size()) // SQLite: the WAL file, before the checkpoint below
	}
	// A passive checkpoint, as SQLite's automatic one: busy is 1 when a
	// reader or writer kept it from finishing; log is the WAL's frames and
	// checkpointed those copied to the database (all of them, and no
	// reader left on the WAL, lets the next writer restart it).
	var busy, log, done int
	if err := e.db.QueryRowContext(ctx, `PRAGMA wal_checkpoint(PASSIVE)`).Scan(&busy, &log, &done); err != nil {
		return p, err
	}
	p.checkpoint = fmt.Sprintf("%d/%d/%d", busy, log, done)
	p.total = p.heap + p.idx
	return p, nil
}

// churnFigures reports sizes at start, middle and end, and throughput at
// the start and the end, and registers the curves.
func churnFigures(e *env, where string, pts []churnPoint) []Figure {
	first, mid, last := pts[1], pts[len(pts)/2], pts[len(pts)-1]
	q := max((len(pts)-1)/4, 1)
	var segs []float64
	for _, p := range pts[1:] {
		segs = append(segs, p.opsPerSec)
	}
	note := fmt.Sprintf("%d grants by %d clients over %d keys, on %s; load %.1f at the first segment, %.1f at the last; segment ops/s %v",
		last.grants, churnClients, churnClients*churnKeys, where, first.load, last.load, roundInts(segs))
	if !e.isPG() {
		var cks []string
		for _, p := range pts[1:] {
			cks = append(cks, fmt.Sprintf("%s (WAL %.0f KiB)", p.checkpoint, p.idx/1024))
		}
		note += "; PRAGMA wal_checkpoint after each segment, busy/log/checkpointed frames: " + strings.Join(cks, ", ")
	}
	var out []Figure
	add := func(f Figure) {
		f.Note = note
		out = append(out, f)
	}
	add(figure("churn.ops.end", e.dialect, medianOf(segs[len(segs)-q:]), "ops/s", base("start", medianOf(segs[:q])), ratioAtLeast(0.8)))
	what := "holders (table, indexes, TOAST)"
	if !e.isPG() {
		what = "database file and WAL"
	}
	for _, s := range []struct {
		at string
		p  churnPoint
	}{{"start", pts[0]}, {"middle", mid}, {"end", last}} {
		add(figure("churn.size."+s.at, e.dialect, s.p.total, "bytes", nil, info))
		if !e.isPG() {
			add(figure("churn.size."+s.at+".db", e.dialect, s.p.heap, "bytes", nil, info))
			add(figure("churn.size."+s.at+".wal", e.dialect, s.p.idx, "bytes", nil, info))
		} else {
			add(figure("churn.size."+s.at+".heap", e.dialect, s.p.heap, "bytes", nil, info))
			add(figure("churn.size."+s.at+".indexes", e.dialect, s.p.idx, "bytes", nil, info))
			add(figure("churn.size."+s.at+".other_tables", e.dialect, s.p.otherTotal, "bytes", nil, info))
		}
	}
	if e.isPG() {
		add(figure("churn.autovacuums", e.dialect, last.vacuums, "runs", base("middle", mid.vacuums), info))
		add(figure("churn.dead_tuples.end", e.dialect, last.dead, "tuples", base("middle", mid.dead), info))
	}
	var xs, totals, kib []float64
	for _, p := range pts[1:] {
		xs, totals, kib = append(xs, float64(p.grants)), append(totals, p.total), append(kib, p.total/1024)
	}
	h := max(len(totals)/2, 1)
	add(figure("churn.size.growth", e.dialect, slices.Max(totals[min(h, len(totals)-1):]), "bytes", base("first half", slices.Max(totals[:h])), atMostRatio(1.25)))
	out[len(out)-1].Note = "largest size of the " + what + " over the second half of the grants against the first half; " + note
	addCurve("churn.ops", e.dialect, "grants", "ops/s (segment)", false, series2("sqlease", xs, segs))
	addCurve("churn.size", e.dialect, "grants", "KiB: "+what, false, series2("sqlease", xs, kib))
	return out
}

// atMostRatio wants the ratio to the baseline to be at most x.
func atMostRatio(x float64) target {
	return target{text: fmt.Sprintf("<= %gx", x), met: func(_ float64, r *float64) bool { return r != nil && *r <= x }}
}
