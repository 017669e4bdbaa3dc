package lock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"time"
)

var errBadConn = driver.ErrBadConn

type leaseState int8

const (
	stateHeld      leaseState = iota
	stateLost                 // lost; context cancelled with a *LeaseLostError
	stateFinishing            // Do's function returned; later losses are ignored (SPEC H4)
	stateReleased             // released (or a release was attempted)
)

// Lease is one grant of a key. It renews itself in the background until
// Release or loss, TTL/3 after the last successful acquire or renew was
// sent, or up to TTL/12 earlier to share a batch with other leases (SPEC
// H2). Its methods are safe for concurrent use.
type Lease struct {
	l    *Locker
	key  string
	mode Mode
	id   string
	// activeID is this lease's claim in Locker.active (W4, W5).
	activeID string
	owner    string
	token    int64
	hold     holds // HoldAtLeast, HoldAtMost (SPEC H10)

	ctx    context.Context
	cancel context.CancelCauseFunc

	watchdog *time.Timer

	mu           sync.Mutex
	state        leaseState
	released     bool  // a release deleted the row or found it gone
	releaseErr   error // what Release returns again once released: nil, or ErrNotHeld when it found the row gone
	expiry       time.Time
	grantedAt    time.Time // database time of the grant
	lostAt       time.Time // local time the loss was detected
	lastSend     time.Time // local monotonic send time of the last successful acquire/renew
	trustedUntil time.Time
	orphaned     bool // Orphan was called: an ended window is reported as LossOrphaned

	// Owned by the Locker's renewer (under Locker.ren.mu).
	renewing  bool          // false once released, lost or orphaned
	inflight  chan struct{} // closed when the renewal statement now in flight returns
	nextAt    time.Time     // when the renewer next renews it
	retryWait time.Duration // backoff of the current run of failed renewals
	heapIndex int
}

func (l *Locker) newLease(key string, mode Mode, res acquireResult, send time.Time, activeID string, hold holds) *Lease {
	le := &Lease{
		l: l, key: key, mode: mode, id: res.lease.LeaseID, activeID: activeID, owner: res.lease.Owner, token: res.lease.Token, hold: hold,
		expiry: res.lease.Expiry, grantedAt: res.grantedAt, lastSend: send, trustedUntil: hold.clamp(send.Add(l.cfg.ttl - l.cfg.margin)),
	}
	le.ctx, le.cancel = context.WithCancelCause(context.WithValue(context.Background(), leaseKey{}, le))
	// checkWindow takes le.mu first, so it cannot see le.watchdog unset.
	le.mu.Lock()
	le.watchdog = time.AfterFunc(time.Until(le.trustedUntil), le.checkWindow)
	le.mu.Unlock()
	l.mu.Lock()
	l.leases[le] = struct{}{}
	if h := l.active[key]; h != nil {
		if _, ok := h.ids[activeID]; ok {
			h.ids[activeID] = le
		}
	}
	l.mu.Unlock()
	l.schedule(le, hold.nextRenewal(l.cfg.ttl, send))
	return le
}

type leaseKey struct{}

// LeaseFrom returns the lease whose context ctx is or descends from: the
// context Do and Lead hand their function, Lease.Context, or one derived
// from them. It lets code that only receives a context (a scheduler's job,
// a migration) fence its writes with the lease that guards it (SPEC F1).
// ok is false when ctx carries no lease.
func LeaseFrom(ctx context.Context) (lease *Lease, ok bool) {
	lease, ok = ctx.Value(leaseKey{}).(*Lease)
	return lease, ok
}

// Key returns the lease's key.
func (le *Lease) Key() string { return le.key }

// Mode returns Exclusive or Shared.
func (le *Lease) Mode() Mode { return le.mode }

// LeaseID returns the random, unique ID of this grant.
func (le *Lease) LeaseID() string { return le.id }

