// Package gooselock serializes goose migrations (github.com/pressly/goose/v3)
// with an exclusive sqlease lease: a goose lock.Locker, wired with
// goose.WithLocker, that works on every sqlease dialect (SQLite,
// PostgreSQL, also through PgBouncer in transaction pooling mode,
// MySQL/MariaDB) and judges expiry by the database's clock.
//
//	locker, err := gooselock.New(sqlitedialect.New(), gooselock.WithTTL(10*time.Second))
//	provider, err := goose.NewProvider(goose.DialectSQLite3, db, migrations, goose.WithLocker(locker))
//	results, err := provider.Up(ctx) // err matches lock.ErrLeaseLost if the lease was lost meanwhile
//
// Lock creates the sqlease lock tables when they are missing (migrate.Up,
// safe to run from several processes at once), waits until the lease is
// granted or goose's context ends, and the lease then renews itself every
// TTL/3 while goose migrates. A migrator that crashes holds the others off
// for at most one TTL. A lease lost while goose migrates is logged at once
// (ERROR) and makes Unlock, hence Provider.Up, return an error matching
// lock.ErrLeaseLost: another migrator may have run migrations at the same
// time. goose cannot be stopped by the Locker; WithOnLost can end the
// context goose runs on, and a Go migration can fence its transaction with
// Lease (SPEC F1).
//
// The documentation cites the rules of docs/contract.md in the repository
// as "SPEC H1" and so on.
package gooselock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	gooselock "github.com/pressly/goose/v3/lock"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

var _ gooselock.Locker = (*Locker)(nil)

// closeTimeout bounds the Close of the sqlease Locker in Unlock, after the
// lease was released (which has its own bound, lock.DefaultReleaseTimeout).
const closeTimeout = 10 * time.Second

// Locker is a goose lock.Locker over an exclusive sqlease lease. Build it
// with New and give it to goose.WithLocker. It serves one Lock at a time:
// a second Lock waits for the first one's Unlock (or its context), so
// one Locker may serve several Providers of one migration set.
type Locker struct {
	d    dialect.Dialect // nil: detected from the *sql.DB at Lock
	cfg  config
	slot chan struct{} // one Lock..Unlock at a time

	mu   sync.Mutex
	held *held // the current lease, nil outside Lock..Unlock
}

// held is one Lock..Unlock: the sqlease Locker built for it, its lease and
// the goroutine that reports a loss.
type held struct {
	locker *lock.Locker
	lease  *lock.Lease
	stop   chan struct{} // closed by Unlock: the watcher returns
	done   chan struct{} // closed when the watcher has returned
	once   sync.Once     // the loss is reported once
}

// New returns a Locker for dialect d (nil: detected at each Lock from the
// *sql.DB goose passes, among registered dialects, as lock.New does).
// Errors: a bad option, or a namespace d does not allow, as an
// *lock.InputError matching lock.ErrInvalidInput (SPEC I1, D3).
func New(d dialect.Dialect, opts ...Option) (*Locker, error) {
	c, err := build(d, opts)
	if err != nil {
		return nil, err
	}
	return &Locker{d: d, cfg: c, slot: make(chan struct{}, 1)}, nil
}

// Key returns the lease key.
func (g *Locker) Key() string { return g.cfg.key }

// TTL returns the lease TTL.
func (g *Locker) TTL() time.Duration { return g.cfg.ttl }

// Lease returns the lease held between Lock and Unlock, nil outside. A Go
// migration can fence its transaction with it (lease.Fence(ctx, tx) as its
// first statement: the transaction then commits only while the lease is
// held, SPEC F1), use its token (Token) to guard other storage, or watch
// its Context, which ends with cause lock.ErrLeaseLost when it is lost.
func (g *Locker) Lease() *lock.Lease {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held == nil {
		return nil
	}
	return g.held.lease
}

