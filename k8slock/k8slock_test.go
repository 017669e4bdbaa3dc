package k8slock_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/sqlease/sqlease/k8slock"
	"github.com/sqlease/sqlease/lock"
)

// TestNewRejectsBadInput: bad input gets an error that names the value and
// what is allowed, matching lock.ErrInvalidInput (SPEC I1).
func TestNewRejectsBadInput(t *testing.T) {
	t.Parallel()
	b := sqliteBackend(t)
	db := b.openT(t, true)
	l, err := b.locker(t.Context(), db, "a", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	for _, c := range []struct {
		name, lockName, identity string
		locker                   *lock.Locker
		want                     string
	}{
		{"nil locker", "x", "a", nil, "invalid locker nil"},
		{"empty name", "", "a", l, `invalid name ""`},
		{"NUL in name", "x\x00y", "a", l, "contains NUL"},
		{"empty identity", "x", "", l, `invalid identity ""`},
		{"identity is not the owner", "x", "b", l, `lock.WithOwner("b")`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := k8slock.New(c.locker, c.lockName, c.identity)
			if !errors.Is(err, lock.ErrInvalidInput) || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "k8slock: ") {
				t.Fatalf("New: got %v, want an error matching lock.ErrInvalidInput containing %q", err, c.want)
			}
		})
	}
}

// rec is the record client-go passes to Create and Update for identity.
func rec(identity string) resourcelock.LeaderElectionRecord {
	return resourcelock.LeaderElectionRecord{HolderIdentity: identity, LeaseDurationSeconds: 1}
}

// mustGet returns the record Get reads, failing t on an error.
func mustGet(t *testing.T, l *k8slock.Lock) (*resourcelock.LeaderElectionRecord, []byte) {
	t.Helper()
	r, raw, err := l.Get(t.Context())
	if err != nil {
		t.Fatalf("%s: Get: %v", l.Identity(), err)
	}
	return r, raw
}

// wantNotFound fails t unless Get reports no live lease.
func wantNotFound(t *testing.T, l *k8slock.Lock) {
	t.Helper()
	if r, _, err := l.Get(t.Context()); !apierrors.IsNotFound(err) {
		t.Fatalf("%s: Get: got %+v, %v; want apierrors.IsNotFound", l.Identity(), r, err)
	}
}

