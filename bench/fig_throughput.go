package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/sqlease/sqlease/lock"
)

// Uncontended throughput: every client repeatedly acquires (TryAcquire)
// and releases its own key, so nothing ever waits for another client's
// lease; what is measured is the cost of the statements and their commits.

// sqleaseWorkload is TryAcquire + Release on per-client keys prefix<client>.
func sqleaseWorkload(l *lock.Locker, prefix string, mode lock.Mode) workload {
	return workload{name: "sqlease", op: func(ctx context.Context, c int) error {
		le, err := l.TryAcquire(ctx, prefix+strconv.Itoa(c), mode)
		if err != nil {
			return err
		}
		return le.Release(ctx)
	}}
}

// sqleaseDoWorkload is the users' path: Do (a blocking acquire with a
// deadline, the function, Release) on per-client keys prefix<client>.
func sqleaseDoWorkload(l *lock.Locker, prefix string, mode lock.Mode) workload {
	return workload{name: "sqlease-do", op: func(ctx context.Context, c int) error {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return l.Do(ctx, prefix+strconv.Itoa(c), mode, func(context.Context, *lock.Lease) error { return nil })
	}}
}

// sqleaseAcquireWorkload is Acquire (blocking, background context) +
// Release on per-client keys prefix<client>.
func sqleaseAcquireWorkload(l *lock.Locker, prefix string, mode lock.Mode) workload {
	return workload{name: "sqlease-acquire", op: func(ctx context.Context, c int) error {
		le, err := l.Acquire(ctx, prefix+strconv.Itoa(c), mode)
		if err != nil {
			return err
		}
		return le.Release(ctx)
	}}
}

// vacuumLockTables starts a throughput figure on clean lock tables
// (PostgreSQL): VACUUM removes the dead rows the figures before it left.
// The raw baseline gets a new table for each figure, while sqlease's tables
// serve the whole run; on a server with autovacuum off (printed in the
// header) sqlease's would otherwise carry every earlier figure's dead rows
// and index entries, and the comparison would not be like for like
// (docs/performance.md, "Method").
func vacuumLockTables(ctx context.Context, e *env) error {
	if !e.isPG() {
		return nil
	}
	for _, t := range []string{"holders", "markers", "watches", "tickets"} {
		if _, err := e.db.ExecContext(ctx, "VACUUM "+e.ns.Object(e.d, t)); err != nil {
			return fmt.Errorf("vacuum %s: %w", t, err)
		}
	}
	return nil
}

// throughputAll is every figure of one throughput step: TryAcquire against
// each baseline, the Do and Acquire paths, and the A/A control.
func throughputAll(e *env, name string, res map[string]*series, baselines []string, want target) []Figure {
	out := append(throughputFigures(e, name, res, baselines, want), pathFigures(e, name, res, want)...)
	return append(out, controlFigure(e, name, res))
}

// rawAgain names the A/A control workload of the throughput figures: the
// raw lease a second time, on keys of its own, in the same interleaved
// rounds, run right after raw as sqlease's TryAcquire runs right before.
const rawAgain = "raw-again"

// controlFigure reports the A/A control, "control.<figure>.ops": the raw
// lease against itself (its value is raw-again's, not sqlease's). Both
// sides run the same statements, so the ratio's distance from 1.00x is one
// measurement of how far this run's noise alone moves the ratios of the
// figure (disk flushes and CPU shared with the server vary from round to
// round); it is not a bound.
func controlFigure(e *env, name string, res map[string]*series) Figure {
	s := res[rawAgain]
	f := figure("control."+name+".ops", e.dialect, s.median(), "ops/s", base("raw", res["raw"].median()), info)
	f.Rounds = s.rounds
	f.Note = "A/A control: " + controlLegend + "; on keys of its own; baseline rounds " + fmt.Sprint(roundInts(res["raw"].rounds))
	return f
}

// pathFigures reports the Do and Acquire paths against raw, held to the
// same target as TryAcquire.
func pathFigures(e *env, name string, res map[string]*series, want target) []Figure {
	var out []Figure
	for _, p := range []string{"do", "acquire"} {
		s := res["sqlease-"+p]
		f := figure(name+"."+p+".ops", e.dialect, s.median(), "ops/s", base("raw", res["raw"].median()), want)
		f.Rounds = s.rounds
		f.Note = "the " + p + " path (blocking acquire, uncontended); median of per-round ops/s"
		out = append(out, f)
	}
	return out
}

// throughputFigures turns interleaved series into figures: ops/s against
// every baseline (the target applies against "raw"), then p50 and p99
// latency against raw.
func throughputFigures(e *env, name string, res map[string]*series, baselines []string, want target) []Figure {
	s := res["sqlease"]
	var out []Figure
	for _, b := range baselines {
		t := info
		if b == "raw" {
			t = want
		}
		f := figure(name+".ops", e.dialect, s.median(), "ops/s", base(b, res[b].median()), t)
		f.Rounds = s.rounds
		f.Note = "median of per-round ops/s; baseline rounds " + fmt.Sprint(roundInts(res[b].rounds))
		out = append(out, f)
	}
	ref := "raw"
	if res[ref] == nil {
		ref = baselines[0]
	}
	for _, p := range []float64{50, 99} {
		out = append(out, figure(fmt.Sprintf("%s.p%.0f", name, p), e.dialect, ms(s.pct(p)), "ms", base(ref, ms(res[ref].pct(p))), info))
	}
	return out
}

