package gocronlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sqlease/sqlease/gocronlock"
	"github.com/sqlease/sqlease/internal/schedjob/schedtest"
	"github.com/sqlease/sqlease/lock"
)

func init() {
	jobOptions["jobs/held"] = []lock.AcquireOption{lock.HoldAtLeast(400 * time.Millisecond)}
}

// TestHoldAtMostEndsOverrunningJob: a job that overruns the lease's
// maximum life (lock.HoldAtMost, SPEC H10) sees its context end with
// lock.ErrLeaseLost; the task returns that loss, and the key is free
// afterwards.
func TestHoldAtMostEndsOverrunningJob(t *testing.T) {
	t.Parallel()
	schedtest.Each(t, func(t *testing.T, b schedtest.Backend) {
		ctx := context.Background()
		l := b.Locker(t, "overrun")
		gl, err := gocronlock.NewLocker(l, gocronlock.WithAcquireOptions(lock.HoldAtMost(300*time.Millisecond)))
		if err != nil {
			t.Fatal(err)
		}
		var ranFor time.Duration
		task := gl.Job("overrun", func(ctx context.Context, lease *lock.Lease) error {
			start := time.Now()
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Second):
			}
			ranFor = time.Since(start)
			return nil
		})
		// What gocron does for one run: Lock, the task, Unlock.
		jl, err := gl.Lock(ctx, "overrun")
		if err != nil {
			t.Fatal(err)
		}
		err = task(ctx)
		_ = jl.Unlock(ctx)
		if !errors.Is(err, lock.ErrLeaseLost) {
			t.Fatalf("task returned %v after %v, want lock.ErrLeaseLost", err, ranFor)
		}
		if ranFor < 100*time.Millisecond || ranFor > 3*time.Second {
			t.Errorf("job context ended after %v, want about 300ms", ranFor)
		}
		jl, err = gl.Lock(ctx, "overrun")
		if err != nil {
			t.Fatalf("lock after the overrun: %v", err)
		}
		_ = jl.Unlock(ctx)
	})
}
