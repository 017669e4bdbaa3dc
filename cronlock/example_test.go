package cronlock_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/robfig/cron/v3"
	_ "modernc.org/sqlite" // database/sql driver "sqlite" (pure Go)

	"github.com/sqlease/sqlease/cronlock"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
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

// Every replica of a service runs the same cron schedule; SkipIfLocked
// makes each tick's job run on one of them. The job is a cronlock.Func, so
// it gets the lease: its context ends if the lease is lost, and the
// fencing token guards what it writes.
func ExampleSkipIfLocked() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "cronlock-example")
	defer os.RemoveAll(dir)
	db, locker := openLocker(ctx, dir)
	defer db.Close()
	defer locker.Close(ctx)

	ran := make(chan struct{}, 1)
	report := cronlock.Func(func(ctx context.Context, lease *lock.Lease) error {
		// Write with lease.RunInTx(ctx, db, nil, ...) or store
		// lease.Token() with the result: a replica that lost the lease
		// cannot overwrite a newer run's output.
		fromCtx, _ := lock.LeaseFrom(ctx)
		fmt.Println("nightly report under", lease.Key(), "fenced:", lease.Token() > 0, "same lease in ctx:", fromCtx == lease)
		select {
		case ran <- struct{}{}:
		default:
		}
		return nil
	})

	c := cron.New(cron.WithSeconds())
	// One chain per job: the key names this job. HoldAtLeast keeps the key
	// taken for 500ms after the grant, so replicas whose ticks come up to
	// that much later skip the tick even though the job took microseconds;
	// HoldAtMost ends a run that hangs (its context ends, lost).
	job := cron.NewChain(cron.Recover(cron.DefaultLogger), cronlock.SkipIfLocked(locker, "reports/nightly",
		cronlock.WithAcquireOptions(lock.HoldAtLeast(500*time.Millisecond), lock.HoldAtMost(time.Minute)))).Then(report)
	if _, err := c.AddJob("* * * * * *", job); err != nil { // every second; "0 0 2 * * *" for 02:00
		panic(err)
	}
	c.Start()
	<-ran
	<-c.Stop().Done()
	// Output:
	// nightly report under reports/nightly fenced: true same lease in ctx: true
}

// LeaderOnly runs a Cron's jobs only on the replica that leads: the
// others keep the same schedule and skip every tick until the leader dies
// (replaced within about one TTL).
func ExampleLeaderOnly() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "cronlock-example")
	defer os.RemoveAll(dir)
	db, locker := openLocker(ctx, dir)
	defer db.Close()
	defer locker.Close(ctx)

	leader := cronlock.LeaderOnly(locker, "cron/leader")
	defer leader.Stop() // after the Cron stopped: releases leadership
	for !leader.Leading() {
		time.Sleep(10 * time.Millisecond) // only for the example: the Cron need not wait
	}

	ran := make(chan struct{}, 1)
	c := cron.New(cron.WithSeconds(), cron.WithChain(leader.Wrap))
	_, err := c.AddJob("* * * * * *", cronlock.Func(func(ctx context.Context, lease *lock.Lease) error {
		fmt.Println("leader runs the job under", lease.Key())
		select {
		case ran <- struct{}{}:
		default:
		}
		return nil
	}))
	if err != nil {
		panic(err)
	}
	c.Start()
	<-ran
	<-c.Stop().Done()
	// Output:
	// leader runs the job under cron/leader
}
