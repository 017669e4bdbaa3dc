package k8slock_test

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/sqlease/sqlease/conformance/conftest"
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/pgdialect"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/k8slock"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// backend is one real database: a SQLite file (modernc.org/sqlite), or a
// fresh schema in the PostgreSQL at SQLEASE_POSTGRES_DSN.
type backend struct {
	Driver string // database/sql driver name
	DSN    string
	Schema string // "" on SQLite
}

func (b backend) dialect() dialect.Dialect {
	if b.Driver == "pgx" {
		return pgdialect.New()
	}
	return sqlitedialect.New()
}

func sqliteBackend(t *testing.T) backend {
	return backend{Driver: "sqlite", DSN: conftest.SQLiteDSN(filepath.Join(t.TempDir(), "k8s.db"))}
}

func postgresBackend(t *testing.T) backend {
	dsn := conftest.PostgresDSN(t)
	b := make([]byte, 6)
	_, _ = crand.Read(b)
	s := "k8slock_t_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		_ = conftest.DropNamespace("pgx", dsn, "DROP SCHEMA IF EXISTS "+pgdialect.New().QuoteIdent(s)+" CASCADE")
	})
	return backend{Driver: "pgx", DSN: dsn, Schema: s}
}

// forEachBackend runs f as parallel subtests "sqlite" and "postgres" (the
// latter skipped, with the reason, without SQLEASE_POSTGRES_DSN).
func forEachBackend(t *testing.T, f func(t *testing.T, b backend)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		f(t, sqliteBackend(t))
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		f(t, postgresBackend(t))
	})
}

// open opens a pool on the backend's database; migrated also creates the
// lock tables.
func (b backend) open(ctx context.Context, migrated bool) (*sql.DB, error) {
	db, err := sql.Open(b.Driver, b.DSN)
	if err != nil {
		return nil, err
	}
	if migrated {
		if _, err := migrate.Up(ctx, db, b.dialect(), migrate.WithNamespace(dialect.Namespace{Schema: b.Schema})); err != nil {
			db.Close()
			return nil, err
		}
	}
	return db, nil
}

// openT is open for a test, closed at cleanup.
func (b backend) openT(t *testing.T, migrated bool) *sql.DB {
	t.Helper()
	db, err := b.open(t.Context(), migrated)
	if err != nil {
		t.Fatalf("open %s: %v", b.Driver, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// locker builds a Locker owned by identity in the backend's namespace.
func (b backend) locker(ctx context.Context, db *sql.DB, identity string, ttl time.Duration) (*lock.Locker, error) {
	return lock.New(ctx, db, b.dialect(), lock.WithSchema(b.Schema), lock.WithOwner(identity), lock.WithTTL(ttl))
}

// newLock builds a Locker and a Lock on name for identity, closed at
// cleanup.
func (b backend) newLock(t *testing.T, db *sql.DB, name, identity string, ttl time.Duration) *k8slock.Lock {
	t.Helper()
	l, err := b.locker(t.Context(), db, identity, ttl)
	if err != nil {
		t.Fatalf("lock.New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = l.Close(ctx)
	})
	rl, err := k8slock.New(l, name, identity)
	if err != nil {
		t.Fatalf("k8slock.New: %v", err)
	}
	return rl
}

// table names an application table in the backend's namespace.
func (b backend) table(name string) string {
	if b.Schema == "" {
		return name
	}
	return pgdialect.New().QuoteIdent(b.Schema) + "." + name
}

var dollar = regexp.MustCompile(`\$\d+`)

// q rewrites $1, $2 placeholders for the backend's driver.
func (b backend) q(query string) string {
	if b.Driver == "pgx" {
		return query
	}
	return dollar.ReplaceAllString(query, "?")
}
