// Package conformance is the executable form of sqlease's behavioural
// contract (docs/contract.md): every rule has cases named after it (S1_..., H2_...),
// and every case runs against any dialect.
//
// Run it from a dialect's tests; the configurations of the built-in dialects
// are in package conformance/conftest:
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, conftest.SQLite(t.TempDir()))
//	}
//
// A third-party dialect needs only a Config: its dialect, its database/sql
// driver name, and a function that prepares an empty, isolated database per
// case. This package imports no driver and registers nothing. Cases are
// skipped only by the dialect's declared capabilities, with the reason,
// never by its name. The same cases run outside go test through RunCase
// with any T (the sqlease check command does this).
//
// # Reading the cases
//
// The files follow the sections of docs/contract.md: safety*.go (S1-S7),
// holder_*.go (the holder's view, H1-H10, one file per area: renewal,
// acquire, release, deadline, hold, force), waiting*.go (W1-W7), fence*.go
// (F1, F2), storage_*.go (D1-D3) and input.go (I1); lead*.go holds the
// leader-election cases, and stress.go the child processes and stress
// workers that several sections share. A case checks in one line each:
// Env.Must and Env.CheckErr for an error (stop, or go on), Env.Require and
// Env.Check for a condition, Env.MustTryAcquire and Env.MustAcquire for a
// lease the case needs. Cases of one shape are rows of a table
// (f1FenceCases, f2StaleCases).
//
// # Child processes
//
// Multi-process cases re-run the test binary: the child process enters the
// same test function, and Run (or ChildMain) does the child's work and
// exits. Set-up that must not run in a child (creating a database, reading
// a DSN that may be missing) goes after an IsChild() check:
//
//	if conformance.IsChild() {
//		conformance.Run(t, conformance.Config{})
//	}
//
// # What cases assume of a dialect
//
// Cases use the lock tables only through the engine, except for the column
// contract of the {holders} table: it has a column lease_id (the lease ID,
// text) and a column token (the lease's fencing token, an integer). Cases
// delete a lease's row (DELETE FROM {holders} WHERE lease_id = ?), which
// must end the lease as a takeover would, rows that depend on it included
// (use ON DELETE CASCADE for a separate expiry table); and they set token to
// another value (UPDATE {holders} SET token = ? WHERE lease_id = ?), after
// which the lease's (lease ID, token) must no longer match. Tables the cases
// create for themselves use portable SQL only: INTEGER, BIGINT, VARCHAR(100)
// and TEXT columns, INSERT, UPDATE without RETURNING, each placeholder bound
// once, SELECT, DELETE. Optional interfaces let a dialect help where SQL
// cannot be portable: LockInspector (watching lock waits) and
// TransientErrorer (an error value to inject).
package conformance

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/internal/faultdb"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// T is what a case needs from its runner; *testing.T satisfies it. Fatalf
// and Skipf must stop the case's goroutine (runtime.Goexit), as testing does.
type T interface {
	Helper()
	Name() string
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
	Cleanup(func())
	Failed() bool
	Context() context.Context
}

// Database is one isolated database prepared for one case.
type Database struct {
	// DSN opens it with Config.DriverName (also from a child process).
	DSN string
	// Namespace places the lock tables: a fresh schema per case, or a
	// schema cases share with a prefix per case (conftest.InSchema). Cases
	// put every table they create under this prefix (Env.Table,
	// Env.SubNamespace), so a Cleanup may remove what starts with it.
	Namespace dialect.Namespace
	// Cleanup removes it after the case; may be nil.
	Cleanup func()
}

