package mysqldialect_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/dialect/mysqldialect"
	"github.com/sqlease/sqlease/lock"
)

// TestKilledAcquireNeverGrantsOverHolder_MySQL: exclusive acquires whose
// wait timeout ends while their CALL runs, so the engine stops the CALL
// with KILL QUERY (SPEC H6), never return a lease while another holder's
// shared lease is live (SPEC S1). MariaDB can interrupt the procedure's
// read of the key's holders without an error: the CALL then grants over
// the live lease and reports success. A killed CALL's outcome is
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
