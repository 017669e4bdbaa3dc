package lock

// The waiting protocol of one acquire as a type: a waiter holds what its
// attempts wrote and when, and how it is woken; each state of the wait is
// one method (SPEC W1-W7, H6, H9).

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/sqlease/sqlease/dialect"
)

// waiter is one acquire's attempts at a key and its waits between them.
// Attempts run under leaseID, which starts as the acquire's ID in l.active
// (activeID) and changes after an attempt whose outcome is unknown (that
// attempt is undone first).
type waiter struct {
	l        *Locker
	ctx      context.Context
	key      string
	mode     Mode
	wait     bool // a blocking acquire; false: refused at once
	cancels  bool // the caller's context can end (acquireBounds)
	activeID string
	leaseID  string
	minHold  time.Duration // HoldAtLeast (SPEC H10); 0: none
	maxLife  time.Duration // HoldAtMost (SPEC H10); 0: none

	start    time.Time
	deadline time.Time // the WaitTimeout's end; zero: none
	hard     time.Time // no statement runs much past it (SPEC H9); zero: none
	watchUS  int64     // the watch TTL each attempt writes (CapNotify); 0: none
	limit    int64     // the semaphore's n (SPEC W7); 0: none

	n        int       // the attempt, from 0
	retries  int       // errors retried so far
	send     time.Time // when the current attempt was sent
	markerUS int64     // the marker TTL the current attempt writes; 0: none
	markerAt time.Time // when our marker was last written; zero: not ours
	// FIFO (SPEC W6): the ticket is the acquire's ID, written on the first
	// attempt and refreshed every third of its TTL; nil without FIFO.
	tk       *ticketArgs
	ticketAt time.Time // when our ticket was last written; zero: not yet
	queued   bool      // the last refused attempt saw tickets ahead of ours
	last     []Holder  // blockers seen by the last refused attempt
	// What attempts under leaseID may have written without our knowing:
	// a grant (reply lost) or a marker.
	maybeGrant, maybeMarker bool

	res acquireResult // the current attempt's outcome
	// The scan targets, reused by every row (passed to Scan through
	// interfaces, each would be allocated alone).
	row struct {
		granted  bool
		m        string
		h        Holder
		exp, now int64
	}

	hw                         *hubWaiter // in-process wake-ups; nil when !wait
	listening                  bool       // registered with the pool's listener
	stopWaiting, stopListening func()
}

// newWaiter prepares the attempts of an acquire of key under activeID; a
// blocking one (wait) is registered for in-process wake-ups at once, so one
// sent while its first attempt sets its marker is not lost.
func (l *Locker) newWaiter(ctx context.Context, key string, mode Mode, activeID string, wait bool, ac acquireConfig) *waiter {
	w := &waiter{l: l, ctx: ctx, key: key, mode: mode, wait: wait, cancels: ac.callerCancels, activeID: activeID, leaseID: activeID,
		start: time.Now(), stopWaiting: func() {}, stopListening: func() {}}
	if wait && ac.waitSet {
		w.deadline = w.start.Add(ac.wait)
	}
	w.hard = w.deadline
	if d, ok := ctx.Deadline(); ok && (w.hard.IsZero() || d.Before(w.hard)) {
		w.hard = d
	}
	if ac.fifo {
		w.tk = &ticketArgs{id: activeID}
	}
	w.minHold, w.maxLife = ac.minHold, ac.maxLife
	if ac.limitSet {
		w.limit = int64(ac.limit)
	}
	if wait {
		if l.caps.Has(dialect.CapNotify) {
			w.watchUS = watchTTL.Microseconds()
		}
		w.hw, w.stopWaiting = l.waitStart(key, activeID)
	}
	return w
}

// run attempts until the key is granted or the acquire ends; what its
// attempts may have written is undone before it returns an error.
func (w *waiter) run() (*Lease, error) {
	defer w.stop()
	for ; ; w.n++ {
		w.plan()
		err := w.attempt()
		w.note(err)
		switch {
		case w.ctx.Err() != nil:
			return nil, w.cancelled(err)
		case err != nil:
			if err := w.retry(err); err != nil {
				return nil, err
			}
		case w.res.granted:
			return w.granted(), nil
		default:
			if err := w.blocked(); err != nil {
				return nil, err
			}
		}
	}
}

