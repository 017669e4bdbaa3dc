package lock

import (
	"context"
	"database/sql"
	"errors"
	"testing"
)

// TestFenceAfterReleaseIsNotHeld: a fenced transaction on a lease the
// caller released is a programming error, not a loss: it matches
// ErrNotHeld and ErrReleased, never ErrLeaseLost, so a caller's "lease
// lost, will retry" branch does not take it (SPEC F1, H3).
func TestFenceAfterReleaseIsNotHeld(t *testing.T) {
	ctx := t.Context()
	l, db := sqliteLocker(t)
	le, err := l.TryAcquire(ctx, "released/k", Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Release(ctx); err != nil {
		t.Fatal(err)
	}
	ran := false
	err = le.RunInTx(ctx, db, nil, func(context.Context, *sql.Tx) error { ran = true; return nil })
	if !errors.Is(err, ErrNotHeld) || !errors.Is(err, ErrReleased) || errors.Is(err, ErrLeaseLost) || ran {
		t.Errorf("RunInTx after Release: %v (fn ran: %v), want ErrNotHeld and ErrReleased, not ErrLeaseLost, and fn not run", err, ran)
	}
}

// TestReleaseAfterLossRepeats: Release is idempotent (SPEC H5): after a
// release found the lease gone (ErrNotHeld), a second Release says so
// again instead of nil; after one that deleted the row, nil again.
func TestReleaseAfterLossRepeats(t *testing.T) {
	ctx := t.Context()
	l, db := sqliteLocker(t)
	le, err := l.TryAcquire(ctx, "released/lost", Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	loseLease(t, db, le)
	for i := range 2 {
		if err := le.Release(ctx); !errors.Is(err, ErrNotHeld) {
			t.Errorf("release %d after a loss: %v, want ErrNotHeld", i+1, err)
		}
	}
	kept, err := l.TryAcquire(ctx, "released/kept", Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := kept.Release(ctx); err != nil {
			t.Errorf("release %d of a held lease: %v, want nil", i+1, err)
		}
	}
}