// Owner returns the owner label stored with the lease.
func (le *Lease) Owner() string { return le.owner }

// Token returns the fencing token: greater than every token granted before
// for this key, in either mode, and stable for the whole lease (SPEC S3).
func (le *Lease) Token() int64 { return le.token }

// Expiry returns the expiry the database reported at the last successful
// acquire or renew, in database time (SPEC S2). Compare it with database
// time, not the local clock; use Remaining for a local decision.
func (le *Lease) Expiry() time.Time {
	le.mu.Lock()
	defer le.mu.Unlock()
	return le.expiry
}

// GrantedAt returns the database time at which the lease was granted (its
// expiry at the grant minus the TTL; SPEC S2).
func (le *Lease) GrantedAt() time.Time { return le.grantedAt }

// Remaining returns how much longer the holder may trust the lease, by the
// local monotonic clock: send time of the last successful acquire or renew,
// plus the TTL, minus the safety margin, minus now (SPEC H1). It is 0 once
// the window has ended or the lease was lost or released.
func (le *Lease) Remaining() time.Duration {
	le.mu.Lock()
	defer le.mu.Unlock()
	if le.state == stateLost || le.state == stateReleased {
		return 0
	}
	return max(time.Until(le.trustedUntil), 0)
}

// Context returns a context that ends when the lease is lost (cause: a
// *LeaseLostError matching ErrLeaseLost; SPEC H3) or released (cause
// ErrReleased). Read the cause with context.Cause. It carries no values.
func (le *Lease) Context() context.Context { return le.ctx }

// Done is Context().Done().
func (le *Lease) Done() <-chan struct{} { return le.ctx.Done() }

// Err returns nil while the lease is held, else context.Cause(Context()):
// ErrReleased after Release, or a *LeaseLostError (matching ErrLeaseLost)
// once the lease is lost: gone from the database, or its trusted window
// (see Remaining: about TTL minus the safety margin after the last
// successful renewal was sent) ended without a renewal. A window that has
// passed is reported here even if the timer that ends it has not run yet
// (SPEC H1, H3).
func (le *Lease) Err() error {
	if le.ctx.Err() == nil {
		le.mu.Lock()
		ended := le.state == stateHeld && !time.Now().Before(le.trustedUntil)
		le.mu.Unlock()
		if !ended {
			return nil
		}
		le.checkWindow()
		if le.ctx.Err() == nil {
			return nil
		}
	}
	return context.Cause(le.ctx)
}

// lostTo reports whether the lease was lost for reason.
func (le *Lease) lostTo(reason LossReason) bool {
	var lost *LeaseLostError
	return errors.As(context.Cause(le.ctx), &lost) && lost.Reason == reason
}

func (le *Lease) lostErr(reason LossReason, err error) *LeaseLostError {
	return &LeaseLostError{Key: le.key, LeaseID: le.id, Token: le.token, Reason: reason, Err: err}
}

// lose marks the lease lost, once, unless it was already released or its
// function returned (SPEC H3, H4). The Locker forgets the key before
// anyone can learn of the loss (the lease's context, or lose's result to
// a second caller while the first is still at work here), so that an
// acquire made on learning it is not refused as reentrant (SPEC W4).
func (le *Lease) lose(reason LossReason, err error) error {
	le.mu.Lock()
	if st := le.state; st != stateHeld {
		le.mu.Unlock()
		if st == stateLost {
			le.l.forget(le.key, le.activeID) // the first caller may not have yet
			if c := context.Cause(le.ctx); c != nil {
				return c
			}
		}
		return le.lostErr(reason, err)
	}
	le.state = stateLost
	le.lostAt = time.Now()
	if (reason == LossWindowExhausted || reason == LossOrphaned || reason == LossMaxLife) && le.trustedUntil.Before(le.lostAt) {
		// The window ended at trustedUntil, whenever its end is noticed
		// (a late timer): a function that returned after that returned
		// without its lease (SPEC H4).
		le.lostAt = le.trustedUntil
	}
	le.mu.Unlock()
	le.l.forget(le.key, le.activeID)
	lost := le.lostErr(reason, err)
	le.cancel(lost)
	le.stopRenewal()
	le.watchdog.Stop()
	le.l.emit(Event{Kind: EventLeaseLost, Key: le.key, Mode: le.mode, LeaseID: le.id, Token: le.token, Reason: reason, Err: err})
	attrs := []any{"key", le.key, "lease_id", le.id, "token", le.token, "reason", string(reason)}
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	le.l.cfg.logger.Warn("sqlease: lease lost", attrs...)
	return lost
}

