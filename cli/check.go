package cli

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"regexp"
	"runtime"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/conformance/conftest"
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
		asJSON   bool
		timeout  time.Duration
		schema   string
	)
	fs.StringVar(&db.dsn, "dsn", "", "database `DSN` (default $"+dsnEnv+"; unset: a fresh embedded SQLite file in a temporary directory)")
	fs.StringVar(&db.dialect, "dialect", "", "dialect `NAME` ("+backendNames()+"); default: inferred from the DSN")
	fs.StringVar(&runExpr, "run", "", "run only the cases whose name matches `REGEXP` (e.g. 'S1_|S3_')")
	fs.BoolVar(&full, "full", false, "run the stress and churn cases at full length (several minutes; default: seconds)")
	fs.IntVar(&parallel, "parallel", 4, "run at most `N` cases at once")
	fs.BoolVar(&verbose, "verbose", false, "print the log of every case, not only of failing ones")
	fs.DurationVar(&timeout, "timeout", 10*time.Minute, "give up after `DURATION`, naming the cases still running (exit 1)")
	fs.BoolVar(&asJSON, "json", false, "print one JSON object with every case and the summary instead of text")
	fs.Func("schema", "run every case in the existing `SCHEMA` (MySQL: database) under a table prefix of its own, instead of in a fresh schema per case (see above)", func(v string) error {
		if v == "" {
			return errors.New("empty; omit --schema for a fresh schema per case, or name an existing one")
		}
		schema = v
		return nil
	})
	return func(ctx context.Context, args []string) error {
		if err := noArgs(args); err != nil {
			return err
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
		cfg, finish, err := checkConfig(ctx, &db, schema)
		if err != nil {
			return err
		}
		cfg.Short = !full
		tracked, inUse := trackDatabases(&cfg)
		var rep checkJSON
		rep.Dialect = cfg.Dialect.Name()
		rep.Cases = []caseJSON{}
		rule := ""
		_, running := runCases(ctx, cfg, cases, parallel, timeout, func(r caseResult) {
			rep.count(r.status)
			msg := ""
			if r.status != "PASS" || verbose {
				msg = strings.Join(r.logs, "\n")
			}
			rep.Cases = append(rep.Cases, caseJSON{Name: r.name, Rule: r.rule, Result: r.status, DurationMS: ms(r.elapsed), Message: msg})
			if asJSON {
				return
			}
			if r.rule != rule {
				rule = r.rule
				fmt.Fprintf(out.stdout, "%s\n", ruleHeader(rule))
			}
			printResult(out, r, width(cases), verbose)
		})
		rep.Summary.Failed += len(running)
		rep.Running = append([]string{}, running...)
		var errs []error
		if len(running) > 0 {
			// The hung cases still hold their databases; leave them.
			errs = append(errs, &exitError{code: exitFailed, err: timedOut(cfg.Dialect.Name(), timeout, running, inUse())})
		} else if leftover := finish(tracked()); leftover != nil {
			errs = append(errs, leftover)
		}
		if asJSON {
			if err := writeJSON(out.stdout, rep); err != nil {
				return err
			}
		} else {
			fmt.Fprintf(out.stdout, "%d passed, %d failed, %d skipped\n", rep.Summary.Passed, rep.Summary.Failed, rep.Summary.Skipped)
		}
		if len(errs) > 0 {
			return errs[0]
		}
		if rep.Summary.Failed > 0 {
			return errFailed
		}
		return nil
	}
}

// checkJSON is the object `sqlease check --json` prints.
type checkJSON struct {
	Dialect string     `json:"dialect"`
	Cases   []caseJSON `json:"cases"` // sorted and grouped by rule, as printed
	Summary struct {
		Passed  int `json:"passed"`
		Failed  int `json:"failed"` // including cases still running at --timeout
		Skipped int `json:"skipped"`
	} `json:"summary"`
	Running []string `json:"running"` // cases still running when --timeout passed
}

// caseJSON is one case of `sqlease check --json`.
type caseJSON struct {
	Name       string  `json:"name"`
	Rule       string  `json:"rule"`
	Result     string  `json:"result"` // PASS, FAIL or SKIP
	DurationMS float64 `json:"duration_ms"`
	Message    string  `json:"message"` // the case's log: failures and skip reasons ("" for a pass without --verbose)
}

func (c *checkJSON) count(status string) {
	switch status {
	case "PASS":
		c.Summary.Passed++
	case "FAIL":
		c.Summary.Failed++
	case "SKIP":
		c.Summary.Skipped++
	}
}

// width is the length of the longest case name.
func width(cases []conformance.Case) int {
	w := 0
	for _, c := range cases {
		w = max(w, len(c.Name))
	}
	return w
}