// Config says how to run the suite against one dialect.
type Config struct {
	// Dialect under test.
	Dialect dialect.Dialect
	// DriverName is the database/sql driver name to open DSNs with
	// ("pgx", "sqlite3"); the driver must be registered.
	DriverName string
	// NewDatabase prepares an empty, isolated database for the case name:
	// one of its own, or a schema shared with other cases and tables under
	// a table prefix of the case's own (Database.Namespace).
	NewDatabase func(ctx context.Context, caseName string) (Database, error)
	// NewLocker builds a Locker; nil means lock.New. Adapters (bunlock,
	// sqlxlock) plug their constructor in here to run cases through it
	// (RunCases with conftest.AdapterSmoke).
	NewLocker func(ctx context.Context, db *sql.DB, d dialect.Dialect, opts ...lock.Option) (*lock.Locker, error)
	// Short shortens stress cases (seconds instead of many seconds).
	Short bool
	// IsolationDSN returns a DSN for the case's database dsn whose sessions
	// default to the transaction isolation level iso, for the S6 cases
	// (every rule holds whatever the default level). It returns an error
	// matching errors.ErrUnsupported when the database cannot default to
	// iso; nil means no level can be set. Either way the case is skipped
	// with the reason.
	IsolationDSN func(dsn string, iso sql.IsolationLevel) (string, error)
}

// Case is one named behavioural test of a SPEC rule.
type Case struct {
	// Name starts with the rule, e.g. "S3_TokensIncreasePerKey".
	Name string
	// Rule is the SPEC rule it proves ("S3").
	Rule string
	// Needs lists capabilities the case requires; without them it is
	// skipped with a reason.
	Needs dialect.Capabilities
	// Run runs the case.
	Run func(e *Env)
}

var (
	regMu    sync.Mutex
	registry []Case
)

func register(cs ...Case) {
	regMu.Lock()
	defer regMu.Unlock()
	registry = append(registry, cs...)
}

