package gocronlock_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/sqlease/sqlease/gocronlock"
	"github.com/sqlease/sqlease/internal/schedjob/schedtest"
	"github.com/sqlease/sqlease/lock"
)

// TestElectorLeaderDies runs three gocron schedulers in three processes
// with one Elector each on the same key and a job every 100 ms that logs
// its runs: only the leader runs it; when the leader's process is killed
// (SIGKILL, nothing released), another replica leads and runs it within
// about one TTL (1 s).
func TestElectorLeaderDies(t *testing.T) {
	if _, ok := schedtest.FromEnv(); ok {
		t.Skip("a child process")
	}
	schedtest.Each(t, func(t *testing.T, b schedtest.Backend) {
		db := b.Open(t)
		b.CreateRunLog(t, db)
		var children []*schedtest.Child
		for i := range 3 {
			c := schedtest.StartChild(t, b, "TestChildElected", "SCHED_REPLICA="+strconv.Itoa(i))
			c.Next(t, "ready")
			children = append(children, c)
		}
		time.Sleep(1500 * time.Millisecond)
		runs := b.Runs(t, db)
		if len(runs) < 3 {
			t.Fatalf("%d runs in 1.5 s of a job every 100 ms, want some: %v", len(runs), runs)
		}
		leader := runs[0].Replica
		for _, r := range runs {
			if r.Replica != leader {
				t.Fatalf("replicas %d and %d both ran the job: %v", leader, r.Replica, runs)
			}
		}

		children[leader].Kill(t)
		killed := time.Now()
		newLeader, took := -1, time.Duration(0)
		for newLeader < 0 && time.Since(killed) < 5*time.Second {
			time.Sleep(50 * time.Millisecond)
			for _, r := range b.Runs(t, db) {
				if r.Replica != leader {
					newLeader, took = r.Replica, time.UnixMilli(r.Tick).Sub(killed)
					break
				}
			}
		}
		if newLeader < 0 {
			t.Fatalf("no replica ran the job within 5 s of the leader's death")
		}
		t.Logf("replica %d led; killed; replica %d ran the job %v later", leader, newLeader, took.Round(time.Millisecond))
		if took > 2500*time.Millisecond {
			t.Errorf("takeover took %v, want about one TTL (1 s) plus a backoff step", took)
		}
		time.Sleep(500 * time.Millisecond)
		for i, c := range children {
			if i != leader {
				c.Stop(t)
				c.Done(t)
			}
		}
		for _, r := range b.Runs(t, db) {
			after := time.UnixMilli(r.Tick).After(killed)
			if (after && r.Replica != newLeader) || (!after && r.Replica != leader) {
				t.Errorf("run %+v by a replica that did not lead (leader %d until %v, then %d)", r, leader, killed.Format(time.StampMilli), newLeader)
			}
		}
	})
}

// TestChildElected is one replica of TestElectorLeaderDies (it runs only
// in a child process).
func TestChildElected(t *testing.T) {
	b, ok := schedtest.FromEnv()
	if !ok || os.Getenv("SCHED_REPLICA") == "" {
		t.Skip("runs only as a child of TestElectorLeaderDies")
	}
	replica, _ := strconv.Atoi(os.Getenv("SCHED_REPLICA"))
	db := b.Open(t)
	l := b.Locker(t, fmt.Sprintf("replica-%d", replica))
	e, err := gocronlock.NewElector(l, "gocron/leader", gocronlock.WithLogger(schedtest.Logger(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	s, err := gocron.NewScheduler(gocron.WithDistributedElector(e))
	if err != nil {
		t.Fatal(err)
	}
	task := e.Job(func(ctx context.Context, lease *lock.Lease) error {
		if got, ok := lock.LeaseFrom(ctx); !ok || got != lease || lease.Key() != "gocron/leader" {
			t.Errorf("LeaseFrom(job context) = %v, %v; want the leader lease", got, ok)
		}
		return b.RecordRun(ctx, db, schedtest.Run{Key: "elected", Tick: time.Now().UnixMilli(), Replica: replica})
	})
	if _, err := s.NewJob(gocron.DurationJob(100*time.Millisecond), gocron.NewTask(task), gocron.WithName("elected")); err != nil {
		t.Fatal(err)
	}
	s.Start()
	fmt.Println("ready")
	schedtest.WaitStop()
	if err := s.Shutdown(); err != nil {
		t.Error(err)
	}
	schedtest.PrintDone(t)
}
