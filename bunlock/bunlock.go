// Package bunlock lets an application built on bun (github.com/uptrace/bun)
// take sqlease leases on the database it already uses. The lock tables live
// next to the application's tables, the lock.Locker runs on bun's own pool,
// and fenced writes run in a bun.Tx, so the application's models and query
// builder work unchanged inside them.
//
// # Setup
//
// Import the sqlease dialect of your database once, next to bun's. The
// package names clash with bun's, so import it blank (it registers itself)
// or renamed:
//
//	import (
//		"github.com/uptrace/bun"
//		"github.com/uptrace/bun/dialect/pgdialect"
//
//		"github.com/sqlease/sqlease/bunlock"
//		_ "github.com/sqlease/sqlease/dialect/pgdialect" // sqlease dialect "postgres"
//		"github.com/sqlease/sqlease/lock"
//	)
//
// Create the lock tables with Migrate, at start-up or from your deploy step.
// It is idempotent and safe when several replicas run it at the same moment.
// The tables are recorded in their own version table (sqlease_db_version),
// never in bun's or goose's, so the application's migrations are unaffected
// (see docs/integrations.md for goose and other migration tools):
//
//	if _, err := bunlock.Migrate(ctx, db); err != nil {
//		return err
//	}
//
// Build one Locker per process with New and keep it for the life of the
// process. It checks that the tables are migrated and fails with an error
// matching lock.ErrSchemaNotMigrated if they are not:
//
//	locker, err := bunlock.New(ctx, db, lock.WithTTL(30*time.Second))
//	if err != nil {
//		return err
//	}
//	defer locker.Close(context.Background())
//
// # Taking a lease and writing under it
//
// Everything about leases is package lock: TryAcquire, Acquire, Do,
// Lease.Release, Lease.Context. RunInTx adds the bun form of a fenced write
// (SPEC F1, F2): a bun.Tx whose first statement checks that the lease is
// still live and keeps it from being taken over until the transaction ends,
// and which commits only if the lease was not lost meanwhile:
//
//	err := locker.Do(ctx, "reports/nightly", lock.Exclusive, func(ctx context.Context, lease *lock.Lease) error {
//		report := build(ctx)
//		return bunlock.RunInTx(ctx, db, lease, nil, func(ctx context.Context, tx bun.Tx) error {
//			report.Token = lease.Token()
//			_, err := tx.NewInsert().Model(report).Exec(ctx)
//			return err
//		})
//	})
//
// A write after the lease was lost fails with an error matching
// lock.ErrLeaseLost and commits nothing. Use lease.Token() as a fencing token
// when the protected resource lives outside this database.
//
// To fence a transaction you begin yourself (bun's db.RunInTx, say), call
// lease.Fence(ctx, tx.Tx) as its first statement (on SQLite it must be the
// first), and do not commit if lease.Err() reports a loss before the commit.
//
// # Which sqlease dialect
//
// New and Migrate infer the sqlease dialect from bun's (db.Dialect().Name()):
// bun's pgdialect (dialect.PG) needs sqlease's "postgres" and bun's
// sqlitedialect (dialect.SQLite) needs sqlease's "sqlite", looked up with
// dialect.Lookup, so the sqlease dialect package must be imported (the error
// says which). For
// another bun dialect they ask the registered sqlease dialects whether one
// recognizes the database/sql driver (dialect.Detect), and otherwise fail
// with an error matching dialect.ErrUnknownDialect that names the bun
// dialect and lists the registered ones. Pass a dialect yourself with
// NewWithDialect (a third-party dialect, or to skip the inference); it is
// rejected when it contradicts bun's (a PostgreSQL bun.DB with the SQLite
// dialect, say), with an error naming both.
//
// # What bun sees
//
// Lock statements (acquire, renew, release, fence, sweep) run on bun's
// underlying *sql.DB (db.DB) and, for the fence, on the bun.Tx's *sql.Tx;
// they never go through bun's query builder. So bun query hooks (bunotel,
// bundebug, your own) do not see them; they see the BEGIN, your queries and
// the COMMIT of RunInTx. A connection resolver (read replicas) is not
// consulted: locks always use the primary pool db.DB.
//
// # Pools
//
// Renewals share the pool with the application. A pool that the application
// can exhaust (SQLite setups often use SetMaxOpenConns(1)) can delay
// renewals past the lease's trusted window; give the Locker its own small
// pool with lock.WithRenewDB (SPEC H7). On SQLite a fenced transaction holds
// the database write lock until it ends, and every renewal waits behind it:
// keep fenced transactions much shorter than the TTL.
//
// "SPEC H3" and the like cite the numbered rules of docs/contract.md in the
// repository, the contract sqlease keeps on every dialect.
package bunlock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/uptrace/bun"
	bundialect "github.com/uptrace/bun/dialect"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// known maps bun dialects to the sqlease dialect that speaks to the same