// plan decides what the next attempt writes: a blocked writer's
// pending-writer marker (SPEC W1, not while FIFO tickets are ahead of it)
// and the FIFO ticket (SPEC W6), each when a third of its TTL has passed.
func (w *waiter) plan() {
	ttl := w.l.cfg.markerTTL
	due := func(at time.Time) bool { return at.IsZero() || time.Since(at) >= ttl/3 }
	w.markerUS = 0
	if w.wait && w.mode == Exclusive && due(w.markerAt) && !w.queued {
		w.markerUS = ttl.Microseconds()
	}
	if w.tk != nil {
		w.tk.us = 0
		if w.wait && due(w.ticketAt) {
			w.tk.us = ttl.Microseconds()
		}
	}
	w.send = time.Now()
}

// attempt runs the Acquire script once (with a ticket, AcquireFIFO),
// leaving the outcome in w.res. Its statements run on a context detached
// from the caller's, bounded by the statement timeout and by hard plus a
// grace (lock waits: acquireBounds), so their outcome is usually known
// (SPEC H6, H9). With the dialect's Grant (and Mark) fast paths an
// uncontended grant is one statement (a blocking acquire's first attempt
// tries Grant first) or a Probe and Grant, and a refused poll is the
// Probe, plus Mark when the marker is due.
func (w *waiter) attempt() (err error) {
	l := w.l
	timeout, lw := acquireBounds(l.cfg.stmtTimeout, w.hard, w.cancels)
	if _, ok := l.d.(dialect.Killer); ok && !w.hard.IsZero() {
		// Room to kill the statement and read its reply (watchCaller).
		timeout = min(l.cfg.stmtTimeout, max(time.Until(w.hard), 0)+killWait)
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), timeout)
	defer cancel()
	// When the caller gives up, the statement is stopped (see watchCaller);
	// either way its outcome is known before undo runs.
	sctx, slot, stop := w.watchCaller(sctx, cancel)
	defer stop()
	defer func() {
		err = slot.outcome(err)
		if err == nil && w.res.granted && l.st.replicated && sctx.Err() != nil {
			err = errUnconfirmed
		}
		if err != nil && l.d.Classify(err) == dialect.ErrorFailoverPause {
			w.res, err = l.pauseRefusal(sctx, w.key)
		}
	}()
	w.res = acquireResult{}
	vals := l.acquireVals(w.key, w.mode, w.leaseID, w.markerUS, w.watchUS, w.limit, w.tk)
	probe, script := l.st.probe, l.st.acquire
	if w.tk != nil {
		probe, script = l.st.probeFIFO, l.st.acquireFIFO
		probe.ok = probe.ok && w.tk.us == 0
	}
	fast := w.tk == nil && l.st.grant.ok && w.watchUS == 0
	if w.limit > 0 {
		// A Probe or Grant that does not count holders would not refuse a
		// full semaphore (SPEC W7): leave it to the script.
		probe.ok = probe.ok && usesLimit(probe.Stmt)
		fast = fast && usesLimit(l.st.grant.Stmt)
	}
	first := w.wait && w.n == 0
	if fast && first {
		// Most acquires find the key free: try the one-statement grant.
		if err := l.runAcquire(sctx, []dialect.Stmt{l.st.grant.Stmt}, vals, w.scan, &w.res, lw); err != nil || w.res.granted {
			return err
		}
		w.res = acquireResult{}
	}
	mark := fast && w.markerUS > 0 && l.st.mark.ok
	if probe.ok && w.watchUS == 0 && (w.markerUS == 0 || mark) {
		// Read-only first: a refused poll writes nothing (but the marker
		// when it is due, in one statement).
		if err := l.probe(sctx, probe.SQL, bindArgs(probe.Stmt, vals), w.scan); err != nil {
			return err
		}
		if len(w.res.holders) > 0 {
			if mark {
				return l.refreshMarker(sctx, w.key, w.leaseID, vals, &w.res, lw)
			}
			return nil
		}
		w.res = acquireResult{}
		if fast && !first {
			if err := l.runAcquire(sctx, []dialect.Stmt{l.st.grant.Stmt}, vals, w.scan, &w.res, lw); err != nil || w.res.granted {
				return err
			}
			w.res = acquireResult{}
		}
	}
	err = l.runAcquire(sctx, script, vals, w.scan, &w.res, lw)
	if err == nil && !w.res.granted && len(w.res.holders) == 0 {
		err = errNoOutcome
	}
	return err
}

// scan reads one row of an attempt into w.res: our grant, or a blocker.
func (w *waiter) scan(row rowScanner) error {
	r := &w.row
	if err := row.Scan(&r.granted, &r.h.LeaseID, &r.m, &r.h.Owner, &r.h.Token, &r.exp, &r.now); err != nil {
		return err
	}
	h := r.h
	h.Key, h.Mode, h.Expiry = w.key, modeFromCode(r.m), time.UnixMicro(r.exp)
	w.res.now = time.UnixMicro(r.now)
	if !r.granted {
		w.res.holders = append(w.res.holders, h)
		return nil
	}
	if h.LeaseID != w.leaseID {
		return fmt.Errorf("lock: dialect %q granted lease %q, asked for %q", w.l.d.Name(), h.LeaseID, w.leaseID)
	}
	w.res.granted, w.res.lease, w.res.grantedAt = true, h, h.Expiry.Add(-w.l.cfg.ttl)
	return nil
}