// Cases returns every case, sorted by name.
func Cases() []Case {
	regMu.Lock()
	defer regMu.Unlock()
	out := slices.Clone(registry)
	slices.SortFunc(out, func(a, b Case) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Run runs every case as a parallel subtest of t. When the process is a
// child started by a multi-process case, Run does the child's work and
// exits instead.
func Run(t *testing.T, cfg Config) {
	t.Helper()
	if IsChild() {
		os.Exit(ChildMain())
	}
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range Cases() {
		t.Run(c.Name, func(t *testing.T) {
			t.Parallel()
			RunCase(t, cfg, c)
		})
	}
}

// RunCases is Run for the named cases only (exact names, as Cases lists
// them), for tests that need a few cases rather than the suite: adapters
// that change only how a Locker is built, say. A name that matches no case
// fails t, so a renamed case cannot silently drop out of such a list.
func RunCases(t *testing.T, cfg Config, names ...string) {
	t.Helper()
	if IsChild() {
		os.Exit(ChildMain())
	}
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	byName := make(map[string]Case)
	for _, c := range Cases() {
		byName[c.Name] = c
	}
	for _, n := range names {
		c, ok := byName[n]
		if !ok {
			t.Errorf("conformance: no case named %q", n)
			continue
		}
		t.Run(c.Name, func(t *testing.T) {
			t.Parallel()
			RunCase(t, cfg, c)
		})
	}
}

func (cfg Config) validate() error {
	if cfg.Dialect == nil || cfg.DriverName == "" || cfg.NewDatabase == nil {
		return fmt.Errorf("conformance: Config needs Dialect, DriverName and NewDatabase")
	}
	return nil
}

// RunCase runs one case with t: it checks capabilities, prepares the
// database (migrated), runs the case and cleans up.
func RunCase(t T, cfg Config, c Case) {
	t.Helper()
	if err := cfg.validate(); err != nil {
		t.Fatalf("%v", err)
	}
	if missing := c.Needs &^ dialect.CapabilitiesOf(cfg.Dialect); missing != 0 {
		t.Skipf("dialect %q lacks capability %s", cfg.Dialect.Name(), missing)
	}
	e := newEnv(t, cfg, c)
	c.Run(e)
}

// Env is what a case works with: a migrated, isolated database reached
// through a fault injector, and helpers.
type Env struct {
	T       T
	Config  Config
	Dialect dialect.Dialect
	// DB reaches the case's database through Faults.
	DB *sql.DB
	// Faults injects delays and errors into DB's statements.
	Faults *faultdb.Injector
	// DSN and Namespace locate the database.
	DSN       string
	Namespace dialect.Namespace
	// Logger writes to the case's log while the case runs.
	Logger *slog.Logger

	mu   sync.Mutex
	done bool
	// gooseBefore: goose's own version table (goose_db_version) was in
	// the case's schema before the case migrated (a shared schema).
	gooseBefore bool
}

func newEnv(t T, cfg Config, c Case) *Env {
	t.Helper()
	ctx := t.Context()
	db0, err := cfg.NewDatabase(ctx, c.Name)
	if err != nil {
		t.Fatalf("prepare database: %v", err)
	}
	if db0.Cleanup != nil {
		t.Cleanup(db0.Cleanup)
	}
	e := &Env{T: t, Config: cfg, Dialect: cfg.Dialect, DSN: db0.DSN, Namespace: db0.Namespace, Faults: faultdb.New()}
	e.Logger = slog.New(slog.NewTextHandler(&caseLog{e: e}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	raw, err := sql.Open(cfg.DriverName, db0.DSN)
	if err != nil {
		t.Fatalf("open %s: %v", cfg.DriverName, err)
	}
	conn, err := faultdb.DSNConnector(raw.Driver(), db0.DSN)
	_ = raw.Close()
	if err != nil {
		t.Fatalf("connector: %v", err)
	}
	e.DB = sql.OpenDB(e.Faults.Connector(conn))
	// Bounded pools: cases run in parallel, and several packages run the
	// suite against one server at once.
	e.DB.SetMaxOpenConns(12)
	e.DB.SetMaxIdleConns(12)
	t.Cleanup(func() {
		e.mu.Lock()
		e.done = true
		e.mu.Unlock()
		e.Faults.Reset()
		_ = e.DB.Close()
	})
	goose := dialect.Namespace{Schema: e.Namespace.Schema, Prefix: "goose_"}
	if rows, err := e.DB.QueryContext(ctx, "SELECT 1 FROM "+goose.Object(cfg.Dialect, "db_version")+" WHERE 1 = 0"); err == nil {
		rows.Close()
		e.gooseBefore = true
	}
	if _, err := migrate.Up(ctx, e.DB, cfg.Dialect, migrate.WithNamespace(e.Namespace)); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return e
}

type caseLog struct{ e *Env }

func (w *caseLog) Write(p []byte) (int, error) {
	w.e.mu.Lock()
	defer w.e.mu.Unlock()
	if !w.e.done {
		w.e.T.Logf("%s", strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// Must fails the case at once (Fatalf) when err is not nil, with the
// message format (args as in Printf) followed by ": " and err; an empty
// format prints err alone. It is a case's one-line check of a step that
// must succeed for the rest of the case to mean anything.
func (e *Env) Must(err error, format string, args ...any) {
	e.T.Helper()
	if err == nil {
		return
	}
	if format == "" {
		e.T.Fatalf("%v", err)
	}
	e.T.Fatalf(format+": %v", append(args, err)...)
}

// CheckErr records a failure (Errorf, the case goes on) when err is not
// nil, with the message format (args as in Printf) followed by ": " and
// err; an empty format prints err alone.
func (e *Env) CheckErr(err error, format string, args ...any) {
	e.T.Helper()
	if err == nil {
		return
	}
	if format == "" {
		e.T.Errorf("%v", err)
		return
	}
	e.T.Errorf(format+": %v", append(args, err)...)
}

// Check records a failure (Errorf, the case goes on) unless ok; format and
// args say what was wrong.
func (e *Env) Check(ok bool, format string, args ...any) {
	e.T.Helper()
	if !ok {
		e.T.Errorf(format, args...)
	}
}

// Require fails the case at once (Fatalf) unless ok; format and args say
// what was wrong.
func (e *Env) Require(ok bool, format string, args ...any) {
	e.T.Helper()
	if !ok {
		e.T.Fatalf(format, args...)
	}
}

// Ctx returns the case's context.
func (e *Env) Ctx() context.Context { return e.T.Context() }

// LockerOptions returns the options that place a Locker in the case's
// namespace and log to the case, followed by opts.
func (e *Env) LockerOptions(opts ...lock.Option) []lock.Option {
	base := []lock.Option{lock.WithSchema(e.Namespace.Schema), lock.WithTablePrefix(e.Namespace.Prefix), lock.WithLogger(e.Logger)}
	return append(base, opts...)
}

// NewLocker builds a Locker on db (nil: e.DB) in the case's namespace, with
// the Config's constructor; it fails the case on error and closes the
// Locker at cleanup.
func (e *Env) NewLocker(db *sql.DB, opts ...lock.Option) *lock.Locker {
	e.T.Helper()
	l, err := e.TryNewLocker(db, opts...)
	if err != nil {
		e.T.Fatalf("new locker: %v", err)
	}
	e.T.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = l.Close(ctx)
	})
	return l
}

// TryNewLocker is NewLocker returning the error.
func (e *Env) TryNewLocker(db *sql.DB, opts ...lock.Option) (*lock.Locker, error) {
	if db == nil {
		db = e.DB
	}
	newLocker := e.Config.NewLocker
	if newLocker == nil {
		newLocker = lock.New
	}
	return newLocker(e.Ctx(), db, e.Dialect, e.LockerOptions(opts...)...)
}

// OpenDB opens another pool to the case's database, without faults; it is
// closed at cleanup.
func (e *Env) OpenDB() *sql.DB {
	e.T.Helper()
	db, err := sql.Open(e.Config.DriverName, e.DSN)
	if err != nil {
		e.T.Fatalf("open: %v", err)
	}
	db.SetMaxOpenConns(8)
	db.SetMaxIdleConns(8)
	e.T.Cleanup(func() { _ = db.Close() })
	return db
}

// Table returns the quoted name of a case-owned table called name (not a
// lock table) in the case's schema, e.g. for a log table: the case's
// prefix (SubNamespace), then "case_", then name.
func (e *Env) Table(name string) string {
	return e.SubNamespace("case_").Object(e.Dialect, name)
}

// SubNamespace returns a namespace of the case's own other than its lock
// tables' (an unmigrated one, say): the case's schema, and its prefix
// followed by prefix. Cases derive every other namespace they use from
// theirs, so that cases sharing one schema (Database.Namespace with a
// prefix per case) never meet, and removing everything under the case's
// prefix cleans up after it. With the case's prefix left empty (the
// default prefix), the prefix is prefix itself.
func (e *Env) SubNamespace(prefix string) dialect.Namespace {
	return dialect.Namespace{Schema: e.Namespace.Schema, Prefix: e.Namespace.Prefix + prefix}
}

// Go runs f in a goroutine; Wait waits for all of them. Use it instead of
// bare goroutines so a case never ends while one still runs.
func (e *Env) Go(wg *sync.WaitGroup, f func()) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		f()
	}()
}

// MustTryAcquire is l.TryAcquire on the case's context; it fails the case at
// once unless the lease is granted.
func (e *Env) MustTryAcquire(l *lock.Locker, key string, mode lock.Mode, opts ...lock.AcquireOption) *lock.Lease {
	e.T.Helper()
	le, err := l.TryAcquire(e.Ctx(), key, mode, opts...)
	e.Must(err, "try acquire %q (%s) as %q", key, mode, l.Owner())
	return le
}

// MustAcquire is l.Acquire on the case's context (waiting as opts say); it
// fails the case at once unless the lease is granted.
func (e *Env) MustAcquire(l *lock.Locker, key string, mode lock.Mode, opts ...lock.AcquireOption) *lock.Lease {
	e.T.Helper()
	le, err := l.Acquire(e.Ctx(), key, mode, opts...)
	e.Must(err, "acquire %q (%s) as %q", key, mode, l.Owner())
	return le
}

// holders returns the lease rows of the keys starting with prefix (all
// modes, live or not), failing the case on error.
func holders(e *Env, l *lock.Locker, prefix string) []lock.Holder {
	e.T.Helper()
	hs, _, err := l.Holders(e.Ctx(), prefix)
	e.Must(err, "holders %q", prefix)
	return hs
}

// Eventually polls cond every 5ms until it is true or timeout passes.
func Eventually(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

var _ = runtime.Goexit

var discard = slog.New(slog.DiscardHandler)
