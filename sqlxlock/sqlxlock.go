// Package sqlxlock lets an application built on sqlx
// (github.com/jmoiron/sqlx) take sqlease leases on the database it already
// uses. The lock tables live next to the application's tables, the
// lock.Locker runs on the sqlx.DB's own pool, and fenced writes run in a
// *sqlx.Tx, so Get, Select, NamedExec and Rebind work unchanged inside them.
//
// # Setup
//
// Import the sqlease dialect of your database once (it registers itself):
//
//	import (
//		_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
//		"github.com/jmoiron/sqlx"
//
//		_ "github.com/sqlease/sqlease/dialect/pgdialect" // sqlease dialect "postgres"
//		"github.com/sqlease/sqlease/lock"
//		"github.com/sqlease/sqlease/sqlxlock"
//	)
//
// Create the lock tables with Migrate, at start-up or from your deploy step.
// It is idempotent and safe when several replicas run it at the same moment.
// The tables are recorded in their own version table (sqlease_db_version),
// never in goose's goose_db_version or another tool's, so the application's
// migrations are unaffected (see docs/integrations.md for goose and other
// migration tools):
//
//	if _, err := sqlxlock.Migrate(ctx, db); err != nil {
//		return err
//	}
//
// Build one Locker per process with New and keep it for the life of the
// process. It checks that the tables are migrated and fails with an error
// matching lock.ErrSchemaNotMigrated if they are not:
//
//	locker, err := sqlxlock.New(ctx, db, lock.WithTTL(30*time.Second))
//	if err != nil {
//		return err
//	}
//	defer locker.Close(context.Background())
//
// # Taking a lease and writing under it
//
// Everything about leases is package lock: TryAcquire, Acquire, Do,
// Lease.Release, Lease.Context. RunInTx adds the sqlx form of a fenced write
// (SPEC F1, F2): a *sqlx.Tx whose first statement checks that the lease is
// still live and keeps it from being taken over until the transaction ends,
// and which commits only if the lease was not lost meanwhile:
//
//	err := locker.Do(ctx, "reports/nightly", lock.Exclusive, func(ctx context.Context, lease *lock.Lease) error {
//		return sqlxlock.RunInTx(ctx, db, lease, nil, func(ctx context.Context, tx *sqlx.Tx) error {
//			_, err := tx.ExecContext(ctx, tx.Rebind(`INSERT INTO reports (day, token) VALUES (?, ?)`), day, lease.Token())
//			return err
//		})
//	})
//
// A write after the lease was lost fails with an error matching
// lock.ErrLeaseLost and commits nothing. Use lease.Token() as a fencing token
// when the protected resource lives outside this database.
//
// To fence a transaction you begin yourself, call lease.Fence(ctx, tx.Tx) as
// its first statement (on SQLite it must be the first), and do not commit if
// lease.Err() reports a loss before the commit.
//
// # Which sqlease dialect
//
// New and Migrate infer the sqlease dialect from the sqlx.DB's driver name
// (db.DriverName()): "pgx", "pgx/v5" and "postgres" are "postgres";
// "sqlite3" and "sqlite" are "sqlite", looked up with dialect.Lookup, so the
// sqlease dialect package must be imported. For another driver name (a
// driver registered under a name of your own, say) they ask the registered
// sqlease dialects whether one recognizes the driver itself
// (dialect.Detect), and otherwise fail with an error matching
// dialect.ErrUnknownDialect that names the driver. Pass a dialect yourself
// with NewWithDialect; it is rejected when it contradicts the driver name
// (a "pgx" sqlx.DB with the SQLite dialect, say), with an error naming both.
//
// # Pools
//
// Lock statements run on the sqlx.DB's *sql.DB (db.DB), and renewals share
// the pool with the application. A pool that the application can exhaust
// can delay renewals past the lease's trusted window; give the Locker its
// own small pool with lock.WithRenewDB (SPEC H7). On SQLite a fenced
// transaction holds the database write lock until it ends, and every
// renewal waits behind it: keep fenced transactions much shorter than the
// TTL.
//
// "SPEC H3" and the like cite the numbered rules of docs/contract.md in the
// repository, the contract sqlease keeps on every dialect.
package sqlxlock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jmoiron/sqlx"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// known maps database/sql driver names to the sqlease dialect that speaks
// to their database, with the package that registers it.
var known = map[string]struct{ name, pkg string }{
	"pgx":      {"postgres", "github.com/sqlease/sqlease/dialect/pgdialect"},
	"pgx/v5":   {"postgres", "github.com/sqlease/sqlease/dialect/pgdialect"},
	"postgres": {"postgres", "github.com/sqlease/sqlease/dialect/pgdialect"},
	"sqlite3":  {"sqlite", "github.com/sqlease/sqlease/dialect/sqlitedialect"},
	"sqlite":   {"sqlite", "github.com/sqlease/sqlease/dialect/sqlitedialect"},
}

