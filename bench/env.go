package main

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"   // registers driver "mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // registers driver "pgx"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/mysqldialect"
	"github.com/sqlease/sqlease/dialect/pgdialect"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/internal/faultdb"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// config is the run's settings, from the flags.
type config struct {
	dsn      string // PostgreSQL or MySQL DSN; empty: SQLite temp file
	jsonPath string
	rounds   int
	duration time.Duration
	quick    bool

	// Sizes of single figures (set from quick).
	handoffSamples int           // handoff samples per round and path
	waiterHold     time.Duration // how long the holder holds in the waiter-load figure
	batchLeases    int           // leases held in the batch-renewal figure
	walPolls       int           // failed polls per round in the WAL figure

	// Batch-renewal set-up (flags).
	batchTTL     time.Duration // TTL of the batch's leases
	batchRenewDB bool          // SQLite: renew them through a separate pool

	scale scaleConfig // sizes of the scale figures (fig_scale.go)
}

// env is one prepared database: the lock tables migrated into a fresh
// namespace, and a plain pool.
type env struct {
	cfg     config
	dialect string // "postgres", "mysql" or "sqlite"
	d       dialect.Dialect
	driver  string // database/sql driver name
	dsn     string
	schema  string // PostgreSQL: the fresh schema; MySQL: the fresh database; SQLite: ""
	dir     string // SQLite: the temp directory
	ns      dialect.Namespace
	db      *sql.DB
	quiet   *slog.Logger
	// machine describes where the run happened, for the report header.
	machine string
}

// isPG reports whether the run is on PostgreSQL.
func (e *env) isPG() bool { return e.dialect == pgdialect.Name }

// isMySQL reports whether the run is on MySQL or MariaDB.
func (e *env) isMySQL() bool { return e.dialect == mysqldialect.Name }

// benchDialect returns the dialect and database/sql driver of a dialect
// name (the child processes get the parent's by name).
func benchDialect(name string) (dialect.Dialect, string) {
	switch name {
	case pgdialect.Name:
		return pgdialect.New(), "pgx"
	case mysqldialect.Name:
		return mysqldialect.New(), "mysql"
	}
	return sqlitedialect.New(), sqliteDriver
}

// mysqlDriverDSN returns dsn in go-sql-driver/mysql's form: a mysql:// or
// mariadb:// URL (user:pass@host:port/db?params) is converted, a DSN already
// in the driver's form (user@tcp(host:3306)/db) is kept. ok is false for
// anything else.
func mysqlDriverDSN(dsn string) (string, bool, error) {
	for _, p := range []string{"mysql://", "mariadb://"} {
		if !strings.HasPrefix(dsn, p) {
			continue
		}
		u, err := url.Parse(dsn)
		if err != nil {
			return "", true, err
		}
		cfg, err := mysql.ParseDSN("/?" + u.RawQuery)
		if err != nil {
			return "", true, err
		}
		cfg.Net, cfg.Addr, cfg.DBName = "tcp", u.Host, strings.TrimPrefix(u.Path, "/")
		if u.Port() == "" {
			cfg.Addr += ":3306"
		}
		if u.User != nil {
			cfg.User = u.User.Username()
			cfg.Passwd, _ = u.User.Password()
		}
		return cfg.FormatDSN(), true, nil
	}
	if strings.Contains(dsn, "@tcp(") || strings.Contains(dsn, "@unix(") {
		_, err := mysql.ParseDSN(dsn)
		return dsn, true, err
	}
	return "", false, nil
}

