package gooselock_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sqlease/sqlease/conformance/conftest"
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/gooselock"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// Bad input is refused before anything is written, with an error naming
// the value that matches lock.ErrInvalidInput (SPEC I1).
func TestBadInput(t *testing.T) {
	ctx := t.Context()
	open := func(maxConns int) *sql.DB {
		db, err := sql.Open("sqlite", conftest.SQLiteDSN(filepath.Join(t.TempDir(), "app.db")))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		db.SetMaxOpenConns(maxConns)
		return db
	}
	lockWith := func(db *sql.DB, opts ...gooselock.Option) func() error {
		return func() error {
			l, err := gooselock.New(nil, opts...)
			if err != nil {
				return err
			}
			return l.Lock(ctx, db)
		}
	}
	newWith := func(d dialect.Dialect, opts ...gooselock.Option) func() error {
		return func() error { _, err := gooselock.New(d, opts...); return err }
	}
	for _, tc := range []struct {
		name string
		run  func() error
		want string
	}{
		{"empty key", newWith(nil, gooselock.WithKey("")), `invalid key ""`},
		{"key with NUL", newWith(nil, gooselock.WithKey("a\x00b")), "contains NUL"},
		{"zero TTL", newWith(nil, gooselock.WithTTL(0)), "invalid TTL 0s"},
		{"TTL too long", newWith(nil, gooselock.WithTTL(48*time.Hour)), "invalid TTL 48h0m0s"},
		{"nil logger", newWith(nil, gooselock.WithLogger(nil)), "invalid logger nil"},
		{"nil on-lost", newWith(nil, gooselock.WithOnLost(nil)), "invalid on-lost function nil"},
		{"nil lock option", newWith(nil, gooselock.WithLockOptions(nil)), "invalid lock option nil (lock option 1 of 1)"},
		{"nil option", newWith(nil, nil), "invalid option nil (option 1 of 1)"},
		{"schema on SQLite", newWith(sqlitedialect.New(), gooselock.WithNamespace(dialect.Namespace{Schema: "locks"})), `schema "locks"`},
		{"schema on SQLite, detected", lockWith(open(0), gooselock.WithNamespace(dialect.Namespace{Schema: "locks"})), `schema "locks"`},
		{"bad lock option", lockWith(open(0), gooselock.WithLockOptions(lock.WithOwner(""))), `invalid owner ""`},
		{"prefix as a lock option", lockWith(open(0), gooselock.WithLockOptions(lock.WithTablePrefix("nc_"))), `invalid namespace in WithLockOptions schema "", prefix "nc_"`},
		{"nil db", lockWith(nil), "invalid database nil"},
		{"one-connection pool", lockWith(open(1)), "SetMaxOpenConns(1)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run()
			var ie *lock.InputError
			if !errors.Is(err, lock.ErrInvalidInput) || !errors.As(err, &ie) {
				t.Fatalf("%v: want a *lock.InputError matching lock.ErrInvalidInput", err)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "gooselock: invalid ") || strings.Count(msg, "gooselock:") != 1 || !strings.Contains(msg, tc.want) {
				t.Errorf("message %q: want one gooselock: prefix and %q", msg, tc.want)
			}
		})
	}
}

// Unlock without a Lock to undo says so; a Lock whose context ends while
// another holds the lease returns the context's error and leaves the
// Locker usable.
func TestUnlockWithoutLockAndCancelledLock(t *testing.T) {
	db, err := sql.Open("sqlite", conftest.SQLiteDSN(filepath.Join(t.TempDir(), "app.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := t.Context()
	a, err := gooselock.New(nil, gooselock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Unlock(ctx, db); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("Unlock without Lock: %v, want lock.ErrNotHeld", err)
	}
	if err := a.Lock(ctx, db); err != nil {
		t.Fatal(err)
	}
	if a.Lease() == nil || a.Lease().Key() != gooselock.DefaultKey {
		t.Fatalf("Lease() = %v, want a lease of %q", a.Lease(), gooselock.DefaultKey)
	}
	b, err := gooselock.New(sqlitedialect.New(), gooselock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := b.Lock(wctx, db); err == nil {
		t.Fatal("a second Locker got the lease while the first held it")
	}
	if err := a.Unlock(ctx, db); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	if err := b.Lock(ctx, db); err != nil {
		t.Fatalf("Lock after the holder's Unlock: %v", err)
	}
	if err := b.Unlock(ctx, db); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
}

// On a dialect whose migration lock needs a connection of its own
// (PostgreSQL), creating the lock tables inside goose's Lock needs three:
// a pool of two is refused at once instead of waiting for the context,
// and works once the tables exist.
func TestTwoConnectionsNeedTablesFirst(t *testing.T) {
	b := newBackend(t, "postgres")
	db := b.open(t)
	db.SetMaxOpenConns(2)
	l, err := gooselock.New(b.d, gooselock.WithTTL(time.Second), gooselock.WithNamespace(b.ns()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	// goose holds one connection while it calls Lock.
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = l.Lock(ctx, db)
	if !errors.Is(err, lock.ErrInvalidInput) || !strings.Contains(err.Error(), "SetMaxOpenConns(2)") {
		t.Fatalf("Lock on a two-connection pool without the lock tables: %v, want an error naming SetMaxOpenConns(2)", err)
	}
	conn.Close()
	if _, err := migrate.Up(ctx, db, b.d, migrate.WithNamespace(b.ns())); err != nil {
		t.Fatal(err)
	}
	if conn, err = db.Conn(ctx); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := l.Lock(ctx, db); err != nil {
		t.Fatalf("Lock on a two-connection pool once the tables exist: %v", err)
	}
	if err := l.Unlock(ctx, db); err != nil {
		t.Fatal(err)
	}
}