// New builds a lock.Locker on db's database: it infers the sqlease dialect
// from db's driver name (see the package documentation), runs on db's
// *sql.DB, and checks that the lock tables are migrated. opts are lock
// options (TTL, owner, schema, table prefix, ...).
//
// Errors: a nil db (a *lock.InputError matching lock.ErrInvalidInput); a
// driver with no registered sqlease dialect (matches
// dialect.ErrUnknownDialect, names the driver and says how to pass a dialect
// with NewWithDialect); otherwise lock.New's errors, for example
// lock.ErrSchemaNotMigrated when Migrate has not run.
func New(ctx context.Context, db *sqlx.DB, opts ...lock.Option) (*lock.Locker, error) {
	return NewWithDialect(ctx, db, nil, opts...)
}

// NewWithDialect is New with an explicit sqlease dialect d (nil: inferred
// as by New). Use it for a driver sqlxlock does not know, or a third-party
// sqlease dialect.
//
// Errors: as New; and a *lock.InputError (lock.ErrInvalidInput), naming both,
// when d contradicts db's driver name (for example sqlite on a "pgx"
// sqlx.DB).
func NewWithDialect(ctx context.Context, db *sqlx.DB, d dialect.Dialect, opts ...lock.Option) (*lock.Locker, error) {
	d, err := resolve(db, d, "new locker")
	if err != nil {
		return nil, err
	}
	l, err := lock.New(ctx, db.DB, d, opts...)
	if errors.Is(err, lock.ErrSchemaNotMigrated) {
		return nil, fmt.Errorf("sqlxlock: new locker: %w (from sqlx: sqlxlock.Migrate(ctx, db), with the same schema and prefix)", err)
	}
	return l, err
}

// Migrate creates or upgrades the lock tables in db's database, with the
// sqlease dialect inferred as by New; it returns the names of the migrations
// it applied (none when the tables are current). Use migrate.WithNamespace
// to place them in a schema or under another prefix, matching the Locker's
// lock.WithSchema and lock.WithTablePrefix. With an explicit dialect, call
// migrate.Up(ctx, db.DB, d, opts...) instead.
//
// Errors: a nil db (lock.ErrInvalidInput), a driver with no sqlease dialect
// (dialect.ErrUnknownDialect), or migrate.Up's error.
func Migrate(ctx context.Context, db *sqlx.DB, opts ...migrate.Option) ([]string, error) {
	d, err := resolve(db, nil, "migrate")
	if err != nil {
		return nil, err
	}
	return migrate.Up(ctx, db.DB, d, opts...)
}

