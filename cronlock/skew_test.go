package cronlock_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/sqlease/sqlease/cronlock"
	"github.com/sqlease/sqlease/internal/schedjob/schedtest"
	"github.com/sqlease/sqlease/lock"
)

// skews delays each replica's attempt after its tick: three replicas
// whose clocks differ by up to 200 ms.
var skews = []time.Duration{0, 100 * time.Millisecond, 200 * time.Millisecond}

// job is one cron job every replica runs on the same schedule.
type job struct {
	key  string
	opts []lock.AcquireOption
}

// runSkewed runs jobs on one cron per replica (each its own Locker and
// pool) every second for ticks whole ticks, each replica's attempts
// delayed by its skew, and returns how often each key ran per tick.
func runSkewed(t *testing.T, b schedtest.Backend, ticks int, jobs []job) map[string][]int {
	first := time.Now().Truncate(time.Second).Add(2 * time.Second)
	var mu sync.Mutex
	runs := map[string][]int{}
	for _, j := range jobs {
		runs[j.key] = make([]int, ticks)
	}
	var crons []*cron.Cron
	for i, skew := range skews {
		l := b.Locker(t, fmt.Sprintf("replica-%d", i))
		c := cron.New(cron.WithSeconds())
		for _, j := range jobs {
			record := cronlock.Func(func(ctx context.Context, lease *lock.Lease) error {
				if got, ok := lock.LeaseFrom(ctx); !ok || got != lease || lease.Key() != j.key {
					t.Errorf("LeaseFrom(job context) = %v, %v; want the lease of %q", got, ok, j.key)
				}
				tick := time.Now().Add(-skew).Truncate(time.Second)
				if n := int(tick.Sub(first) / time.Second); n >= 0 && n < ticks {
					mu.Lock()
					runs[j.key][n]++
					mu.Unlock()
				}
				time.Sleep(10 * time.Millisecond) // a short job: done long before the next replica ticks
				return nil
			})
			wrapped := cron.NewChain(delay(skew), cronlock.SkipIfLocked(l, j.key,
				cronlock.WithAcquireOptions(j.opts...), cronlock.WithLogger(schedtest.Logger(t)))).Then(record)
			if _, err := c.AddJob("* * * * * *", wrapped); err != nil {
				t.Fatal(err)
			}
		}
		c.Start()
		crons = append(crons, c)
	}
	time.Sleep(time.Until(first.Add(time.Duration(ticks)*time.Second + 500*time.Millisecond)))
	for _, c := range crons {
		<-c.Stop().Done()
	}
	return runs
}

// delay is a cron.JobWrapper that runs the job d after its tick.
func delay(d time.Duration) cron.JobWrapper {
	return func(j cron.Job) cron.Job {
		return cron.FuncJob(func() {
			time.Sleep(d)
			j.Run()
		})
	}
}

// jobs are the jobs every replica runs. jobs/plain has no acquire
// options: replicas whose ticks differ by more than the job's 10 ms run it
// again. hold_test.go adds jobs/held, with lock.HoldAtLeast (SPEC H10).
var jobs = []job{{key: "jobs/plain"}}

// TestSkewedReplicas runs three replicas (each its own cron, Locker and
// pool) whose ticks differ by up to 200 ms, every second, with the jobs
// of jobs through SkipIfLocked: without HoldAtLeast the later replicas
// find the key free again and run the tick again (the trap HoldAtLeast
// closes); with it, every tick runs exactly once.
func TestSkewedReplicas(t *testing.T) {
	t.Parallel()
	schedtest.Each(t, func(t *testing.T, b schedtest.Backend) {
		schedtest.CheckSkewedRuns(t, runSkewed(t, b, 5, jobs))
	})
}