// setup opens the database and migrates the lock tables into a fresh
// schema (PostgreSQL) or a new temp file (SQLite).
func setup(ctx context.Context, cfg config) (*env, error) {
	e := &env{cfg: cfg, quiet: quietLogger()}
	if cfg.dsn == "" {
		dir, err := os.MkdirTemp("", "sqlease-bench-")
		if err != nil {
			return nil, err
		}
		e.dialect, e.d, e.driver, e.dir = sqlitedialect.Name, sqlitedialect.New(), sqliteDriver, dir
		e.dsn = sqliteDSN(filepath.Join(dir, "bench.db"))
	} else {
		my, isMySQL, err := mysqlDriverDSN(cfg.dsn)
		switch {
		case err != nil:
			return nil, fmt.Errorf("--dsn: %w", err)
		case isMySQL:
			e.dialect, e.d, e.driver, e.dsn = mysqldialect.Name, mysqldialect.New(), "mysql", my
		case strings.HasPrefix(cfg.dsn, "postgres://") || strings.HasPrefix(cfg.dsn, "postgresql://"):
			e.dialect, e.d, e.driver, e.dsn = pgdialect.Name, pgdialect.New(), "pgx", cfg.dsn
		default:
			return nil, fmt.Errorf("--dsn must be a postgres:// or mysql:// URL, or a go-sql-driver/mysql DSN (SQLite runs on a temp file without --dsn)")
		}
		e.schema = "sqlease_bench_" + randHex(5)
		e.ns = dialect.Namespace{Schema: e.schema}
	}
	db, err := e.open(e.dsn)
	if err != nil {
		e.close()
		return nil, err
	}
	e.db = db
	if _, err := migrate.Up(ctx, db, e.d, migrate.WithNamespace(e.ns)); err != nil {
		e.close()
		return nil, fmt.Errorf("migrate: %w", err)
	}
	e.machine = e.describe(ctx)
	return e, nil
}

// sqliteDSN is the DSN of the bench's SQLite file: WAL journal, a 5 s
// busy timeout and mattn/go-sqlite3's per-connection statement cache, as
// docs/operations.md recommends for that driver (synchronous stays the
// driver's default, NORMAL). The raw baseline runs on the same DSN. Without
// the cache mattn compiles every statement on every call (docs/performance.md,
// "SQLite: statements and pages", has a run with and without it). A busy
// timeout of at most 5 s (the default release timeout) spares each release
// two PRAGMA statements (same section).
func sqliteDSN(path string) string {
	return "file:" + path + "?_journal_mode=WAL&_busy_timeout=5000&_stmt_cache_size=32"
}

// sqliteDriver is mattn/go-sqlite3 with journal_size_limit set on every
// connection (4 MiB, the WAL's size at SQLite's automatic checkpoint), as
// docs/operations.md ("WAL size") recommends: mattn has no DSN key for it,
// and without it the WAL file keeps the largest size it ever reached. It is
// registered in env_cgo.go (without cgo, mattn cannot open a database).
const sqliteDriver = "sqlite3-bench"

// open opens a pool on dsn (see sizePool).
func (e *env) open(dsn string) (*sql.DB, error) {
	db, err := sql.Open(e.driver, dsn)
	if err != nil {
		return nil, err
	}
	sizePool(db)
	return db, nil
}

// sizePool keeps enough idle connections for 8 clients plus renewals and
// a listener, and lets them go after half a minute idle: the PostgreSQL
// server is shared with other users (max_connections).
func sizePool(db *sql.DB) {
	db.SetMaxIdleConns(12)
	db.SetMaxOpenConns(40)
	db.SetConnMaxIdleTime(30 * time.Second)
}

// openCounting opens a pool on dsn whose statements an Injector counts.
func (e *env) openCounting(dsn string) (*sql.DB, *faultdb.Injector, error) {
	raw, err := sql.Open(e.driver, dsn)
	if err != nil {
		return nil, nil, err
	}
	conn, err := faultdb.DSNConnector(raw.Driver(), dsn)
	_ = raw.Close()
	if err != nil {
		return nil, nil, err
	}
	inj := faultdb.New()
	db := sql.OpenDB(inj.Connector(conn))
	sizePool(db)
	return db, inj, nil
}

// fastDSN is a PostgreSQL DSN whose commits do not wait for the disk
// (synchronous_commit=off), for setting up many leases quickly where
// durability is not what is measured. MySQL has no such session setting
// (innodb_flush_log_at_trx_commit is global): its DSN is returned as is.
func (e *env) fastDSN() string {
	if e.isMySQL() {
		return e.dsn
	}
	sep := "?"
	if strings.Contains(e.dsn, "?") {
		sep = "&"
	}
	return e.dsn + sep + "synchronous_commit=off"
}

// newLocker builds a Locker on db in the bench namespace with a silent
// logger.
func (e *env) newLocker(ctx context.Context, db *sql.DB, opts ...lock.Option) (*lock.Locker, error) {
	base := []lock.Option{lock.WithSchema(e.ns.Schema), lock.WithLogger(e.quiet)}
	return lock.New(ctx, db, e.d, append(base, opts...)...)
}

// quietLogger discards everything: the bench's Lockers log expected events
// (orphaned leases ending, waiters giving up) that would clutter the
// report.
func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// closeLocker closes l with a bounded context.
func closeLocker(l *lock.Locker) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = l.Close(ctx)
}

