package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/dialect"
)

// newDatabaseHook, when set, sees every database a check case gets (tests
// use it to verify that PostgreSQL schemas are dropped).
var newDatabaseHook func(conformance.Database)

func setupCheck(fs *flag.FlagSet, out *output) func(context.Context, []string) error {
	var (
		db       dbFlags
		runExpr  string
		full     bool
		parallel int
		verbose  bool
		timeout  time.Duration
	)
	fs.StringVar(&db.dsn, "dsn", "", "database `DSN` (default $"+dsnEnv+"; unset: a fresh embedded SQLite file in a temporary directory)")
	fs.StringVar(&db.dialect, "dialect", "", "dialect `NAME` (postgres, sqlite); default: inferred from the DSN")
	fs.StringVar(&runExpr, "run", "", "run only the cases whose name matches `REGEXP` (e.g. 'S1_|S3_')")
	fs.BoolVar(&full, "full", false, "run the stress and churn cases at full length (several minutes; default: seconds)")
	fs.IntVar(&parallel, "parallel", 4, "run at most `N` cases at once")
	fs.BoolVar(&verbose, "verbose", false, "print the log of every case, not only of failing ones")
	fs.DurationVar(&timeout, "timeout", 10*time.Minute, "give up after `DURATION`, naming the cases still running (exit 1)")
	return func(ctx context.Context, args []string) error {
		if len(args) > 0 {
			return usageErr("unexpected argument %q", args[0])
		}
		if timeout <= 0 {
			return usageErr("--timeout must be positive, got %s", timeout)
		}
		if parallel < 1 {
			return usageErr("--parallel must be at least 1, got %d", parallel)
		}
		var filter *regexp.Regexp
		if runExpr != "" {
			var err error
			if filter, err = regexp.Compile(runExpr); err != nil {
				return usageErr("--run: %v", err)
			}
		}
		var cases []conformance.Case
		for _, c := range conformance.Cases() {
			if filter == nil || filter.MatchString(c.Name) {
				cases = append(cases, c)
			}
		}
		if len(cases) == 0 {
			return usageErr("no conformance case matches --run %q", runExpr)
		}
		cfg, finish, err := checkConfig(ctx, &db)
		if err != nil {
			return err
		}
		cfg.Short = !full
		tracked := trackDatabases(&cfg)
		passed, failed, skipped, running := runCases(ctx, out, cfg, cases, parallel, verbose, timeout)
		if len(running) > 0 {
			// The hung cases still hold their databases; leave them.
			fmt.Fprintf(out.stdout, "%d passed, %d failed, %d skipped\n", passed, failed+len(running), skipped)
			return &exitError{code: exitFailed, err: fmt.Errorf("timed out after %s; still running: %s", timeout, strings.Join(running, ", "))}
		}
		leftover := finish(tracked())
		fmt.Fprintf(out.stdout, "%d passed, %d failed, %d skipped\n", passed, failed, skipped)
		if leftover != nil {
			return leftover
		}
		if failed > 0 {
			return errFailed
		}
		return nil
	}
}