// database, with the package that registers it.
var known = map[bundialect.Name]struct{ name, pkg string }{
	bundialect.PG:     {"postgres", "github.com/sqlease/sqlease/dialect/pgdialect"},
	bundialect.SQLite: {"sqlite", "github.com/sqlease/sqlease/dialect/sqlitedialect"},
}

// New builds a lock.Locker on db's database: it infers the sqlease dialect
// from db's bun dialect (see the package documentation), runs on db's
// underlying *sql.DB, and checks that the lock tables are migrated. opts are
// lock options (TTL, owner, schema, table prefix, ...).
//
// Errors: a nil db (a *lock.InputError matching lock.ErrInvalidInput); a
// bun dialect with no registered sqlease dialect (matches
// dialect.ErrUnknownDialect, names it and says how to pass one with
// NewWithDialect); otherwise lock.New's errors, for example
// lock.ErrSchemaNotMigrated when Migrate has not run.
func New(ctx context.Context, db *bun.DB, opts ...lock.Option) (*lock.Locker, error) {
	return NewWithDialect(ctx, db, nil, opts...)
}

// NewWithDialect is New with an explicit sqlease dialect d (nil: inferred
// as by New). Use it for a bun dialect sqlease does not map, or a
// third-party sqlease dialect.
//
// Errors: as New; and a *lock.InputError (lock.ErrInvalidInput), naming both,
// when d contradicts db's bun dialect (for example sqlite on a bun.DB with
// pgdialect).
func NewWithDialect(ctx context.Context, db *bun.DB, d dialect.Dialect, opts ...lock.Option) (*lock.Locker, error) {
	d, err := resolve(db, d, "new locker")
	if err != nil {
		return nil, err
	}
	l, err := lock.New(ctx, db.DB, d, opts...)
	if errors.Is(err, lock.ErrSchemaNotMigrated) {
		return nil, fmt.Errorf("bunlock: new locker: %w (from bun: bunlock.Migrate(ctx, db), with the same schema and prefix)", err)
	}
	return l, err
}

// Migrate creates or upgrades the lock tables in db's database, with the
// sqlease dialect inferred as by New; it returns the names of the migrations
// it applied (none when the tables are current). Use
// migrate.WithNamespace to place them in a schema or under another prefix,
// matching the Locker's lock.WithSchema and lock.WithTablePrefix. With an
// explicit dialect, call migrate.Up(ctx, db.DB, d, opts...) instead.
//
// Errors: a nil db (lock.ErrInvalidInput), a bun dialect with no sqlease
// dialect (dialect.ErrUnknownDialect), or migrate.Up's error.
func Migrate(ctx context.Context, db *bun.DB, opts ...migrate.Option) ([]string, error) {
	d, err := resolve(db, nil, "migrate")
	if err != nil {
		return nil, err
	}
	return migrate.Up(ctx, db.DB, d, opts...)
}

