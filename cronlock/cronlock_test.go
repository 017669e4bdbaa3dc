package cronlock_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/sqlease/sqlease/cronlock"
	"github.com/sqlease/sqlease/internal/schedjob/schedtest"
	"github.com/sqlease/sqlease/lock"
)

// TestSkipIfLocked: a plain cron.Job runs under the exclusive lease (the
// key is taken while it runs and free after), a run while another
// replica holds the key is skipped and logged at DEBUG, and a job's error
// is logged at ERROR.
func TestSkipIfLocked(t *testing.T) {
	t.Parallel()
	schedtest.Each(t, func(t *testing.T, b schedtest.Backend) {
		ctx := context.Background()
		l, other := b.Locker(t, "a"), b.Locker(t, "b")
		var logs schedtest.Buffer
		logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		wrap := cronlock.SkipIfLocked(l, "jobs/report", cronlock.WithLogger(logger))

		var heldErr error
		runs := 0
		plain := wrap(cron.FuncJob(func() {
			runs++
			_, heldErr = other.TryAcquire(ctx, "jobs/report", lock.Exclusive)
		}))
		plain.Run()
		if runs != 1 || !errors.Is(heldErr, lock.ErrLocked) {
			t.Fatalf("runs = %d, acquire by another replica during the run = %v; want 1 run under the lease (ErrLocked)", runs, heldErr)
		}

		lease, err := other.TryAcquire(ctx, "jobs/report", lock.Exclusive)
		if err != nil {
			t.Fatalf("key not free after the job: %v", err)
		}
		plain.Run()
		if runs != 1 || !strings.Contains(logs.String(), "job skipped: another replica holds its key") {
			t.Fatalf("runs = %d while another replica held the key, log:\n%s", runs, logs.String())
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}

		wrap(cronlock.Func(func(ctx context.Context, lease *lock.Lease) error {
			return errors.New("report failed")
		})).Run()
		if !strings.Contains(logs.String(), "level=ERROR msg=\"cronlock: job failed\" key=jobs/report err=\"report failed\"") {
			t.Errorf("job error not logged:\n%s", logs.String())
		}
	})
}

// TestFuncOutsideWrapperDoesNotRun: a Func that reaches cron without a
// cronlock wrapper next to it has no lease and does not run.
func TestFuncOutsideWrapperDoesNotRun(t *testing.T) {
	ran := false
	cron.NewChain(cron.Recover(cron.DiscardLogger)).Then(cronlock.Func(func(context.Context, *lock.Lease) error {
		ran = true
		return nil
	})).Run()
	if ran {
		t.Fatal("a Func without a lease ran")
	}
}

// TestLeaderOnly: of two replicas only the leader runs wrapped jobs, with
// the leader lease in the job's context; when the leader stops, the other
// replica leads and runs them within about one TTL.
func TestLeaderOnly(t *testing.T) {
	t.Parallel()
	schedtest.Each(t, func(t *testing.T, b schedtest.Backend) {
		logger := schedtest.Logger(t)
		a := cronlock.LeaderOnly(b.Locker(t, "a"), "cron/leader", cronlock.WithLogger(logger))
		defer a.Stop()
		waitFor(t, 3*time.Second, "replica a to lead", a.Leading)
		bl := cronlock.LeaderOnly(b.Locker(t, "b"), "cron/leader", cronlock.WithLogger(logger))
		defer bl.Stop()

		var runs [2]atomic.Int32
		jobOf := func(i int) cron.Job {
			return cronlock.Func(func(ctx context.Context, lease *lock.Lease) error {
				if got, ok := lock.LeaseFrom(ctx); !ok || got != lease || lease.Key() != "cron/leader" {
					t.Errorf("LeaseFrom(job context) = %v, %v; want the leader lease", got, ok)
				}
				runs[i].Add(1)
				return nil
			})
		}
		jobA, jobB := a.Wrap(jobOf(0)), bl.Wrap(jobOf(1))
		for range 3 {
			jobA.Run()
			jobB.Run()
		}
		if runs[0].Load() != 3 || runs[1].Load() != 0 {
			t.Fatalf("runs (leader a, follower b) = %d, %d; want 3, 0", runs[0].Load(), runs[1].Load())
		}

		stopped := time.Now()
		a.Stop()
		waitFor(t, 3*time.Second, "replica b to lead", bl.Leading)
		t.Logf("b leads %v after a stopped", time.Since(stopped).Round(time.Millisecond))
		jobA.Run()
		jobB.Run()
		if runs[0].Load() != 3 || runs[1].Load() != 1 {
			t.Fatalf("after the leader stopped: runs (a, b) = %d, %d; want 3, 1", runs[0].Load(), runs[1].Load())
		}
	})
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestNilLocker: wrappers built on a nil Locker never run the job and say
// why, instead of panicking in cron's goroutine.
func TestNilLocker(t *testing.T) {
	var logs schedtest.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	ran := false
	job := cron.FuncJob(func() { ran = true })
	cronlock.SkipIfLocked(nil, "k", cronlock.WithLogger(logger))(job).Run()
	leader := cronlock.LeaderOnly(nil, "k", cronlock.WithLogger(logger))
	defer leader.Stop()
	leader.Wrap(job).Run()
	if ran || leader.Leading() || strings.Count(logs.String(), "nil *lock.Locker") != 2 {
		t.Fatalf("ran %v, leading %v; log:\n%s", ran, leader.Leading(), logs.String())
	}
}