// checkConfig builds the conformance Config for the flags. finish runs after
// the cases: it removes the temporary SQLite directory, or verifies that
// every PostgreSQL schema the cases made was dropped.
func checkConfig(ctx context.Context, f *dbFlags) (cfg conformance.Config, finish func([]conformance.Database) error, err error) {
	dsn := f.dsnValue()
	if dsn == "" {
		if f.dialect != "" {
			d, err := dialect.Lookup(f.dialect)
			if err != nil {
				return cfg, nil, usageErr("%v", err)
			}
			if d.Name() != "sqlite" {
				return cfg, nil, usageErr("checking dialect %q needs a database: pass --dsn DSN or set $%s", d.Name(), dsnEnv)
			}
		}
		dir, err := os.MkdirTemp("", "sqlease-check-")
		if err != nil {
			return cfg, nil, err
		}
		return conformance.SQLite(dir), func([]conformance.Database) error { return os.RemoveAll(dir) }, nil
	}
	t, err := resolve(dsn, f.dialect)
	if err != nil {
		return cfg, nil, err
	}
	switch t.dialect.Name() {
	case "sqlite":
		// Cases never touch the DSN's file: each gets a new file in a
		// temporary directory next to it.
		dir, err := tempDirNear(t)
		if err != nil {
			return cfg, nil, usageErr("SQLite: cannot create a directory for the check databases: %v", err)
		}
		cfg = conformance.SQLite(dir)
		cfg.Dialect = t.dialect
		return cfg, func([]conformance.Database) error { return os.RemoveAll(dir) }, nil
	case "postgres":
		db, t, err := open(ctx, f, false)
		if err != nil {
			return cfg, nil, err
		}
		db.Close()
		cfg = conformance.Postgres(t.dsn)
		cfg.Dialect = t.dialect
		return cfg, func(dbs []conformance.Database) error { return verifySchemasDropped(t, dbs) }, nil
	}
	return cfg, nil, usageErr("check has no conformance configuration for dialect %q (built in: postgres, sqlite)", t.dialect.Name())
}

// trackDatabases wraps cfg.NewDatabase to remember every database handed to
// a case; the returned function lists them.
func trackDatabases(cfg *conformance.Config) func() []conformance.Database {
	var mu sync.Mutex
	var dbs []conformance.Database
	inner := cfg.NewDatabase
	cfg.NewDatabase = func(ctx context.Context, name string) (conformance.Database, error) {
		d, err := inner(ctx, name)
		if err == nil {
			mu.Lock()
			dbs = append(dbs, d)
			mu.Unlock()
			if newDatabaseHook != nil {
				newDatabaseHook(d)
			}
		}
		return d, err
	}
	return func() []conformance.Database {
		mu.Lock()
		defer mu.Unlock()
		return append([]conformance.Database(nil), dbs...)
	}
}

// verifySchemasDropped checks that no schema a case used is left in the
// database.
func verifySchemasDropped(t target, dbs []conformance.Database) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := sql.Open(t.driver, t.dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	var left []string
	for _, d := range dbs {
		if d.Namespace.Schema == "" {
			continue
		}
		var n int
		q := "SELECT count(*) FROM information_schema.schemata WHERE schema_name = " + t.dialect.Placeholder(1)
		if err := db.QueryRowContext(ctx, q, d.Namespace.Schema).Scan(&n); err != nil {
			return fmt.Errorf("verify that the case schemas were dropped: %w", err)
		}
		if n > 0 {
			left = append(left, d.Namespace.Schema)
		}
	}
	if len(left) > 0 {
		return &exitError{code: exitFailed, err: fmt.Errorf("schemas left behind (drop them by hand): %s", strings.Join(left, ", "))}
	}
	return nil
}

// caseResult is the outcome of one case.
type caseResult struct {
	name    string
	status  string // PASS, FAIL, SKIP
	elapsed time.Duration
	logs    []string
}

