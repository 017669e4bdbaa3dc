package lock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/migrate"
)

// The engine bounds SQLite's busy wait (which no context interrupts) around
// its writes unless the pool's own busy timeout ends in time (writeConn,
// lockWait). These tests hold the write lock from another pool and check
// that each kind of write ends when its rule says, and that the
// application's connections keep their own busy timeout.

// openBusy opens path with a busy timeout of busyMS milliseconds.
func openBusy(t *testing.T, path string, busyMS int) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+path+"?_journal_mode=WAL&_busy_timeout="+strconv.Itoa(busyMS))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// holdWriteLock takes the database write lock on a connection of a pool of
// its own (BEGIN IMMEDIATE) until the returned func runs (or t ends).
func holdWriteLock(t *testing.T, path string) (unlock func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := openBusy(t, path, 5000).Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	unlock = func() {
		once.Do(func() {
			_, _ = conn.ExecContext(ctx, "ROLLBACK")
			_ = conn.Close()
		})
	}
	t.Cleanup(unlock)
	return unlock
}

// busyTimeouts reads PRAGMA busy_timeout on n connections of db held at
// once (so n different connections when the pool has them).
func busyTimeouts(t *testing.T, db *sql.DB, n int) []int {
	t.Helper()
	ctx := context.Background()
	var out []int
	for i := 0; i < n; i++ {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		var ms int
		if err := c.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&ms); err != nil {
			t.Fatal(err)
		}
		out = append(out, ms)
	}
	return out
}

// TestWriteConnBoundsTheBusyWaitUnlessThePoolsEndsInTime: inside writeConn
// the connection's busy timeout is the pool's own (5 s) when that ends by
// the write's until, and the write's bound otherwise; afterwards the pool's
// is back. waitUntil allows the pool's bound to end lockWaitSlack after the
// deadline, no more (SPEC H5, H9).
func TestWriteConnBoundsTheBusyWaitUnlessThePoolsEndsInTime(t *testing.T) {
	ctx := context.Background()
	db := openBusy(t, filepath.Join(t.TempDir(), "app.db"), 5000)
	db.SetMaxOpenConns(1) // the same connection every time
	if _, err := migrate.Up(ctx, db, sqlitedialect.New()); err != nil {
		t.Fatal(err)
	}
	l, err := New(ctx, db, sqlitedialect.New())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	deadline := func(d time.Duration) lockWait {
		c, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		return waitUntil(c)
	}
	acquire := func(hard time.Duration, cancels bool) lockWait {
		var h time.Time
		if hard > 0 {
			h = time.Now().Add(hard)
		}
		_, lw := acquireBounds(5*time.Second, h, cancels)
		return lw
	}
	now := time.Now()
	for _, tc := range []struct {
		name string
		lw   lockWait
		want int
	}{
		{"no bound", lockWait{}, 5000},
		{"bound, no until", lockWait{bound: 250 * time.Millisecond}, 250},
		{"pool ends before until", lockWait{bound: 250 * time.Millisecond, until: now.Add(6 * time.Second)}, 5000},
		{"pool ends after until", lockWait{bound: 250 * time.Millisecond, until: now.Add(4 * time.Second)}, 250},
		{"deadline 5 s: within the slack", deadline(5 * time.Second), 5000},
		{"deadline 4.8 s: past the slack", deadline(4800 * time.Millisecond), 250},
		{"deadline 100 ms", deadline(100 * time.Millisecond), 100},
		// An acquire: its deadline, not its statement's (the deadline
		// plus acquireCancelGrace), plus the slack (SPEC H9).
		{"acquire, deadline 4.95 s", acquire(4950*time.Millisecond, true), 5000},
		{"acquire, deadline 4.76 s", acquire(4760*time.Millisecond, true), 250},
		// Cancellable, no deadline: the statement timeout (5 s) is the
		// limit, without slack, so a 5 s pool is bounded.
		{"acquire, cancellable, no deadline", acquire(0, true), 250},
		{"acquire, neither", acquire(0, false), 5000},
	} {
		conn, done, err := l.writeConn(ctx, db, tc.lw)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var ms int
		err = conn.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&ms)
		done()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		// The deadline case's bound is what is left of 100 ms.
		if ms != tc.want && !(tc.want == 100 && ms > 50 && ms <= 100) {
			t.Errorf("%s: busy timeout during the write %d ms, want %d", tc.name, ms, tc.want)
		}
		if got := busyTimeouts(t, db, 1); got[0] != 5000 {
			t.Fatalf("%s: busy timeout after the write %d ms, want the pool's 5000", tc.name, got[0])
		}
	}
}

