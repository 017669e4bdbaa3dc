package lock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/lock"
)

// Two replicas run the same schedule; their ticks differ by a little. The
// first runs the job, which ends quickly; HoldAtLeast keeps the key taken
// after it, so the second replica's tick skips the job (SPEC H10).
func ExampleHoldAtLeast() {
	db, cleanup := openExampleDB()
	defer cleanup()
	ctx := context.Background()
	a, _ := lock.New(ctx, db, sqlitedialect.New(), lock.WithOwner("replica-a"))
	defer a.Close(ctx)
	b, _ := lock.New(ctx, db, sqlitedialect.New(), lock.WithOwner("replica-b"))
	defer b.Close(ctx)

	tick := func(l *lock.Locker, name string) {
		err := l.Do(ctx, "jobs/hourly", lock.Exclusive, func(ctx context.Context, lease *lock.Lease) error {
			fmt.Println(name, "runs the job")
			return nil
		}, lock.WaitTimeout(0), lock.HoldAtLeast(time.Minute), lock.HoldAtMost(50*time.Minute))
		var locked *lock.LockedError
		if errors.As(err, &locked) {
			fmt.Println(name, "skips: the key is held by", locked.Holders[0].Owner)
		}
	}
	tick(a, "replica-a")
	time.Sleep(100 * time.Millisecond) // replica-b's clock is a little behind
	tick(b, "replica-b")
	// Output:
	// replica-a runs the job
	// replica-b skips: the key is held by replica-a
}

// A job that outlives HoldAtMost loses its lease: its context ends with
// cause ErrLeaseLost, reason LossMaxLife (SPEC H10, H3).
func ExampleHoldAtMost() {
	db, cleanup := openExampleDB()
	defer cleanup()
	ctx := context.Background()
	l, _ := lock.New(ctx, db, sqlitedialect.New(), lock.WithTTL(time.Second))
	defer l.Close(ctx)

	err := l.Do(ctx, "jobs/stuck", lock.Exclusive, func(ctx context.Context, lease *lock.Lease) error {
		<-ctx.Done() // a job that would run forever
		return context.Cause(ctx)
	}, lock.HoldAtMost(300*time.Millisecond))
	var lost *lock.LeaseLostError
	fmt.Println("lost:", errors.Is(err, lock.ErrLeaseLost), errors.As(err, &lost) && lost.Reason == lock.LossMaxLife)
	// Output:
	// lost: true true
}

// Lead with HoldAtMost: a leader steps down at the end of each lease's
// maximum life and campaigns again, so terms end on a schedule; each term
// ends with LossMaxLife.
func TestLeadWithHoldAtMost(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	l := sqliteLocker(t, lock.WithTTL(time.Second))
	const life = 300 * time.Millisecond
	var mu sync.Mutex
	var stops []error
	var tokens []int64
	err := l.Lead(ctx, "h10/lead", func(ctx context.Context, lease *lock.Lease) error {
		<-ctx.Done()
		return context.Cause(ctx)
	}, lock.LeadAcquireOptions(lock.HoldAtMost(life)),
		lock.OnStartedLeading(func(lease *lock.Lease) {
			mu.Lock()
			defer mu.Unlock()
			tokens = append(tokens, lease.Token())
			if len(tokens) == 3 {
				cancel()
			}
		}),
		lock.OnStoppedLeading(func(err error) {
			mu.Lock()
			defer mu.Unlock()
			stops = append(stops, err)
		}))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Lead = %v, want the context's error", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(tokens) != 3 || tokens[1] <= tokens[0] || tokens[2] <= tokens[1] {
		t.Fatalf("terms' tokens %v, want 3 increasing", tokens)
	}
	for _, err := range stops[:2] {
		var lost *lock.LeaseLostError
		if !errors.As(err, &lost) || lost.Reason != lock.LossMaxLife {
			t.Errorf("term ended with %v, want a loss with reason %s", err, lock.LossMaxLife)
		}
	}
}

// A bad hold option passed to Lead is returned at once, as from Do.
func TestLeadRefusesBadHold(t *testing.T) {
	l := sqliteLocker(t)
	err := l.Lead(t.Context(), "h10/lead", func(context.Context, *lock.Lease) error {
		t.Error("fn ran with a bad option")
		return nil
	}, lock.LeadAcquireOptions(lock.HoldAtMost(-time.Second)))
	checkInputError(t, err, "lock", "HoldAtMost", "-1s", "positive")
}

// A lease released early with HoldAtLeast and then released again stays
// held (Release is idempotent), and the same Locker waits for the hold like
// any other acquirer (SPEC H10, H8).
func TestHoldAtLeastSameLockerWaits(t *testing.T) {
	ctx := t.Context()
	l := sqliteLocker(t, lock.WithTTL(2*time.Second))
	const hold = 600 * time.Millisecond
	le, err := l.TryAcquire(ctx, "h10/same", lock.Exclusive, lock.HoldAtLeast(hold))
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := le.Release(ctx); err != nil {
		t.Fatalf("second release: %v", err)
	}
	if _, err := l.TryAcquire(ctx, "h10/same", lock.Exclusive); !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("try acquire during the hold = %v, want ErrLocked", err)
	}
	again, err := l.Acquire(ctx, "h10/same", lock.Exclusive, lock.WaitTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer again.Release(ctx)
	if again.GrantedAt().Before(le.GrantedAt().Add(hold)) {
		t.Errorf("granted at %s, before the hold's end %s", again.GrantedAt(), le.GrantedAt().Add(hold))
	}
}

// A lease lost before its release keeps no minimum hold: the release
// deletes the row and the key is free at once (SPEC H10).
func TestLostLeaseKeepsNoHold(t *testing.T) {
	ctx := t.Context()
	l := sqliteLocker(t, lock.WithTTL(300*time.Millisecond))
	le, err := l.TryAcquire(ctx, "h10/lost", lock.Exclusive, lock.HoldAtLeast(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	le.Orphan()
	select {
	case <-le.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("orphaned lease not lost 5s after its window")
	}
	if err := le.Release(ctx); err != nil && !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("release of the lost lease: %v", err)
	}
	again, err := l.TryAcquire(ctx, "h10/lost", lock.Exclusive)
	if err != nil {
		t.Fatalf("try acquire after releasing a lost lease with a minimum hold: %v, want the key free", err)
	}
	_ = again.Release(ctx)
}
