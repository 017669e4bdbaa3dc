package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sqlease/sqlease/lock"
)

// The scale figures (issue 32): how the cost of sqlease grows with the
// work in the tables rather than with the clients. Each is a step of its
// own (--only scaleleases, crowd, churn, renewmany; --only scale runs the
// four), sized by the flags below.

// scaleConfig sizes the scale figures.
type scaleConfig struct {
	liveLeases   []int         // live-lease levels of the scaleleases figure
	crowdWaiters []int         // waiter counts of the crowd figure
	crowdProcs   int           // processes the crowd's waiters are spread over
	churnGrants  int           // grants of the churn figure
	renewLeases  int           // leases of the renewmany figure
	renewTTL     time.Duration // their TTL
	plotDir      string        // where the SVG plots go ("" or "-": none)
}

// scaleFlags registers the scale figures' flags on cfg.
func scaleFlags(cfg *scaleConfig) {
	cfg.liveLeases, cfg.crowdWaiters = []int{1, 1000, 100_000}, []int{100, 1000}
	flag.Func("scale-leases", "comma-separated live-lease `LEVELS` of the scaleleases figure (default 1,1000,100000)", func(s string) (err error) {
		cfg.liveLeases, err = parseInts(s)
		return err
	})
	flag.Func("crowd-waiters", "comma-separated waiter `COUNTS` of the crowd figure (default 100,1000)", func(s string) (err error) {
		cfg.crowdWaiters, err = parseInts(s)
		return err
	})
	flag.IntVar(&cfg.crowdProcs, "crowd-procs", 5, "processes the crowd figure's waiters are spread over")
	flag.IntVar(&cfg.churnGrants, "churn-grants", 1_000_000, "grants of the churn figure")
	flag.IntVar(&cfg.renewLeases, "renew-leases", 100_000, "leases held and renewed by one Locker in the renewmany figure")
	flag.DurationVar(&cfg.renewTTL, "renew-ttl", lock.DefaultTTL, "TTL of the renewmany figure's leases (renewed every third of it)")
	flag.StringVar(&cfg.plotDir, "plots", "docs/plots", "write SVG plots of the figures measured to `DIR` (\"-\": none)")
}

// parseInts parses a comma-separated list of positive integers.
func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// scaleSteps are the ids of the scale figures, which --only scale selects.
var scaleSteps = []string{"scaleleases", "crowd", "churn", "renewmany"}

// figScaleLeases: uncontended TryAcquire+Release (1 client, keys of its
// own) with 1, 1,000 and 100,000 live leases on distinct keys in the
// holders table (--scale-leases). The live leases are rows inserted
// directly (owner "filler", TTL 1 hour), the table is then analyzed as
// autovacuum would. At each level sqlease runs interleaved with the raw
// lease on a table of its own that stays small, so raw measures the
// machine's load at that level. Target: at every level, sqlease's ops/s
// relative to raw's is at least 0.8 of that ratio at the first level
// (flat within 20%); the plain ops/s ratio is reported too.
func figScaleLeases(ctx context.Context, e *env) ([]Figure, error) {
	levels := e.cfg.scale.liveLeases
	l, err := e.newLocker(ctx, e.db)
	if err != nil {
		return nil, err
	}
	defer closeLocker(l)
	raw, err := newRawLease(ctx, e, e.db, "raw_scale")
	if err != nil {
		return nil, err
	}
	var out []Figure
	var first, firstRel float64
	var xs, ops, rawOps, p99 []float64
	filled := 0
	for i, n := range levels {
		if err := fillLiveLeases(ctx, e, filled, n); err != nil {
			return nil, err
		}
		filled = max(filled, n)
		ws := []workload{sqleaseWorkload(l, "bench/scale/", lock.Exclusive), raw.workload("raw", "bench/scale/", false)}
		res, err := interleave(ctx, e.cfg.rounds, 1, e.cfg.duration, ws)
		if err != nil {
			return nil, err
		}
		s, r := res["sqlease"], res["raw"]
		rel := s.median() / r.median()
		if i == 0 {
			first, firstRel = s.median(), rel
		}
		name := "scaleleases." + strconv.Itoa(n)
		f := figure(name+".ops", e.dialect, s.median(), "ops/s", base("at "+strconv.Itoa(levels[0]), first), info)
		f.Rounds = s.rounds
		f.Note = fmt.Sprintf("%d live leases; raw (small table) %.0f ops/s in the same rounds", n, r.median())
		g := figure(name+".vs_raw", e.dialect, rel, "x raw", base("at "+strconv.Itoa(levels[0]), firstRel), ratioAtLeast(0.8))
		g.Note = "sqlease/raw ops/s at this level, against the same ratio at the first level: flat within 20% when >= 0.8x"
		h := figure(name+".p99", e.dialect, ms(s.pct(99)), "ms", base("raw", ms(r.pct(99))), info)
		out = append(out, f, g, h)
		xs, ops, rawOps, p99 = append(xs, float64(n)), append(ops, s.median()), append(rawOps, r.median()), append(p99, ms(s.pct(99)))
	}
	addCurve("scaleleases.ops", e.dialect, "live leases", "ops/s", true, series2("sqlease", xs, ops), series2("raw (small table)", xs, rawOps))
	addCurve("scaleleases.p99", e.dialect, "live leases", "p99 ms", true, series2("sqlease", xs, p99))
	return out, nil
}

// fillLiveLeases inserts live leases number from+1..to (owner "filler",
// distinct keys bench/fill/<n>, TTL 1 hour) into the holders table and
// vacuums and analyzes it on PostgreSQL, as autovacuum would.
func fillLiveLeases(ctx context.Context, e *env, from, to int) error {
	if to <= from {
		return nil
	}
	t := e.ns.Object(e.d, "holders")
	q := `INSERT INTO ` + t + ` (lease_id, lock_key, mode, owner, token, acquired_at, expires_at)
SELECT 'fill-' || g, 'bench/fill/' || g, 'x', 'filler', 1, now(), now() + interval '1 hour'
FROM generate_series($1::int, $2::int) g`
	if !e.isPG() {
		q = `INSERT INTO ` + t + ` (lease_id, lock_key, mode, owner, token, acquired_us, expires_us)
WITH RECURSIVE g(n) AS (SELECT ?1 UNION ALL SELECT n + 1 FROM g WHERE n < ?2)
SELECT 'fill-' || n, 'bench/fill/' || n, 'x', 'filler', 1, unixepoch() * 1000000, (unixepoch() + 3600) * 1000000 FROM g`
	}
	if _, err := e.db.ExecContext(ctx, q, from+1, to); err != nil {
		return fmt.Errorf("fill live leases %d..%d: %w", from+1, to, err)
	}
	if !e.isPG() {
		return nil // SQLite's planner needs no statistics for these lookups
	}
	if _, err := e.db.ExecContext(ctx, "VACUUM ANALYZE "+t); err != nil {
		return fmt.Errorf("analyze: %w", err)
	}
	return nil
}

// quickScale shrinks the scale figures for --quick, except where a flag
// set their size.
func quickScale(cfg *scaleConfig, set map[string]bool) {
	if !set["scale-leases"] {
		cfg.liveLeases = []int{1, 1000, 10_000}
	}
	if !set["crowd-waiters"] {
		cfg.crowdWaiters = []int{20, 100}
	}
	if !set["churn-grants"] {
		cfg.churnGrants = 20_000
	}
	if !set["renew-leases"] {
		cfg.renewLeases = 10_000
	}
}