// TestLockWaitOfEachPool: the renew pool (WithRenewDB) has a 1 s busy
// timeout, the main pool 10 s. After renewals read and cached the renew
// pool's, a release on the main pool with a 1 s release timeout must
// still bound its busy wait (it returned after 10 s when one value was
// cached for both pools), and each pool's connections keep their own busy
// timeout (SPEC H5, H8).
func TestLockWaitOfEachPool(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "app.db")
	db := openBusy(t, path, 10000)
	rdb := openBusy(t, path, 1000)
	if _, err := migrate.Up(ctx, db, sqlitedialect.New()); err != nil {
		t.Fatal(err)
	}
	l, err := New(ctx, db, sqlitedialect.New(), WithTTL(1500*time.Millisecond), WithRenewDB(rdb), WithReleaseTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	le, err := l.TryAcquire(ctx, "k", Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1200 * time.Millisecond) // renewals every 0.5 s
	if err := le.Err(); err != nil {
		t.Fatalf("lease lost before the release: %v", err)
	}
	unlock := holdWriteLock(t, path)
	start := time.Now()
	err = le.Release(ctx)
	took := time.Since(start)
	unlock()
	if err == nil {
		t.Fatal("Release with the write lock held elsewhere succeeded")
	}
	if took > 2500*time.Millisecond {
		t.Fatalf("Release took %v with a 1 s release timeout (SPEC H5): %v", took, err)
	}
	for _, ms := range busyTimeouts(t, db, 3) {
		if ms != 10000 {
			t.Fatalf("main pool connection busy timeout %d ms after engine writes, want the DSN's 10000", ms)
		}
	}
	for _, ms := range busyTimeouts(t, rdb, 2) {
		if ms != 1000 {
			t.Fatalf("renew pool connection busy timeout %d ms after renewals, want the DSN's 1000", ms)
		}
	}
	// The next operation works.
	le2, err := l.TryAcquire(ctx, "k2", Exclusive)
	if err != nil {
		t.Fatalf("TryAcquire after the failed release: %v", err)
	}
	if err := le2.Release(ctx); err != nil {
		t.Fatalf("Release after the failed release: %v", err)
	}
}

// TestRenewalBusyWaitEndsByTheRenewTimeout: a renewal that meets another
// connection's write lock gives up after its renew timeout (TTL/5, 1.8 s
// here), not after the pool's busy timeout (4.5 s), even though the pool's
// ends within the lease's trusted window (SPEC H7; the bound was once
// compared with the window). The write lock is held from the grant to 6 s
// after it: the first renewal (due 2.25-3 s after the grant) must fail by
// 4.8 s and be retried; one that waited out the busy timeout would end
// only when the lock is freed, without a failure. The lease survives.
func TestRenewalBusyWaitEndsByTheRenewTimeout(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "app.db")
	db := openBusy(t, path, 4500)
	if _, err := migrate.Up(ctx, db, sqlitedialect.New()); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var firstRetry time.Time
	obs := ObserverFunc(func(e Event) {
		if e.Kind == EventRenewRetry {
			mu.Lock()
			if firstRetry.IsZero() {
				firstRetry = time.Now()
			}
			mu.Unlock()
		}
	})
	l, err := New(ctx, db, sqlitedialect.New(), WithTTL(9*time.Second), WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	le, err := l.TryAcquire(ctx, "k", Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(ctx)
	granted := time.Now()
	unlock := holdWriteLock(t, path)
	time.Sleep(time.Until(granted.Add(6 * time.Second)))
	unlock()
	mu.Lock()
	first := firstRetry
	mu.Unlock()
	switch {
	case first.IsZero():
		t.Fatal("no renewal failed while the write lock was held for 6 s: a renewal waited out the pool's 4.5 s busy timeout instead of its 1.8 s renew timeout")
	case first.Sub(granted) > 5600*time.Millisecond:
		t.Fatalf("the first renewal failed %v after the grant; due by 3 s with a 1.8 s renew timeout", first.Sub(granted))
	}
	time.Sleep(1500 * time.Millisecond) // a renewal after the hold
	if err := le.Err(); err != nil {
		t.Fatalf("lease lost after the hold: %v", err)
	}
}

// TestTxDoneIsTheContextsError: a transaction database/sql rolled back
// because the statement's context ended is reported as that context's
// error (uncertain: undone and retried by the acquire loop), not as
// sql.ErrTxDone (an acquire failure); with the context live, or for any
// other error, the error is kept as it is.
func TestTxDoneIsTheContextsError(t *testing.T) {
	live := context.Background()
	ended, cancel := context.WithCancel(live)
	cancel()
	for _, tc := range []struct {
		name      string
		ctx       context.Context
		err       error
		uncertain bool
		same      bool
	}{
		{"ended, ErrTxDone", ended, sql.ErrTxDone, true, false},
		{"ended, wrapped ErrTxDone", ended, fmt.Errorf("commit: %w", sql.ErrTxDone), true, false},
		{"live, ErrTxDone", live, sql.ErrTxDone, false, true},
		{"ended, other error", ended, sql.ErrConnDone, false, true},
		{"ended, nil", ended, nil, false, true},
	} {
		got := txDone(tc.ctx, tc.err)
		if tc.same && got != tc.err {
			t.Errorf("%s: txDone = %v, want the error unchanged", tc.name, got)
		}
		if !tc.same && (!errors.Is(got, context.Canceled) || !errors.Is(got, sql.ErrTxDone)) {
			t.Errorf("%s: txDone = %v, want it to wrap context.Canceled and sql.ErrTxDone", tc.name, got)
		}
		if got != nil && tc.uncertain != (errors.Is(got, context.Canceled)) {
			t.Errorf("%s: txDone = %v: counted as uncertain %v, want %v", tc.name, got, !tc.uncertain, tc.uncertain)
		}
	}
}