// checkWindow runs when the trusted window may have ended (SPEC H1, H2).
func (le *Lease) checkWindow() {
	le.mu.Lock()
	until, orphaned := le.trustedUntil, le.orphaned
	le.mu.Unlock()
	if d := time.Until(until); d > 0 {
		le.watchdog.Reset(d)
		return
	}
	switch {
	case le.hold.maxLife > 0 && !until.Before(le.hold.lifeEnd):
		le.lose(LossMaxLife, nil)
	case orphaned:
		le.lose(LossOrphaned, nil)
	default:
		le.lose(LossWindowExhausted, nil)
	}
}

func (le *Lease) stopRenewal() { le.l.unschedule(le) }

// stopRenewalWait stops renewing le and waits, until ctx ends, for a
// renewal of it already in flight to return (SPEC H8).
func (le *Lease) stopRenewalWait(ctx context.Context) {
	if ch := le.l.unschedule(le); ch != nil {
		select {
		case <-ch:
		case <-ctx.Done():
		}
	}
}

// finish is called when Do's function has returned (at returned; zero when
// it panicked): it reports a loss that happened before that, and makes later
// losses no-ops (SPEC H4).
func (le *Lease) finish(returned time.Time) error {
	le.mu.Lock()
	late := le.state == stateHeld && !returned.IsZero() && !returned.Before(le.trustedUntil)
	le.mu.Unlock()
	if late {
		// The window had ended when the function returned, although the
		// timer that ends it has not run yet (SPEC H1, H3).
		le.checkWindow()
	}
	le.mu.Lock()
	defer le.mu.Unlock()
	if le.state == stateLost {
		if !returned.IsZero() && le.lostAt.After(returned) {
			le.state = stateFinishing
			return nil
		}
		return context.Cause(le.ctx)
	}
	if le.state == stateHeld {
		le.state = stateFinishing
	}
	return nil
}

var errRenewNotFound = errors.New("lease not found")

