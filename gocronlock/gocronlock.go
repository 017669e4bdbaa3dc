// Package gocronlock backs github.com/go-co-op/gocron/v2's distributed
// Locker and Elector with sqlease leases, so that a schedule shared by
// several replicas runs once per tick (Locker, with lock.HoldAtLeast) or
// only on the elected leader (Elector).
//
// gocron hands a job the same context on every run, and its Locker API
// returns the lock to gocron, not to the job: a job that wants the lease
// (to fence its writes, SPEC F1) or a context that ends when the lease is
// lost (SPEC H3) is built with Locker.Job or Elector.Job, which look the
// lease up and run the function with the lease's context, in which
// lock.LeaseFrom finds it.
package gocronlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/go-co-op/gocron/v2"

	"github.com/sqlease/sqlease/internal/schedjob"
	"github.com/sqlease/sqlease/lock"
)

// ErrNoLease is returned by a function built with Locker.Job or
// Elector.Job when it runs without the lease it needs: the job's
// gocron.WithName differs from the name given to Job, the job does not use
// this Locker, or this process does not lead (then the error also matches
// ErrNotLeader).
var ErrNoLease = errors.New("gocronlock: the job runs without a lease")

// Option configures NewLocker and NewElector.
type Option func(*config)

type config struct {
	logger  *slog.Logger
	prefix  string
	acquire []lock.AcquireOption
	bad     error // the first option refused
}

// WithLogger sets where runs skipped because the key is held (DEBUG),
// failed acquires (ERROR) and failed releases (WARN) are logged. Default
// slog.Default(); nil is refused (lock.ErrInvalidInput), as lock.WithLogger
// does.
func WithLogger(logger *slog.Logger) Option {
	return func(c *config) {
		if logger == nil && c.bad == nil {
			c.bad = &lock.InputError{Pkg: "gocronlock", Field: "logger", Value: "nil", Allowed: "a *slog.Logger; slog.New(slog.DiscardHandler) logs nothing"}
		}
		c.logger = logger
	}
}

// WithKeyPrefix puts prefix before every job name to make the lock key
// (default "": the key is the job's name). Locker only: NewElector refuses
// a non-empty one (put the prefix in its key). A prefix that no key may start with
// (over 511 bytes, invalid UTF-8, NUL) is refused by NewLocker
// (lock.ErrInvalidInput, SPEC I1).
func WithKeyPrefix(prefix string) Option {
	return func(c *config) { c.prefix = prefix }
}

// WithAcquireOptions passes options to every acquire of a Locker, for
// example lock.HoldAtLeast(d), which keeps the key taken for at least d
// after the grant (in database time) so a replica whose tick comes up to
// d later is refused instead of running the job again, and
// lock.HoldAtMost(d), which ends a job that overruns d (SPEC H10).
// A lock.WaitTimeout among them is overridden: Lock never waits. The
// Elector passes them to each campaign's acquire (see NewElector).
func WithAcquireOptions(opts ...lock.AcquireOption) Option {
	return func(c *config) { c.acquire = append(c.acquire, opts...) }
}

func newConfig(opts []Option) (config, error) {
	c := config{logger: slog.Default()}
	for i, o := range opts {
		if o == nil {
			return c, fmt.Errorf("gocronlock: option %d of %d is nil; leave it out instead: %w", i+1, len(opts), lock.ErrInvalidInput)
		}
		o(&c)
	}
	if c.bad != nil {
		return c, c.bad
	}
	for i, o := range c.acquire {
		if o == nil {
			return c, fmt.Errorf("gocronlock: WithAcquireOptions: option %d of %d is nil; leave it out instead: %w", i+1, len(c.acquire), lock.ErrInvalidInput)
		}
	}
	if c.prefix != "" {
		// Job names are at least a byte long: the shortest key is prefix+"x".
		if err := lock.CheckKey(c.prefix + "x"); err != nil {
			return c, fmt.Errorf("gocronlock: WithKeyPrefix(%q): no job's key could start with it: %w", clipPrefix(c.prefix), err)
		}
	}
	return c, nil
}

// clipPrefix shortens a long prefix for a message.
func clipPrefix(p string) string {
	if len(p) > 40 {
		return p[:40] + "..."
	}
	return p
}

// Locker is a gocron.Locker: give it to gocron.WithDistributedLocker (every
// job of the scheduler) or gocron.WithDistributedJobLocker (one job).
type Locker struct {
	l       *lock.Locker
	cfg     config
	acquire []lock.AcquireOption

	mu   sync.Mutex
	held map[string]*lock.Lease // job name -> the lease its run holds
}

