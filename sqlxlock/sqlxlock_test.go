package sqlxlock_test

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/conformance/conftest"
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/pgdialect"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/internal/faultdb"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
	"github.com/sqlease/sqlease/sqlxlock"
)

// viaSqlx is a conformance constructor that wraps the suite's *sql.DB in a
// sqlx.DB named after driver and builds the Locker with sqlxlock.New, which
// must infer the dialect the suite runs.
func viaSqlx(driver string) func(context.Context, *sql.DB, dialect.Dialect, ...lock.Option) (*lock.Locker, error) {
	return func(ctx context.Context, db *sql.DB, d dialect.Dialect, opts ...lock.Option) (*lock.Locker, error) {
		l, err := sqlxlock.New(ctx, sqlx.NewDb(db, driver), opts...)
		if err != nil {
			return nil, err
		}
		if l.Dialect().Name() != d.Name() {
			_ = l.Close(ctx)
			return nil, fmt.Errorf("sqlxlock.New inferred dialect %q, the suite runs %q", l.Dialect().Name(), d.Name())
		}
		return l, nil
	}
}

// TestConformanceSQLite runs the adapter smoke cases of the conformance
// suite (conftest.AdapterSmoke, which says which and why) on SQLite files
// with every Locker built by sqlxlock.New over a "sqlite3" sqlx.DB. The
// whole suite runs in the dialect packages.
func TestConformanceSQLite(t *testing.T) {
	if conformance.IsChild() {
		conformance.Run(t, conformance.Config{}) // exits: the child needs no config (and no temp dir left behind)
	}
	cfg := conftest.SQLiteDriver(t.TempDir(), "sqlite3")
	cfg.NewLocker = viaSqlx("sqlite3")
	conformance.RunCases(t, cfg, conftest.AdapterSmoke...)
}

// TestConformancePostgres runs the adapter smoke cases on PostgreSQL (when
// SQLEASE_POSTGRES_DSN is set) with every Locker built by sqlxlock.New over
// a "pgx" sqlx.DB.
func TestConformancePostgres(t *testing.T) {
	if conformance.IsChild() {
		conformance.Run(t, conformance.Config{})
	}
	cfg := conftest.Postgres(conftest.PostgresDSN(t))
	cfg.NewLocker = viaSqlx("pgx")
	conformance.RunCases(t, cfg, conftest.AdapterSmoke...)
}

// backend is one real database: a SQLite file, or a fresh schema in the
// PostgreSQL at SQLEASE_POSTGRES_DSN.
type backend struct {
	driver string
	dsn    string
	ns     dialect.Namespace
	d      dialect.Dialect
}

func sqliteBackend(t *testing.T) backend {
	return backend{driver: "sqlite3", dsn: conftest.SQLiteDSN(filepath.Join(t.TempDir(), "app.db")), d: sqlitedialect.New()}
}

func postgresBackend(t *testing.T) backend {
	dsn := conftest.PostgresDSN(t)
	b := make([]byte, 6)
	_, _ = crand.Read(b)
	s := "sqlxlock_t_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		db, err := sql.Open("pgx", dsn)
		if err != nil {
			return
		}
		defer db.Close()
		_, _ = db.ExecContext(context.Background(), "DROP SCHEMA IF EXISTS "+pgdialect.New().QuoteIdent(s)+" CASCADE")
	})
	return backend{driver: "pgx", dsn: dsn, ns: dialect.Namespace{Schema: s}, d: pgdialect.New()}
}

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

