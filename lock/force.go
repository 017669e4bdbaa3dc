package lock

// Ending another process's lease: ForceRelease, the operator's tool behind
// `sqlease release` (SPEC H3, F2, S3).

import (
	"context"
	"errors"
	"fmt"
)

// ForceRelease deletes every lease on exactly key, exclusive and shared,
// live or expired and not yet swept, whichever process holds it, and
// returns the leases it removed (none, with a nil error, when nothing held
// the key). It is for operators: a holder that is stuck, or a process known
// dead whose lease should not wait for its expiry.
//
// It reads the key's holders (as Holders does) and runs the dialect's
// Release statement for each lease ID and token it found, so waiters are
// woken as by an ordinary release. A lease granted after that read is
// kept. Pending-writer markers and FIFO tickets on key are left alone:
// their waiters keep their places, and the first of them is granted next
// (SPEC W1, W6).
//
// The holder is not told at once. Its Locker learns of the deletion at its
// next renewal, within about TTL/3: the lease is then lost with a
// *LeaseLostError of reason LossNotOurs, and the holder's context ends
// with cause ErrLeaseLost (SPEC H3). Until then its function runs on, but a
// fenced transaction (Lease.RunInTx, Lease.Fence) it begins after the
// deletion commits nothing: the fence finds no row (SPEC F2). A fenced
// transaction already past its fence commits first: the deletion waits for
// it, as a takeover does (SPEC F1). The next grant on key has a greater
// token than every removed lease (SPEC S3; tokens follow the database
// clock, S7), so storage that refuses older tokens refuses the old holder
// too. What the holder does outside the database, unfenced, nothing
// stops: force a release only when the holder is gone or hung, or its
// writes are fenced. When this Locker itself holds a removed lease, that
// lease is marked lost at once, with the same reason.
//
// Transient errors are retried for at most the statement timeout per
// lease (SPEC S6). Errors: an *InputError matching ErrInvalidInput for a
// key CheckKey rejects (SPEC I1); errors.ErrUnsupported when the dialect
// has no Holders statement; otherwise the database's error, returned with
// the leases removed before it.
func (l *Locker) ForceRelease(ctx context.Context, key string) ([]Holder, error) {
	if err := CheckKey(key); err != nil {
		return nil, err
	}
	if !l.st.holders.ok {
		return nil, fmt.Errorf("lock: force release %q: dialect %q: %w", key, l.d.Name(), errors.ErrUnsupported)
	}
	hs, _, err := l.Holders(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("lock: force release %q: %w", key, err)
	}
	var removed []Holder
	for _, h := range hs {
		if h.Key != key || (h.Mode != Exclusive && h.Mode != Shared) {
			continue
		}
		gone, err := l.forceReleaseOne(ctx, h)
		if err != nil {
			l.afterForceRelease(key, removed)
			return removed, fmt.Errorf("lock: force release %q: lease %s token %d: %w", key, h.LeaseID, h.Token, err)
		}
		if gone {
			removed = append(removed, h)
		}
	}
	l.afterForceRelease(key, removed)
	return removed, nil
}

// forceReleaseOne deletes the lease of h by its lease ID and token and
// reports whether it is gone by this call: deleted, or possibly deleted by
// an attempt whose reply was lost before a retry found no row.
func (l *Locker) forceReleaseOne(ctx context.Context, h Holder) (bool, error) {
	unsure := false
	var n int64
	err := l.retryTransient(ctx, l.cfg.stmtTimeout, func(ctx context.Context) error {
		var err error
		n, err = l.releaseRows(ctx, h.LeaseID, h.Token)
		if err != nil && l.uncertain(err) {
			unsure = true
		}
		return err
	})
	return n > 0 || (err == nil && unsure), err
}

// afterForceRelease wakes this process's waiters of key and marks lost the
// leases of this Locker among removed.
func (l *Locker) afterForceRelease(key string, removed []Holder) {
	if len(removed) == 0 {
		return
	}
	hubWake(l.channel, key, "")
	ids := make(map[string]int64, len(removed))
	for _, h := range removed {
		ids[h.LeaseID] = h.Token
	}
	var mine []*Lease
	l.mu.Lock()
	for le := range l.leases {
		if tok, ok := ids[le.id]; ok && tok == le.token {
			mine = append(mine, le)
		}
	}
	l.mu.Unlock()
	for _, le := range mine {
		le.lose(LossNotOurs, nil)
	}
}
