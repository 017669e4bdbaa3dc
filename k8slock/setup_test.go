package k8slock_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/conformance/conftest"
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/mysqldialect"
	"github.com/sqlease/sqlease/dialect/pgdialect"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/k8slock"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// backend is one real database: a SQLite file (modernc.org/sqlite), a
// fresh schema in the PostgreSQL at SQLEASE_POSTGRES_DSN, or a fresh
// database on the MySQL/MariaDB server at SQLEASE_MYSQL_DSN.
type backend struct {
	Driver string // database/sql driver name: "sqlite", "pgx" or "mysql"
	DSN    string
	Schema string // "" on SQLite
}

func (b backend) dialect() dialect.Dialect {
	switch b.Driver {
	case "pgx":
		return pgdialect.New()
	case "mysql":
		return mysqldialect.New()
	}
	return sqlitedialect.New()
}

func sqliteBackend(t *testing.T) backend {
	return backend{Driver: "sqlite", DSN: conftest.SQLiteDSN(filepath.Join(t.TempDir(), "k8s.db"))}
}

func postgresBackend(t *testing.T) backend {
	return serverBackend(t, conftest.Postgres(conftest.PostgresDSN(t)))
}

func mysqlBackend(t *testing.T) backend {
	return serverBackend(t, conftest.MySQL(conftest.MySQLDSN(t)))
}

// serverBackend is a fresh sqlease_t_* schema (PostgreSQL) or database
// (MySQL) of cfg, dropped when t ends.
func serverBackend(t *testing.T, cfg conformance.Config) backend {
	d, err := cfg.NewDatabase(t.Context(), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Cleanup)
	return backend{Driver: cfg.DriverName, DSN: d.DSN, Schema: d.Namespace.Schema}
}

// forEachBackend runs f as parallel subtests "sqlite", "postgres" and
// "mysql" (the last two skipped, with the reason, without
// SQLEASE_POSTGRES_DSN or SQLEASE_MYSQL_DSN).
func forEachBackend(t *testing.T, f func(t *testing.T, b backend)) {
	for _, c := range []struct {
		name       string
		newBackend func(*testing.T) backend
	}{{"sqlite", sqliteBackend}, {"postgres", postgresBackend}, {"mysql", mysqlBackend}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f(t, c.newBackend(t))
		})
	}
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
	return b.dialect().QuoteIdent(b.Schema) + "." + name
}

var dollar = regexp.MustCompile(`\$\d+`)

// q rewrites $1, $2 placeholders for the backend's driver.
func (b backend) q(query string) string {
	if b.Driver == "pgx" {
		return query
	}
	return dollar.ReplaceAllString(query, "?")
}