// open opens a new sqlx pool to the backend's database, closed at cleanup.
func (b backend) open(t *testing.T) *sqlx.DB {
	t.Helper()
	db, err := sqlx.Open(b.driver, b.dsn)
	if err != nil {
		t.Fatalf("open %s: %v", b.driver, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func (b backend) lockOpts(opts ...lock.Option) []lock.Option {
	return append([]lock.Option{lock.WithSchema(b.ns.Schema), lock.WithTablePrefix(b.ns.Prefix)}, opts...)
}

func (b backend) table(name string) string {
	ns := b.ns
	ns.Prefix = "app_"
	return ns.Object(b.d, name)
}

func newLocker(t *testing.T, db *sqlx.DB, b backend, opts ...lock.Option) *lock.Locker {
	t.Helper()
	l, err := sqlxlock.New(t.Context(), db, b.lockOpts(opts...)...)
	if err != nil {
		t.Fatalf("sqlxlock.New: %v", err)
	}
	t.Cleanup(func() { closeLocker(l) })
	return l
}

func closeLocker(l *lock.Locker) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = l.Close(ctx)
}

// undetectable opens the SQLite file at dsn through faultdb's wrapper (no
// faults), whose driver no sqlease dialect recognizes.
func undetectable(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	raw, err := sql.Open("sqlite3", dsn)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := faultdb.DSNConnector(raw.Driver(), dsn)
	_ = raw.Close()
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(faultdb.New().Connector(conn))
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func contains(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("want an error mentioning %q, got nil", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not mention %q", err, p)
		}
	}
}

// TestNewErrors: bad input gets a clear error that says what to do (SPEC I1).
func TestNewErrors(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := sqliteBackend(t)
	migrated := b.open(t)
	if _, err := sqlxlock.Migrate(ctx, migrated); err != nil {
		t.Fatalf("migrate: %v", err)
	}

	t.Run("NilDB", func(t *testing.T) {
		for _, db := range map[string]*sqlx.DB{"nil": nil, "NewDb(nil)": sqlx.NewDb(nil, "pgx")} {
			_, err := sqlxlock.New(ctx, db)
			wantInput(t, err, "database", "nil")
			contains(t, err, "sqlxlock: new locker", "*sqlx.DB")
			_, err = sqlxlock.Migrate(ctx, db)
			wantInput(t, err, "database", "nil")
			contains(t, err, "sqlxlock: migrate")
		}
	})

	t.Run("UnknownDriver", func(t *testing.T) {
		db := sqlx.NewDb(undetectable(t, b.dsn), "clickhouse")
		_, err := sqlxlock.New(ctx, db)
		contains(t, err, `invalid driver "clickhouse"`, "sqlxlock.NewWithDialect(ctx, db, d, opts...)", `"pgx"`, `"sqlite3"`)
		for _, n := range dialect.Names() {
			contains(t, err, n)
		}
		if !errors.Is(err, dialect.ErrUnknownDialect) {
			t.Errorf("want ErrUnknownDialect, got %v", err)
		}
		_, err = sqlxlock.Migrate(ctx, db)
		if !errors.Is(err, dialect.ErrUnknownDialect) {
			t.Errorf("Migrate: want ErrUnknownDialect, got %v", err)
		}
		// The override named in the message works.
		l, err := sqlxlock.NewWithDialect(ctx, db, sqlitedialect.New())
		if err != nil {
			t.Fatalf("NewWithDialect: %v", err)
		}
		closeLocker(l)
	})

	t.Run("UnknownDriverNameDetectedFromDriver", func(t *testing.T) {
		// A name sqlxlock does not know, but the driver is
		// mattn/go-sqlite3, which the SQLite dialect recognizes.
		l, err := sqlxlock.New(ctx, sqlx.NewDb(migrated.DB, "sqlite3_custom"))
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		defer closeLocker(l)
		if l.Dialect().Name() != sqlitedialect.Name {
			t.Errorf("detected dialect %q, want %q", l.Dialect().Name(), sqlitedialect.Name)
		}
	})

	t.Run("MismatchedDialect", func(t *testing.T) {
		_, err := sqlxlock.NewWithDialect(ctx, migrated, pgdialect.New())
		wantInput(t, err, "dialect", `"postgres"`)
		contains(t, err, `"sqlite3"`, `"sqlite"`, "does not match")
		l, err := sqlxlock.NewWithDialect(ctx, migrated, sqlitedialect.New())
		if err != nil {
			t.Fatalf("NewWithDialect with the matching dialect: %v", err)
		}
		closeLocker(l)
	})

	t.Run("MismatchedDialectPostgres", func(t *testing.T) {
		pb := postgresBackend(t)
		_, err := sqlxlock.NewWithDialect(ctx, pb.open(t), sqlitedialect.New())
		wantInput(t, err, "dialect", `"sqlite"`)
		contains(t, err, `"pgx"`, `"postgres"`, "does not match")
	})

	t.Run("NotMigrated", func(t *testing.T) {
		_, err := sqlxlock.New(ctx, sqliteBackend(t).open(t))
		if !errors.Is(err, lock.ErrSchemaNotMigrated) {
			t.Fatalf("want ErrSchemaNotMigrated, got %v", err)
		}
		var se *lock.SchemaError
		if !errors.As(err, &se) {
			t.Errorf("want a *lock.SchemaError, got %T", err)
		}
		contains(t, err, "sqlxlock.Migrate(ctx, db)")
	})

	t.Run("BadOption", func(t *testing.T) {
		_, err := sqlxlock.New(ctx, migrated, lock.WithTTL(time.Millisecond))
		if !errors.Is(err, lock.ErrInvalidInput) {
			t.Fatalf("TTL 1ms: want ErrInvalidInput, got %v", err)
		}
	})

	t.Run("RunInTxNilArguments", func(t *testing.T) {
		l, err := sqlxlock.New(ctx, migrated)
		if err != nil {
			t.Fatal(err)
		}
		defer closeLocker(l)
		lease, err := l.TryAcquire(ctx, "k", lock.Exclusive)
		if err != nil {
			t.Fatal(err)
		}
		defer lease.Release(ctx)
		fn := func(context.Context, *sqlx.Tx) error { return nil }
		for field, err := range map[string]error{
			"database": sqlxlock.RunInTx(ctx, nil, lease, nil, fn),
			"lease":    sqlxlock.RunInTx(ctx, migrated, nil, nil, fn),
			"function": sqlxlock.RunInTx(ctx, migrated, lease, nil, nil),
		} {
			wantInput(t, err, field, "nil")
		}
	})
}

// Job is an application row written under a lease with sqlx.
type Job struct {
	ID    int64 `db:"id"`
	Token int64 `db:"token"`
}

// TestRunInTx: fenced sqlx transactions commit only under a live lease
// (SPEC F1, F2).
func TestRunInTx(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		db := b.open(t)
		if _, err := sqlxlock.Migrate(ctx, db, migrate.WithNamespace(b.ns)); err != nil {
			t.Fatalf("migrate: %v", err)
		}
		jobs := b.table("jobs")
		if _, err := db.ExecContext(ctx, "CREATE TABLE "+jobs+" (id BIGINT PRIMARY KEY, token BIGINT NOT NULL)"); err != nil {
			t.Fatalf("create table: %v", err)
		}
		count := func(t *testing.T) int {
			t.Helper()
			var n int
			if err := db.GetContext(ctx, &n, "SELECT count(*) FROM "+jobs); err != nil {
				t.Fatalf("count: %v", err)
			}
			return n
		}
		insert := func(ctx context.Context, tx *sqlx.Tx, id, token int64) error {
			_, err := tx.NamedExecContext(ctx, "INSERT INTO "+jobs+" (id, token) VALUES (:id, :token)", Job{ID: id, Token: token})
			return err
		}
		quiet := lock.WithLogger(slog.New(slog.DiscardHandler))
		l := newLocker(t, db, b)

		t.Run("Commits", func(t *testing.T) {
			lease, err := l.TryAcquire(ctx, "jobs/commit", lock.Exclusive)
			if err != nil {
				t.Fatal(err)
			}
			err = sqlxlock.RunInTx(ctx, db, lease, nil, func(ctx context.Context, tx *sqlx.Tx) error {
				return insert(ctx, tx, 1, lease.Token())
			})
			if err != nil {
				t.Fatalf("RunInTx: %v", err)
			}
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
			var got Job
			if err := db.GetContext(ctx, &got, db.Rebind("SELECT id, token FROM "+jobs+" WHERE id = ?"), 1); err != nil || got.Token != lease.Token() {
				t.Fatalf("committed row: %+v, %v; want token %d", got, err, lease.Token())
			}
		})

		t.Run("FnErrorRollsBack", func(t *testing.T) {
			lease, err := l.TryAcquire(ctx, "jobs/fail", lock.Exclusive)
			if err != nil {
				t.Fatal(err)
			}
			defer lease.Release(ctx)
			before := count(t)
			boom := errors.New("boom")
			err = sqlxlock.RunInTx(ctx, db, lease, nil, func(ctx context.Context, tx *sqlx.Tx) error {
				if err := insert(ctx, tx, 2, lease.Token()); err != nil {
					return err
				}
				return boom
			})
			if !errors.Is(err, boom) {
				t.Fatalf("want fn's error, got %v", err)
			}
			if n := count(t); n != before {
				t.Errorf("rows %d -> %d: fn's failed transaction committed", before, n)
			}
			if lease.Err() != nil {
				t.Errorf("fn's error must not end the lease: %v", lease.Err())
			}
		})

		t.Run("PanicRollsBack", func(t *testing.T) {
			lease, err := l.TryAcquire(ctx, "jobs/panic", lock.Exclusive)
			if err != nil {
				t.Fatal(err)
			}
			defer lease.Release(ctx)
			before := count(t)
			func() {
				defer func() {
					if recover() == nil {
						t.Errorf("RunInTx swallowed fn's panic")
					}
				}()
				_ = sqlxlock.RunInTx(ctx, db, lease, nil, func(ctx context.Context, tx *sqlx.Tx) error {
					if err := insert(ctx, tx, 3, lease.Token()); err != nil {
						return err
					}
					panic("boom")
				})
			}()
			if n := count(t); n != before {
				t.Errorf("rows %d -> %d: a panicking transaction committed", before, n)
			}
		})

		t.Run("LostBeforeWritesNothing", func(t *testing.T) {
			short := newLocker(t, db, b, lock.WithTTL(lock.MinTTL), quiet)
			lease, err := short.TryAcquire(ctx, "jobs/lost-before", lock.Exclusive)
			if err != nil {
				t.Fatal(err)
			}
			lease.Orphan()
			select {
			case <-lease.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("orphaned lease not reported lost within 10s")
			}
			before := count(t)
			ran := false
			err = sqlxlock.RunInTx(ctx, db, lease, nil, func(ctx context.Context, tx *sqlx.Tx) error {
				ran = true
				return insert(ctx, tx, 4, lease.Token())
			})
			var lost *lock.LeaseLostError
			if !errors.Is(err, lock.ErrLeaseLost) || !errors.As(err, &lost) {
				t.Fatalf("want a *LeaseLostError matching ErrLeaseLost, got %v", err)
			}
			if ran {
				t.Errorf("fn ran under a lost lease")
			}
			if n := count(t); n != before {
				t.Errorf("rows %d -> %d: committed under a lost lease (F2)", before, n)
			}
		})

		t.Run("LostDuringFnCommitsNothing", func(t *testing.T) {
			short := newLocker(t, db, b, lock.WithTTL(lock.MinTTL), quiet)
			lease, err := short.TryAcquire(ctx, "jobs/lost-during", lock.Exclusive)
			if err != nil {
				t.Fatal(err)
			}
			before := count(t)
			err = sqlxlock.RunInTx(ctx, db, lease, nil, func(ctx context.Context, tx *sqlx.Tx) error {
				if err := insert(ctx, tx, 5, lease.Token()); err != nil {
					return err
				}
				// The holder "crashes" mid-transaction: no more renewals,
				// so its trusted window ends before fn returns.
				lease.Orphan()
				select {
				case <-lease.Done():
					return nil
				case <-time.After(10 * time.Second):
					return errors.New("orphaned lease not reported lost within 10s")
				}
			})
			if !errors.Is(err, lock.ErrLeaseLost) {
				t.Fatalf("want ErrLeaseLost, got %v", err)
			}
			if n := count(t); n != before {
				t.Errorf("rows %d -> %d: committed after the lease was lost (F2)", before, n)
			}
		})

		t.Run("ReleasedLeaseCannotWrite", func(t *testing.T) {
			lease, err := l.TryAcquire(ctx, "jobs/released", lock.Exclusive)
			if err != nil {
				t.Fatal(err)
			}
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
			before := count(t)
			err = sqlxlock.RunInTx(ctx, db, lease, nil, func(ctx context.Context, tx *sqlx.Tx) error {
				return insert(ctx, tx, 6, lease.Token())
			})
			if !errors.Is(err, lock.ErrNotHeld) || errors.Is(err, lock.ErrLeaseLost) {
				t.Fatalf("want ErrNotHeld (not ErrLeaseLost) after Release, got %v", err)
			}
			if n := count(t); n != before {
				t.Errorf("rows %d -> %d: committed under a released lease", before, n)
			}
		})
	})
}

// wantInput checks that err is a *lock.InputError matching
// lock.ErrInvalidInput for field, whose message shows value and what is
// allowed.
func wantInput(t *testing.T, err error, field, value string) {
	t.Helper()
	var ie *lock.InputError
	if !errors.Is(err, lock.ErrInvalidInput) || !errors.As(err, &ie) {
		t.Fatalf("want a *lock.InputError matching ErrInvalidInput, got %v", err)
	}
	if ie.Field != field || !strings.Contains(ie.Value, value) || ie.Allowed == "" {
		t.Errorf("InputError %+v: want field %q showing %q and what is allowed", ie, field, value)
	}
	if !strings.Contains(err.Error(), ie.Allowed) {
		t.Errorf("message %q should say what is allowed (%q)", err, ie.Allowed)
	}
}
