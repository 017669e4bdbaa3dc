package gooselock_test

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"

	"github.com/sqlease/sqlease/conformance/conftest" // registers "pgx", "mysql", "sqlite" (modernc)
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/mysqldialect"
	"github.com/sqlease/sqlease/dialect/pgdialect"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/gooselock"
)

// backend is one database the tests run goose on: a fresh SQLite file, or
// a fresh schema (PostgreSQL, also through PgBouncer) or database
// (MariaDB) on the shared server.
type backend struct {
	name   string // "sqlite", "postgres", "pgbouncer", "mysql"
	driver string
	dsn    string
	d      dialect.Dialect
	schema string // "" on SQLite
}

// backends runs f on every database whose DSN is set, each in a parallel
// subtest.
func backends(t *testing.T, f func(t *testing.T, b backend)) {
	for _, name := range []string{"sqlite", "postgres", "pgbouncer", "mysql"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f(t, newBackend(t, name))
		})
	}
}

func newBackend(t *testing.T, name string) backend {
	t.Helper()
	b := make([]byte, 6)
	_, _ = crand.Read(b)
	schema := "sqlease_t_" + hex.EncodeToString(b)
	switch name {
	case "sqlite":
		return backend{name: name, driver: "sqlite", dsn: conftest.SQLiteDSN(filepath.Join(t.TempDir(), "app.db")), d: sqlitedialect.New()}
	case "postgres", "pgbouncer":
		dsn := conftest.PostgresDSN(t)
		if name == "pgbouncer" {
			dsn = conftest.PgBouncerDSN(t)
		}
		d := pgdialect.New()
		execSQL(t, "pgx", dsn, "CREATE SCHEMA "+d.QuoteIdent(schema))
		t.Cleanup(func() {
			_ = conftest.DropNamespace("pgx", dsn, "DROP SCHEMA IF EXISTS "+d.QuoteIdent(schema)+" CASCADE")
		})
		return backend{name: name, driver: "pgx", dsn: dsn, d: d, schema: schema}
	case "mysql":
		dsn := conftest.MySQLDSN(t)
		d := mysqldialect.New()
		execSQL(t, "mysql", dsn, "CREATE DATABASE "+d.QuoteIdent(schema))
		t.Cleanup(func() { _ = conftest.DropNamespace("mysql", dsn, "DROP DATABASE IF EXISTS "+d.QuoteIdent(schema)) })
		return backend{name: name, driver: "mysql", dsn: dsn, d: d, schema: schema}
	}
	t.Fatalf("unknown backend %q", name)
	return backend{}
}

