package gooselock

import (
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/lock"
)

// DefaultKey is the lease key when WithKey is not given. Migration sets
// that must not wait for each other (separate goose version tables) need
// keys of their own, such as "goose/" plus the version table's name.
const DefaultKey = "goose/migrations"

// DefaultTTL is the lease TTL when WithTTL is not given: a migrator that
// crashed keeps the others waiting for at most this long.
const DefaultTTL = 30 * time.Second

// Option configures a Locker. New validates the options and names the bad
// value in an error matching lock.ErrInvalidInput (SPEC I1); a nil Option
// is rejected the same way.
type Option func(*config)

type config struct {
	key      string
	ttl      time.Duration
	logger   *slog.Logger
	ns       dialect.Namespace
	lockOpts []lock.Option
	onLost   func(error)
	bad      error // the first bad option
}

func (c *config) reject(field, value, allowed string) {
	if c.bad == nil {
		c.bad = &lock.InputError{Pkg: "gooselock", Field: field, Value: value, Allowed: allowed}
	}
}

// WithKey sets the lease key (default DefaultKey; 1..lock.MaxKeyLength
// bytes of valid UTF-8 without NUL, as lock.CheckKey). Every migrator of one
// migration set must use the same key, in the same namespace.
func WithKey(key string) Option {
	return func(c *config) {
		if err := lock.CheckKey(key); err != nil {
			c.bad = dialect.Relabel(err, "gooselock")
			return
		}
		c.key = key
	}
}

// WithTTL sets the lease TTL (default DefaultTTL; lock.MinTTL..lock.MaxTTL,
// as lock.WithTTL). The lease renews itself every TTL/3 while goose
// migrates; after a crash the next migrator takes over at most one TTL
// later, judged by the database's clock (SPEC H1, H2). On SQLite a
// migration in a transaction holds the write lock, and renewals wait behind
// it: take a TTL longer than the longest migration.
func WithTTL(ttl time.Duration) Option {
	return func(c *config) {
		if err := lock.CheckTTL(ttl); err != nil {
			c.bad = dialect.Relabel(err, "gooselock")
			return
		}
		c.ttl = ttl
	}
}

// WithLogger sets the logger of a lost lease (ERROR) and of the sqlease
// Locker underneath (renewal retries at DEBUG, losses and failed releases
// at WARN). Default: slog.Default(); nil is rejected (slog.New(slog.DiscardHandler)
// logs nothing).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l == nil {
			c.reject("logger", "nil", "a *slog.Logger; slog.New(slog.DiscardHandler) logs nothing")
			return
		}
		c.logger = l
	}
}

// WithNamespace puts the sqlease lock tables in ns (schema and prefix,
// validated as dialect.Namespace.Validate; SPEC D3): Lock creates them
// there when missing and takes the lease there. Default: the zero
// Namespace (no schema, prefix "sqlease_"), as migrate.Up and lock.New.
// Give the namespace here: Lock refuses a different one given as
// lock.WithSchema or lock.WithTablePrefix in WithLockOptions (it would
// create the tables in one place and look for them in the other).
func WithNamespace(ns dialect.Namespace) Option { return func(c *config) { c.ns = ns } }

// WithLockOptions passes options to the lock.New call of every Lock, after
// the ones this package sets (the TTL, the logger and the namespace), so
// they win: for example lock.WithOwner, lock.WithRenewDB or
// lock.WithObserver. lock.New validates them; a nil one is rejected.
func WithLockOptions(opts ...lock.Option) Option {
	return func(c *config) {
		for i, o := range opts {
			if o == nil {
				c.reject("lock option", "nil (lock option "+strconv.Itoa(i+1)+" of "+strconv.Itoa(len(opts))+")", "a lock.Option; leave it out instead of passing nil")
				return
			}
		}
		c.lockOpts = append(c.lockOpts, opts...)
	}
}

// WithOnLost makes the Locker call f once, from a goroutine of its own, when
// the lease is lost while goose migrates (f gets the *lock.LeaseLostError).
// goose runs on the context given to Provider.Up, which the Locker cannot
// end; pass that context's context.CancelCauseFunc here to stop goose at
// its next statement (a migration in a transaction then rolls back). nil is
// rejected.
func WithOnLost(f func(err error)) Option {
	return func(c *config) {
		if f == nil {
			c.reject("on-lost function", "nil", "a func(error), such as the CancelCauseFunc of the context given to Provider.Up")
			return
		}
		c.onLost = f
	}
}

func build(d dialect.Dialect, opts []Option) (config, error) {
	c := config{key: DefaultKey, ttl: DefaultTTL, logger: slog.Default()}
	for i, o := range opts {
		if o == nil {
			return c, &lock.InputError{Pkg: "gooselock", Field: "option", Value: fmt.Sprintf("nil (option %d of %d)", i+1, len(opts)),
				Allowed: "a gooselock.Option such as WithTTL(time.Minute); leave it out instead of passing nil"}
		}
		o(&c)
		if c.bad != nil {
			return c, c.bad
		}
	}
	if d != nil {
		if err := c.ns.Validate(d); err != nil {
			return c, dialect.Relabel(err, "gooselock")
		}
	}
	return c, nil
}
