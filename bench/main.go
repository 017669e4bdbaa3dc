// Command bench compares sqlease with the baselines it must be measured
// against, in the same run, on the same database:
//
//   - raw: a hand-rolled single-statement lease (INSERT ... ON CONFLICT DO
//     UPDATE ... WHERE expired, RETURNING; on MySQL INSERT ... ON DUPLICATE
//     KEY UPDATE, granted when rows are affected; DELETE by key and owner);
//   - advisory (PostgreSQL): pg_try_advisory_lock / pg_advisory_unlock on
//     one pinned connection; get_lock (MySQL): GET_LOCK(name, 0) /
//     RELEASE_LOCK, likewise;
//   - goose (PostgreSQL): goose's table locker (lock.NewPostgresTableLocker).
//
// Usage:
//
//	go run ./bench                               # SQLite, temp file
//	go run ./bench --dsn postgres://...          # PostgreSQL, fresh schema (dropped after)
//	go run ./bench --dsn mysql://root@host/test  # MySQL/MariaDB, fresh database (dropped after)
//	go run ./bench --quick --json results.jsonl  # shorter; JSON lines
//	go run ./bench --only handoff,takeover       # some figures only
//	bash bench/server-instructions.sh            # PostgreSQL server instructions per operation (callgrind)
//
// Every figure interleaves rounds of sqlease and of its baselines (sqlease
// round, baseline round, ...) and reports medians and p99s; each says
// whether it meets its target. docs/performance.md has the results and
// their analysis.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(childDispatch(mode))
	}
	os.Exit(run())
}

// childDispatch runs the child process of the given kind (the value of
// childEnv) and returns its exit status.
func childDispatch(mode string) int {
	switch mode {
	case "herd":
		return herdChildMain()
	case "serverops":
		return serverOpsMain()
	case "crowd":
		return crowdChildMain()
	}
	return childMain()
}