// RunInTx runs fn in a bun transaction fenced by lease (SPEC F1, F2): it
// begins a bun.Tx on db with opts, runs lease.Fence as the transaction's
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
func RunInTx(ctx context.Context, db *bun.DB, lease *lock.Lease, opts *sql.TxOptions, fn func(ctx context.Context, tx bun.Tx) error) error {
	switch {
	case db == nil || db.DB == nil:
		return fmt.Errorf("bunlock: fenced transaction: %w", &lock.InputError{Field: "database", Value: "nil", Allowed: "pass the *bun.DB the lease lives in"})
	case lease == nil:
		return fmt.Errorf("bunlock: fenced transaction: %w", &lock.InputError{Field: "lease", Value: "nil", Allowed: "pass the *lock.Lease to fence with"})
	case fn == nil:
		return fmt.Errorf("bunlock: fenced transaction %q: %w", lease.Key(), &lock.InputError{Field: "function", Value: "nil", Allowed: "pass a function to run"})
	}
	return lock.RunFenced(ctx, lease, func(ctx context.Context) (bun.Tx, *sql.Tx, error) {
		tx, err := db.BeginTx(ctx, opts)
		return tx, tx.Tx, err
	}, fn)
}

// resolve returns the sqlease dialect for db: d checked against bun's
// dialect, or the inferred one when d is nil.
func resolve(db *bun.DB, d dialect.Dialect, op string) (dialect.Dialect, error) {
	if db == nil || db.DB == nil {
		return nil, (&lock.InputError{Pkg: "bunlock: " + op, Field: "database", Value: "nil",
			Allowed: "pass the application's *bun.DB (bun.NewDB(sqldb, pgdialect.New()) or similar)"})
	}
	bunName := db.Dialect().Name()
	want, isKnown := known[bunName]
	if d != nil {
		// Reject only what is known to be wrong: another sqlease dialect
		// on a bun.DB sqlease has a built-in for, or a built-in sqlease
		// dialect on a bun.DB that bun says is another database. A custom
		// bun dialect says nothing, so any sqlease dialect goes.
		mismatch := isKnown && d.Name() != want.name
		if isNamed(bunName) {
			for n, k := range known {
				if k.name == d.Name() && n != bunName {
					mismatch = true
				}
			}
		}
		if mismatch {
			hint := "pass a dialect for the database bun is configured for"
			if isKnown {
				hint = fmt.Sprintf("pass sqlease dialect %q or nil to infer it", want.name)
			}
			return nil, (&lock.InputError{Pkg: "bunlock: " + op, Field: "dialect", Value: strconv.Quote(d.Name()),
				Allowed: fmt.Sprintf("does not match the bun.DB's dialect %q; %s", bunName, hint)})
		}
		return d, nil
	}
	if isKnown {
		d, err := dialect.Lookup(want.name)
		if err != nil {
			return nil, &lock.InputError{Pkg: "bunlock: " + op, Field: "bun dialect", Value: strconv.Quote(bunName.String()),
				Allowed: fmt.Sprintf("needs sqlease dialect %q, which is not registered (registered: %s): import _ %q, or pass a dialect with bunlock.NewWithDialect(ctx, db, d, opts...)", want.name, names(), want.pkg),
				Err:     dialect.ErrUnknownDialect}
		}
		return d, nil
	}
	if d, err := dialect.Detect(db.DB); err == nil {
		return d, nil
	}
	return nil, &lock.InputError{Pkg: "bunlock: " + op, Field: "bun dialect", Value: strconv.Quote(bunName.String()),
		Allowed: fmt.Sprintf("has no sqlease dialect (registered: %s), and none recognizes the driver %T; pass one with bunlock.NewWithDialect(ctx, db, d, opts...)", names(), db.DB.Driver()),
		Err:     dialect.ErrUnknownDialect}
}

// isNamed reports whether bun names the database n is for (not Invalid or a
// custom dialect).
func isNamed(n bundialect.Name) bool {
	switch n {
	case bundialect.PG, bundialect.SQLite, bundialect.MySQL, bundialect.MSSQL, bundialect.Oracle:
		return true
	}
	return false
}

func names() string {
	n := dialect.Names()
	if len(n) == 0 {
		return "none"
	}
	return strings.Join(n, ", ")
}