// Lock takes the exclusive lease on the key, waiting until it is granted
// or ctx ends (goose calls it at the start of Up, Down and the other
// locking Provider methods). It first builds a sqlease lock.Locker on db
// and creates the lock tables with migrate.Up if they are missing (SPEC
// D1). The lease then renews itself every TTL/3 (SPEC H2) until Unlock.
//
// db must allow at least two open connections: goose keeps one for the
// migrations while the lease's statements need another (three while Lock
// creates the tables on PostgreSQL or MySQL, whose migration lock needs a
// connection of its own). Errors: a nil db, a one-connection pool (two
// while the tables are to be created on PostgreSQL or MySQL), a driver no
// registered dialect claims or a bad namespace (matching
// lock.ErrInvalidInput, SPEC I1), ctx's error when it ends first, and the
// errors of migrate.Up, lock.New and lock.Locker.Acquire.
func (g *Locker) Lock(ctx context.Context, db *sql.DB) error {
	select {
	case g.slot <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("gooselock: lock %q: %w", g.cfg.key, context.Cause(ctx))
	}
	h, err := g.lock(ctx, db)
	if err != nil {
		<-g.slot
		return err
	}
	g.mu.Lock()
	g.held = h
	g.mu.Unlock()
	go g.watch(h)
	return nil
}

func (g *Locker) lock(ctx context.Context, db *sql.DB) (*held, error) {
	if db == nil {
		return nil, &lock.InputError{Pkg: "gooselock", Field: "database", Value: "nil", Allowed: "goose passes its *sql.DB; call Lock with an open one"}
	}
	if db.Stats().MaxOpenConnections == 1 {
		return nil, &lock.InputError{Pkg: "gooselock", Field: "pool size", Value: "1 open connection (SetMaxOpenConns(1))",
			Allowed: "at least 2: goose keeps one for the migrations while the lease needs another"}
	}
	d := g.d
	if d == nil {
		var err error
		if d, err = dialect.Detect(db); err != nil {
			return nil, dialect.Relabel(err, "gooselock")
		}
		if err := g.cfg.ns.Validate(d); err != nil {
			return nil, dialect.Relabel(err, "gooselock")
		}
	}
	l, err := g.newLocker(ctx, db, d)
	if err != nil {
		return nil, err
	}
	lease, err := l.Acquire(ctx, g.cfg.key, lock.Exclusive)
	if err != nil {
		g.closeLocker(ctx, l)
		return nil, fmt.Errorf("gooselock: lock %q: %w", g.cfg.key, err)
	}
	return &held{locker: l, lease: lease, stop: make(chan struct{}), done: make(chan struct{})}, nil
}

// newLocker builds the sqlease Locker of one Lock, creating the lock
// tables first when lock.New finds them missing or old.
func (g *Locker) newLocker(ctx context.Context, db *sql.DB, d dialect.Dialect) (*lock.Locker, error) {
	opts := append([]lock.Option{
		lock.WithTTL(g.cfg.ttl), lock.WithLogger(g.cfg.logger),
		lock.WithSchema(g.cfg.ns.Schema), lock.WithTablePrefix(g.cfg.ns.Prefix),
	}, g.cfg.lockOpts...)
	l, err := lock.New(ctx, db, d, opts...)
	// A namespace given through WithLockOptions would make Lock create the
	// tables in one place and look for them in another: refuse it before
	// anything is written.
	var se *lock.SchemaError
	switch {
	case errors.As(err, &se) && !sameNamespace(se.Namespace, g.cfg.ns):
		return nil, g.namespaceConflict(se.Namespace)
	case err == nil && !sameNamespace(l.Namespace(), g.cfg.ns):
		ns := l.Namespace()
		g.closeLocker(ctx, l)
		return nil, g.namespaceConflict(ns)
	}
	if errors.Is(err, lock.ErrSchemaNotMigrated) {
		if _, ok := d.(dialect.MigrationLocker); ok && db.Stats().MaxOpenConnections == 2 {
			// goose's connection, migrate's, and one for its migration
			// lock: with two, migrate.Up would wait for ctx to end.
			return nil, &lock.InputError{Pkg: "gooselock", Field: "pool size", Value: "2 open connections (SetMaxOpenConns(2))",
				Allowed: fmt.Sprintf("at least 3 while Lock creates the lock tables on dialect %q (goose keeps one, migrate.Up needs two), or run migrate.Up before goose", d.Name())}
		}
		if _, err := migrate.Up(ctx, db, d, migrate.WithNamespace(g.cfg.ns)); err != nil {
			return nil, fmt.Errorf("gooselock: create the lock tables: %w", err)
		}
		l, err = lock.New(ctx, db, d, opts...)
	}
	if errors.Is(err, lock.ErrInvalidInput) {
		return nil, dialect.Relabel(err, "gooselock") // a bad WithLockOptions option
	}
	if err != nil {
		return nil, fmt.Errorf("gooselock: lock %q: %w", g.cfg.key, err)
	}
	return l, nil
}

