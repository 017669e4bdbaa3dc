package cronlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sqlease/sqlease/cronlock"
	"github.com/sqlease/sqlease/internal/schedjob/schedtest"
	"github.com/sqlease/sqlease/lock"
)

func init() {
	jobs = append(jobs, job{key: "jobs/held", opts: []lock.AcquireOption{lock.HoldAtLeast(500 * time.Millisecond)}})
}

// TestHoldAtMostEndsOverrunningJob: a job that overruns the lease's
// maximum life (lock.HoldAtMost, SPEC H10) sees its context end with
// lock.ErrLeaseLost; the key is free afterwards.
func TestHoldAtMostEndsOverrunningJob(t *testing.T) {
	t.Parallel()
	schedtest.Each(t, func(t *testing.T, b schedtest.Backend) {
		l := b.Locker(t, "overrun")
		var cause error
		var ranFor time.Duration
		job := cronlock.Func(func(ctx context.Context, lease *lock.Lease) error {
			start := time.Now()
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Second):
			}
			ranFor, cause = time.Since(start), context.Cause(ctx)
			return cause
		})
		cronlock.SkipIfLocked(l, "jobs/overrun", cronlock.WithLogger(schedtest.Logger(t)),
			cronlock.WithAcquireOptions(lock.HoldAtMost(300*time.Millisecond)))(job).Run()
		if !errors.Is(cause, lock.ErrLeaseLost) {
			t.Fatalf("job context ended with %v after %v, want lock.ErrLeaseLost", cause, ranFor)
		}
		if ranFor < 100*time.Millisecond || ranFor > 3*time.Second {
			t.Errorf("job context ended after %v, want about 300ms", ranFor)
		}
		lease, err := l.TryAcquire(context.Background(), "jobs/overrun", lock.Exclusive)
		if err != nil {
			t.Fatalf("acquire after the overrun: %v", err)
		}
		_ = lease.Release(context.Background())
	})
}

// TestLeaderOnlyHoldAtMost: with lock.HoldAtMost the leader steps down
// when its lease reaches its maximum life (a running job's context ends
// with lock.ErrLeaseLost) and campaigns again.
func TestLeaderOnlyHoldAtMost(t *testing.T) {
	t.Parallel()
	schedtest.Each(t, func(t *testing.T, b schedtest.Backend) {
		leader := cronlock.LeaderOnly(b.Locker(t, "a"), "cron/leader", cronlock.WithLogger(schedtest.Logger(t)),
			cronlock.WithAcquireOptions(lock.HoldAtMost(400*time.Millisecond)))
		defer leader.Stop()
		waitFor(t, 3*time.Second, "the replica to lead", leader.Leading)
		var cause error
		var first *lock.Lease
		leader.Wrap(cronlock.Func(func(ctx context.Context, lease *lock.Lease) error {
			first = lease
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Second):
			}
			cause = context.Cause(ctx)
			return nil
		})).Run()
		if !errors.Is(cause, lock.ErrLeaseLost) {
			t.Fatalf("leader job context ended with %v, want lock.ErrLeaseLost at the maximum life", cause)
		}
		var again *lock.Lease
		rerun := leader.Wrap(cronlock.Func(func(ctx context.Context, lease *lock.Lease) error { again = lease; return nil }))
		waitFor(t, 3*time.Second, "the replica to lead again and run the job", func() bool {
			rerun.Run()
			return again != nil
		})
		if again.Token() <= first.Token() {
			t.Fatalf("after stepping down: lease %v, want a new lease with a greater token than %d", again, first.Token())
		}
	})
}
