package lock_test

// The cores of the River and asynq recipes of docs/integrations.md,
// compiled and run here on SQLite with database/sql only: the queue's own
// call (River's Client.InsertTx, an asynq handler) is the one line each
// recipe adds around them.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/lock"
)

// leadPeriodicEnqueue runs on every replica: the one that leads name
// enqueues the job of each period once. Each tick it claims the period in
// the periodic_claim row and calls enqueue (with River:
// client.InsertTx(ctx, tx, args, nil) on a Client[*sql.Tx]) in one fenced
// transaction, so the claim and the job commit together, only while the
// lease is ours, and a new leader finds the periods already claimed.
func leadPeriodicEnqueue(ctx context.Context, locker *lock.Locker, db *sql.DB, name string, every time.Duration,
	enqueue func(ctx context.Context, tx *sql.Tx, period time.Time) error) error {
	return locker.Lead(ctx, "periodic/"+name, func(ctx context.Context, lease *lock.Lease) error {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			period := time.Now().Truncate(every)
			err := lease.RunInTx(ctx, db, nil, func(ctx context.Context, tx *sql.Tx) error {
				res, err := tx.ExecContext(ctx, `UPDATE periodic_claim SET period = $1, token = $2 WHERE name = $3 AND period < $1`,
					period.UnixMicro(), lease.Token(), name)
				if err != nil {
					return err
				}
				if n, err := res.RowsAffected(); err != nil || n == 0 {
					return err // claimed already: enqueued by an earlier leader
				}
				return enqueue(ctx, tx, period)
			})
			if errors.Is(err, lock.ErrLeaseLost) {
				return err // Lead campaigns again
			}
			if err != nil {
				log.Printf("enqueue %s for %s: %v; next tick retries", name, period, err)
			}
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-t.C:
			}
		}
	})
}

// buildReport is the asynq recipe's handler body: one build of report id
// at a time across every worker process, its result stored only while the
// lease is ours and only over an older build's (the token guard). A
// handler that finds the key busy for 5 seconds returns ErrLocked, and one
// whose own process builds the report already returns ErrReentrant at
// once (SPEC W4): asynq retries the task later.
func buildReport(ctx context.Context, locker *lock.Locker, db *sql.DB, id int64) error {
	return locker.Do(ctx, fmt.Sprintf("report/%d", id), lock.Exclusive, func(ctx context.Context, lease *lock.Lease) error {
		body := fmt.Sprintf("report %d", id) // the slow part: reads only
		return lease.RunInTx(ctx, db, nil, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `UPDATE report SET body = $1, token = $2 WHERE id = $3 AND token < $2`, body, lease.Token(), id)
			return err
		})
	}, lock.WaitTimeout(5*time.Second))
}

// Two replicas run leadPeriodicEnqueue; only the leader enqueues, once per
// period.
func ExampleLocker_Lead_periodicEnqueue() {
	db, cleanup := openExampleDB()
	defer cleanup()
	ctx, stop := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer stop()
	db.Exec(`CREATE TABLE periodic_claim (name TEXT PRIMARY KEY, period BIGINT NOT NULL, token BIGINT NOT NULL)`)
	db.Exec(`INSERT INTO periodic_claim VALUES ('digest', 0, 0)`)
	db.Exec(`CREATE TABLE jobs (period BIGINT NOT NULL)`) // stands in for River's job table
	enqueue := func(ctx context.Context, tx *sql.Tx, period time.Time) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO jobs (period) VALUES ($1)`, period.UnixMicro())
		return err
	}
	var wg sync.WaitGroup
	for _, replica := range []string{"a", "b"} {
		locker, err := lock.New(ctx, db, sqlitedialect.New(), lock.WithOwner(replica), lock.WithTTL(2*time.Second))
		if err != nil {
			log.Fatal(err)
		}
		defer locker.Close(context.Background())
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = leadPeriodicEnqueue(ctx, locker, db, "digest", 100*time.Millisecond, enqueue)
		}()
	}
	wg.Wait()
	var jobs, periods int
	db.QueryRow(`SELECT COUNT(*), COUNT(DISTINCT period) FROM jobs`).Scan(&jobs, &periods)
	fmt.Println("jobs enqueued:", jobs > 0, "one per period:", jobs == periods)
	// Output:
	// jobs enqueued: true one per period: true
}

// Two deliveries of the same asynq task, on two worker processes (two
// Lockers), run one after the other; the stored report carries the later
// build's token.
func ExampleLocker_Do_asynqHandler() {
	db, cleanup := openExampleDB()
	defer cleanup()
	ctx := context.Background()
	db.Exec(`CREATE TABLE report (id INTEGER PRIMARY KEY, body TEXT, token BIGINT NOT NULL)`)
	db.Exec(`INSERT INTO report VALUES (7, '', 0)`)
	errs := make(chan error, 2)
	for _, worker := range []string{"worker-1", "worker-2"} {
		locker, err := lock.New(ctx, db, sqlitedialect.New(), lock.WithOwner(worker))
		if err != nil {
			log.Fatal(err)
		}
		defer locker.Close(ctx)
		go func() { errs <- buildReport(ctx, locker, db, 7) }()
	}
	fmt.Println("deliveries:", <-errs, <-errs)
	var body string
	var token int64
	db.QueryRow(`SELECT body, token FROM report WHERE id = 7`).Scan(&body, &token)
	fmt.Println(body, "stored with a token:", token > 0)
	// Output:
	// deliveries: <nil> <nil>
	// report 7 stored with a token: true
}