// RunInTx runs fn in a sqlx transaction fenced by lease (SPEC F1, F2): it
// begins a *sqlx.Tx on db with opts, runs lease.Fence as the transaction's
// first statement, runs fn, and commits only if the fence held and the lease
// was not lost meanwhile; otherwise, or if fn fails or panics, it rolls
// back. It keeps the semantics of lock.Lease.RunInTx. db must reach the
// database the lease lives in.
//
// Errors: a *lock.LeaseLostError (lock.ErrLeaseLost) when the fence failed
// or the lease was lost before commit (nothing is committed); an error
// matching lock.ErrNotHeld when the lease was released before (nothing is
// committed); fn's error (rolled back); a *lock.InputError (lock.ErrInvalidInput) for a nil db,
// lease or fn; or the database's error.
func RunInTx(ctx context.Context, db *sqlx.DB, lease *lock.Lease, opts *sql.TxOptions, fn func(ctx context.Context, tx *sqlx.Tx) error) error {
	switch {
	case db == nil || db.DB == nil:
		return fmt.Errorf("sqlxlock: fenced transaction: %w", &lock.InputError{Field: "database", Value: "nil", Allowed: "pass the *sqlx.DB the lease lives in"})
	case lease == nil:
		return fmt.Errorf("sqlxlock: fenced transaction: %w", &lock.InputError{Field: "lease", Value: "nil", Allowed: "pass the *lock.Lease to fence with"})
	case fn == nil:
		return fmt.Errorf("sqlxlock: fenced transaction %q: %w", lease.Key(), &lock.InputError{Field: "function", Value: "nil", Allowed: "pass a function to run"})
	}
	return lock.RunFenced(ctx, lease, func(ctx context.Context) (*sqlx.Tx, *sql.Tx, error) {
		tx, err := db.BeginTxx(ctx, opts)
		if err != nil {
			return nil, nil, err
		}
		return tx, tx.Tx, nil
	}, fn)
}

// resolve returns the sqlease dialect for db: d checked against db's driver
// name, or the inferred one when d is nil.
func resolve(db *sqlx.DB, d dialect.Dialect, op string) (dialect.Dialect, error) {
	if db == nil || db.DB == nil {
		return nil, (&lock.InputError{Pkg: "sqlxlock: " + op, Field: "database", Value: "nil",
			Allowed: "pass the application's *sqlx.DB (sqlx.Open, sqlx.Connect or sqlx.NewDb)"})
	}
	driver := db.DriverName()
	want, isKnown := known[driver]
	if d != nil {
		// Reject only what is known to be wrong: a dialect other than the
		// one a known driver name speaks to.
		if isKnown && d.Name() != want.name {
			return nil, (&lock.InputError{Pkg: "sqlxlock: " + op, Field: "dialect", Value: strconv.Quote(d.Name()),
				Allowed: fmt.Sprintf("does not match the sqlx.DB's driver %q, which needs sqlease dialect %q; pass that dialect or nil to infer it", driver, want.name)})
		}
		return d, nil
	}
	if isKnown {
		d, err := dialect.Lookup(want.name)
		if err != nil {
			return nil, &lock.InputError{Pkg: "sqlxlock: " + op, Field: "driver", Value: strconv.Quote(driver),
				Allowed: fmt.Sprintf("needs sqlease dialect %q, which is not registered (registered: %s): import _ %q, or pass a dialect with sqlxlock.NewWithDialect(ctx, db, d, opts...)", want.name, names(), want.pkg),
				Err:     dialect.ErrUnknownDialect}
		}
		return d, nil
	}
	if d, err := dialect.Detect(db.DB); err == nil {
		return d, nil
	}
	return nil, &lock.InputError{Pkg: "sqlxlock: " + op, Field: "driver", Value: fmt.Sprintf("%q (%T)", driver, db.DB.Driver()),
		Allowed: fmt.Sprintf("no registered sqlease dialect (%s) recognizes it; known driver names are %s; pass a dialect with sqlxlock.NewWithDialect(ctx, db, d, opts...)", names(), knownNames()),
		Err:     dialect.ErrUnknownDialect}
}

func names() string {
	n := dialect.Names()
	if len(n) == 0 {
		return "none"
	}
	return strings.Join(n, ", ")
}

func knownNames() string {
	return `"pgx", "pgx/v5", "postgres" (postgres), "sqlite3", "sqlite" (sqlite)`
}