// renewOnce sends one renewal and, on success, moves the trusted window.
func (le *Lease) renewOnce(ctx context.Context, db *sql.DB) error {
	l := le.l
	le.mu.Lock()
	until := le.trustedUntil
	le.mu.Unlock()
	timeout := l.cfg.renewTimeout
	if d := time.Until(until); d > 0 && d < timeout {
		timeout = d
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	leave, err := l.enter(rctx)
	if err != nil {
		return err
	}
	defer leave()
	send := time.Now()
	ttl, final := le.hold.renewTTL(l.cfg.ttl, send)
	if ttl <= 0 {
		return nil // at its end of life (SPEC H10): the watchdog ends it
	}
	var exp, now int64
	err = queryOne(rctx, l.st.replicated, db, l.st.renew.SQL, l.st.renew.Args(map[string]any{
		"lease_id": le.id, "token": le.token, "ttl_us": ttl.Microseconds(),
	}), &exp, &now)
	if errors.Is(err, sql.ErrNoRows) {
		return errRenewNotFound
	}
	if err != nil {
		return err
	}
	le.renewed(send, exp, final)
	return nil
}

// renewed records a successful renewal sent at send: it moves the trusted
// window (SPEC H1) and the database expiry. A final renewal (HoldAtMost,
// SPEC H10) took the row to the end of life: the window ends there, and no
// renewal follows.
func (le *Lease) renewed(send time.Time, expUS int64, final bool) {
	l := le.l
	le.mu.Lock()
	if le.state == stateHeld || le.state == stateFinishing {
		if send.After(le.lastSend) {
			le.lastSend = send
			le.trustedUntil = le.hold.clamp(send.Add(l.cfg.ttl - l.cfg.margin))
			if final {
				le.trustedUntil = le.hold.lifeEnd
			}
			le.expiry = time.UnixMicro(expUS)
		}
		if le.state == stateHeld {
			le.watchdog.Reset(time.Until(le.trustedUntil))
		}
	}
	le.mu.Unlock()
	l.emit(Event{Kind: EventRenewOK, Key: le.key, Mode: le.mode, LeaseID: le.id, Token: le.token, Latency: time.Since(send)})
}

// Renew extends the lease now, on ctx, outside the background schedule. It
// moves the trusted window on success (SPEC H1).
//
// Transient errors are retried for at most the renew timeout.
//
// Errors: a *LeaseLostError (ErrLeaseLost) when the database no longer has
// this exact lease, which also ends the lease (SPEC S4); ErrNotHeld after
// Release; the cause when already lost; otherwise the database's error,
// after which the lease stays held and background renewal goes on.
func (le *Lease) Renew(ctx context.Context) error {
	le.mu.Lock()
	st := le.state
	le.mu.Unlock()
	switch st {
	case stateLost:
		return context.Cause(le.ctx)
	case stateReleased:
		return fmt.Errorf("lock: renew %q token %d: %w", le.key, le.token, ErrNotHeld)
	}
	err := le.l.retryTransient(ctx, le.l.cfg.renewTimeout, func(ctx context.Context) error {
		return le.renewOnce(ctx, le.l.renewDB)
	})
	if errors.Is(err, errRenewNotFound) {
		return le.lose(LossNotOurs, nil)
	}
	if err != nil {
		return fmt.Errorf("lock: renew %q token %d: %w", le.key, le.token, err)
	}
	return nil
}

// Release ends the lease: it stops renewal (waiting for a renewal of it
// already in flight, so none reaches the database after Release returns)
// and deletes exactly this lease (lease ID and token; never a successor's,
// SPEC S4) on a context detached from ctx with its own deadline (the
// release timeout, default 5s), so it runs even when ctx is already
// cancelled (SPEC H5). Transient errors (dropped connection, serialization
// failure, busy) are retried with backoff until that deadline (SPEC H8).
//
// Whatever it returns, the Locker no longer counts the key as held: the
// key can be acquired again from this Locker at once (the database grants
// it when the row is gone or expired; SPEC H8). The lease's context ends
// with cause ErrReleased, unless it was lost before or the release found
// the lease gone (cause: a *LeaseLostError).
//
// It returns nil when it deleted the lease's row, also after a loss the
// Locker had already reported (its trusted window ended, yet the row was
// still there): nil does not mean the lease was held throughout; Err does
// tell. It returns an error matching ErrNotHeld when the database no longer
// had the lease (it had expired and was taken over or swept, or a renewal
// had found it gone); the lease is then lost too (Err, Context). Release is idempotent: once a release reached the
// database, every later call returns what that one returned (nil, or the
// ErrNotHeld error). A release that still fails at its deadline is logged
// at WARN and returned; the row then ends by expiry, and calling Release
// again retries.
//
// A dialect may commit the release without waiting for the disk (the
// PostgreSQL dialect does: synchronous_commit off for the release's own
// transaction). A crash or failover of the database right after it can
// then bring the row back: the lease ends by expiry, as after a failed
// release (SPEC H5), at most one TTL later, and is never granted to two
// holders, since grants commit durably.
//
// With HoldAtLeast, a release before grant + minimum (database time) sets
// the row's expiry to grant + minimum instead of deleting it (SPEC H10);
// the Lease counts as released all the same. A lease lost before its
// release keeps no hold, unless it was lost to its maximum life
// (HoldAtMost, LossMaxLife) with its row still live.
func (le *Lease) Release(ctx context.Context) error {
	return le.release(ctx, true)
}

// release is Release; keepHold false deletes the row even before the
// minimum hold (an acquire that returns ErrClosed: the caller never had
// the lease).
func (le *Lease) release(ctx context.Context, keepHold bool) error {
	le.mu.Lock()
	if le.released {
		err := le.releaseErr
		le.mu.Unlock()
		return err
	}
	wasLost := le.state == stateLost
	le.state = stateReleased
	le.mu.Unlock()
	le.watchdog.Stop()
	l := le.l
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.releaseTimeout)
	defer cancel()
	le.stopRenewalWait(rctx)
	// SPEC H8: the key is free for this Locker whatever happens below.
	l.forget(le.key, le.activeID)
	l.mu.Lock()
	delete(l.leases, le)
	l.mu.Unlock()
	start := time.Now()
	unsure := false // an earlier attempt may have deleted the row
	var n int64
	keep := keepHold && (!wasLost || le.lostTo(LossMaxLife)) && le.holdLeft(start) > 0
	deleted := !keep
	err := l.retryTransient(rctx, untilCtx, func(ctx context.Context) error {
		var err error
		if keep {
			n, deleted, err = le.keep(ctx)
		} else {
			n, err = l.releaseRows(ctx, le.id, le.token)
		}
		if err != nil && l.uncertain(err) {
			unsure = true
		}
		return err
	})
	if err != nil {
		if !wasLost {
			le.cancel(ErrReleased)
		}
		l.emit(Event{Kind: EventReleaseFailed, Key: le.key, Mode: le.mode, LeaseID: le.id, Token: le.token, Latency: time.Since(start), Err: err})
		l.cfg.logger.Warn("sqlease: release failed; the lease ends by expiry", "key", le.key, "lease_id", le.id, "token", le.token, "err", err)
		return fmt.Errorf("lock: release %q token %d: %w", le.key, le.token, err)
	}
	if n == 0 && !unsure {
		err := fmt.Errorf("lock: release %q token %d: the lease had already ended (expired and taken over, swept, or deleted by sqlease release): %w", le.key, le.token, ErrNotHeld)
		le.mu.Lock()
		le.released, le.releaseErr = true, err
		le.mu.Unlock()
		if !wasLost {
			le.cancel(le.lostErr(LossNotOurs, nil))
		}
		l.emit(Event{Kind: EventReleaseFailed, Key: le.key, Mode: le.mode, LeaseID: le.id, Token: le.token, Latency: time.Since(start), Err: err})
		return err
	}
	le.mu.Lock()
	le.released = true
	le.mu.Unlock()
	if !wasLost {
		le.cancel(ErrReleased)
	}
	if deleted {
		hubWake(l.channel, le.key, "")
	}
	l.emit(Event{Kind: EventReleaseOK, Key: le.key, Mode: le.mode, LeaseID: le.id, Token: le.token, Latency: time.Since(start)})
	return nil
}

// Orphan stops renewing the lease without releasing it: the lease ends by
// expiry in the database, and the handle reports it lost when its trusted
// window ends, with reason LossOrphaned. Use it to hand a key over to expiry when a release cannot be
// trusted to run, and in tests to simulate a crashed holder.
//
// Until that window ends the Locker still counts the key as held
// (ErrReentrant for a new acquire that conflicts with it, SPEC W4). Close
// does not release an orphaned lease.
func (le *Lease) Orphan() {
	le.mu.Lock()
	le.orphaned = true
	le.mu.Unlock()
	le.stopRenewal()
	le.l.mu.Lock()
	delete(le.l.leases, le)
	le.l.mu.Unlock()
}
