package k8slock

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/sqlease/sqlease/lock"
)

// observed is what this Lock knows of the leases it has seen lead.
type observed struct {
	leaseID     string    // the last live lease seen ("" before the first)
	acquired    time.Time // its grant time, as well as this Lock knows it
	transitions int       // changes of the live lease seen after the first
}

// rawRecord is the raw record Get returns, which client-go compares byte
// for byte to tell whether the leader renewed. It names the lease and its
// expiry to the microsecond, so every renewal changes it, although the
// record's times, like every metav1.Time, marshal to whole seconds.
type rawRecord struct {
	Record       resourcelock.LeaderElectionRecord `json:"record"`
	LeaseID      string                            `json:"leaseID"`
	Token        int64                             `json:"token"`
	ExpiryMicros int64                             `json:"expiryMicros"`
}

// Get returns the record of the live exclusive lease on the name and its
// raw form, read from the database (lock.Locker.Holders, live in database
// time; SPEC S2). The record is derived from the lease, because sqlease
// stores leases, not records (fields client-go passes to Create and Update
// other than HolderIdentity are not stored):
//
//   - HolderIdentity: the lease's owner, which is its Lock's identity (New).
//   - LeaseDurationSeconds: the Locker's TTL, rounded up to whole seconds.
//   - RenewTime: the lease's expiry minus the TTL, the database time of
//     its grant or last renewal when every candidate's Locker has the same
//     TTL. It changes on every renewal, and so does the raw record, which
//     also carries the lease ID, fencing token and expiry in microseconds.
//   - AcquireTime: for a lease this Lock was granted, its grant time in
//     database time (lock.Lease.GrantedAt); for another's, RenewTime when
//     this Lock first saw it, which is its grant time if seen before its
//     first renewal and later otherwise.
//   - LeaderTransitions: how many times this Lock has seen the live lease
//     change (to another lease of any identity) since its first Get; a
//     count local to this Lock, not shared between candidates.
//
// Errors: apierrors.NewNotFound(Resource, name) (apierrors.IsNotFound)
// when no exclusive lease on the name is live: none was ever granted, or
// the last expired or was released; the database's error otherwise. Keys
// that start with the name are read too, then skipped.
func (l *Lock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	l.op.Lock()
	defer l.op.Unlock()
	h, ok, err := l.live(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("k8slock: get %q: %w", l.name, err)
	}
	if le := l.held(); le != nil && (!ok || h.LeaseID != le.LeaseID()) {
		l.dropLost(ctx, le)
	}
	if !ok {
		return nil, nil, apierrors.NewNotFound(Resource, l.name)
	}
	rec := l.record(h)
	raw, err := json.Marshal(rawRecord{Record: rec, LeaseID: h.LeaseID, Token: h.Token, ExpiryMicros: h.Expiry.UnixMicro()})
	if err != nil {
		return nil, nil, fmt.Errorf("k8slock: get %q: %w", l.name, err)
	}
	return &rec, raw, nil
}

// live returns the live exclusive lease on the name, if any.
func (l *Lock) live(ctx context.Context) (lock.Holder, bool, error) {
	hs, now, err := l.locker.Holders(ctx, l.name)
	if err != nil {
		return lock.Holder{}, false, err
	}
	for _, h := range hs {
		if h.Key == l.name && h.Mode == lock.Exclusive && h.Expiry.After(now) {
			return h, true, nil
		}
	}
	return lock.Holder{}, false, nil
}

// see records that the lease leaseID leads, granted at acquired (or
// later, when this Lock cannot know better), and returns what this Lock
// knows of it.
func (l *Lock) see(leaseID string, acquired time.Time) observed {
	l.mu.Lock()
	defer l.mu.Unlock()
	if leaseID != l.seen.leaseID {
		if l.seen.leaseID != "" {
			l.seen.transitions++
		}
		l.seen.leaseID, l.seen.acquired = leaseID, acquired
	}
	return l.seen
}

// record describes the live lease h (see Get).
func (l *Lock) record(h lock.Holder) resourcelock.LeaderElectionRecord {
	ttl := l.ttl()
	renewed := h.Expiry.Add(-ttl)
	acquired := renewed
	if le := l.held(); le != nil && le.LeaseID() == h.LeaseID {
		acquired = le.GrantedAt()
	}
	seen := l.see(h.LeaseID, acquired)
	return resourcelock.LeaderElectionRecord{
		HolderIdentity:       h.Owner,
		LeaseDurationSeconds: int((ttl + time.Second - 1) / time.Second),
		AcquireTime:          metav1.NewTime(seen.acquired),
		RenewTime:            metav1.NewTime(renewed),
		LeaderTransitions:    seen.transitions,
	}
}