// sameNamespace reports whether a and b name the same lock tables.
func sameNamespace(a, b dialect.Namespace) bool {
	return a.Schema == b.Schema && a.VersionTable() == b.VersionTable()
}

func (g *Locker) namespaceConflict(got dialect.Namespace) error {
	show := func(ns dialect.Namespace) string {
		if ns.Prefix == "" {
			ns.Prefix = dialect.DefaultPrefix
		}
		return fmt.Sprintf("schema %q, prefix %q", ns.Schema, ns.Prefix)
	}
	return &lock.InputError{Pkg: "gooselock", Field: "namespace in WithLockOptions", Value: show(got),
		Allowed: "the namespace given to gooselock.WithNamespace (now " + show(g.cfg.ns) + "), where Lock creates the tables: give it there, not as lock.WithSchema or lock.WithTablePrefix"}
}

// watch reports a loss of h's lease as soon as it happens, until Unlock.
func (g *Locker) watch(h *held) {
	defer close(h.done)
	select {
	case <-h.lease.Done():
		if err := h.lease.Err(); errors.Is(err, lock.ErrLeaseLost) {
			g.lost(h, err)
		}
	case <-h.stop:
	}
}

// lost logs the loss of h's lease and calls the WithOnLost function, once.
func (g *Locker) lost(h *held, err error) {
	h.once.Do(func() {
		g.cfg.logger.Error("gooselock: lease lost while goose migrates; another migrator may run at the same time",
			"key", g.cfg.key, "lease_id", h.lease.LeaseID(), "token", h.lease.Token(), "err", err)
		if g.cfg.onLost != nil {
			go g.cfg.onLost(err)
		}
	})
}

// Unlock releases the lease taken by Lock (goose calls it when Up, Down
// and the other locking methods end, on a context without cancellation)
// and closes the sqlease Locker built for it. Errors: the loss of the
// lease while goose migrated, as a *lock.LeaseLostError matching
// lock.ErrLeaseLost (SPEC H3; also when the release finds the lease gone),
// a release that failed (the lease then ends by expiry, SPEC H5), and
// lock.ErrNotHeld without a Lock to undo. db is not used: the lease knows
// its pool.
func (g *Locker) Unlock(ctx context.Context, _ *sql.DB) error {
	g.mu.Lock()
	h := g.held
	g.held = nil
	g.mu.Unlock()
	if h == nil {
		return fmt.Errorf("gooselock: unlock %q: no Lock to undo: %w", g.cfg.key, lock.ErrNotHeld)
	}
	defer func() { <-g.slot }()
	close(h.stop)
	<-h.done
	err := h.lease.Err()
	if err == nil {
		if rerr := h.lease.Release(ctx); rerr != nil {
			err = rerr
			if lerr := h.lease.Err(); errors.Is(lerr, lock.ErrLeaseLost) {
				err = lerr // gone from the database: lost while goose migrated
			}
		}
	}
	if errors.Is(err, lock.ErrLeaseLost) {
		g.lost(h, err)
		err = fmt.Errorf("gooselock: unlock %q: the lease was lost while goose migrated: %w", g.cfg.key, err)
	} else if err != nil {
		err = fmt.Errorf("gooselock: unlock %q: %w", g.cfg.key, err)
	}
	g.closeLocker(ctx, h.locker)
	return err
}

// closeLocker closes l on a context detached from ctx, with its own bound.
func (g *Locker) closeLocker(ctx context.Context, l *lock.Locker) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
	defer cancel()
	if err := l.Close(cctx); err != nil {
		g.cfg.logger.Warn("gooselock: close the sqlease locker", "key", g.cfg.key, "err", err)
	}
}