// run parses the flags, runs every figure and reports; it returns the exit
// status (1 when a figure could not be measured; missed targets are
// reported, not failures).
func run() int {
	var cfg config
	flag.StringVar(&cfg.dsn, "dsn", "", "PostgreSQL or MySQL `URL` (postgres://..., mysql://..., or a go-sql-driver/mysql DSN); default: SQLite in a temp file")
	flag.StringVar(&cfg.jsonPath, "json", "", "write one JSON object per figure per line to `FILE`")
	flag.IntVar(&cfg.rounds, "rounds", 5, "interleaved rounds per figure")
	flag.DurationVar(&cfg.duration, "duration", 800*time.Millisecond, "length of one throughput round")
	flag.DurationVar(&cfg.batchTTL, "batch-ttl", 6*time.Second, "TTL of the leases in the batch-renewal figure (renewed every third of it)")
	flag.BoolVar(&cfg.batchRenewDB, "batch-renew-db", false, "SQLite: renew the batch-renewal figure's leases through a separate pool (lock.WithRenewDB; always so on PostgreSQL)")
	only := flag.String("only", "", "run only these comma-separated `STEPS` (roundtrips, exclusive1, exclusive8, shared1, shared8, handoff, herd, takeover, waiterload, crosskey, wal, batch; scale figures, not run by default: scaleleases, crowd, churn, renewmany, or scale for the four)")
	scaleFlags(&cfg.scale)
	cpuProfile := flag.String("cpuprofile", "", "write a pprof CPU profile of the bench process to `FILE`")
	flag.BoolVar(&cfg.quick, "quick", false, "shorter run: 3 rounds of 300ms, 3s waiter hold, 2,000 leases in the batch-renewal figure (defaults: 5 rounds of 800ms, 8s hold, 10,000 leases)")
	flag.Parse()
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	cfg.handoffSamples, cfg.waiterHold, cfg.batchLeases, cfg.walPolls = 4, 8*time.Second, 10_000, 1000
	if cfg.quick {
		if !set["rounds"] {
			cfg.rounds = 3
		}
		if !set["duration"] {
			cfg.duration = 300 * time.Millisecond
		}
		cfg.handoffSamples, cfg.waiterHold, cfg.batchLeases = 3, 3*time.Second, 2000
		quickScale(&cfg.scale, set)
	}
	if cfg.rounds < 1 || cfg.duration <= 0 || cfg.batchTTL < 300*time.Millisecond {
		fmt.Fprintln(os.Stderr, "bench: --rounds must be >= 1, --duration > 0 and --batch-ttl >= 300ms")
		return 2
	}

	if *cpuProfile != "" {
		stopProfile, err := startCPUProfile(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			return 1
		}
		defer stopProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	e, err := setup(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	defer e.close()

	steps := []struct {
		id, name string
		run      func(context.Context, *env) ([]Figure, error)
	}{
		{"roundtrips", "round trips", figRoundTrips},
		{"exclusive1", "exclusive, 1 client", func(ctx context.Context, e *env) ([]Figure, error) { return figExclusive(ctx, e, 1) }},
		{"exclusive8", "exclusive, 8 clients", func(ctx context.Context, e *env) ([]Figure, error) { return figExclusive(ctx, e, 8) }},
		{"shared1", "shared, 1 client", func(ctx context.Context, e *env) ([]Figure, error) { return figShared(ctx, e, 1) }},
		{"shared8", "shared, 8 clients", func(ctx context.Context, e *env) ([]Figure, error) { return figShared(ctx, e, 8) }},
		{"handoff", "handoff", figHandoff},
		{"herd", "herd (50 waiters, 5 processes)", figHerd},
		{"takeover", "takeover", figTakeover},
		{"waiterload", "waiter load", figWaiterLoad},
		{"crosskey", "cross-key wait", figCrossKey},
		{"wal", "failed-poll WAL", figFailedPollWAL},
		{"batch", "batch renewal", figBatchRenewal},
		{"scaleleases", "live leases in the table", figScaleLeases},
		{"crowd", "waiters on one key", figCrowd},
		{"churn", "grants churned", figChurn},
		{"renewmany", "many leases renewed", figRenewMany},
	}
	if *only == "" {
		steps = steps[:len(steps)-len(scaleSteps)] // long: run when asked for
	} else {
		want := map[string]bool{}
		for _, id := range strings.Split(*only, ",") {
			want[strings.TrimSpace(id)] = true
		}
		if want["scale"] {
			delete(want, "scale")
			for _, id := range scaleSteps {
				want[id] = true
			}
		}
		kept := steps[:0]
		for _, s := range steps {
			if want[s.id] {
				kept = append(kept, s)
				delete(want, s.id)
			}
		}
		if len(want) > 0 {
			fmt.Fprintf(os.Stderr, "bench: unknown --only steps %v\n", want)
			return 2
		}
		steps = kept
	}
	start, rev, startLoad := time.Now(), revision(), loadAverage()
	fmt.Fprintf(os.Stderr, "bench: %s; engine %s; %s\n", e.dialect, rev, e.machine)
	var figs []Figure
	status := 0
	for _, s := range steps {
		t := time.Now()
		fs, err := s.run(ctx, e)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: %s: %v\n", s.name, err)
			status = 1
			if ctx.Err() != nil {
				break
			}
			continue
		}
		load := loadAverage()
		fmt.Fprintf(os.Stderr, "bench: %-28s %5.1fs, load average %.2f\n", s.name, time.Since(t).Seconds(), load)
		for i := range fs {
			fs[i].Load = load
		}
		figs = append(figs, fs...)
	}

	for i := range figs {
		figs[i].Revision = rev
	}
	fmt.Printf("sqlease bench: dialect %s, engine %s, %d rounds x %s, %s total\n", e.dialect, rev, cfg.rounds, cfg.duration, time.Since(start).Round(time.Second))
	fmt.Printf("machine: %s; load average at start %.2f, at end %.2f (column load: when each figure was taken; wall-clock figures are only compared with their baseline from the same run)\n\n", e.machine, startLoad, loadAverage())
	printTable(os.Stdout, figs)
	printLegend(os.Stdout, figs)
	if dir := cfg.scale.plotDir; dir != "" && dir != "-" {
		files, err := writePlots(dir, figs)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench: plots:", err)
			status = 1
		}
		if len(files) > 0 {
			fmt.Printf("\nplots: %s\n", strings.Join(files, ", "))
		}
	}
	if m := missed(figs); len(m) > 0 {
		fmt.Printf("\nmissed targets (%d):\n  %s\n", len(m), strings.Join(m, "\n  "))
	} else {
		fmt.Printf("\nall targets met\n")
	}
	if cfg.jsonPath != "" {
		f, err := os.Create(cfg.jsonPath)
		if err == nil {
			err = writeJSON(f, figs)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench: write json:", err)
			status = 1
		}
	}
	return status
}