// table returns the quoted name of a baseline table in the bench namespace.
func (e *env) table(name string) string {
	if e.schema != "" {
		return e.d.QuoteIdent(e.schema) + "." + e.d.QuoteIdent(name)
	}
	return e.d.QuoteIdent(name)
}

// describe returns the machine and database settings for the report.
func (e *env) describe(ctx context.Context) string {
	s := fmt.Sprintf("%s/%s, %d CPUs (GOMAXPROCS %d), %s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version())
	q := func(query string) string {
		var v string
		if err := e.db.QueryRowContext(ctx, query).Scan(&v); err != nil {
			return "?"
		}
		return v
	}
	if e.isPG() {
		// autovacuum matters: a hot key's dead rows pile up in its index
		// until VACUUM (docs/performance.md).
		return s + fmt.Sprintf("; PostgreSQL %s, fsync=%s, synchronous_commit=%s, wal_level=%s, autovacuum=%s", q("SHOW server_version"), q("SHOW fsync"), q("SHOW synchronous_commit"), q("SHOW wal_level"), q("SHOW autovacuum"))
	}
	if e.isMySQL() {
		// The commit's disk flush and the binary log's decide the
		// 1-client rates, as fsync does on PostgreSQL.
		return s + fmt.Sprintf("; %s, innodb_flush_log_at_trx_commit=%s, log_bin=%s, sync_binlog=%s, binlog_format=%s", q("SELECT VERSION()"),
			q("SELECT @@innodb_flush_log_at_trx_commit"), q("SELECT @@log_bin"), q("SELECT @@sync_binlog"), q("SELECT @@binlog_format"))
	}
	sync := map[string]string{"0": "OFF", "1": "NORMAL", "2": "FULL", "3": "EXTRA"}[q("PRAGMA synchronous")]
	return s + fmt.Sprintf("; SQLite %s (mattn/go-sqlite3), journal_mode=%s, synchronous=%s", q("SELECT sqlite_version()"), q("PRAGMA journal_mode"), sync)
}

// revision names the engine version measured: a git commit, marked
// "+dirty" when lock/, dialect/ or migrate/ have uncommitted changes other
// than tests ("unknown" when neither the binary nor a git checkout names
// one). A binary built with go build in the repository carries its commit
// wherever it runs from; when it runs elsewhere than in a checkout at that
// commit, "+dirty" means the tree had any uncommitted change when it was
// built. go run does not stamp binaries by default, so git is asked.
func revision() string {
	stamped, modified := stampedRevision()
	out, err := exec.Command("git", "rev-parse", "HEAD").Output()
	head := strings.TrimSpace(string(out))
	if stamped != "" && (err != nil || head != stamped) {
		if modified {
			return short(stamped) + "+dirty"
		}
		return short(stamped)
	}
	if err != nil || head == "" {
		return "unknown"
	}
	st, err := exec.Command("git", "status", "--porcelain", "--", "lock", "dialect", "migrate").Output()
	if err != nil {
		return short(head)
	}
	for _, line := range strings.Split(string(st), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasSuffix(line, "_test.go") {
			return short(head) + "+dirty"
		}
	}
	return short(head)
}

// short abbreviates a commit hash to 12 characters.
func short(rev string) string { return rev[:min(len(rev), 12)] }

// stampedRevision returns the commit the binary was built from and whether
// the tree had uncommitted changes then, from its build information, when
// go build recorded them (rev is empty otherwise).
func stampedRevision() (rev string, modified bool) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "", false
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	return rev, modified
}

// close drops the bench schema (PostgreSQL) or database (MySQL), or
// removes the temp file (SQLite).
func (e *env) close() {
	if e.db != nil && e.schema != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		drop := "DROP SCHEMA IF EXISTS " + e.d.QuoteIdent(e.schema) + " CASCADE"
		if e.isMySQL() {
			drop = "DROP DATABASE IF EXISTS " + e.d.QuoteIdent(e.schema)
		}
		if _, err := e.db.ExecContext(ctx, drop); err != nil {
			fmt.Fprintf(os.Stderr, "bench: drop schema %s: %v\n", e.schema, err)
		}
	}
	if e.db != nil {
		_ = e.db.Close()
	}
	if e.dir != "" {
		_ = os.RemoveAll(e.dir)
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = crand.Read(b)
	return hex.EncodeToString(b)
}
