package gocronlock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"

	"github.com/sqlease/sqlease/gocronlock"
	"github.com/sqlease/sqlease/internal/schedjob/schedtest"
	"github.com/sqlease/sqlease/lock"
)

// The skewed schedule: every replica runs each job every interval from
// the same start, replica i's ticks skews[i] later (clocks up to 200 ms
// apart), for ticks ticks.
const (
	interval = 600 * time.Millisecond
	ticks    = 20
)

var skews = []time.Duration{0, 100 * time.Millisecond, 200 * time.Millisecond}

// jobOptions names the jobs every replica runs and the acquire options of
// each one's Locker. jobs/plain has none: replicas whose ticks differ by
// more than the job's 10 ms run it again. hold_test.go adds jobs/held,
// with lock.HoldAtLeast (SPEC H10).
var jobOptions = map[string][]lock.AcquireOption{"jobs/plain": nil}

// TestSkewedReplicasAcrossProcesses runs three gocron schedulers in three
// processes (children re-running this test binary), each a replica with
// its own Locker and pool, on one skewed DurationJob per key of
// jobOptions for 20 ticks, and reads the run log every run wrote:
// without HoldAtLeast the later replicas run the tick again; with it,
// every tick runs exactly once.
func TestSkewedReplicasAcrossProcesses(t *testing.T) {
	if _, ok := schedtest.FromEnv(); ok {
		t.Skip("a child process")
	}
	schedtest.Each(t, func(t *testing.T, b schedtest.Backend) {
		db := b.Open(t)
		b.CreateRunLog(t, db)
		first := time.Now().Add(3 * time.Second).Truncate(100 * time.Millisecond)
		var children []*schedtest.Child
		for i := range skews {
			children = append(children, schedtest.StartChild(t, b, "TestChildSkewedReplica",
				"SCHED_REPLICA="+strconv.Itoa(i), "SCHED_FIRST="+strconv.FormatInt(first.UnixNano(), 10)))
		}
		for _, c := range children {
			c.Done(t)
		}
		count := map[string][]int{}
		for key := range jobOptions {
			count[key] = make([]int, ticks)
		}
		for _, r := range b.Runs(t, db) {
			if r.Tick < 0 || r.Tick >= ticks {
				t.Errorf("run %+v outside ticks 0..%d", r, ticks-1)
				continue
			}
			count[r.Key][r.Tick]++
		}
		schedtest.CheckSkewedRuns(t, count)
	})
}

// TestChildSkewedReplica is one replica of TestSkewedReplicasAcrossProcesses
// (it runs only in a child process).
func TestChildSkewedReplica(t *testing.T) {
	b, ok := schedtest.FromEnv()
	if !ok {
		t.Skip("runs only as a child of TestSkewedReplicasAcrossProcesses")
	}
	replica, _ := strconv.Atoi(os.Getenv("SCHED_REPLICA"))
	firstNS, _ := strconv.ParseInt(os.Getenv("SCHED_FIRST"), 10, 64)
	first, skew := time.Unix(0, firstNS), skews[replica]
	db := b.Open(t)
	l := b.Locker(t, fmt.Sprintf("replica-%d", replica))
	s, err := gocron.NewScheduler()
	if err != nil {
		t.Fatal(err)
	}
	// stopping: Shutdown cancels a run or an acquire still under way (late
	// on a loaded machine); its context.Canceled is no failure.
	var stopping atomic.Bool
	canceled := func(err error) bool { return stopping.Load() && errors.Is(err, context.Canceled) }
	for key, opts := range jobOptions {
		gl, err := gocronlock.NewLocker(l, gocronlock.WithAcquireOptions(opts...), gocronlock.WithLogger(schedtest.Logger(t)))
		if err != nil {
			t.Fatal(err)
		}
		task := gl.Job(key, func(ctx context.Context, lease *lock.Lease) error {
			if got, ok := lock.LeaseFrom(ctx); !ok || got != lease {
				t.Errorf("LeaseFrom(job context) = %v, %v; want the run's lease", got, ok)
			}
			tick := int64(time.Since(first.Add(skew)) / interval)
			time.Sleep(10 * time.Millisecond) // a short job
			return b.RecordRun(ctx, db, schedtest.Run{Key: key, Tick: tick, Replica: replica})
		})
		_, err = s.NewJob(gocron.DurationJob(interval), gocron.NewTask(task), gocron.WithName(key),
			gocron.WithStartAt(gocron.WithStartDateTime(first.Add(skew))), gocron.WithDistributedJobLocker(gl),
			gocron.WithEventListeners(gocron.AfterJobRunsWithError(func(_ uuid.UUID, name string, err error) {
				if !canceled(err) {
					t.Errorf("job %s: %v", name, err)
				}
			}), gocron.AfterLockError(func(_ uuid.UUID, name string, err error) {
				// ErrLocked: another replica runs the tick. ErrReentrant:
				// this replica's previous run has not released yet (a slow
				// release on a loaded machine); both skip the run.
				if !errors.Is(err, lock.ErrLocked) && !errors.Is(err, lock.ErrReentrant) && !canceled(err) {
					t.Errorf("job %s: lock: %v", name, err)
				}
			})))
		if err != nil {
			t.Fatal(err)
		}
	}
	s.Start()
	time.Sleep(time.Until(first.Add(ticks*interval - interval/2 + skew)))
	stopping.Store(true)
	if err := s.Shutdown(); err != nil {
		t.Error(err)
	}
	schedtest.PrintDone(t)
}
