package k8slock

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/sqlease/sqlease/lock"
)

// Create acquires the name for this Lock: client-go calls it when Get
// found no live lease. The database grants the key only when no lease on
// it is live (an exclusive TryAcquire; SPEC S1, W3); the lease is then not
// renewed in the background but by each later Update (see the package
// documentation). Fields of ler other than HolderIdentity are not stored.
//
// Errors: a *ConflictError matching ErrConflict and apierrors.IsAlreadyExists
// when another lease on the name is live (it wraps the *lock.LockedError
// that names it) or this Lock already holds one; an *lock.InputError
// matching lock.ErrInvalidInput when ler.HolderIdentity is not this Lock's
// identity (SPEC I1); otherwise the database's error.
func (l *Lock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	if ler.HolderIdentity != l.identity {
		return l.badHolder("create", ler.HolderIdentity, "this Lock's identity")
	}
	l.op.Lock()
	defer l.op.Unlock()
	if le := l.held(); le != nil && le.Err() == nil {
		return &ConflictError{Op: "create", Name: l.name, Err: errAlreadyHeld}
	}
	return l.acquire(ctx, "create")
}

// Update is client-go's compare-and-swap of the record, decided by the
// database:
//
//   - ler.HolderIdentity is this Lock's identity: renew the lease this Lock
//     holds (lock.Lease.Renew: only that exact lease, SPEC S4), or, holding
//     none, acquire the name as Create does. A renewal that finds the lease
//     gone (expired, then taken over or swept) fails with a *ConflictError
//     wrapping the *lock.LeaseLostError; client-go then calls Get, and
//     Create or Update again.
//   - ler.HolderIdentity is empty (ReleaseOnCancel): release the lease this
//     Lock holds (lock.Lease.Release, on a context detached from ctx with
//     the Locker's release timeout; SPEC H5), so another candidate is
//     granted the name at once. It returns nil when this Lock holds no
//     lease or its lease had already ended.
//
// Errors: a *ConflictError matching ErrConflict and apierrors.IsConflict
// when another lease on the name is live or this Lock's lease was lost; an
// *lock.InputError matching lock.ErrInvalidInput when ler.HolderIdentity
// is another identity (SPEC I1); otherwise the database's error (a failed
// renewal leaves the lease held until its trusted window ends, SPEC H1,
// and client-go retries until its RenewDeadline).
func (l *Lock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	switch ler.HolderIdentity {
	case l.identity:
	case "":
		return l.release(ctx)
	default:
		return l.badHolder("update", ler.HolderIdentity, `this Lock's identity (acquire or renew) or "" (release)`)
	}
	l.op.Lock()
	defer l.op.Unlock()
	le := l.held()
	if le == nil {
		return l.acquire(ctx, "update")
	}
	err := le.Renew(ctx)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, lock.ErrLeaseLost), errors.Is(err, lock.ErrNotHeld):
		l.setHeld(nil)
		return &ConflictError{Op: "update", Name: l.name, Err: err}
	}
	return fmt.Errorf("k8slock: update %q: %w", l.name, err)
}

// acquire tries once to be granted the name; op names the caller.
func (l *Lock) acquire(ctx context.Context, op string) error {
	le, err := l.locker.TryAcquire(ctx, l.name, lock.Exclusive)
	switch {
	case errors.Is(err, lock.ErrLocked), errors.Is(err, lock.ErrReentrant):
		return &ConflictError{Op: op, Name: l.name, Err: err}
	case err != nil:
		return fmt.Errorf("k8slock: %s %q: %w", op, l.name, err)
	}
	// client-go renews through Update: a lease renewed in the background
	// would outlive a leader that stopped renewing.
	le.Orphan()
	l.setHeld(le)
	l.see(le.LeaseID(), le.GrantedAt())
	return nil
}

// release releases the lease this Lock holds, if any.
func (l *Lock) release(ctx context.Context) error {
	l.op.Lock()
	defer l.op.Unlock()
	le := l.held()
	if le == nil {
		return nil
	}
	l.setHeld(nil)
	err := le.Release(ctx)
	if err != nil && !errors.Is(err, lock.ErrNotHeld) {
		return fmt.Errorf("k8slock: release %q: %w", l.name, err)
	}
	return nil
}

func (l *Lock) badHolder(op, holder, allowed string) error {
	return inputErr(op+" holder identity", strconv.Quote(holder), allowed+" "+strconv.Quote(l.identity))
}
