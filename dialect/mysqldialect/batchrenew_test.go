package mysqldialect_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sqlease/sqlease/conformance/conftest"
	"github.com/sqlease/sqlease/dialect/mysqldialect"
	"github.com/sqlease/sqlease/internal/faultdb"
	"github.com/sqlease/sqlease/lock"
)

// TestBatchRenewal10000_MySQL: one Locker holds 10,000 leases; every one is
// renewed in each renewal interval, none is lost, and the Locker sends at
// most 20 statements per interval (SPEC H2; the CALL of the renew_batch
// procedure, migration 00005, renews up to 2,500 leases).
func TestBatchRenewal10000_MySQL(t *testing.T) {
	if testing.Short() {
		t.Skip("acquires 10,000 leases (-short)")
	}
	const n, ttl, workers = 10_000, 3 * time.Second, 16
	interval := ttl / 3
	_, ns, _ := tokenSchema(t, "sqlease_batch_", 0)
	cfg, err := mysql.ParseDSN(conftest.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	base, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	inj := faultdb.New()
	db := sql.OpenDB(inj.Connector(base))
	db.SetMaxOpenConns(workers + 4)
	t.Cleanup(func() { db.Close() })
	var lost atomic.Int64
	l, err := lock.New(t.Context(), db, mysqldialect.New(), lock.WithSchema(ns.Schema), lock.WithTTL(ttl),
		lock.WithObserver(lock.ObserverFunc(func(ev lock.Event) {
			if ev.Kind == lock.EventLeaseLost {
				lost.Add(1)
			}
		})))
	if err != nil {
		t.Fatal(err)
	}
	leases := make([]*lock.Lease, n)
	t.Cleanup(func() {
		// Releasing 10,000 leases is 10,000 CALLs; the schema is dropped.
		for _, le := range leases {
			if le != nil {
				le.Orphan()
			}
		}
		_ = l.Close(context.Background())
	})
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				le, err := l.TryAcquire(t.Context(), fmt.Sprintf("batch/%d", i), lock.Exclusive)
				if err != nil {
					errs <- fmt.Errorf("acquire %d: %w", i, err)
					return
				}
				leases[i] = le
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d leases acquired in %v", n, time.Since(start).Round(time.Millisecond))

	// Every lease is on the renewal schedule after one interval; count
	// over the next three.
	time.Sleep(interval)
	first := make([]time.Time, n)
	for i, le := range leases {
		first[i] = le.Expiry()
	}
	inj.ResetCounts()
	t0 := time.Now()
	time.Sleep(3 * interval)
	stmts, calls := inj.Count(""), inj.Count("renew_batch")
	intervals := float64(time.Since(t0)) / float64(interval)
	perInterval := float64(stmts) / intervals
	stale, gone := 0, 0
	for i, le := range leases {
		if err := le.Err(); err != nil {
			if gone == 0 {
				t.Errorf("lease %s lost: %v", le.Key(), err)
			}
			gone++
			continue
		}
		// Renewed at least twice in three intervals: past its expiry at
		// the start by more than one interval.
		if !le.Expiry().After(first[i].Add(interval)) {
			stale++
		}
	}
	t.Logf("%d statements (%d renew_batch CALLs) in %.1f intervals of %v: %.1f per interval; %d leases lost, %d not renewed twice",
		stmts, calls, intervals, interval, perInterval, gone, stale)
	if perInterval > 20 {
		t.Errorf("%.1f statements per renewal interval for %d leases, want at most 20", perInterval, n)
	}
	if lost.Load() > 0 || gone > 0 || stale > 0 {
		t.Errorf("%d leases lost (%d loss events) and %d not renewed twice in three intervals, want none", gone, lost.Load(), stale)
	}
	if calls == 0 {
		t.Errorf("no renew_batch CALL was sent")
	}
}
