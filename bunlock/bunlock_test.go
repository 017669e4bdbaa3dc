package bunlock_test

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
	"sync"
	"testing"
	"time"

	"github.com/uptrace/bun"
	bundialect "github.com/uptrace/bun/dialect"
	bunpg "github.com/uptrace/bun/dialect/pgdialect"
	bunsqlite "github.com/uptrace/bun/dialect/sqlitedialect"
	"github.com/uptrace/bun/schema"

	"github.com/sqlease/sqlease/bunlock"
	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/conformance/conftest"
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/pgdialect"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/internal/faultdb"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// viaBun is a conformance constructor that wraps the suite's *sql.DB in a
// bun.DB and builds the Locker with bunlock.New, which must infer the
// dialect the suite runs.
func viaBun(bunDialect func() schema.Dialect) func(context.Context, *sql.DB, dialect.Dialect, ...lock.Option) (*lock.Locker, error) {
	return func(ctx context.Context, db *sql.DB, d dialect.Dialect, opts ...lock.Option) (*lock.Locker, error) {
		l, err := bunlock.New(ctx, bun.NewDB(db, bunDialect()), opts...)
		if err != nil {
			return nil, err
		}
		if l.Dialect().Name() != d.Name() {
			_ = l.Close(ctx)
			return nil, fmt.Errorf("bunlock.New inferred dialect %q, the suite runs %q", l.Dialect().Name(), d.Name())
		}
		return l, nil
	}
}

// TestConformanceSQLite runs the adapter smoke cases of the conformance
// suite (conftest.AdapterSmoke, which says which and why) on SQLite files
// with every Locker built by bunlock.New over a bun.DB. The whole suite runs
// in the dialect packages.
func TestConformanceSQLite(t *testing.T) {
	if conformance.IsChild() {
		conformance.Run(t, conformance.Config{}) // exits: the child needs no config (and no temp dir left behind)
	}
	cfg := conftest.SQLiteDriver(t.TempDir(), "sqlite3")
	cfg.NewLocker = viaBun(func() schema.Dialect { return bunsqlite.New() })
	conformance.RunCases(t, cfg, conftest.AdapterSmoke...)
}

// TestConformancePostgres runs the adapter smoke cases on PostgreSQL (when
// SQLEASE_POSTGRES_DSN is set) with every Locker built by bunlock.New over a
// bun.DB with bun's pgdialect.
func TestConformancePostgres(t *testing.T) {
	if conformance.IsChild() {
		conformance.Run(t, conformance.Config{})
	}
	cfg := conftest.Postgres(conftest.PostgresDSN(t))
	cfg.NewLocker = viaBun(func() schema.Dialect { return bunpg.New() })
	conformance.RunCases(t, cfg, conftest.AdapterSmoke...)
}

// backend is one real database for the adapter tests: a SQLite file, or a
// fresh schema in the PostgreSQL at SQLEASE_POSTGRES_DSN.
type backend struct {
	driver string // database/sql driver name
	dsn    string
	ns     dialect.Namespace
	d      dialect.Dialect
	bun    func() schema.Dialect
}

func sqliteBackend(t *testing.T) backend {
	return backend{
		driver: "sqlite3", dsn: conftest.SQLiteDSN(filepath.Join(t.TempDir(), "app.db")),
		d: sqlitedialect.New(), bun: func() schema.Dialect { return bunsqlite.New() },
	}
}

func postgresBackend(t *testing.T) backend {
	dsn := conftest.PostgresDSN(t)
	b := make([]byte, 6)
	_, _ = crand.Read(b)
	s := "bunlock_t_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		db, err := sql.Open("pgx", dsn)
		if err != nil {
			return
		}
		defer db.Close()
		_, _ = db.ExecContext(context.Background(), "DROP SCHEMA IF EXISTS "+pgdialect.New().QuoteIdent(s)+" CASCADE")
	})
	return backend{
		driver: "pgx", dsn: dsn, ns: dialect.Namespace{Schema: s},
		d: pgdialect.New(), bun: func() schema.Dialect { return bunpg.New() },
	}
}

