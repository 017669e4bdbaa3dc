// Package schedtest gives the scheduler adapters' tests (cronlock,
// gocronlock) real databases: a SQLite file always, a fresh PostgreSQL
// schema or MySQL database when SQLEASE_POSTGRES_DSN / SQLEASE_MYSQL_DSN
// is set (skipped with the reason otherwise), and the same database again
// in a child process through environment variables.
package schedtest

import (
	"context"
	"database/sql"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/conformance/conftest"
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// Backend is one migrated, isolated database.
type Backend struct {
	Name    string // the dialect's name: "sqlite", "postgres" or "mysql"
	Dialect dialect.Dialect
	Driver  string
	DSN     string
	NS      dialect.Namespace
}

// Each runs f in one parallel subtest per database, each with a fresh,
// migrated Backend dropped when the subtest ends.
func Each(t *testing.T, f func(t *testing.T, b Backend)) {
	EachOf(t, []string{"sqlite", "postgres", "mysql"}, f)
}

// EachOf is Each on the databases named (of "sqlite", "postgres",
// "mysql"), for tests too slow to run on all three.
func EachOf(t *testing.T, names []string, f func(t *testing.T, b Backend)) {
	configs := []struct {
		name string
		cfg  func(t *testing.T) conformance.Config
	}{
		{"sqlite", func(t *testing.T) conformance.Config { return conftest.SQLite(t.TempDir()) }},
		{"postgres", func(t *testing.T) conformance.Config { return conftest.Postgres(conftest.PostgresDSN(t)) }},
		{"mysql", func(t *testing.T) conformance.Config { return conftest.MySQL(conftest.MySQLDSN(t)) }},
	}
	for _, c := range configs {
		if !slices.Contains(names, c.name) {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f(t, New(t, c.name, c.cfg(t)))
		})
	}
}

// New prepares a fresh database of cfg, migrated, dropped when t ends.
func New(t *testing.T, name string, cfg conformance.Config) Backend {
	t.Helper()
	ctx := context.Background()
	d, err := cfg.NewDatabase(ctx, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	if d.Cleanup != nil {
		t.Cleanup(d.Cleanup)
	}
	b := Backend{Name: name, Dialect: cfg.Dialect, Driver: cfg.DriverName, DSN: d.DSN, NS: d.Namespace}
	db := b.Open(t)
	if _, err := migrate.Up(ctx, db, b.Dialect, migrate.WithNamespace(b.NS)); err != nil {
		t.Fatal(err)
	}
	return b
}

// Open opens the database, closed when t ends.
func (b Backend) Open(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sql.Open(b.Driver, b.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// Locker opens a pool of its own (a replica of its own) and builds a
// Locker on it with a 1 s TTL, logging to t, closed when t ends.
func (b Backend) Locker(t testing.TB, owner string, opts ...lock.Option) *lock.Locker {
	t.Helper()
	ctx := context.Background()
	base := []lock.Option{lock.WithTTL(time.Second), lock.WithOwner(owner),
		lock.WithSchema(b.NS.Schema), lock.WithTablePrefix(b.NS.Prefix), lock.WithLogger(Logger(t))}
	l, err := lock.New(ctx, b.Open(t), b.Dialect, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

// Env describes b to a child process (see FromEnv).
func (b Backend) Env() []string {
	return []string{"SCHEDTEST_BACKEND=" + strings.Join([]string{b.Name, b.Driver, b.NS.Schema, b.NS.Prefix, b.DSN}, "\x1f")}
}

// FromEnv returns the Backend a parent described with Env, or false in a
// process that is no such child.
func FromEnv() (Backend, bool) {
	v, ok := os.LookupEnv("SCHEDTEST_BACKEND")
	if !ok {
		return Backend{}, false
	}
	p := strings.SplitN(v, "\x1f", 5)
	d, err := dialect.Lookup(p[0])
	if err != nil {
		panic(err)
	}
	return Backend{Name: p[0], Driver: p[1], NS: dialect.Namespace{Schema: p[2], Prefix: p[3]}, DSN: p[4], Dialect: d}, true
}

// Logger logs to t at INFO and above.
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