var _ gocron.Locker = (*Locker)(nil)

// NewLocker returns a gocron.Locker that takes an exclusive lease per job
// run on l. Errors: an error matching lock.ErrInvalidInput for a nil l,
// a nil option (also among WithAcquireOptions), WithLogger(nil) or a
// WithKeyPrefix no key may start with (SPEC I1).
func NewLocker(l *lock.Locker, opts ...Option) (*Locker, error) {
	if l == nil {
		return nil, fmt.Errorf("gocronlock: NewLocker: nil *lock.Locker: %w", lock.ErrInvalidInput)
	}
	c, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	acquire := append(append([]lock.AcquireOption(nil), c.acquire...), lock.WaitTimeout(0))
	return &Locker{l: l, cfg: c, acquire: acquire, held: map[string]*lock.Lease{}}, nil
}

// Lock takes an exclusive lease on the key prefix+key at once
// (lock.Locker.TryAcquire, SPEC W3); gocron passes the job's name as key.
// When it returns an error, gocron skips this run of the job (and calls
// the job's gocron.AfterLockError listener): an error matching
// lock.ErrLocked when another replica holds the key (logged at DEBUG),
// lock.ErrReentrant when a run of the same job still holds it in this
// process, or the acquire's error (bad key, database down; logged at
// ERROR). The lease renews itself until gocron calls Unlock after the run.
func (gl *Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	lease, err := gl.l.TryAcquire(ctx, gl.cfg.prefix+key, lock.Exclusive, gl.acquire...)
	if err != nil {
		if errors.Is(err, lock.ErrLocked) || errors.Is(err, lock.ErrReentrant) {
			gl.cfg.logger.Debug("gocronlock: run skipped: the job's key is held", "key", gl.cfg.prefix+key, "err", err)
		} else {
			gl.cfg.logger.Error("gocronlock: run skipped: acquire failed", "key", gl.cfg.prefix+key, "err", err)
		}
		return nil, fmt.Errorf("gocronlock: lock %q: %w", key, err)
	}
	gl.mu.Lock()
	gl.held[key] = lease
	gl.mu.Unlock()
	return &jobLock{gl: gl, name: key, lease: lease}, nil
}

// lease returns the lease the run of job name holds, if any.
func (gl *Locker) lease(name string) *lock.Lease {
	gl.mu.Lock()
	defer gl.mu.Unlock()
	return gl.held[name]
}

// Job returns a gocron task function (for gocron.NewTask) that runs fn
// with the lease this Locker took for the run of the job named name: name
// must be the job's gocron.WithName. fn's context carries the lease
// (lock.LeaseFrom) and ends when the lease is lost (cause
// lock.ErrLeaseLost, SPEC H3), for example past lock.HoldAtMost, or when
// gocron ends the job. The task returns fn's error, an error matching
// lock.ErrLeaseLost if the lease was lost and fn returned nil, or
// ErrNoLease (fn does not run) when no run of name holds a lease here.
func (gl *Locker) Job(name string, fn func(ctx context.Context, lease *lock.Lease) error) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		lease := gl.lease(name)
		if lease == nil {
			return fmt.Errorf("%w: no lease held for job %q; name the job gocron.WithName(%q) and give it this Locker", ErrNoLease, name, name)
		}
		return runUnder(ctx, lease, fn)
	}
}

// runUnder runs fn with lease's context, also ended by ctx.
func runUnder(ctx context.Context, lease *lock.Lease, fn func(ctx context.Context, lease *lock.Lease) error) error {
	fctx, cancel := schedjob.LeaseContext(ctx, lease)
	defer cancel()
	err := fn(fctx, lease)
	if cause := context.Cause(fctx); err == nil && errors.Is(cause, lock.ErrLeaseLost) {
		err = cause
	}
	return err
}

// jobLock is the gocron.Lock of one run.
type jobLock struct {
	gl    *Locker
	name  string
	lease *lock.Lease
}

// Unlock releases the run's lease (SPEC H5: bounded, even with ctx
// ended). With lock.HoldAtLeast the key stays taken until the minimum hold
// has passed. A release that finds the lease lost is logged at WARN and
// returned (gocron ignores it).
func (j *jobLock) Unlock(ctx context.Context) error {
	j.gl.mu.Lock()
	if j.gl.held[j.name] == j.lease {
		delete(j.gl.held, j.name)
	}
	j.gl.mu.Unlock()
	err := j.lease.Release(ctx)
	if err != nil {
		j.gl.cfg.logger.Warn("gocronlock: release after the run failed", "key", j.lease.Key(), "err", err)
	}
	return err
}
