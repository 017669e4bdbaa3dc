// Package cronlock runs github.com/robfig/cron/v3 jobs under sqlease
// leases, so that a schedule shared by several replicas runs once per tick
// (SkipIfLocked) or only on the elected leader (LeaderOnly).
//
// cron.Job's Run has no context, so a job that wants the lease (to fence
// its writes, SPEC F1) or a context that ends when the lease is lost (SPEC
// H3) is written as a Func, or any Job of this package, and wrapped
// directly by SkipIfLocked or a Leader: the wrapper calls it with the
// lease's context, in which lock.LeaseFrom finds the lease. Other cron.Job
// values run under the lease too, but cannot see it.
package cronlock

import (
	"context"
	"errors"
	"log/slog"

	"github.com/robfig/cron/v3"

	"github.com/sqlease/sqlease/lock"
)

// Job is a cron job that runs under a lease: ctx carries the lease
// (lock.LeaseFrom) and ends, with cause lock.ErrLeaseLost, when the lease
// is lost (SPEC H3). Its error is logged by the wrapper.
type Job interface {
	RunWithLease(ctx context.Context, lease *lock.Lease) error
}

// Func is a Job written as a function. Wrap it with SkipIfLocked or a
// Leader (as the innermost wrapper of the chain, so the wrapper sees the
// Func itself).
type Func func(ctx context.Context, lease *lock.Lease) error

var (
	_ Job      = Func(nil)
	_ cron.Job = Func(nil)
)

// RunWithLease calls f.
func (f Func) RunWithLease(ctx context.Context, lease *lock.Lease) error { return f(ctx, lease) }

// Run is called only when the Func was not handed to a cronlock wrapper
// directly (no wrapper, or another wrapper in between, as in
// cron.NewChain(cronlock.SkipIfLocked(...), cron.Recover(logger))): it
// does not run f, which expects a lease, and logs an error to
// slog.Default() that says how to wrap it.
func (f Func) Run() {
	slog.Default().Error("cronlock: a cronlock.Func ran without a lease and was skipped: put cronlock.SkipIfLocked or a cronlock.Leader's Wrap last in the chain, next to the job")
}

// Option configures SkipIfLocked and LeaderOnly.
type Option func(*config)

type config struct {
	logger  *slog.Logger
	acquire []lock.AcquireOption
}

// WithLogger sets where the wrappers log: skipped runs at DEBUG, a lost
// lease at WARN, jobs' errors and acquire errors at ERROR. Default
// slog.Default(); a nil logger keeps the default.
func WithLogger(logger *slog.Logger) Option {
	return func(c *config) {
		if logger != nil {
			c.logger = logger
		}
	}
}

// WithAcquireOptions passes options to every acquire SkipIfLocked makes,
// for example lock.HoldAtLeast(d), which keeps the key taken for at least
// d after the grant (in database time) so a replica whose tick comes up to
// d later skips instead of running the job again, and lock.HoldAtMost(d),
// which ends a job that overruns d (its context ends with
// lock.ErrLeaseLost; SPEC H10). A lock.WaitTimeout among them is
// overridden: SkipIfLocked never waits. LeaderOnly passes them to each
// campaign's acquire (see LeaderOnly).
func WithAcquireOptions(opts ...lock.AcquireOption) Option {
	return func(c *config) { c.acquire = append(c.acquire, opts...) }
}

func newConfig(opts []Option) config {
	c := config{logger: slog.Default()}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	return c
}

// SkipIfLocked returns a cron.JobWrapper that runs the job only if this
// process can take an exclusive lease on key at once (l.TryAcquire's
// semantics, SPEC W3): when another replica holds key, the run is skipped
// and logged at DEBUG. The lease is renewed while the job runs and
// released when it returns.
//
// Every job the wrapper wraps shares key: wrap each job with a chain of
// its own (cron.NewChain(cronlock.SkipIfLocked(l, "reports/nightly")).Then(job))
// rather than cron.WithChain when a Cron has several jobs.
//
// Replicas whose clocks or ticks differ by more than the job's duration
// each find the key free and run it: give lock.HoldAtLeast(d), with d
// longer than that skew and shorter than the schedule's interval, through
// WithAcquireOptions. Acquire errors (the database is down, bad key,
// ErrInvalidInput, SPEC I1) are logged at ERROR; the run is skipped.
func SkipIfLocked(l *lock.Locker, key string, opts ...Option) cron.JobWrapper {
	c := newConfig(opts)
	acquire := append(append([]lock.AcquireOption(nil), c.acquire...), lock.WaitTimeout(0))
	return func(j cron.Job) cron.Job {
		return cron.FuncJob(func() {
			if l == nil {
				c.logger.Error("cronlock: SkipIfLocked has a nil *lock.Locker; the job does not run", "key", key)
				return
			}
			ran := false
			err := l.Do(context.Background(), key, lock.Exclusive, func(ctx context.Context, lease *lock.Lease) error {
				ran = true
				return run(ctx, lease, j)
			}, acquire...)
			switch {
			case !ran && errors.Is(err, lock.ErrLocked):
				c.logger.Debug("cronlock: job skipped: another replica holds its key", "key", key, "err", err)
			case !ran:
				c.logger.Error("cronlock: job skipped: acquire failed", "key", key, "err", err)
			default:
				logResult(c.logger, key, err)
			}
		})
	}
}

// run runs j under lease: a Job gets ctx and the lease, another cron.Job
// only runs.
func run(ctx context.Context, lease *lock.Lease, j cron.Job) error {
	if lj, ok := j.(Job); ok {
		return lj.RunWithLease(ctx, lease)
	}
	j.Run()
	return nil
}

func logResult(logger *slog.Logger, key string, err error) {
	switch {
	case errors.Is(err, lock.ErrLeaseLost):
		logger.Warn("cronlock: lease lost while the job ran", "key", key, "err", err)
	case err != nil:
		logger.Error("cronlock: job failed", "key", key, "err", err)
	}
}
