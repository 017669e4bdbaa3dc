package mysqldialect_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/dialect/mysqldialect"
	"github.com/sqlease/sqlease/lock"
)

// TestCancelledAcquireLeavesNoGrant_MySQL: an acquire whose deadline passes
// while its CALL waits on the server, for the key's named lock (GET_LOCK)
// or for the row lock a fenced transaction holds on an expired holder, is
// stopped on the server (KILL CONNECTION, dialect.Killer): right after Acquire
// returns no holder row of it exists, none appears once the blocker lets
// go (checked again 2 TTLs later), and the next acquire of the key works
// (SPEC H6, H9). Without the kill, the CALL would go on waiting (up to
// 2 s) and grant once the blocker let go.
func TestCancelledAcquireLeavesNoGrant_MySQL(t *testing.T) {
	if conformance.IsChild() {
		t.Skip("child process")
	}
	const ttl = time.Second
	const wait = 400 * time.Millisecond
	cases := []struct {
		name string
		// block makes the key's acquire CALL wait on the server and
		// returns the function that lets it go.
		block func(t *testing.T, ctx context.Context, db *sql.DB, newLocker func(owner string) *lock.Locker, holders, key string) func()
	}{
		{"named lock", blockNamedLock},
		{"fenced row", blockFencedRow},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			db, ns, _ := tokenSchema(t, "sqlease_kill_", 0)
			d := mysqldialect.New()
			newLocker := func(owner string) *lock.Locker {
				l, err := lock.New(ctx, db, d, lock.WithSchema(ns.Schema), lock.WithTTL(ttl), lock.WithOwner(owner))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { l.Close(context.Background()) })
				return l
			}
			const key = "k"
			letGo := tc.block(t, ctx, db, newLocker, ns.Object(d, "holders"), key)
			rows := func() int {
				var n int
				if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+ns.Object(d, "holders")+" WHERE owner = 'cancelled'").Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			l := newLocker("cancelled")
			actx, cancel := context.WithTimeout(ctx, wait)
			start := time.Now()
			le, err := l.Acquire(actx, key, lock.Exclusive)
			took := time.Since(start)
			cancel()
			if le != nil || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("acquire against a blocked key = %v, %v; want the deadline's error", le, err)
			}
			if took > wait+500*time.Millisecond {
				t.Errorf("acquire returned %s after it started, want within %s (SPEC H9)", took, wait+500*time.Millisecond)
			}
			if n := rows(); n != 0 {
				t.Fatalf("right after the acquire returned: %d holder rows of it", n)
			}
			letGo()
			time.Sleep(2 * ttl)
			if n := rows(); n != 0 {
				t.Fatalf("2 TTLs after the acquire returned: %d holder rows of it (granted after it gave up)", n)
			}
			le, err = l.TryAcquire(ctx, key, lock.Exclusive)
			if err != nil {
				t.Fatalf("acquire after the cancelled one: %v", err)
			}
			if err := le.Release(ctx); err != nil {
				t.Fatal(err)
			}
			t.Logf("acquire returned %s after it started; nothing granted since", took.Round(time.Millisecond))
		})
	}
}

// blockNamedLock holds the key's per-key named lock (GET_LOCK on a hash of
// the rendered holders table and the key, see migration 00001) on a
// connection of its own until the returned function.
func blockNamedLock(t *testing.T, ctx context.Context, db *sql.DB, _ func(string) *lock.Locker, holders, key string) func() {
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got int
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(CONCAT('sqlease:', SHA1(CONCAT(?, ':', ?))), 0)", holders, key).Scan(&got); err != nil || got != 1 {
		t.Fatalf("GET_LOCK = %d, %v", got, err)
	}
	return func() { conn.Close() }
}

// blockFencedRow leaves an expired lease of key whose holder row a fenced
// transaction, kept busy, holds in share mode, so a takeover waits for its
// row lock, until the returned function rolls the transaction back.
func blockFencedRow(t *testing.T, ctx context.Context, db *sql.DB, newLocker func(string) *lock.Locker, _, key string) func() {
	h := newLocker("holder")
	le, err := h.TryAcquire(ctx, key, lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Fence(ctx, tx); err != nil {
		t.Fatal(err)
	}
	le.Orphan()
	// The transaction stays busy, as a live holder's would: idle for the
	// TTL, the server would end it (the fence's idle timeout, SPEC F1).
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-done:
				_ = tx.Rollback()
				return
			case <-time.After(100 * time.Millisecond):
			}
			if _, err := tx.ExecContext(ctx, "DO 0"); err != nil {
				t.Errorf("blocking fenced transaction: %v", err)
			}
		}
	}()
	time.Sleep(time.Until(le.Expiry()) + 100*time.Millisecond)
	return func() {
		close(done)
		<-stopped
	}
}