func execSQL(t *testing.T, driver, dsn, q string) {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(t.Context(), q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// table returns the quoted, schema-qualified name of an application table.
func (b backend) table(name string) string {
	if b.schema == "" {
		return b.d.QuoteIdent(name)
	}
	return b.d.QuoteIdent(b.schema) + "." + b.d.QuoteIdent(name)
}

func (b backend) ns() dialect.Namespace { return dialect.Namespace{Schema: b.schema} }

func (b backend) open(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sql.Open(b.driver, b.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// prepare creates the side table in which every migration records its
// application: (version, pid).
func (b backend) prepare(t *testing.T) {
	t.Helper()
	execSQL(t, b.driver, b.dsn, "CREATE TABLE "+b.table("applied")+" (version INTEGER NOT NULL, pid INTEGER NOT NULL)")
}

// migrations are the test's migration set: 00001 and 00003 are SQL files,
// 00002 a Go migration in a transaction that runs slow(ctx, tx) (a sleep,
// a fault, a fence) before it records itself.
type migrations struct {
	fsys fstest.MapFS
	go2  *goose.Migration
}

func (b backend) migrations(slow func(ctx context.Context, tx *sql.Tx) error) migrations {
	pid := os.Getpid()
	record := func(v int) string {
		return fmt.Sprintf("INSERT INTO %s (version, pid) VALUES (%d, %d);\n", b.table("applied"), v, pid)
	}
	file := func(up, down string) *fstest.MapFile {
		return &fstest.MapFile{Data: []byte("-- +goose Up\n" + up + "-- +goose Down\n" + down)}
	}
	return migrations{
		fsys: fstest.MapFS{
			"00001_widgets.sql": file("CREATE TABLE "+b.table("widgets")+" (id INTEGER PRIMARY KEY);\n"+record(1), "DROP TABLE "+b.table("widgets")+";\n"),
			"00003_widget.sql":  file("INSERT INTO "+b.table("widgets")+" (id) VALUES (3);\n"+record(3), "DELETE FROM "+b.table("widgets")+";\n"),
		},
		go2: goose.NewGoMigration(2, &goose.GoFunc{RunTx: func(ctx context.Context, tx *sql.Tx) error {
			if err := slow(ctx, tx); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, strings.TrimSuffix(record(2), ";\n"))
			return err
		}}, &goose.GoFunc{RunTx: func(context.Context, *sql.Tx) error { return nil }}),
	}
}

// provider builds a goose Provider of the migration set with locker.
func (b backend) provider(t testing.TB, db *sql.DB, locker *gooselock.Locker, m migrations) *goose.Provider {
	t.Helper()
	p, err := newProvider(b, db, locker, m)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newProvider(b backend, db *sql.DB, locker *gooselock.Locker, m migrations) (*goose.Provider, error) {
	versions := "goose_db_version"
	if b.schema != "" {
		versions = b.schema + "." + versions
	}
	store, err := database.NewStore(database.Dialect(b.d.GooseDialect()), versions)
	if err != nil {
		return nil, err
	}
	return goose.NewProvider("", db, m.fsys, goose.WithStore(store), goose.WithDisableGlobalRegistry(true),
		goose.WithGoMigrations(m.go2), goose.WithLocker(locker))
}

// driverOf returns the database/sql driver and the dialect of a backend.
func driverOf(name string) (string, dialect.Dialect) {
	switch name {
	case "postgres", "pgbouncer":
		return "pgx", pgdialect.New()
	case "mysql":
		return "mysql", mysqldialect.New()
	}
	return "sqlite", sqlitedialect.New()
}

// checkOnce checks that each of the three migrations was applied exactly
// once: one row per version in the side table and in goose's version
// table. It returns the pid that applied each version.
func (b backend) checkOnce(t *testing.T, db *sql.DB) map[int]int {
	t.Helper()
	ctx := t.Context()
	by := map[int]int{}
	count := func(q string, each func(v, n, pid int)) {
		rows, err := db.QueryContext(ctx, q)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		defer rows.Close()
		for rows.Next() {
			var v, n, pid int
			if err := rows.Scan(&v, &n, &pid); err != nil {
				t.Fatal(err)
			}
			each(v, n, pid)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	count("SELECT version, COUNT(*), MIN(pid) FROM "+b.table("applied")+" GROUP BY version", func(v, n, pid int) {
		if n != 1 {
			t.Errorf("migration %d ran %d times, want once", v, n)
		}
		by[v] = pid
	})
	goose := map[int]int{}
	count("SELECT version_id, COUNT(*), 0 FROM "+b.table("goose_db_version")+" WHERE version_id > 0 GROUP BY version_id", func(v, n, _ int) {
		goose[v] = n
	})
	for v := 1; v <= 3; v++ {
		if _, ok := by[v]; !ok {
			t.Errorf("migration %d never ran", v)
		}
		if goose[v] != 1 {
			t.Errorf("goose's version table records version %d %d times, want once", v, goose[v])
		}
	}
	return by
}

// logFile returns a new file in t's temporary directory, for a logger or
// a child's stderr (writes to an *os.File are safe from any goroutine),
// and a function that reads what it holds.
func logFile(t *testing.T, name string) (*os.File, func() string) {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, func() string {
		b, _ := os.ReadFile(f.Name())
		return string(b)
	}
}

// sleep returns a slow function that waits d or until ctx ends.
func sleep(d time.Duration) func(ctx context.Context, _ *sql.Tx) error {
	return func(ctx context.Context, _ *sql.Tx) error {
		select {
		case <-time.After(d):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
