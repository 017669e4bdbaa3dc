package mysqldialect_test

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/dialect/mysqldialect"
	"github.com/sqlease/sqlease/lock"
)

// TestKilledAcquireNeverGrantsOverHolder_MySQL: exclusive acquires whose
// wait timeout ends while their CALL runs, so the engine kills the CALL
// (SPEC H6), never return a lease while another holder's shared lease is
// live (SPEC S1). With KILL QUERY, MariaDB could interrupt the procedure's
// read of the key's holders without an error: the CALL then granted over
// the live lease and reported success. A killed CALL's outcome is
// therefore unknown whatever it reports, and its grant is undone.
func TestKilledAcquireNeverGrantsOverHolder_MySQL(t *testing.T) {
	if conformance.IsChild() {
		t.Skip("child process")
	}
	db, ns, _ := tokenSchema(t, "sqlease_t_killgrant_", 0)
	ctx := t.Context()
	d := mysqldialect.New()
	newLocker := func(owner string) *lock.Locker {
		l, err := lock.New(ctx, db, d, lock.WithSchema(ns.Schema), lock.WithTTL(time.Minute), lock.WithOwner(owner))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close(context.Background()) })
		return l
	}
	const key = "k"
	if _, err := newLocker("reader").TryAcquire(ctx, key, lock.Shared); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	var refused atomic.Int64
	var wg sync.WaitGroup
	for i := range 8 {
		w := newLocker(fmt.Sprintf("writer %d", i))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) && !t.Failed() {
				wait := time.Duration(200+rand.IntN(2800)) * time.Microsecond
				le, err := w.Acquire(ctx, key, lock.Exclusive, lock.WaitTimeout(wait))
				if le != nil {
					t.Errorf("wait timeout %s: granted exclusive lease %s while the reader's shared lease is live (SPEC S1)", wait, le.LeaseID())
					return
				}
				if !errors.Is(err, lock.ErrLocked) {
					t.Errorf("%v, want ErrLocked", err)
					return
				}
				refused.Add(1)
			}
		}()
	}
	wg.Wait()
	n := refused.Load()
	t.Logf("%d acquires refused", n)
}

// TestKillCommitsNothingMore_MySQL: Dialect.Kill stops an acquire CALL,
// wherever it is, without it committing anything afterwards. The CALL
// asks for an exclusive lease of a key a live shared lease holds, so any
// grant it commits is a second holder (SPEC S1). With KILL QUERY, MariaDB
// cut a read inside the procedure short without an error about once in
// 600 calls killed 0-3 ms after they started: the CALL went on, granted
// and committed.
func TestKillCommitsNothingMore_MySQL(t *testing.T) {
	if conformance.IsChild() {
		t.Skip("child process")
	}
	db, ns, _ := tokenSchema(t, "sqlease_t_killcall_", 0)
	ctx := t.Context()
	d := mysqldialect.New()
	l, err := lock.New(ctx, db, d, lock.WithSchema(ns.Schema), lock.WithTTL(time.Minute), lock.WithOwner("reader"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	if _, err := l.TryAcquire(ctx, "k", lock.Shared); err != nil {
		t.Fatal(err)
	}
	holders := ns.Object(d, "holders")
	call := "CALL " + ns.Object(d, "acquire_limit") + "(?, 'x', ?, 'killed', 60000000, 0, 0, 0)"
	deadline := time.Now().Add(20 * time.Second)
	n := 0
	for ; n < 2500 && time.Now().Before(deadline); n++ {
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		id, err := d.SessionID(ctx, conn)
		if err != nil {
			t.Fatal(err)
		}
		delay := time.Duration(rand.IntN(3000)) * time.Microsecond
		killed := make(chan error, 1)
		go func() {
			time.Sleep(delay)
			killed <- d.Kill(ctx, db, id)
		}()
		leaseID := fmt.Sprintf("killed-%d", n)
		if rows, err := conn.QueryContext(ctx, call, "k", leaseID); err == nil {
			for rows.Next() {
			}
			for rows.NextResultSet() {
				for rows.Next() {
				}
			}
			rows.Close()
		}
		if err := <-killed; err != nil && !strings.Contains(err.Error(), "Unknown thread id") {
			t.Fatal(err)
		}
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		conn.Close()
		// The killed session is gone once a new statement sees no trace
		// of it in the process list; then its grant, if any, committed.
		for {
			var alive int
			if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.processlist WHERE id = ?", id).Scan(&alive); err != nil {
				t.Fatal(err)
			}
			if alive == 0 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		var granted int
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+holders+" WHERE lease_id = ?", leaseID).Scan(&granted); err != nil {
			t.Fatal(err)
		}
		if granted > 0 {
			t.Fatalf("call %d, killed %s after it started: it committed an exclusive grant beside the live shared lease (SPEC S1)", n, delay)
		}
	}
	t.Logf("%d calls killed, none committed a grant", n)
}
