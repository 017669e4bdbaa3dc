//go:build h10

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
