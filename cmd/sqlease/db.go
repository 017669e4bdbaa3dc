package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers driver "pgx"
	_ "github.com/mattn/go-sqlite3"    // registers driver "sqlite3"

	"github.com/sqlease/sqlease/dialect"
	_ "github.com/sqlease/sqlease/dialect/pgdialect"     // registers dialect "postgres"
	_ "github.com/sqlease/sqlease/dialect/sqlitedialect" // registers dialect "sqlite"
	"github.com/sqlease/sqlease/lock"
)

// dsnEnv is the environment variable read when --dsn is not given.
const dsnEnv = "SQLEASE_DSN"

// pingTimeout bounds the reachability check before a command runs.
const pingTimeout = 10 * time.Second

// sqliteBusyTimeoutMS is added to SQLite DSNs that set no busy timeout, so
// the tool waits for the application's writers instead of failing with
// SQLITE_BUSY.
const sqliteBusyTimeoutMS = 10000

// drivers maps a built-in dialect name to its database/sql driver name.
var drivers = map[string]string{"postgres": "pgx", "sqlite": "sqlite3"}

// dbFlags are the connection flags every command shares.
type dbFlags struct {
	dsn, dialect string
}

func (f *dbFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.dsn, "dsn", "", "database `DSN` (default $"+dsnEnv+")")
	fs.StringVar(&f.dialect, "dialect", "", "dialect `NAME` (postgres, sqlite); default: inferred from the DSN")
}

// nsFlags place the lock tables.
type nsFlags struct {
	schema, prefix string
}

func (f *nsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.schema, "schema", "", "`SCHEMA` holding the lock tables (PostgreSQL; default: the search path)")
	fs.StringVar(&f.prefix, "prefix", "", "table name `PREFIX` of the lock tables (default \""+dialect.DefaultPrefix+"\")")
}

func (f *nsFlags) namespace() dialect.Namespace {
	return dialect.Namespace{Schema: f.schema, Prefix: f.prefix}
}

// dsnValue returns --dsn, else $SQLEASE_DSN.
func (f *dbFlags) dsnValue() string {
	if f.dsn != "" {
		return f.dsn
	}
	return os.Getenv(dsnEnv)
}

// target is a resolved database: what to open and with which dialect.
type target struct {
	dsn     string // passed to sql.Open
	driver  string
	dialect dialect.Dialect
	// sqlitePath is the SQLite database file ("" for other dialects, an
	// in-memory database or a path that could not be parsed).
	sqlitePath string
}

// resolve picks the dialect and driver for dsn: --dialect when given, else
// from the DSN's form. Errors are usage errors (exit 2).
func resolve(dsn, dialectName string) (target, error) {
	if dsn == "" {
		return target{}, usageErr("no database: pass --dsn DSN or set $%s", dsnEnv)
	}
	name := dialectName
	if name == "" {
		name = inferDialect(dsn)
		if name == "" {
			return target{}, usageErr("cannot tell the dialect from the DSN (expected postgres://, postgresql://, file:, sqlite: or a path ending in .db, .sqlite or .sqlite3); pass --dialect NAME (registered: %s)",
				strings.Join(dialect.Names(), ", "))
		}
	}
	d, err := dialect.Lookup(name)
	if err != nil {
		return target{}, usageErr("%v", err)
	}
	drv, ok := drivers[d.Name()]
	if !ok {
		return target{}, usageErr("dialect %q has no database/sql driver in this program (built in: postgres, sqlite)", d.Name())
	}
	t := target{dsn: dsn, driver: drv, dialect: d}
	if drv == "sqlite3" {
		t.dsn, t.sqlitePath = sqliteDSN(dsn)
	}
	return t, nil
}

// inferDialect guesses the dialect name from the DSN's form ("" if unknown).
func inferDialect(dsn string) string {
	lower := strings.ToLower(dsn)
	switch {
	case strings.HasPrefix(lower, "postgres://"), strings.HasPrefix(lower, "postgresql://"):
		return "postgres"
	case strings.HasPrefix(lower, "file:"), strings.HasPrefix(lower, "sqlite:"):
		return "sqlite"
	}
	path, _, _ := strings.Cut(lower, "?")
	for _, ext := range []string{".db", ".sqlite", ".sqlite3"} {
		if strings.HasSuffix(path, ext) {
			return "sqlite"
		}
	}
	return ""
}

