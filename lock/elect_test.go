package lock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlease/sqlease/lock"
)

// deleteLeases removes every lease row behind the holders' backs, as a
// takeover after expiry would: their next renewal finds the lease gone.
func deleteLeases(t *testing.T, ctx context.Context, exec func(context.Context, string, ...any) error) {
	t.Helper()
	if err := exec(ctx, `DELETE FROM sqlease_holders`); err != nil {
		t.Fatalf("delete leases: %v", err)
	}
}

// A leader whose lease is lost sees its fn's context end with cause
// ErrLeaseLost, is told through OnStoppedLeading, and campaigns again: fn
// runs again under a new lease with a larger token (SPEC H3, S3).
func TestLeadRecampaignsAfterLoss(t *testing.T) {
	db := setupSQLite(t)
	ctx := t.Context()
	exec := func(ctx context.Context, q string, args ...any) error {
		_, err := db.ExecContext(ctx, q, args...)
		return err
	}
	l, err := lock.New(ctx, db, nil, lock.WithTTL(300*time.Millisecond), lock.WithOwner("leader"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())

	var mu sync.Mutex
	var tokens []int64
	var stops []error
	runs := make(chan struct{}, 4)
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- l.Lead(lctx, "leader/k", func(ctx context.Context, lease *lock.Lease) error {
			mu.Lock()
			tokens = append(tokens, lease.Token())
			mu.Unlock()
			runs <- struct{}{}
			<-ctx.Done()
			return context.Cause(ctx)
		}, lock.OnStoppedLeading(func(err error) {
			mu.Lock()
			stops = append(stops, err)
			mu.Unlock()
		}))
	}()
	select {
	case <-runs:
	case <-time.After(10 * time.Second):
		t.Fatal("never became leader")
	}
	deleteLeases(t, ctx, exec)
	select {
	case <-runs:
	case <-time.After(10 * time.Second):
		t.Fatal("did not lead again after the lease was lost")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Lead after cancel = %v, want context.Canceled", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(tokens) != 2 || tokens[1] <= tokens[0] {
		t.Errorf("tokens %v: want two leaderships, the second with a larger token", tokens)
	}
	if len(stops) != 2 || !errors.Is(stops[0], lock.ErrLeaseLost) || !errors.Is(stops[1], context.Canceled) {
		t.Errorf("OnStoppedLeading got %v: want ErrLeaseLost, then context.Canceled", stops)
	}
	// The Locker still works after the loss.
	if err := l.Do(ctx, "leader/other", lock.Exclusive, func(context.Context, *lock.Lease) error { return nil }); err != nil {
		t.Fatalf("Do after Lead: %v", err)
	}
}

// Within one process, fn calls of Lead on one key never overlap, even
// through two Lockers and even when a lost leader's fn is slow to return.
func TestLeadNeverOverlapsInProcess(t *testing.T) {
	db := setupSQLite(t)
	ctx := t.Context()
	exec := func(ctx context.Context, q string, args ...any) error {
		_, err := db.ExecContext(ctx, q, args...)
		return err
	}
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var running, maxRunning, started atomic.Int32
	var wg sync.WaitGroup
	for _, owner := range []string{"a", "b"} {
		l, err := lock.New(ctx, db, nil, lock.WithTTL(300*time.Millisecond), lock.WithOwner(owner), lock.WithMaxBackoff(10*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close(context.Background())
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = l.Lead(lctx, "leader/k", func(ctx context.Context, lease *lock.Lease) error {
				n := running.Add(1)
				defer running.Add(-1)
				for m := maxRunning.Load(); n > m && !maxRunning.CompareAndSwap(m, n); m = maxRunning.Load() {
				}
				started.Add(1)
				<-ctx.Done()
				time.Sleep(400 * time.Millisecond) // slow to stop: ignores its context a while
				return context.Cause(ctx)
			})
		}()
	}
	for i := 0; i < 3; i++ {
		want := int32(i + 1)
		if !waitFor(20*time.Second, func() bool { return started.Load() >= want }) {
			t.Fatalf("leadership %d never started", want)
		}
		deleteLeases(t, ctx, exec) // the leader loses; the other can take the key at once
	}
	cancel()
	wg.Wait()
	if m := maxRunning.Load(); m != 1 {
		t.Errorf("%d fn calls ran at once in one process, want 1", m)
	}
}

func TestLeadBadInput(t *testing.T) {
	db := setupSQLite(t)
	ctx := t.Context()
	l, err := lock.New(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	fn := func(context.Context, *lock.Lease) error { return nil }
	checkInputError(t, l.Lead(ctx, "k", nil), "lock", "function nil")
	checkInputError(t, l.Lead(ctx, "", fn), "lock", `key ""`)
	checkInputError(t, l.Lead(ctx, "k", fn, lock.ObserveInterval(0)), "lock", "observe interval 0s", "at least 10ms")
	checkInputError(t, l.Lead(ctx, "k", fn, lock.OnNewLeader(nil)), "lock", "OnNewLeader nil")
	checkInputError(t, l.Lead(ctx, "k", fn, lock.OnStartedLeading(nil)), "lock", "OnStartedLeading nil")
	checkInputError(t, l.Lead(ctx, "k", fn, lock.OnStoppedLeading(nil)), "lock", "OnStoppedLeading nil")
	checkInputError(t, l.Lead(ctx, "k", fn, nil), "lock", "lead option nil (option 1 of 1)")
	if err := l.Lead(ctx, "k", fn); err != nil {
		t.Fatalf("Lead after bad input: %v", err)
	}
}

func waitFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}
