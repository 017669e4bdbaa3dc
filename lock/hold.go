package lock

// Hold at least, hold at most (SPEC H10): a minimum hold kept after an
// early release by renewing the row to grant + minimum instead of deleting
// it, and a maximum life that caps renewals and ends the lease as lost.
// Both reuse the dialect's Renew and Release statements: a dialect needs no
// SQL of its own for them.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// MaxHold is the longest HoldAtLeast or HoldAtMost accepted.
const MaxHold = 24 * time.Hour

// holdSlack is how far past grant + minimum a held row may expire before
// the hold corrects its expiry with a second statement.
const holdSlack = 50 * time.Millisecond

// HoldAtLeast keeps the key taken until at least d after the grant, in
// database time, even when the lease is released earlier (SPEC H10): the
// release (Release, Do's function returning, Close) then leaves the
// lease's row in place with its expiry set to grant + d, instead of
// deleting it. Other acquirers see the key held until then and take it
// over when it expires, with a greater token. The Lease counts as released
// at once for this Locker (ErrReleased; renewals stop; the same Locker may
// acquire the key again and waits like anyone else; Lease.Expiry reports
// the held row's expiry). A release at or after grant + d deletes the row
// as usual.
//
// It is ShedLock's lockAtLeastFor: replicas of a scheduled job whose ticks
// differ by less than d run the job once per tick.
//
// The hold is kept by the holder's release: a holder that crashes (or a
// release that fails) leaves the row to expire at its last expiry, one TTL
// after its last renewal, which may be before grant + d. A lease lost
// before its release keeps no hold, unless it was lost to its maximum life
// (HoldAtMost close to d) with its row still live. The hold costs one
// Renew statement at release instead of a Release (two when the database
// clock disagrees with the local one by more than 50 ms).
//
// d is in (0, MaxHold]; exclusive leases only. Otherwise the acquire fails
// with an *InputError matching ErrInvalidInput (SPEC I1). With Lead, pass
// it through LeadAcquireOptions.
func HoldAtLeast(d time.Duration) AcquireOption {
	return func(c *acquireConfig) { c.minHold, c.minHoldSet = d, true }
}

// HoldAtMost gives the lease a maximum life of d after the grant, in
// database time (SPEC H10). The lease is lost before grant + d: its
// context (and Do's or Lead's function context) ends with a
// *LeaseLostError matching ErrLeaseLost, reason LossMaxLife (SPEC H3), up
// to the safety margin (scaled by min(d, TTL)/TTL) early, and always
// before its row expires. Renewals stop extending the row by the TTL once
// less than a TTL of life is left: the last one sets its expiry to grant +
// d (plus that renewal's latency), so another acquirer takes the key over
// right after; a Do whose function returns on the lost context deletes
// the row at once.
//
// It is ShedLock's lockAtMostFor: a job that hangs does not keep the key
// forever. It also ends leases of any length on a schedule (with Lead, a
// leader steps down at most every d and campaigns again; pass it through
// LeadAcquireOptions).
//
// A holder that crashes frees the key when its row expires: one TTL after
// its last renewal, which is at most about grant + d once the last renewal
// ran (with d shorter than the TTL that renewal runs halfway to d; a crash
// before it leaves the grant's expiry, grant + TTL).
//
// d is in (0, MaxHold] and at least HoldAtLeast when both are given;
// exclusive leases only. Otherwise the acquire fails with an *InputError
// matching ErrInvalidInput (SPEC I1).
func HoldAtMost(d time.Duration) AcquireOption {
	return func(c *acquireConfig) { c.maxLife, c.maxLifeSet = d, true }
}

// checkHold returns the error of hold options that cannot apply (SPEC I1).
func checkHold(mode Mode, ac acquireConfig) error {
	if !ac.minHoldSet && !ac.maxLifeSet {
		return nil
	}
	if ac.minHoldSet && (ac.minHold <= 0 || ac.minHold > MaxHold) {
		return inputErr("HoldAtLeast", ac.minHold.String(), fmt.Sprintf("a positive duration up to %s", MaxHold))
	}
	if ac.maxLifeSet && (ac.maxLife <= 0 || ac.maxLife > MaxHold) {
		return inputErr("HoldAtMost", ac.maxLife.String(), fmt.Sprintf("a positive duration up to %s", MaxHold))
	}
	if ac.minHoldSet && ac.maxLifeSet && ac.maxLife < ac.minHold {
		return inputErr("HoldAtMost", ac.maxLife.String(), fmt.Sprintf("at least HoldAtLeast (%s)", ac.minHold))
	}
	if mode != Exclusive {
		opt := "HoldAtLeast"
		if !ac.minHoldSet {
			opt = "HoldAtMost"
		}
		return inputErr(opt+" with mode", mode.String(), "lock.Exclusive only: a hold keeps the key from every other holder, which a shared lease cannot")
	}
	return nil
}