// note records what a failed attempt whose reply was lost may have
// written: a grant, and the marker it was to write.
func (w *waiter) note(err error) {
	if err != nil && w.l.uncertain(err) {
		w.maybeGrant = true
		w.maybeMarker = w.maybeMarker || w.markerUS > 0
	}
}

// cancelled ends an acquire whose context ended. The last statement may
// have committed a grant or a marker after the caller gave up: both are
// undone before it returns (SPEC H6).
func (w *waiter) cancelled(err error) error {
	if err == nil {
		w.maybeGrant = w.maybeGrant || w.res.granted
		w.maybeMarker = w.maybeMarker || w.markerUS > 0
	}
	return w.fail(context.Cause(w.ctx))
}

// retry handles a failed attempt: a transient error, or a statement that
// ran out of its own time (the statement timeout, a busy pool) or lost its
// connection while the caller still waits, is retried after a backoff;
// anything else ends the acquire. It returns nil to attempt again.
func (w *waiter) retry(err error) error {
	l := w.l
	retryable := l.transient(err) || errors.Is(err, errNoOutcome) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
	if !retryable || (!w.wait && w.retries >= 2) {
		return w.fail(err)
	}
	w.retries++
	l.cfg.logger.Debug("sqlease: acquire retry", "key", w.key, "mode", w.mode.String(), "err", err)
	if w.maybeGrant {
		// The attempt may have committed: undo it and go on under a new
		// lease ID, so a grant we never saw cannot block us.
		w.giveUp()
		w.leaseID, w.markerAt, w.ticketAt = newID(), time.Time{}, time.Time{}
		w.maybeGrant, w.maybeMarker = false, false
	}
	if perr := w.pause(Backoff(w.n, l.cfg.maxBackoff), nil); perr != nil {
		return w.fail(perr)
	}
	if w.expired() {
		return w.deny(time.Since(w.start), err)
	}
	return nil
}

// granted turns the grant in w.res into the caller's lease, renewing it
// once when the grant was slow (SPEC H1), and passes the wake-up on.
func (w *waiter) granted() *Lease {
	l := w.l
	hold := l.newHolds(w.minHold, w.maxLife, w.send)
	if time.Since(w.send) > (l.cfg.ttl-l.cfg.margin)/3 {
		// The grant took long (it waited for locks): its trusted window,
		// counted from the send, is mostly spent. Best effort: on failure
		// the lease keeps its short window and the renewer retries.
		if err := l.freshen(w.ctx, &w.res, &w.send); err != nil {
			l.cfg.logger.Debug("sqlease: renewal after a slow grant failed", "key", w.key, "lease_id", w.leaseID, "err", err)
		}
	}
	l.emit(Event{Kind: EventAcquireGranted, Key: w.key, Mode: w.mode, LeaseID: w.leaseID, Token: w.res.lease.Token, Wait: time.Since(w.start)})
	if w.listening {
		// Pass the wake-up on to the next waiter of this process: after a
		// shared grant (or our FIFO ticket leaving the queue) it may be
		// granted too; after an exclusive one it claims the pending-writer
		// marker, so the next release wakes it alone.
		w.stop()
		hubWake(l.channel, w.key, "")
	}
	return l.newLease(w.key, w.mode, w.res, w.send, w.activeID, hold)
}

// blocked handles a refused attempt: it records the blockers, refuses a
// try or a wait past its WaitTimeout (SPEC W3), and otherwise waits for a
// wake-up, the earliest blocker's expiry or the next poll.
func (w *waiter) blocked() error {
	until := w.observe()
	if !w.wait {
		return w.deny(0, nil)
	}
	if w.expired() {
		return w.deny(time.Since(w.start), nil)
	}
	w.listen()
	if err := w.pause(w.nextPoll(until), w.hw.ch); err != nil {
		return w.fail(err)
	}
	return nil
}

