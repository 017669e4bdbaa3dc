// Package k8slock backs client-go's leader election
// (k8s.io/client-go/tools/leaderelection) with a sqlease lease instead of a
// Kubernetes Lease object: *Lock implements resourcelock.Interface, so
// leaderelection.RunOrDie, and controller-runtime's
// manager.Options.LeaderElectionResourceLockInterface (which takes a
// resourcelock.Interface), elect a leader over the SQL database an
// application already has, with no Kubernetes API server.
//
//	locker, err := lock.New(ctx, db, sqlitedialect.New(), lock.WithTTL(15*time.Second), lock.WithOwner(id))
//	rl, err := k8slock.New(locker, "my-controller", id)
//	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
//		Lock: rl, LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
//		Callbacks: leaderelection.LeaderCallbacks{OnStartedLeading: run, OnStoppedLeading: stop},
//	})
//
// # The database decides
//
// client-go keeps a record (holder, lease duration, renew time) and decides
// from its own clock when a record it has watched stop changing has
// expired; the API server only makes each write a compare-and-swap. Here
// the sqlease lease is the truth and the database's clock decides (SPEC S1,
// S2): the key of the lease is the lock's name, and
//
//   - Create or Update with this Lock's identity acquires the key (an
//     exclusive TryAcquire) or, while this Lock holds it, renews its lease.
//     Either fails with a *ConflictError (apierrors.IsConflict, or
//     IsAlreadyExists for Create) while another identity's lease is live,
//     however long ago client-go saw the record change.
//   - Update with an empty HolderIdentity (client-go's ReleaseOnCancel)
//     releases the lease.
//   - Get reads the live lease of the key and describes it as a record; it
//     returns apierrors.NewNotFound when no lease is live, and client-go
//     then calls Create at once, so a crashed leader is replaced within one
//     TTL of its last renewal plus one retry of the follower (RetryPeriod,
//     jittered by client-go up to 2.2 × RetryPeriod).
//
// client-go drives the renewals: the lease is not renewed in the
// background (it is orphaned, lock.Lease.Orphan, as soon as it is
// granted), so it ends by expiry one TTL after the last Update, exactly
// when a Kubernetes Lease that its leader stopped renewing would be taken
// over, including after RunOrDie returned without ReleaseOnCancel or after
// the Locker was closed.
//
// # Durations
//
// Build the Locker with lock.WithTTL equal to client-go's LeaseDuration,
// the same on every candidate, and keep LeaseDuration > RenewDeadline +
// RetryPeriod: a leader that cannot renew stops leading (its
// OnStartedLeading context ends) at most RetryPeriod + RenewDeadline after
// its last successful renewal, before its lease expires in the database
// and another candidate can be granted it. Neither client-go nor a lease makes
// that a guarantee across a paused process: guard writes with the lease's
// fencing token (Lock.Lease; SPEC F1, F2).
//
// "SPEC S1" and the like cite the numbered rules of docs/contract.md in the
// sqlease repository.
package k8slock

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/sqlease/sqlease/lock"
)

var _ resourcelock.Interface = (*Lock)(nil)

// Resource is the group and resource that the Kubernetes-style errors of
// this package name (apierrors.NewNotFound, NewConflict,
// NewAlreadyExists): "leases.sqlease".
var Resource = schema.GroupResource{Group: "sqlease", Resource: "leases"}

// Lock is a client-go resourcelock.Interface whose record is a sqlease
// exclusive lease on one key. Build it with New; its methods are safe for
// concurrent use, and client-go's LeaderElector calls them from one
// goroutine. Use one Lock per name and identity in a process: a second Lock
// of the same name on the same Locker is refused the key (lock.ErrReentrant,
// SPEC W4) and only ever follows.
type Lock struct {
	locker   *lock.Locker
	name     string
	identity string

	op sync.Mutex // serializes Get, Create and Update

	mu    sync.Mutex
	lease *lock.Lease // the lease this Lock holds, nil when none
	seen  observed    // the last live lease Get saw
}