// sqliteDSN turns a sqlite:PATH or sqlite://PATH DSN into one
// mattn/go-sqlite3 accepts, adds a busy timeout when none is set, and
// returns the database file's path.
func sqliteDSN(dsn string) (string, string) {
	if rest, ok := cutPrefixFold(dsn, "sqlite://"); ok {
		dsn = rest
	} else if rest, ok := cutPrefixFold(dsn, "sqlite:"); ok {
		dsn = rest
	}
	path, query, hasQuery := strings.Cut(dsn, "?")
	if !strings.Contains(query, "_busy_timeout=") && !strings.Contains(query, "_timeout=") {
		sep := "?"
		if hasQuery {
			sep = "&"
		}
		dsn += fmt.Sprintf("%s_busy_timeout=%d", sep, sqliteBusyTimeoutMS)
	}
	if rest, ok := cutPrefixFold(path, "file:"); ok {
		path = rest
		if strings.HasPrefix(path, "//") {
			path = strings.TrimPrefix(path, "//")
		}
	}
	if path == "" || path == ":memory:" || strings.Contains(query, "mode=memory") {
		path = ""
	}
	return dsn, path
}

func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix) {
		return s[len(prefix):], true
	}
	return s, false
}

// open resolves the flags, opens the database and pings it. With mustExist,
// a SQLite file that does not exist is an error instead of being created.
// Unreachable databases are usage errors (exit 2).
func open(ctx context.Context, f *dbFlags, mustExist bool) (*sql.DB, target, error) {
	t, err := resolve(f.dsnValue(), f.dialect)
	if err != nil {
		return nil, t, err
	}
	if mustExist && t.sqlitePath != "" {
		if _, err := os.Stat(t.sqlitePath); err != nil {
			return nil, t, usageErr("SQLite database %s: %v", t.sqlitePath, errors.Unwrap(err))
		}
	}
	db, err := sql.Open(t.driver, t.dsn)
	if err != nil {
		return nil, t, usageErr("open %s database: %v", t.dialect.Name(), err)
	}
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		db.Close()
		return nil, t, usageErr("cannot reach the %s database: %v", t.dialect.Name(), err)
	}
	return db, t, nil
}

// newLocker builds a Locker on db for the operator commands. Lock tables
// that are missing or old are a usage error (exit 2) telling to migrate.
func newLocker(ctx context.Context, db *sql.DB, t target, ns dialect.Namespace) (*lock.Locker, error) {
	l, err := lock.New(ctx, db, t.dialect,
		lock.WithSchema(ns.Schema), lock.WithTablePrefix(ns.Prefix),
		lock.WithLogger(slog.New(slog.DiscardHandler)))
	var se *lock.SchemaError
	switch {
	case errors.As(err, &se):
		return nil, usageErr("the lock tables are not migrated (%s is at version %d, need %d): run `sqlease migrate%s` first",
			se.Table, se.Current, se.Want, nsArgs(ns))
	case errors.Is(err, lock.ErrInvalidInput), errors.Is(err, dialect.ErrInvalidName):
		return nil, usageErr("%v", err)
	case err != nil:
		return nil, err
	}
	return l, nil
}

// nsArgs renders the namespace flags for a suggested command line.
func nsArgs(ns dialect.Namespace) string {
	s := " --dsn DSN"
	if ns.Schema != "" {
		s += " --schema " + ns.Schema
	}
	if ns.Prefix != "" {
		s += " --prefix " + ns.Prefix
	}
	return s
}

// tempDirNear makes a temporary directory for SQLite check databases: next
// to the DSN's file when there is one (to check that filesystem), else in
// the system's temporary directory.
func tempDirNear(t target) (string, error) {
	parent := ""
	if t.sqlitePath != "" {
		parent = filepath.Dir(t.sqlitePath)
	}
	return os.MkdirTemp(parent, "sqlease-check-")
}
