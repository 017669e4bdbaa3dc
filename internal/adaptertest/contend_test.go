package adaptertest

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/uptrace/bun"
	bunpg "github.com/uptrace/bun/dialect/pgdialect"
	bunsqlite "github.com/uptrace/bun/dialect/sqlitedialect"
	"github.com/uptrace/bun/schema"

	"github.com/sqlease/sqlease/bunlock"
	"github.com/sqlease/sqlease/conformance/conftest"
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/pgdialect"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
	"github.com/sqlease/sqlease/sqlxlock"
)

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
	s := "adaptertest_t_" + hex.EncodeToString(b)
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

// sqlxDB opens a sqlx.DB on a new pool.
func (b backend) sqlxDB(t *testing.T) *sqlx.DB { return sqlx.NewDb(b.open(t), b.driver) }

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

func newSqlxLocker(t *testing.T, db *sqlx.DB, b backend, opts ...lock.Option) *lock.Locker {
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

func wantLocked(t *testing.T, what string, err error, holder *lock.Lease) {
	t.Helper()
	var le *lock.LockedError
	if !errors.As(err, &le) || !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("%s: want a *lock.LockedError matching ErrLocked, got %v", what, err)
	}
	if holder == nil {
		return
	}
	for _, h := range le.Holders {
		if h.LeaseID == holder.LeaseID() && h.Token == holder.Token() && h.Owner == holder.Owner() {
			return
		}
	}
	t.Errorf("%s: conflict should name the holder %s (token %d, owner %q), got %+v", what, holder.LeaseID(), holder.Token(), holder.Owner(), le.Holders)
}

// TestBunAndSqlxContend: a bun application and a sqlx application in one
// process, each with its own pool, share the lock tables of one database
// (migrated once, by either) and contend for one key; S1 holds across them.
func TestBunAndSqlxContend(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		bdb, xdb := b.bunDB(t), b.sqlxDB(t)
		applied, err := bunlock.Migrate(ctx, bdb, migrate.WithNamespace(b.ns))
		if err != nil || len(applied) == 0 {
			t.Fatalf("bunlock.Migrate: applied %v, err %v; want the lock migrations applied", applied, err)
		}
		again, err := sqlxlock.Migrate(ctx, xdb, migrate.WithNamespace(b.ns))
		if err != nil || len(again) != 0 {
			t.Fatalf("sqlxlock.Migrate after bunlock.Migrate: applied %v, err %v; want nothing left to apply", again, err)
		}
		bl := newBunLocker(t, bdb, b, lock.WithOwner("bun-app"), lock.WithMaxBackoff(20*time.Millisecond))
		xl := newSqlxLocker(t, xdb, b, lock.WithOwner("sqlx-app"), lock.WithMaxBackoff(20*time.Millisecond))
		const key = "orders/42"

		t.Run("ExclusiveBlocksTheOther", func(t *testing.T) {
			for _, dir := range []struct {
				name           string
				holder, waiter *lock.Locker
			}{{"bun holds", bl, xl}, {"sqlx holds", xl, bl}} {
				x, err := dir.holder.TryAcquire(ctx, key, lock.Exclusive)
				if err != nil {
					t.Fatalf("%s: exclusive: %v", dir.name, err)
				}
				for _, m := range []lock.Mode{lock.Exclusive, lock.Shared} {
					_, err := dir.waiter.TryAcquire(ctx, key, m)
					wantLocked(t, fmt.Sprintf("%s: other app's %s", dir.name, m), err, x)
				}
				// The blocking form waits until the holder releases.
				got := make(chan *lock.Lease, 1)
				errc := make(chan error, 1)
				go func() {
					l, err := dir.waiter.Acquire(ctx, key, lock.Exclusive, lock.WaitTimeout(20*time.Second))
					if err != nil {
						errc <- err
						return
					}
					got <- l
				}()
				select {
				case l := <-got:
					t.Fatalf("%s: other app granted token %d while the key was held", dir.name, l.Token())
				case err := <-errc:
					t.Fatalf("%s: other app's blocking acquire: %v", dir.name, err)
				case <-time.After(300 * time.Millisecond):
				}
				if err := x.Release(ctx); err != nil {
					t.Fatalf("%s: release: %v", dir.name, err)
				}
				select {
				case y := <-got:
					if y.Token() <= x.Token() {
						t.Errorf("%s: successor token %d not greater than %d (S3)", dir.name, y.Token(), x.Token())
					}
					if err := y.Release(ctx); err != nil {
						t.Fatalf("%s: release successor: %v", dir.name, err)
					}
				case err := <-errc:
					t.Fatalf("%s: other app's blocking acquire after release: %v", dir.name, err)
				case <-time.After(15 * time.Second):
					t.Fatalf("%s: other app not granted within 15s of the release", dir.name)
				}
			}
		})

		t.Run("SharedCoexist", func(t *testing.T) {
			bs, err := bl.TryAcquire(ctx, key, lock.Shared)
			if err != nil {
				t.Fatalf("bun shared: %v", err)
			}
			xs, err := xl.TryAcquire(ctx, key, lock.Shared)
			if err != nil {
				t.Fatalf("sqlx shared while bun holds shared: %v", err)
			}
			writer := newBunLocker(t, bdb, b, lock.WithOwner("bun-writer"))
			_, err = writer.TryAcquire(ctx, key, lock.Exclusive)
			var le *lock.LockedError
			if !errors.As(err, &le) || len(le.Holders) != 2 {
				t.Fatalf("exclusive while both apps hold shared: want LockedError naming 2 holders, got %v", err)
			}
			for _, l := range []*lock.Lease{bs, xs} {
				if err := l.Release(ctx); err != nil {
					t.Fatalf("release %s: %v", l.Owner(), err)
				}
			}
			w, err := writer.TryAcquire(ctx, key, lock.Exclusive)
			if err != nil {
				t.Fatalf("exclusive after both shared released: %v", err)
			}
			_ = w.Release(ctx)
		})

		t.Run("MutualExclusionUnderContention", func(t *testing.T) {
			contend(t, b, bdb, xdb)
		})
	})
}