// holds is what an exclusive lease keeps for SPEC H10; zero without
// HoldAtLeast and HoldAtMost.
type holds struct {
	minHold time.Duration // HoldAtLeast; 0: none
	maxLife time.Duration // HoldAtMost; 0: none
	// granted is the local time the grant's reply had arrived: the grant
	// took place in the database before it, so elapsed time measured from
	// it is never more than the database's.
	granted time.Time
	// lifeEnd is the local time the lease is lost at (HoldAtMost): the
	// grant's send time (the grant took place after it) plus maxLife minus
	// the safety margin scaled to min(maxLife, TTL)/TTL; zero without
	// HoldAtMost.
	lifeEnd time.Time
}

// newHolds returns the holds of a lease whose granting attempt was sent
// at sent.
func (l *Locker) newHolds(minHold, maxLife time.Duration, sent time.Time) holds {
	h := holds{minHold: minHold, maxLife: maxLife, granted: time.Now()}
	if maxLife > 0 {
		margin := time.Duration(float64(l.cfg.margin) * float64(min(maxLife, l.cfg.ttl)) / float64(l.cfg.ttl))
		h.lifeEnd = sent.Add(maxLife - margin)
	}
	return h
}

// clamp returns the trusted window end t, no later than the end of life.
func (h holds) clamp(t time.Time) time.Time {
	if h.maxLife > 0 && t.After(h.lifeEnd) {
		return h.lifeEnd
	}
	return t
}

// renewTTL returns the TTL a renewal sent at send asks for: the Locker's
// TTL, or what is left of the life when that is less (final: this renewal
// takes the row to its end of life, and no other follows). The estimate
// of the life left counts from h.granted, so the row may outlive grant +
// maxLife by the latencies of the grant's reply and the renewal, never
// expire before the lease's local end of life.
func (h holds) renewTTL(ttl time.Duration, send time.Time) (d time.Duration, final bool) {
	if h.maxLife == 0 {
		return ttl, false
	}
	left := h.maxLife - send.Sub(h.granted)
	if left >= ttl {
		return ttl, false
	}
	return left, true
}

// nextRenewal returns when to renew after a renewal (or the grant) sent at
// send: a third of the TTL later, or, with a maximum life, no later than
// the time the life left falls to one TTL, so that the final renewal
// shortens the row's expiry to the end of life in time.
func (h holds) nextRenewal(ttl time.Duration, send time.Time) time.Time {
	at := send.Add(ttl / 3)
	if h.maxLife == 0 {
		return at
	}
	final := h.granted.Add(h.maxLife - ttl)
	switch {
	case !at.After(final):
		return at
	case final.After(send):
		return final
	case h.lifeEnd.After(send):
		return send.Add(h.lifeEnd.Sub(send) / 2)
	}
	return send
}

// holdLeft returns how much longer the key must stay taken after a release
// sent at send (HoldAtLeast): an upper bound of grant + minimum minus the
// database's time then, measured from the local time the grant's reply
// arrived. Zero or less: no hold.
func (le *Lease) holdLeft(send time.Time) time.Duration {
	if le.hold.minHold == 0 {
		return 0
	}
	return le.hold.minHold - send.Sub(le.hold.granted)
}

// keep runs the release of a lease that must stay taken (HoldAtLeast):
// it renews the row with the hold left, so the row expires at grant +
// minimum or a little later, and if the database's reply says it expires
// before that, or more than holdSlack after, sets the expiry once more from
// the reply's database time (deleting the row when that time is already
// past grant + minimum). It returns the rows renewed or deleted (0: the
// lease was gone) and whether the row was deleted.
func (le *Lease) keep(ctx context.Context) (n int64, deleted bool, err error) {
	l := le.l
	target := le.grantedAt.Add(le.hold.minHold).UnixMicro()
	left := le.holdLeft(time.Now())
	if left <= 0 {
		n, err = l.releaseRows(ctx, le.id, le.token)
		return n, true, err
	}
	exp, now, n, err := l.renewRow(ctx, le, left)
	if err != nil || n == 0 {
		return n, false, err
	}
	if exp < target || exp > target+holdSlack.Microseconds() {
		if target <= now {
			n, err = l.releaseRows(ctx, le.id, le.token)
			return n, true, err
		}
		if exp, _, n, err = l.renewRow(ctx, le, time.Duration(target-now)*time.Microsecond); err != nil || n == 0 {
			return n, false, err
		}
	}
	le.mu.Lock()
	le.expiry = time.UnixMicro(exp)
	le.mu.Unlock()
	return n, false, nil
}

// renewRow runs the Renew statement for le with ttl on a write connection
// of the main pool; n is 0 when the lease was gone.
func (l *Locker) renewRow(ctx context.Context, le *Lease, ttl time.Duration) (exp, now, n int64, err error) {
	conn, done, err := l.writeConn(ctx, l.db, waitUntil(ctx))
	if err != nil {
		return 0, 0, 0, err
	}
	defer done()
	args := l.st.renew.Args(map[string]any{"lease_id": le.id, "token": le.token, "ttl_us": max(ttl.Microseconds(), 1)})
	err = queryOne(ctx, l.st.replicated, conn, l.st.renew.SQL, args, &exp, &now)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, 0, 0, nil
	}
	if err != nil {
		return 0, 0, 0, err
	}
	return exp, now, 1, nil
}