func roundInts(xs []float64) []int {
	out := make([]int, len(xs))
	for i, x := range xs {
		out[i] = int(x + 0.5)
	}
	return out
}

// figExclusive: uncontended exclusive acquire+release with clients clients
// on distinct keys, against the raw lease, and on PostgreSQL also against
// raw+notify (the raw lease whose delete notifies, as sqlease's release
// does), advisory locks and goose's table locker, on MySQL also against
// GET_LOCK. Targets: PostgreSQL and MySQL >= 0.9x raw with 1 client,
// >= 0.8x with 8; SQLite >= 0.7x raw.
func figExclusive(ctx context.Context, e *env, clients int) ([]Figure, error) {
	name := fmt.Sprintf("exclusive.%dc", clients)
	l, err := e.newLocker(ctx, e.db)
	if err != nil {
		return nil, err
	}
	defer closeLocker(l)
	raw, err := newRawLease(ctx, e, e.db, "raw_x"+strconv.Itoa(clients))
	if err != nil {
		return nil, err
	}
	ws := []workload{sqleaseWorkload(l, "bench/x/", lock.Exclusive), raw.workload("raw", "bench/x/", false),
		raw.workload(rawAgain, "bench/xa/", false),
		sqleaseDoWorkload(l, "bench/x/", lock.Exclusive), sqleaseAcquireWorkload(l, "bench/x/", lock.Exclusive)}
	baselines := []string{"raw"}
	want := ratioAtLeast(0.7)
	if e.isPG() {
		want = ratioAtLeast(0.9)
		if clients > 1 {
			want = ratioAtLeast(0.8)
		}
		adv, err := advisoryWorkload(ctx, e.db, clients, 1_000_000*int64(clients), false)
		if err != nil {
			return nil, err
		}
		goose, err := gooseWorkload(e, clients)
		if err != nil {
			adv.close()
			return nil, err
		}
		ws = append(ws, raw.workload("raw+notify", "bench/xn/", true), adv, goose)
		baselines = append(baselines, "raw+notify", "advisory", "goose")
	}
	if e.isMySQL() {
		want = ratioAtLeast(0.9)
		if clients > 1 {
			want = ratioAtLeast(0.8)
		}
		gl, err := getLockWorkload(ctx, e, clients, "x"+strconv.Itoa(clients)+"/")
		if err != nil {
			return nil, err
		}
		ws = append(ws, gl)
		baselines = append(baselines, "get_lock")
	}
	if err := vacuumLockTables(ctx, e); err != nil {
		return nil, err
	}
	res, err := interleave(ctx, e.cfg.rounds, clients, e.cfg.duration, ws)
	if err != nil {
		return nil, err
	}
	return throughputAll(e, name, res, baselines, want), nil
}

// figShared: uncontended shared acquire+release, clients clients on
// distinct keys, against the raw lease (which has only one mode) and, on
// PostgreSQL, shared advisory locks. Targets: PostgreSQL and MySQL >= 0.8x
// raw, SQLite >= 0.7x raw.
func figShared(ctx context.Context, e *env, clients int) ([]Figure, error) {
	name := fmt.Sprintf("shared.%dc", clients)
	l, err := e.newLocker(ctx, e.db)
	if err != nil {
		return nil, err
	}
	defer closeLocker(l)
	raw, err := newRawLease(ctx, e, e.db, "raw_s"+strconv.Itoa(clients))
	if err != nil {
		return nil, err
	}
	ws := []workload{sqleaseWorkload(l, "bench/s/", lock.Shared), raw.workload("raw", "bench/s/", false),
		raw.workload(rawAgain, "bench/sa/", false),
		sqleaseDoWorkload(l, "bench/s/", lock.Shared), sqleaseAcquireWorkload(l, "bench/s/", lock.Shared)}
	baselines := []string{"raw"}
	want := ratioAtLeast(0.7)
	if e.isPG() {
		want = ratioAtLeast(0.8)
		adv, err := advisoryWorkload(ctx, e.db, clients, 2_000_000*int64(clients), true)
		if err != nil {
			return nil, err
		}
		ws = append(ws, adv)
		baselines = append(baselines, "advisory-shared")
	}
	if e.isMySQL() {
		want = ratioAtLeast(0.8) // GET_LOCK has no shared mode: raw only
	}
	if err := vacuumLockTables(ctx, e); err != nil {
		return nil, err
	}
	res, err := interleave(ctx, e.cfg.rounds, clients, e.cfg.duration, ws)
	if err != nil {
		return nil, err
	}
	return throughputAll(e, name, res, baselines, want), nil
}