// contend runs workers through both adapters on one key: exclusive holders
// read a counter outside any transaction and write counter+1 in a fenced
// transaction, shared holders only look. Any overlap of an exclusive lease
// with another lease shows up in the in-process counters, and as a lost
// update of the counter.
func contend(t *testing.T, b backend, bdb *bun.DB, xdb *sqlx.DB) {
	ctx := t.Context()
	table := b.table("counter")
	if _, err := bdb.DB.ExecContext(ctx, "CREATE TABLE "+table+" (id INTEGER PRIMARY KEY, n BIGINT NOT NULL, token BIGINT NOT NULL)"); err != nil {
		t.Fatalf("create table: %v", err)
	}
	if _, err := bdb.DB.ExecContext(ctx, "INSERT INTO "+table+" (id, n, token) VALUES (1, 0, 0)"); err != nil {
		t.Fatalf("insert: %v", err)
	}
	const key, perWorker = "counter", 12
	var excl, shared atomic.Int32
	var writes atomic.Int64
	var violations []string
	var mu sync.Mutex
	violate := func(format string, args ...any) {
		mu.Lock()
		violations = append(violations, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	// write is the fenced increment through one adapter.
	type writer func(ctx context.Context, lease *lock.Lease, n int64) error
	bunWrite := func(ctx context.Context, lease *lock.Lease, n int64) error {
		return bunlock.RunInTx(ctx, bdb, lease, nil, func(ctx context.Context, tx bun.Tx) error {
			var prev int64
			if err := tx.NewSelect().ColumnExpr("token").TableExpr(table).Where("id = 1").Scan(ctx, &prev); err != nil {
				return err
			}
			if prev >= lease.Token() {
				violate("bun: token %d written after token %d (S3)", lease.Token(), prev)
			}
			_, err := tx.NewUpdate().TableExpr(table).Set("n = ?", n).Set("token = ?", lease.Token()).Where("id = 1").Exec(ctx)
			return err
		})
	}
	sqlxWrite := func(ctx context.Context, lease *lock.Lease, n int64) error {
		return sqlxlock.RunInTx(ctx, xdb, lease, nil, func(ctx context.Context, tx *sqlx.Tx) error {
			var prev int64
			if err := tx.GetContext(ctx, &prev, "SELECT token FROM "+table+" WHERE id = 1"); err != nil {
				return err
			}
			if prev >= lease.Token() {
				violate("sqlx: token %d written after token %d (S3)", lease.Token(), prev)
			}
			_, err := tx.ExecContext(ctx, tx.Rebind("UPDATE "+table+" SET n = ?, token = ? WHERE id = 1"), n, lease.Token())
			return err
		})
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := 0; w < 4; w++ {
		var l *lock.Locker
		var write writer
		var read func(ctx context.Context) (int64, error)
		if w%2 == 0 {
			l = newBunLocker(t, bdb, b, lock.WithOwner(fmt.Sprintf("bun-%d", w)), lock.WithMaxBackoff(20*time.Millisecond))
			write = bunWrite
			read = func(ctx context.Context) (n int64, err error) {
				err = bdb.NewSelect().ColumnExpr("n").TableExpr(table).Where("id = 1").Scan(ctx, &n)
				return n, err
			}
		} else {
			l = newSqlxLocker(t, xdb, b, lock.WithOwner(fmt.Sprintf("sqlx-%d", w)), lock.WithMaxBackoff(20*time.Millisecond))
			write = sqlxWrite
			read = func(ctx context.Context) (n int64, err error) {
				err = xdb.GetContext(ctx, &n, "SELECT n FROM "+table+" WHERE id = 1")
				return n, err
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWorker; i++ {
				mode := lock.Exclusive
				if i%3 == 2 {
					mode = lock.Shared
				}
				lease, err := l.Acquire(ctx, key, mode, lock.WaitTimeout(30*time.Second))
				if err != nil {
					errs <- fmt.Errorf("%s: acquire %s: %w", l.Owner(), mode, err)
					return
				}
				if mode == lock.Exclusive {
					if n := excl.Add(1); n != 1 || shared.Load() != 0 {
						violate("%s: exclusive token %d granted with %d exclusive and %d shared held (S1)", l.Owner(), lease.Token(), n-1, shared.Load())
					}
					n, err := read(ctx)
					if err == nil {
						time.Sleep(time.Millisecond) // widen the read-modify-write window
						err = write(ctx, lease, n+1)
					}
					excl.Add(-1)
					if err != nil {
						errs <- fmt.Errorf("%s: fenced increment: %w", l.Owner(), err)
						_ = lease.Release(ctx)
						return
					}
					writes.Add(1)
				} else {
					shared.Add(1)
					if excl.Load() != 0 {
						violate("%s: shared token %d granted while an exclusive lease is held (S1)", l.Owner(), lease.Token())
					}
					time.Sleep(2 * time.Millisecond)
					shared.Add(-1)
				}
				if err := lease.Release(ctx); err != nil {
					errs <- fmt.Errorf("%s: release: %w", l.Owner(), err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, v := range violations {
		t.Error(v)
	}
	var n int64
	if err := bdb.DB.QueryRowContext(ctx, "SELECT n FROM "+table+" WHERE id = 1").Scan(&n); err != nil {
		t.Fatalf("read counter: %v", err)
	}
	if n != writes.Load() {
		t.Errorf("counter is %d after %d fenced increments: updates were lost, two exclusive holders overlapped (S1)", n, writes.Load())
	}
}