// runCases runs cases with at most parallel at once and prints one line per
// case as it ends. When timeout passes first, it returns the names of the
// cases still running (their goroutines cannot be stopped).
func runCases(ctx context.Context, out *output, cfg conformance.Config, cases []conformance.Case, parallel int, verbose bool, timeout time.Duration) (passed, failed, skipped int, running []string) {
	width := 0
	for _, c := range cases {
		width = max(width, len(c.Name))
	}
	// Buffered so that nothing blocks on a runCases that gave up.
	results := make(chan caseResult, len(cases))
	var mu sync.Mutex
	started := map[string]bool{}
	go func() {
		sem := make(chan struct{}, parallel)
		for _, c := range cases {
			sem <- struct{}{}
			mu.Lock()
			started[c.Name] = true
			mu.Unlock()
			go func() {
				defer func() { <-sem }()
				results <- runT(ctx, c.Name, func(t *caseT) { conformance.RunCase(t, cfg, c) })
			}()
		}
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for range cases {
		var r caseResult
		select {
		case r = <-results:
		case <-timer.C:
			mu.Lock()
			defer mu.Unlock()
			for _, c := range cases {
				if started[c.Name] {
					running = append(running, c.Name)
				}
			}
			return passed, failed, skipped, running
		}
		mu.Lock()
		delete(started, r.name)
		mu.Unlock()
		fmt.Fprintf(out.stdout, "%-*s  %s  %.2fs\n", width, r.name, r.status, r.elapsed.Seconds())
		switch r.status {
		case "PASS":
			passed++
		case "FAIL":
			failed++
		case "SKIP":
			skipped++
		}
		if r.status != "PASS" || verbose {
			for _, line := range r.logs {
				fmt.Fprintf(out.stdout, "    %s\n", line)
			}
		}
	}
	return passed, failed, skipped, nil
}

// runT runs body as the case called name on its own goroutine, then the
// case's cleanups (last registered first), and reports the outcome.
func runT(ctx context.Context, name string, body func(*caseT)) caseResult {
	cctx, cancel := context.WithCancel(ctx)
	t := &caseT{name: name, ctx: cctx}
	start := time.Now()
	t.protect(func() { body(t) })
	// As with testing, the context ends just before the cleanups run.
	cancel()
	for {
		t.mu.Lock()
		n := len(t.cleanups)
		if n == 0 {
			t.done = true
			t.mu.Unlock()
			break
		}
		f := t.cleanups[n-1]
		t.cleanups = t.cleanups[:n-1]
		t.mu.Unlock()
		t.protect(f)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	status := "PASS"
	switch {
	case t.failed:
		status = "FAIL"
	case t.skipped:
		status = "SKIP"
	}
	return caseResult{name: name, status: status, elapsed: time.Since(start), logs: t.logs}
}

// caseT is the conformance.T of one case run by sqlease check. Like
// *testing.T, Fatalf and Skipf end the calling goroutine (runtime.Goexit),
// Context ends when the case ends, and Cleanup functions run last-first
// after the case, even when it stopped early.
type caseT struct {
	name string
	ctx  context.Context

	mu       sync.Mutex
	logs     []string
	failed   bool
	skipped  bool
	done     bool
	cleanups []func()
}

var _ conformance.T = (*caseT)(nil)

// protect runs f on a new goroutine and waits for it: a Goexit (Fatalf,
// Skipf) ends only that goroutine, and a panic fails the case.
func (t *caseT) protect(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("panic: %v\n%s", r, debug.Stack())
			}
		}()
		f()
	}()
	<-done
}

// Helper does nothing: log lines carry no file:line.
func (t *caseT) Helper() {}

// Name returns the case's name.
func (t *caseT) Name() string { return t.name }

func (t *caseT) log(s string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return
	}
	for _, line := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		t.logs = append(t.logs, line)
	}
}

// Logf records a log line, printed when the case fails or with --verbose.
func (t *caseT) Logf(format string, args ...any) { t.log(fmt.Sprintf(format, args...)) }

// Errorf records a log line and marks the case failed.
func (t *caseT) Errorf(format string, args ...any) {
	t.log(fmt.Sprintf(format, args...))
	t.mu.Lock()
	t.failed = true
	t.mu.Unlock()
}

// Fatalf is Errorf followed by runtime.Goexit.
func (t *caseT) Fatalf(format string, args ...any) {
	t.Errorf(format, args...)
	runtime.Goexit()
}

// Skipf records the reason, marks the case skipped and calls runtime.Goexit.
func (t *caseT) Skipf(format string, args ...any) {
	t.log("skipped: " + fmt.Sprintf(format, args...))
	t.mu.Lock()
	t.skipped = true
	t.mu.Unlock()
	runtime.Goexit()
}

// Cleanup registers f to run after the case, last registered first.
func (t *caseT) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}

// Failed reports whether the case has failed.
func (t *caseT) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed
}

// Context is cancelled when the case ends, before its cleanups run.
func (t *caseT) Context() context.Context { return t.ctx }