// ruleHeader is the line printed before the cases of a rule: "== S1".
func ruleHeader(rule string) string {
	if rule == "" {
		rule = "(no rule)"
	}
	return "== " + rule
}

// printResult prints one case's line, and its log when it did not pass or
// with verbose.
func printResult(out *output, r caseResult, width int, verbose bool) {
	fmt.Fprintf(out.stdout, "%-*s  %s  %.2fs\n", width, r.name, r.status, r.elapsed.Seconds())
	if r.status != "PASS" || verbose {
		for _, line := range r.logs {
			fmt.Fprintf(out.stdout, "    %s\n", line)
		}
	}
}

// ruleFamilies orders the rule families as docs/contract.md does.
const ruleFamilies = "SHWFDI"

// ruleLess orders rules by family (S, H, W, F, D, I, then any other letter
// alphabetically), then by number: S1, S2, ..., S10, H1, ...
func ruleLess(a, b string) bool {
	fa, na, ra := splitRule(a)
	fb, nb, rb := splitRule(b)
	if fa != fb {
		return fa < fb
	}
	if na != nb {
		return na < nb
	}
	return ra < rb
}

// splitRule returns a rule's family rank, its number and the rule itself
// (for any other ordering).
func splitRule(r string) (family, number int, rest string) {
	if r == "" {
		return 1 << 20, 0, r
	}
	family = strings.IndexByte(ruleFamilies, r[0])
	if family < 0 {
		family = len(ruleFamilies) + int(r[0])
	}
	digits := strings.TrimLeft(r[1:], "0123456789")
	n, err := strconv.Atoi(r[1 : len(r)-len(digits)])
	if err != nil {
		n = 1 << 20
	}
	return family, n, r
}

