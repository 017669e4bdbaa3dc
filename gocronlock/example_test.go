package gocronlock_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/go-co-op/gocron/v2"
	_ "modernc.org/sqlite" // database/sql driver "sqlite" (pure Go)

	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/gocronlock"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// openLocker opens a SQLite file in dir, creates the lock tables and
// returns a Locker on it; in production, every replica opens the same
// (PostgreSQL, MySQL) database.
func openLocker(ctx context.Context, dir string) (*sql.DB, *lock.Locker) {
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_journal_mode=WAL&_busy_timeout=5000")
	if err != nil {
		panic(err)
	}
	if _, err := migrate.Up(ctx, db, sqlitedialect.New()); err != nil {
		panic(err)
	}
	locker, err := lock.New(ctx, db, sqlitedialect.New(), lock.WithTTL(10*time.Second))
	if err != nil {
		panic(err)
	}
	return db, locker
}

// Every replica runs the same gocron scheduler with a gocronlock.Locker:
// each run of a job takes an exclusive lease named after the job, and a
// replica that finds it held skips that run. Locker.Job hands the task
// the lease, for fencing and to stop when the lease is lost.
func ExampleLocker() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "gocronlock-example")
	defer os.RemoveAll(dir)
	db, locker := openLocker(ctx, dir)
	defer db.Close()
	defer locker.Close(ctx)

	// HoldAtLeast keeps a job's key taken for 30s after the grant, so
	// replicas whose ticks come up to that much later skip the run even
	// when it took milliseconds; HoldAtMost ends a run that hangs (its
	// context ends, lost).
	gl, err := gocronlock.NewLocker(locker, gocronlock.WithKeyPrefix("jobs/"),
		gocronlock.WithAcquireOptions(lock.HoldAtLeast(30*time.Second), lock.HoldAtMost(time.Hour)))
	if err != nil {
		panic(err)
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(gl))
	if err != nil {
		panic(err)
	}
	ran := make(chan struct{}, 1)
	task := gl.Job("nightly-report", func(ctx context.Context, lease *lock.Lease) error {
		// Fence writes with lease.RunInTx(ctx, db, nil, ...) or lease.Token().
		fromCtx, _ := lock.LeaseFrom(ctx)
		fmt.Println("report under", lease.Key(), "fenced:", lease.Token() > 0, "same lease in ctx:", fromCtx == lease)
		select {
		case ran <- struct{}{}:
		default:
		}
		return nil
	})
	// The name is the lock key (after the prefix), and what Job looks the
	// lease up by.
	_, err = s.NewJob(gocron.DurationJob(time.Hour), gocron.NewTask(task),
		gocron.WithName("nightly-report"), gocron.WithStartAt(gocron.WithStartImmediately()))
	if err != nil {
		panic(err)
	}
	s.Start()
	<-ran
	if err := s.Shutdown(); err != nil {
		panic(err)
	}
	// Output:
	// report under jobs/nightly-report fenced: true same lease in ctx: true
}

// With a gocronlock.Elector only the replica that leads runs the
// scheduler's jobs; when it dies another replica leads within about one
// TTL.
func ExampleElector() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "gocronlock-example")
	defer os.RemoveAll(dir)
	db, locker := openLocker(ctx, dir)
	defer db.Close()
	defer locker.Close(ctx)

	elector, err := gocronlock.NewElector(locker, "gocron/leader")
	if err != nil {
		panic(err)
	}
	defer elector.Close() // after Shutdown: releases leadership
	for elector.IsLeader(ctx) != nil {
		time.Sleep(10 * time.Millisecond) // only for the example: the scheduler need not wait
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedElector(elector))
	if err != nil {
		panic(err)
	}
	ran := make(chan struct{}, 1)
	task := elector.Job(func(ctx context.Context, lease *lock.Lease) error {
		fmt.Println("leader runs the job under", lease.Key())
		select {
		case ran <- struct{}{}:
		default:
		}
		return nil
	})
	if _, err := s.NewJob(gocron.DurationJob(time.Hour), gocron.NewTask(task), gocron.WithStartAt(gocron.WithStartImmediately())); err != nil {
		panic(err)
	}
	s.Start()
	<-ran
	if err := s.Shutdown(); err != nil {
		panic(err)
	}
	// Output:
	// leader runs the job under gocron/leader
}
