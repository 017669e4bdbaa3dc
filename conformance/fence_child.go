package conformance

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/lock"
)

func init() {
	childRoles["f2-counter"] = func(ctx context.Context, db *sql.DB, d dialect.Dialect, spec StressSpec) error {
		return runFencedCounterWorkers(ctx, db, d, spec, nil)
	}
}

// createFencedCounterTables creates the log of committed fenced increments
// (n is the counter value the increment produced, so log order is commit
// order) and the per-worker report table.
func createFencedCounterTables(ctx context.Context, db *sql.DB, logTable, report string) error {
	if _, err := db.ExecContext(ctx, `CREATE TABLE `+logTable+` (n BIGINT PRIMARY KEY, token BIGINT NOT NULL, worker VARCHAR(100) NOT NULL)`); err != nil {
		return err
	}
	_, err := db.ExecContext(ctx, `CREATE TABLE `+report+` (worker VARCHAR(100) NOT NULL PRIMARY KEY, ok BIGINT NOT NULL, lost BIGINT NOT NULL, stale BIGINT NOT NULL, grants BIGINT NOT NULL, orphans BIGINT NOT NULL)`)
	return err
}

// runFencedCounterWorkers runs spec.Workers holders (each its own Locker,
// TTL spec.TTL) for spec.Duration. Each takes the counter key exclusively
// and increments the guarded row of table Extra["guarded"] only through
// RunInTx, logging each increment to spec.LogTable in the same
// transaction. By turns a holder writes and releases, orphans its lease
// and keeps writing with it until refused, or pauses inside the fenced
// transaction for longer than the TTL. At the end each worker writes what
// RunInTx reported to Extra["report"].
func runFencedCounterWorkers(ctx context.Context, db *sql.DB, d dialect.Dialect, spec StressSpec, newLocker func(context.Context, *sql.DB, dialect.Dialect, ...lock.Option) (*lock.Locker, error)) error {
	if newLocker == nil {
		newLocker = lock.New
	}
	g := guardedTable{table: spec.Extra["guarded"], d: d}
	insertLog := fmt.Sprintf(`INSERT INTO %s (n, token, worker) VALUES (%s, %s, %s)`, spec.LogTable, d.Placeholder(1), d.Placeholder(2), d.Placeholder(3))
	insertReport := fmt.Sprintf(`INSERT INTO %s (worker, ok, lost, stale, grants, orphans) VALUES (%s, %s, %s, %s, %s, %s)`,
		spec.Extra["report"], d.Placeholder(1), d.Placeholder(2), d.Placeholder(3), d.Placeholder(4), d.Placeholder(5), d.Placeholder(6))
	deadline := time.Now().Add(spec.Duration)
	var wg sync.WaitGroup
	errs := make(chan error, spec.Workers)
	for i := range spec.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("%s/%d", spec.Worker, i)
			if err := fencedCounterWorker(ctx, db, d, spec, newLocker, g, name, i, deadline, insertLog, insertReport); err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return errors.Join(all...)
}

// fencedCounterWorker is one holder of runFencedCounterWorkers; index
// staggers its behaviour turns.
func fencedCounterWorker(ctx context.Context, db *sql.DB, d dialect.Dialect, spec StressSpec,
	newLocker func(context.Context, *sql.DB, dialect.Dialect, ...lock.Option) (*lock.Locker, error),
	g guardedTable, name string, index int, deadline time.Time, insertLog, insertReport string) error {
	l, err := newLocker(ctx, db, d, lock.WithSchema(spec.Namespace.Schema), lock.WithTablePrefix(spec.Namespace.Prefix),
		lock.WithTTL(spec.TTL), lock.WithoutSchemaCheck(), lock.WithMaxBackoff(20*time.Millisecond),
		lock.WithOwner(name), lock.WithLogger(discard))
	if err != nil {
		return err
	}
	defer l.Close(context.Background())
	var ok, lost, stale, grants, orphans int64
	write := func(lease *lock.Lease, pause time.Duration) error {
		return lease.RunInTx(ctx, db, nil, func(ctx context.Context, tx *sql.Tx) error {
			n, err := g.inc(ctx, tx, lease.Token())
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, insertLog, n, lease.Token(), name); err != nil {
				return err
			}
			time.Sleep(pause)
			return nil
		})
	}
	// count classifies a write's result; it returns whether to stop
	// writing with the lease, or an unexpected error.
	count := func(err error) (bool, error) {
		switch {
		case err == nil:
			ok++
			return false, nil
		case errors.Is(err, lock.ErrLeaseLost):
			lost++
			return true, nil
		case errors.Is(err, errStaleToken):
			stale++
			return true, nil
		}
		return true, err
	}
	for turn := 0; time.Now().Before(deadline); turn++ {
		lease, err := l.Acquire(ctx, "f2/counter", lock.Exclusive, lock.WaitTimeout(spec.WaitTimeout))
		if errors.Is(err, lock.ErrLocked) {
			continue
		}
		if err != nil {
			// The counts say how the turns before ended: an ErrReentrant
			// here means the Locker still held the key from one of them.
			return fmt.Errorf("acquire (turn %d; so far %d grants, %d orphaned, %d increments, %d refused as lost, %d refused by the token guard): %w",
				turn, grants, orphans, ok, lost, stale, err)
		}
		grants++
		switch (index + turn) % 4 {
		case 0, 1: // a few increments, then release
			for range 1 + rand.IntN(3) {
				stop, err := count(write(lease, 0))
				if err != nil {
					return fmt.Errorf("write: %w", err)
				}
				if stop {
					break
				}
			}
			_ = lease.Release(ctx) // a failed release ends by expiry (SPEC H5)
		case 2: // crash-like: stop renewing, keep writing with the lease
			lease.Orphan()
			orphans++
			giveUp := time.Now().Add(10 * spec.TTL)
			for {
				stop, err := count(write(lease, 0))
				if err != nil {
					return fmt.Errorf("write with an orphaned lease: %w", err)
				}
				if stop {
					break
				}
				if time.Now().After(giveUp) {
					return fmt.Errorf("orphaned lease token %d still writes %s after it stopped renewing", lease.Token(), 10*spec.TTL)
				}
				time.Sleep(30 * time.Millisecond)
			}
		case 3: // a pause inside the fenced transaction, longer than the TTL
			pause := spec.TTL * 4 / 3
			if dialect.CapabilitiesOf(d).Has(dialect.CapFenceIdleTimeout) {
				pause = spec.TTL * 2 / 3 // the database ends a fenced transaction idle for a TTL
			}
			if _, err := count(write(lease, pause)); err != nil {
				return fmt.Errorf("write with a pause: %w", err)
			}
			_ = lease.Release(ctx) // a failed release ends by expiry (SPEC H5)
		}
	}
	if _, err := db.ExecContext(context.WithoutCancel(ctx), insertReport, name, ok, lost, stale, grants, orphans); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}