// TestCompareAndSwap: Create and Update acquire, renew and release a lease,
// and are refused while another identity's lease is live; Get reads the
// live lease (SPEC S1, S4).
func TestCompareAndSwap(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		ctx := t.Context()
		db := b.openT(t, true)
		const ttl = time.Second
		a := b.newLock(t, db, "ctrl/leader", "a", ttl)
		bl := b.newLock(t, db, "ctrl/leader", "b", ttl)

		wantNotFound(t, a)
		if err := a.Create(ctx, rec("a")); err != nil {
			t.Fatalf("a: Create: %v", err)
		}
		leaseA, ok := a.Lease()
		if !ok || leaseA.Key() != "ctrl/leader" || leaseA.Owner() != "a" {
			t.Fatalf("a: Lease after Create: %v %v", leaseA, ok)
		}
		r1, raw1 := mustGet(t, bl)
		if r1.HolderIdentity != "a" || r1.LeaseDurationSeconds != 1 || r1.LeaderTransitions != 0 || r1.RenewTime.IsZero() || r1.AcquireTime.After(r1.RenewTime.Time) {
			t.Fatalf("b: Get: %+v, want holder a, 1s, no transitions, acquired no later than renewed", r1)
		}

		// Another identity is refused while a's lease is live.
		err := bl.Create(ctx, rec("b"))
		if !apierrors.IsAlreadyExists(err) || !errors.Is(err, k8slock.ErrConflict) || !errors.Is(err, lock.ErrLocked) {
			t.Fatalf("b: Create while a leads: %v, want AlreadyExists matching ErrConflict and lock.ErrLocked", err)
		}
		err = bl.Update(ctx, rec("b"))
		if !apierrors.IsConflict(err) || !errors.Is(err, lock.ErrLocked) {
			t.Fatalf("b: Update while a leads: %v, want Conflict matching lock.ErrLocked", err)
		}
		if err := a.Create(ctx, rec("a")); !apierrors.IsAlreadyExists(err) {
			t.Fatalf("a: Create while a holds: %v, want AlreadyExists", err)
		}

		// a renews: the raw record changes, the holder does not.
		time.Sleep(20 * time.Millisecond)
		if err := a.Update(ctx, rec("a")); err != nil {
			t.Fatalf("a: Update (renew): %v", err)
		}
		r2, raw2 := mustGet(t, bl)
		if bytes.Equal(raw1, raw2) || r2.HolderIdentity != "a" || r2.LeaderTransitions != 0 || r2.RenewTime.Before(&r1.RenewTime) {
			t.Fatalf("b: Get after renewal: %+v (raw changed: %v), want holder a and a new raw record", r2, !bytes.Equal(raw1, raw2))
		}
		if _, raw3 := mustGet(t, bl); !bytes.Equal(raw2, raw3) {
			t.Fatalf("b: raw record changed without a renewal:\n%s\n%s", raw2, raw3)
		}
		if l2, ok := a.Lease(); !ok || l2.Token() != leaseA.Token() {
			t.Fatalf("a: renewal changed the lease: %v %v", l2, ok)
		}

		// a releases (ReleaseOnCancel); b acquires at once.
		if err := a.Update(ctx, resourcelock.LeaderElectionRecord{LeaseDurationSeconds: 1}); err != nil {
			t.Fatalf("a: Update (release): %v", err)
		}
		if _, ok := a.Lease(); ok {
			t.Fatal("a: Lease still held after release")
		}
		if err := a.Update(ctx, resourcelock.LeaderElectionRecord{}); err != nil {
			t.Fatalf("a: second release: %v, want nil", err)
		}
		wantNotFound(t, bl)
		if err := bl.Update(ctx, rec("b")); err != nil {
			t.Fatalf("b: Update after a released: %v", err)
		}
		leaseB, _ := bl.Lease()
		if leaseB == nil || leaseB.Token() <= leaseA.Token() {
			t.Fatalf("b: lease %v, want a token greater than a's %d (SPEC S3)", leaseB, leaseA.Token())
		}
		r4, _ := mustGet(t, a)
		if r4.HolderIdentity != "b" || r4.LeaderTransitions != 1 {
			t.Fatalf("a: Get: %+v, want holder b after one transition", r4)
		}
		if err := a.Update(ctx, rec("a")); !apierrors.IsConflict(err) {
			t.Fatalf("a: Update while b leads: %v, want Conflict", err)
		}

		// b stops renewing: its lease ends by expiry, not renewed in the
		// background, and a takes over; b's next renewal is a conflict.
		deadline := time.Now().Add(ttl + 2*time.Second)
		for {
			_, _, err := a.Get(ctx)
			if apierrors.IsNotFound(err) {
				break
			}
			if err != nil || time.Now().After(deadline) {
				t.Fatalf("a: Get: %v; b's lease still live %s after its last renewal", err, ttl+2*time.Second)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err := a.Create(ctx, rec("a")); err != nil {
			t.Fatalf("a: Create after b's lease expired: %v", err)
		}
		err = bl.Update(ctx, rec("b"))
		if !apierrors.IsConflict(err) || !errors.Is(err, k8slock.ErrConflict) || !errors.Is(err, lock.ErrLeaseLost) {
			t.Fatalf("b: Update after its lease expired: %v, want Conflict matching lock.ErrLeaseLost", err)
		}
		if _, ok := bl.Lease(); ok {
			t.Fatal("b: Lease still held after a conflict")
		}
		if r, _ := mustGet(t, bl); r.HolderIdentity != "a" {
			t.Fatalf("b: Get: %+v, want holder a", r)
		}

		// Only this Lock's identity or "" may be written.
		if err := a.Update(ctx, rec("c")); !errors.Is(err, lock.ErrInvalidInput) {
			t.Fatalf("a: Update with holder c: %v, want lock.ErrInvalidInput", err)
		}
		if err := a.Create(ctx, rec("")); !errors.Is(err, lock.ErrInvalidInput) {
			t.Fatalf("a: Create with no holder: %v, want lock.ErrInvalidInput", err)
		}
		if err := a.Update(ctx, resourcelock.LeaderElectionRecord{}); err != nil {
			t.Fatalf("a: release: %v", err)
		}
		wantNotFound(t, bl)
	})
}