// New returns a Lock electing on key name through locker, as identity.
//
// identity must be locker.Owner(): the owner label stored with the lease
// is what every candidate's Get reports as HolderIdentity, so build the
// Locker with lock.WithOwner(identity) (the default owner, "host:pid", is a
// valid identity too: pass locker.Owner()). name is the lease's key and
// must satisfy lock.CheckKey.
//
// Errors: an *lock.InputError matching lock.ErrInvalidInput (SPEC I1) for
// a nil locker, a bad name, an empty identity or one that differs from
// locker.Owner(); it names the bad value and what is allowed.
func New(locker *lock.Locker, name, identity string) (*Lock, error) {
	if locker == nil {
		return nil, inputErr("locker", "nil", "a *lock.Locker built with lock.WithOwner(identity)")
	}
	if err := lock.CheckKey(name); err != nil {
		return nil, relabel(err, "name")
	}
	if identity == "" {
		return nil, inputErr("identity", `""`, "a non-empty identity, the Locker's owner (lock.WithOwner)")
	}
	if identity != locker.Owner() {
		return nil, inputErr("identity", strconv.Quote(identity),
			fmt.Sprintf("the Locker's owner %q, which every candidate reads as the holder's identity: build the Locker with lock.WithOwner(%q), or pass locker.Owner()", locker.Owner(), identity))
	}
	return &Lock{locker: locker, name: name, identity: identity}, nil
}

// Identity returns the identity given to New (the Locker's owner).
func (l *Lock) Identity() string { return l.identity }

// Describe returns `sqlease/<dialect> "<name>"`, for client-go's logs.
func (l *Lock) Describe() string {
	return fmt.Sprintf("sqlease/%s %q", l.locker.Dialect().Name(), l.name)
}

// RecordEvent does nothing: client-go calls it with "became leader" and
// "stopped leading", which a Kubernetes lock records as Events. Observe the
// lease itself instead with lock.WithObserver (grants, renewals, losses).
func (l *Lock) RecordEvent(string) {}

// Lease returns the lease this Lock holds while it leads, for fenced writes
// (Lease.RunInTx, Lease.Token, Lease.Context, which lock.LeaseFrom reads;
// SPEC F1, F2), and false when it holds none or the one it held is lost.
//
// Leadership may go on under a new lease: when the lease of a leader that
// could not renew in time expired and nobody else took the key, its renewal
// fails, client-go's next Get finds no live lease, and its Create acquires
// the key again, with a new, greater token (SPEC S3), within the
// RenewDeadline, so client-go does not stop leading. Call Lease for each fenced write rather
// than keeping the first one: a write fenced with the old lease fails with
// lock.ErrLeaseLost and commits nothing.
func (l *Lock) Lease() (*lock.Lease, bool) {
	l.mu.Lock()
	le := l.lease
	l.mu.Unlock()
	if le == nil || le.Err() != nil {
		return nil, false
	}
	return le, true
}

// held returns the lease this Lock holds, or nil.
func (l *Lock) held() *lock.Lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lease
}

// setHeld records the lease this Lock holds (nil: none).
func (l *Lock) setHeld(le *lock.Lease) {
	l.mu.Lock()
	l.lease = le
	l.mu.Unlock()
}

// ttl is the lease TTL of the Locker.
func (l *Lock) ttl() time.Duration { return l.locker.TTL() }

// dropLost forgets a lease that this Lock held and that the database no
// longer has (Get found no live lease of ours): a lease not yet lost by
// its own account is released, which is quick when its row is gone, so
// the Locker no longer counts the key as held (SPEC H8) and a new acquire
// is not refused as reentrant.
func (l *Lock) dropLost(ctx context.Context, le *lock.Lease) {
	if le.Err() == nil {
		_ = le.Release(ctx)
	}
	l.setHeld(nil)
}

func inputErr(field, value, allowed string) error {
	return &lock.InputError{Pkg: "k8slock", Field: field, Value: value, Allowed: allowed}
}

// relabel reports a lock input error as this package's, about field.
func relabel(err error, field string) error {
	if ie, ok := err.(*lock.InputError); ok {
		c := *ie
		c.Pkg, c.Field = "k8slock", field
		return &c
	}
	return err
}