// observe records a refused attempt's blockers (our own marker is not
// one), whether FIFO tickets are ahead of ours, and whether our marker
// and ticket are written; it returns the time left until the earliest
// blocker expires (-1: none).
func (w *waiter) observe() time.Duration {
	w.last, w.queued = w.last[:0], false
	mine := false
	var until time.Duration = -1
	if w.tk != nil && w.tk.us > 0 {
		w.ticketAt = w.send
	}
	for _, h := range w.res.holders {
		if h.Mode == PendingWriter && h.LeaseID == w.leaseID {
			mine = true
			continue
		}
		w.queued = w.queued || h.Mode == Queued
		w.last = append(w.last, h)
		if d := h.Expiry.Sub(w.res.now); until < 0 || d < until {
			until = d
		}
	}
	switch {
	case !mine:
		w.markerAt = time.Time{}
	case w.markerUS > 0:
		w.markerAt = w.send
	}
	return until
}

// listen registers the blocked waiter with the pool's listener (only after
// a refused attempt, so an uncontended acquire never opens a listening
// connection), tells the hub whether its marker is live, and passes a
// wake-up on to a waiter whose claim alone blocks it.
func (w *waiter) listen() {
	if !w.listening {
		w.stopListening, w.listening = w.l.listenStart(), true
	}
	hubUpdate(w.hw, w.leaseID, !w.markerAt.IsZero())
	held, claim := false, ""
	for _, h := range w.last {
		switch h.Mode {
		case Exclusive, Shared:
			held = true
		case PendingWriter:
			claim = h.LeaseID
		}
	}
	if !held && claim != "" {
		// The claimant may be in this process and have missed the release
		// (its marker may have committed just after the release looked for
		// one).
		hubWake(w.l.channel, w.key, claim)
	}
}

// nextPoll returns how long a refused waiter waits when nothing wakes it:
// the backoff (SPEC W2), or a slower fallback poll while releases wake it,
// cut to just after the earliest blocker expires and to a third of the
// marker TTL while it keeps a marker or a ticket.
func (w *waiter) nextPoll(until time.Duration) time.Duration {
	l := w.l
	sleep := Backoff(w.n, l.cfg.maxBackoff)
	if ready, since := l.notifyReady(); ready && since.Before(w.send) {
		// The listener was up before this attempt, so no release was
		// missed. Drawn from the upper half of the interval: wake-ups are
		// targeted (one waiter per release), so a ramp of early polls
		// would be most of the statements.
		half := l.cfg.notifyPoll / 2
		sleep = max(half+rand.N(half+1), min(notifyMinPoll, l.cfg.notifyPoll))
	}
	if until >= 0 {
		sleep = min(sleep, max(until+time.Millisecond, MinBackoff))
	}
	if !w.markerAt.IsZero() || w.tk != nil {
		sleep = min(sleep, l.cfg.markerTTL/3)
	}
	if len(w.last) == 0 {
		// What blocked ended while the attempt ran (only our own marker
		// is left): a release that looked for a marker before ours
		// committed woke someone else.
		sleep = MinBackoff
	}
	return sleep
}

// pause waits d, cut to the WaitTimeout's end, or until wake fires; when
// the context ends first it returns its cause (ErrClosed after Close).
func (w *waiter) pause(d time.Duration, wake <-chan struct{}) error {
	if !w.deadline.IsZero() {
		d = min(d, max(time.Until(w.deadline), 0))
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.ctx.Done():
		return context.Cause(w.ctx)
	case <-t.C:
	case <-wake:
	}
	return nil
}

// expired reports whether the WaitTimeout has run out.
func (w *waiter) expired() bool {
	return !w.deadline.IsZero() && !time.Now().Before(w.deadline)
}

// deny refuses the acquire with the blockers last seen (SPEC W3) and
// lastErr, the last attempt's error when it failed instead of being
// refused, after undoing what it wrote, and reports the denial.
func (w *waiter) deny(waited time.Duration, lastErr error) error {
	w.giveUp()
	err := &LockedError{Key: w.key, Mode: w.mode, Limit: int(w.limit), Holders: w.last, Waited: waited, Err: lastErr}
	w.l.emit(Event{Kind: EventAcquireDenied, Key: w.key, Mode: w.mode, Wait: time.Since(w.start), Err: err})
	return err
}

// fail ends the acquire with err, after undoing what it wrote.
func (w *waiter) fail(err error) error {
	w.giveUp()
	return fmt.Errorf("lock: acquire %s %q: %w", w.mode, w.key, err)
}

// giveUp undoes what attempts under the current lease ID may have written:
// a grant we never saw, and our marker (SPEC H6), within hard (SPEC H9).
func (w *waiter) giveUp() {
	w.l.undo(w.ctx, w.key, w.leaseID, w.maybeGrant, w.maybeMarker || !w.markerAt.IsZero(), w.hard)
}

// stop ends the waiter's wake-up registrations (calling it again does
// nothing).
func (w *waiter) stop() {
	w.stopWaiting()
	w.stopListening()
}