// forEachBackend runs f as parallel subtests "sqlite" and "postgres".
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

// open opens a new pool to the backend's database, closed at cleanup.
func (b backend) open(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open(b.driver, b.dsn)
	if err != nil {
		t.Fatalf("open %s: %v", b.driver, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// bunDB opens a bun.DB on a new pool.
func (b backend) bunDB(t *testing.T) *bun.DB { return bun.NewDB(b.open(t), b.bun()) }

// lockOpts places a Locker in the backend's namespace.
func (b backend) lockOpts(opts ...lock.Option) []lock.Option {
	return append([]lock.Option{lock.WithSchema(b.ns.Schema), lock.WithTablePrefix(b.ns.Prefix)}, opts...)
}

// table returns the quoted name of an application table in the backend's
// namespace.
func (b backend) table(name string) string {
	ns := b.ns
	ns.Prefix = "app_"
	return ns.Object(b.d, name)
}

// locker builds a Locker with bunlock.New, closed at cleanup.
func newBunLocker(t *testing.T, db *bun.DB, b backend, opts ...lock.Option) *lock.Locker {
	t.Helper()
	l, err := bunlock.New(t.Context(), db, b.lockOpts(opts...)...)
	if err != nil {
		t.Fatalf("bunlock.New: %v", err)
	}
	t.Cleanup(func() { closeLocker(l) })
	return l
}

func closeLocker(l *lock.Locker) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = l.Close(ctx)
}

// mysqlish is bun's SQLite dialect reporting itself as MySQL: a bun dialect
// sqlease has no mapping for, over a real SQLite database.
type mysqlish struct{ *bunsqlite.Dialect }

func (mysqlish) Name() bundialect.Name { return bundialect.MySQL }

// custom is bun's SQLite dialect reporting a name bun itself does not know
// ("custom"), as a third-party bun dialect would.
type custom struct{ *bunsqlite.Dialect }

func (custom) Name() bundialect.Name { return bundialect.Name(100) }

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

// TestNewErrors: bad input gets a clear error that says what to do (SPEC I1).
func TestNewErrors(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := sqliteBackend(t)
	migrated := b.bunDB(t)
	if _, err := bunlock.Migrate(ctx, migrated); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	contains := func(t *testing.T, err error, parts ...string) {
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

	t.Run("NilDB", func(t *testing.T) {
		_, err := bunlock.New(ctx, nil)
		wantInput(t, err, "database", "nil")
		contains(t, err, "bunlock: new locker", "*bun.DB")
		_, err = bunlock.Migrate(ctx, nil)
		wantInput(t, err, "database", "nil")
		contains(t, err, "bunlock: migrate")
	})

	t.Run("UnknownBunDialect", func(t *testing.T) {
		for _, bd := range []schema.Dialect{mysqlish{bunsqlite.New()}, custom{bunsqlite.New()}} {
			db := bun.NewDB(undetectable(t, b.dsn), bd)
			_, err := bunlock.New(ctx, db)
			contains(t, err, fmt.Sprintf("bun dialect %q", bd.Name().String()), "bunlock.NewWithDialect(ctx, db, d, opts...)", "faultdb")
			for _, n := range dialect.Names() {
				contains(t, err, n)
			}
			if !errors.Is(err, dialect.ErrUnknownDialect) {
				t.Errorf("want ErrUnknownDialect, got %v", err)
			}
			_, err = bunlock.Migrate(ctx, db)
			if !errors.Is(err, dialect.ErrUnknownDialect) {
				t.Errorf("Migrate: want ErrUnknownDialect, got %v", err)
			}
		}
		// The override named in the message works for a bun dialect
		// sqlease cannot check.
		db := bun.NewDB(undetectable(t, b.dsn), custom{bunsqlite.New()})
		l, err := bunlock.NewWithDialect(ctx, db, sqlitedialect.New())
		if err != nil {
			t.Fatalf("NewWithDialect with the right dialect: %v", err)
		}
		closeLocker(l)
	})

	t.Run("UnmappedBunDialectDetectedFromDriver", func(t *testing.T) {
		// bun's dialect says nothing sqlease knows, but the driver is
		// mattn/go-sqlite3, which the SQLite dialect recognizes.
		l, err := bunlock.New(ctx, bun.NewDB(b.open(t), mysqlish{bunsqlite.New()}))
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		defer closeLocker(l)
		if l.Dialect().Name() != sqlitedialect.Name {
			t.Errorf("detected dialect %q, want %q", l.Dialect().Name(), sqlitedialect.Name)
		}
	})

	t.Run("MismatchedDialect", func(t *testing.T) {
		_, err := bunlock.NewWithDialect(ctx, migrated, pgdialect.New())
		wantInput(t, err, "dialect", `"postgres"`)
		contains(t, err, `"sqlite"`, "does not match")
		// A built-in dialect on a bun dialect for another database.
		_, err = bunlock.NewWithDialect(ctx, bun.NewDB(migrated.DB, mysqlish{bunsqlite.New()}), pgdialect.New())
		wantInput(t, err, "dialect", `"postgres"`)
		contains(t, err, `"mysql"`, "does not match")
		// The matching dialect, explicit, is accepted.
		l, err := bunlock.NewWithDialect(ctx, migrated, sqlitedialect.New())
		if err != nil {
			t.Fatalf("NewWithDialect with the matching dialect: %v", err)
		}
		closeLocker(l)
	})

	t.Run("MismatchedDialectPostgres", func(t *testing.T) {
		pb := postgresBackend(t)
		_, err := bunlock.NewWithDialect(ctx, pb.bunDB(t), sqlitedialect.New())
		wantInput(t, err, "dialect", `"sqlite"`)
		contains(t, err, `"pg"`, `"postgres"`, "does not match")
	})

	t.Run("NotMigrated", func(t *testing.T) {
		fresh := sqliteBackend(t).bunDB(t)
		_, err := bunlock.New(ctx, fresh)
		if !errors.Is(err, lock.ErrSchemaNotMigrated) {
			t.Fatalf("want ErrSchemaNotMigrated, got %v", err)
		}
		contains(t, err, "migrate")
	})

	t.Run("BadOption", func(t *testing.T) {
		_, err := bunlock.New(ctx, migrated, lock.WithTTL(time.Millisecond))
		if !errors.Is(err, lock.ErrInvalidInput) {
			t.Fatalf("TTL 1ms: want ErrInvalidInput, got %v", err)
		}
	})

	t.Run("RunInTxNilArguments", func(t *testing.T) {
		l, err := bunlock.New(ctx, migrated)
		if err != nil {
			t.Fatal(err)
		}
		defer closeLocker(l)
		lease, err := l.TryAcquire(ctx, "k", lock.Exclusive)
		if err != nil {
			t.Fatal(err)
		}
		defer lease.Release(ctx)
		fn := func(context.Context, bun.Tx) error { return nil }
		for field, err := range map[string]error{
			"database": bunlock.RunInTx(ctx, nil, lease, nil, fn),
			"lease":    bunlock.RunInTx(ctx, migrated, nil, nil, fn),
			"function": bunlock.RunInTx(ctx, migrated, lease, nil, nil),
		} {
			wantInput(t, err, field, "nil")
		}
	})
}

// Order is an application model written under a lease with bun's query
// builder.
type Order struct {
	bun.BaseModel `bun:"table:orders"`
	ID            int64 `bun:",pk"`
	Token         int64
}

// recorder is a bun query hook that records the queries bun sees.
type recorder struct {
	mu      sync.Mutex
	queries []string
}

func (r *recorder) BeforeQuery(ctx context.Context, _ *bun.QueryEvent) context.Context { return ctx }

func (r *recorder) AfterQuery(_ context.Context, e *bun.QueryEvent) {
	r.mu.Lock()
	r.queries = append(r.queries, e.Query)
	r.mu.Unlock()
}

func (r *recorder) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.queries...)
}

// TestRunInTx: fenced bun transactions commit only under a live lease
// (SPEC F1, F2).
func TestRunInTx(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		db := b.bunDB(t)
		if _, err := bunlock.Migrate(ctx, db, migrate.WithNamespace(b.ns)); err != nil {
			t.Fatalf("migrate: %v", err)
		}
		orders := b.table("orders")
		ordersAs := orders + ` AS "order"` // bun's alias for the model
		if _, err := db.NewCreateTable().Model((*Order)(nil)).ModelTableExpr(orders).Exec(ctx); err != nil {
			t.Fatalf("create table: %v", err)
		}
		count := func(t *testing.T) int64 {
			t.Helper()
			n, err := db.NewSelect().Model((*Order)(nil)).ModelTableExpr(ordersAs).Count(ctx)
			if err != nil {
				t.Fatalf("count: %v", err)
			}
			return n
		}
		insert := func(ctx context.Context, tx bun.Tx, id, token int64) error {
			_, err := tx.NewInsert().Model(&Order{ID: id, Token: token}).ModelTableExpr(orders).Exec(ctx)
			return err
		}
		quiet := lock.WithLogger(slog.New(slog.DiscardHandler))
		l := newBunLocker(t, db, b)

		t.Run("Commits", func(t *testing.T) {
			rec := &recorder{}
			hooked := bun.NewDB(db.DB, b.bun())
			hooked.AddQueryHook(rec)
			hl := newBunLocker(t, hooked, b)
			lease, err := hl.TryAcquire(ctx, "orders/commit", lock.Exclusive)
			if err != nil {
				t.Fatal(err)
			}
			err = bunlock.RunInTx(ctx, hooked, lease, nil, func(ctx context.Context, tx bun.Tx) error {
				return insert(ctx, tx, 1, lease.Token())
			})
			if err != nil {
				t.Fatalf("RunInTx: %v", err)
			}
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
			var got Order
			if err := db.NewSelect().Model(&got).ModelTableExpr(ordersAs).Where("id = 1").Scan(ctx); err != nil || got.Token != lease.Token() {
				t.Fatalf("committed row: %+v, %v; want token %d", got, err, lease.Token())
			}
			// bun saw the application's transaction, not the lock
			// statements (documented).
			qs := rec.all()
			joined := strings.Join(qs, "\n")
			if !strings.Contains(joined, "BEGIN") || !strings.Contains(joined, "INSERT") || !strings.Contains(joined, "COMMIT") {
				t.Errorf("bun hook should see BEGIN, INSERT and COMMIT, saw %q", qs)
			}
			if strings.Contains(joined, dialect.DefaultPrefix) {
				t.Errorf("bun hook saw a lock statement: %q", qs)
			}
		})

		t.Run("FnErrorRollsBack", func(t *testing.T) {
			lease, err := l.TryAcquire(ctx, "orders/fail", lock.Exclusive)
			if err != nil {
				t.Fatal(err)
			}
			defer lease.Release(ctx)
			before := count(t)
			boom := errors.New("boom")
			err = bunlock.RunInTx(ctx, db, lease, nil, func(ctx context.Context, tx bun.Tx) error {
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
			lease, err := l.TryAcquire(ctx, "orders/panic", lock.Exclusive)
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
				_ = bunlock.RunInTx(ctx, db, lease, nil, func(ctx context.Context, tx bun.Tx) error {
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
			short := newBunLocker(t, db, b, lock.WithTTL(lock.MinTTL), quiet)
			lease, err := short.TryAcquire(ctx, "orders/lost-before", lock.Exclusive)
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
			err = bunlock.RunInTx(ctx, db, lease, nil, func(ctx context.Context, tx bun.Tx) error {
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
			short := newBunLocker(t, db, b, lock.WithTTL(lock.MinTTL), quiet)
			lease, err := short.TryAcquire(ctx, "orders/lost-during", lock.Exclusive)
			if err != nil {
				t.Fatal(err)
			}
			before := count(t)
			err = bunlock.RunInTx(ctx, db, lease, nil, func(ctx context.Context, tx bun.Tx) error {
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
			lease, err := l.TryAcquire(ctx, "orders/released", lock.Exclusive)
			if err != nil {
				t.Fatal(err)
			}
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
			before := count(t)
			err = bunlock.RunInTx(ctx, db, lease, nil, func(ctx context.Context, tx bun.Tx) error {
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