// sortCases orders cases by rule, then by name.
func sortCases(cases []conformance.Case) []conformance.Case {
	out := append([]conformance.Case(nil), cases...)
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Rule != out[j].Rule {
			return ruleLess(out[i].Rule, out[j].Rule)
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// checkMore is the help of check past its summary.
const checkMore = `Each case gets a database of its own, removed after it: without a DSN a
fresh embedded SQLite file; on PostgreSQL a fresh schema (the role needs
CREATE on the database); on MySQL/MariaDB a fresh database (CREATE
DATABASE). With --schema NAME every case runs instead in that existing
schema (MySQL: database), which the role needs only to create tables and
routines in, under a fresh table prefix of its own ("t" and 8 hex digits
and "_"): cases never see each other's tables, and after each case
everything under its prefix is dropped (migrate.Drop, then the tables the
case made); the schema and whatever else it holds are left alone. check
fails when anything under a case's prefix is left. SQLite has no schemas.`

// checkConfig builds the conformance Config for the flags from the
// registered Backend of the database; with schema (--schema), every case
// runs in that schema under a prefix of its own (conftest.InSchema).
// finish runs after the cases: it runs the backend's cleanup (a temporary
// SQLite directory), then verifies that every schema the cases made was
// dropped, or with schema that nothing is left under their prefixes.
func checkConfig(ctx context.Context, f *dbFlags, schema string) (cfg conformance.Config, finish func([]conformance.Database) error, err error) {
	var t target
	if dsn := f.dsnValue(); dsn == "" {
		// No database: the embedded backend, in a temporary directory.
		for _, b := range backendList() {
			if b.Embedded && b.Check != nil && (f.dialect == "" || f.dialect == b.Dialect) {
				t.backend = b
				break
			}
		}
		if t.backend.Dialect == "" {
			if f.dialect != "" {
				if _, err := dialectBackend(f.dialect); err != nil {
					return cfg, nil, err
				}
				return cfg, nil, usageErr("checking dialect %q needs a database: pass --dsn DSN or set $%s", f.dialect, dsnEnv)
			}
			return cfg, nil, usageErr("no database: pass --dsn DSN or set $%s", dsnEnv)
		}
		if t.dialect, err = dialect.Lookup(t.backend.Dialect); err != nil {
			return cfg, nil, usageErr("%v", err)
		}
		t.driver = t.backend.Driver
		if err := checkSchemaFlag(t, schema); err != nil {
			return cfg, nil, err
		}
	} else {
		if t, err = resolve(dsn, f.dialect); err != nil {
			return cfg, nil, err
		}
		if err := checkSchemaFlag(t, schema); err != nil {
			return cfg, nil, err
		}
		if t.backend.Check == nil {
			return cfg, nil, usageErr("check has no conformance configuration for dialect %q (its backend sets no Check)", t.dialect.Name())
		}
		if t.file == "" {
			// A server: it must be reachable, and --schema must exist.
			db, _, err := open(ctx, f, false)
			if err != nil {
				return cfg, nil, err
			}
			err = schemaExists(ctx, db, t, schema)
			db.Close()
			if err != nil {
				return cfg, nil, err
			}
		}
	}
	cfg, cleanup, err := t.backend.Check(ctx, t.dsn, t.file)
	if err != nil {
		return cfg, nil, usageErr("%s: %v", t.dialect.Name(), err)
	}
	cfg.Dialect = t.dialect
	if schema != "" {
		cfg = conftest.InSchema(cfg, t.dsn, schema)
	}
	return cfg, func(dbs []conformance.Database) error {
		var errs []error
		if cleanup != nil {
			errs = append(errs, cleanup())
		}
		switch {
		case schema != "":
			errs = append(errs, verifyPrefixesDropped(t, schema, dbs))
		case t.dsn != "" && t.file == "":
			errs = append(errs, verifySchemasDropped(t, dbs))
		}
		return errors.Join(errs...)
	}, nil
}

// checkSchemaFlag refuses a --schema that the dialect cannot have (no
// schemas: SQLite) or that is not a valid or allowed schema name.
func checkSchemaFlag(t target, schema string) error {
	if schema == "" {
		return nil
	}
	if !t.dialect.Capabilities().Has(dialect.CapSchemas) {
		return usageErr("invalid --schema %q: %s databases have no schemas; omit --schema (check gives every case a database file of its own)",
			schema, t.dialect.Name())
	}
	if err := (dialect.Namespace{Schema: schema}).Validate(t.dialect); err != nil {
		return inputUsageErr(err)
	}
	return nil
}

// schemaExists refuses a --schema the database does not have: check
// creates no schema with --schema (migrate.Up would), so that it needs no
// right to and leaves none behind.
func schemaExists(ctx context.Context, db *sql.DB, t target, schema string) error {
	if schema == "" {
		return nil
	}
	var n int
	q := "SELECT count(*) FROM information_schema.schemata WHERE schema_name = " + t.dialect.Placeholder(1)
	if err := db.QueryRowContext(ctx, q, schema).Scan(&n); err != nil {
		return usageErr("--schema %q: cannot tell whether the %s database %s has it: %s", schema, t.dialect.Name(), t.where(), scrubSecrets(err.Error(), t.dsn))
	}
	if n == 0 {
		return usageErr("invalid --schema %q: no such %s in the %s database %s, or none the role may use; create it first or grant the role its use (check creates none), or name an existing one",
			schema, schemaWord(t.dialect.Name()), t.dialect.Name(), t.where())
	}
	return nil
}

// verifyPrefixesDropped checks that nothing is left under the prefix of
// any case in schema (conftest.Leftovers).
func verifyPrefixesDropped(t target, schema string, dbs []conformance.Database) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var nss []dialect.Namespace
	for _, d := range dbs {
		nss = append(nss, d.Namespace)
	}
	left, err := conftest.Leftovers(ctx, t.driver, t.dsn, t.dialect, schema, nss)
	if err != nil {
		return fmt.Errorf("verify that the cases' tables were dropped: %w", err)
	}
	if len(left) > 0 {
		return &exitError{code: exitFailed, err: fmt.Errorf("tables or routines of the cases left behind in schema %s (drop them by hand): %s", schema, strings.Join(left, ", "))}
	}
	return nil
}

// trackDatabases wraps cfg.NewDatabase to remember every database handed to
// a case. all lists them; inUse lists those whose Cleanup has not run yet
// (a hung case's, at --timeout).
func trackDatabases(cfg *conformance.Config) (all, inUse func() []conformance.Database) {
	var mu sync.Mutex
	var dbs []conformance.Database
	cleaned := map[int]bool{}
	inner := cfg.NewDatabase
	cfg.NewDatabase = func(ctx context.Context, name string) (conformance.Database, error) {
		d, err := inner(ctx, name)
		if err != nil {
			return d, err
		}
		mu.Lock()
		i := len(dbs)
		dbs = append(dbs, d)
		mu.Unlock()
		cleanup := d.Cleanup
		d.Cleanup = func() {
			if cleanup != nil {
				cleanup()
			}
			mu.Lock()
			cleaned[i] = true
			mu.Unlock()
		}
		if newDatabaseHook != nil {
			newDatabaseHook(d)
		}
		return d, nil
	}
	list := func(keep func(i int) bool) []conformance.Database {
		mu.Lock()
		defer mu.Unlock()
		var out []conformance.Database
		for i, d := range dbs {
			if keep(i) {
				out = append(out, d)
			}
		}
		return out
	}
	all = func() []conformance.Database { return list(func(int) bool { return true }) }
	inUse = func() []conformance.Database { return list(func(i int) bool { return !cleaned[i] }) }
	return all, inUse
}

// timedOut is check's error when --timeout passed with cases running: it
// names them, and where the databases they still hold are.
func timedOut(dialectName string, timeout time.Duration, running []string, inUse []conformance.Database) error {
	err := fmt.Errorf("timed out after %s; still running: %s", timeout, strings.Join(running, ", "))
	if len(inUse) > 0 {
		err = fmt.Errorf("%w; their lock tables are left behind, drop them by hand once they stop: %s", err, describeNamespaces(dialectName, inUse))
	}
	return err
}

// describeNamespaces names where dbs keep their lock tables, for a message
// that asks the user to drop them.
func describeNamespaces(dialectName string, dbs []conformance.Database) string {
	word := schemaWord(dialectName)
	var out []string
	for _, d := range dbs {
		switch ns := d.Namespace; {
		case ns.Schema != "" && ns.Prefix != "":
			out = append(out, fmt.Sprintf("%s %q, prefix %q", word, ns.Schema, ns.Prefix))
		case ns.Schema != "":
			out = append(out, fmt.Sprintf("%s %q", word, ns.Schema))
		case ns.Prefix != "":
			out = append(out, fmt.Sprintf("prefix %q", ns.Prefix))
		default: // a database of its own (SQLite: a file, with its -wal and -shm files)
			out = append(out, fmt.Sprintf("database %q", scrubSecrets(d.DSN, d.DSN)))
		}
	}
	return strings.Join(out, "; ")
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
		// information_schema.schemata is standard SQL (PostgreSQL, MySQL);
		// where it is missing, the namespace's version table must be gone.
		var n int
		q := "SELECT count(*) FROM information_schema.schemata WHERE schema_name = " + t.dialect.Placeholder(1)
		if err := db.QueryRowContext(ctx, q, d.Namespace.Schema).Scan(&n); err != nil {
			rows, perr := db.QueryContext(ctx, "SELECT 1 FROM "+d.Namespace.Object(t.dialect, "db_version")+" WHERE 1 = 0")
			switch {
			case perr == nil:
				rows.Close()
				n = 1
			case t.dialect.Classify(perr) != dialect.ErrorUndefinedTable:
				return fmt.Errorf("verify that the case schemas were dropped: %w", errors.Join(err, perr))
			}
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
	rule    string
	status  string // PASS, FAIL, SKIP
	elapsed time.Duration
	logs    []string
}

// runCases runs cases sorted by rule (sortCases), at most parallel at
// once, and calls emit with each result in that order as soon as it and
// every case before it have ended, so the output is sorted yet streams.
// When timeout passes first, it emits the ended cases before the first
// one still running, skips the rest, and returns the names of the cases
// still running (their goroutines cannot be stopped). It returns every
// result emitted.
func runCases(ctx context.Context, cfg conformance.Config, cases []conformance.Case, parallel int, timeout time.Duration, emit func(caseResult)) (emitted []caseResult, running []string) {
	cases = sortCases(cases)
	// Buffered so that nothing blocks on a runCases that gave up.
	type indexed struct {
		i int
		r caseResult
	}
	results := make(chan indexed, len(cases))
	var mu sync.Mutex
	started := map[string]bool{}
	go func() {
		sem := make(chan struct{}, parallel)
		for i, c := range cases {
			sem <- struct{}{}
			mu.Lock()
			started[c.Name] = true
			mu.Unlock()
			go func() {
				defer func() { <-sem }()
				r := runT(ctx, c.Name, func(t *caseT) { conformance.RunCase(t, cfg, c) })
				r.rule = c.Rule
				results <- indexed{i, r}
			}()
		}
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	done := make([]*caseResult, len(cases))
	next := 0
	flush := func() {
		for next < len(cases) && done[next] != nil {
			emit(*done[next])
			emitted = append(emitted, *done[next])
			next++
		}
	}
	for range cases {
		select {
		case x := <-results:
			mu.Lock()
			delete(started, x.r.name)
			mu.Unlock()
			done[x.i] = &x.r
			flush()
		case <-timer.C:
			mu.Lock()
			defer mu.Unlock()
			for _, c := range cases {
				if started[c.Name] {
					running = append(running, c.Name)
				}
			}
			// Emit what ended, in order, skipping the running cases.
			for i := next; i < len(cases); i++ {
				if done[i] != nil {
					emit(*done[i])
					emitted = append(emitted, *done[i])
				}
			}
			return emitted, running
		}
	}
	return emitted, nil
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

// schemaWord is what the dialect calls the namespace --schema names:
// MySQL and MariaDB call it a database.
func schemaWord(dialectName string) string {
	if dialectName == "mysql" {
		return "database"
	}
	return "schema"
}
