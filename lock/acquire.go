package lock

// Acquiring: TryAcquire, Acquire, Do, and the statements of one attempt;
// the waiting protocol (backoff, markers, FIFO tickets, wake-ups) is the
// waiter's, in waiter.go (SPEC W1-W7, H6, H9).

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/sqlease/sqlease/dialect"
)

// AcquireOption configures one Acquire, TryAcquire or Do call. A nil
// AcquireOption is rejected (an *InputError matching ErrInvalidInput, I1).
type AcquireOption func(*acquireConfig)

type acquireConfig struct {
	wait    time.Duration
	waitSet bool
	fifo    bool
	// HoldAtLeast and HoldAtMost (SPEC H10).
	minHold, maxLife       time.Duration
	minHoldSet, maxLifeSet bool
	limit                  int   // Limit's n (SPEC W7); valid when limitSet
	limitSet               bool  // Limit was given
	bad                    error // the first nil option (rule I1)
	// callerCancels: the caller's context can end (Done is not nil);
	// set by acquire before it adds Close's cancellation.
	callerCancels bool
}

// apply runs opts on c; a nil option is recorded in c.bad, which acquire
// returns before anything else.
func (c *acquireConfig) apply(opts []AcquireOption) {
	for i, o := range opts {
		if o == nil {
			if c.bad == nil {
				c.bad = inputErr("acquire option", fmt.Sprintf("nil (option %d of %d)", i+1, len(opts)), "a lock.AcquireOption such as WaitTimeout(5*time.Second); leave it out instead of passing nil")
			}
			continue
		}
		o(c)
	}
}

// WaitTimeout bounds how long a blocking acquire waits for the key (default:
// until the context ends). When it runs out, the acquire returns a
// *LockedError (ErrLocked) with the holders it last saw. Negative values are
// rejected with ErrInvalidInput (SPEC W3, I1).
func WaitTimeout(d time.Duration) AcquireOption {
	return func(c *acquireConfig) { c.wait, c.waitSet = d, true }
}

// FIFO makes the acquire wait in the key's strict FIFO queue (SPEC W6): a
// blocking acquire takes a ticket (database time and a sequence number) when
// it starts waiting and is granted in ticket order: an exclusive ticket
// when every ticket ahead of it is gone, a shared ticket when no exclusive
// ticket is ahead of it, so consecutive shared tickets are granted
// together. A TryAcquire (or WaitTimeout(0)) with FIFO takes no ticket and
// counts as behind every ticket: it never jumps a non-empty queue.
//
// Costs: the ticket is written when the wait starts and refreshed every
// third of its TTL (the pending-writer TTL, WithPendingWriterTTL); other
// refused polls write nothing. A waiter that gives up deletes its ticket at
// once; one that dies leaves the queue when its ticket expires, so it
// delays the waiters behind it by at most one ticket TTL. A waiter stalled
// for longer than its ticket TTL loses its place and queues again at the
// end.
//
// The queue orders FIFO acquires only. Acquires of the same key without
// FIFO do not look at tickets; they follow writer preference (SPEC W1),
// which the head of the queue takes part in: an exclusive ticket at the
// head keeps a pending-writer marker like any waiting writer. Use FIFO for
// every acquire of a key for strict arrival order.
//
// Acquires with FIFO fail with errors.ErrUnsupported when the dialect
// lacks dialect.CapFIFO.
func FIFO() AcquireOption {
	return func(c *acquireConfig) { c.fifo = true }
}

// TryAcquire grants a lease on key in mode, or fails at once with a
// *LockedError matching ErrLocked that lists the blocking holders (SPEC W3).
// It never waits for the key and writes no pending-writer marker.
//
// Shared acquires of one key by several goroutines of one Locker are
// granted together, each its own lease (SPEC W5).
//
// Errors: ErrInvalidInput (bad key or mode, SPEC I1), ErrReentrant (this
// Locker holds or is acquiring key exclusively, or key in any mode and
// mode is Exclusive; SPEC W4), ErrClosed, the context's
// error (nothing is left held, SPEC H6), or the database's error.
//
// Options: FIFO (never jump the key's FIFO queue, SPEC W6), Limit (a
// semaphore of at most n shared holders, SPEC W7); HoldAtLeast and
// HoldAtMost (exclusive only, SPEC H10); WaitTimeout is ignored.
func (l *Locker) TryAcquire(ctx context.Context, key string, mode Mode, opts ...AcquireOption) (*Lease, error) {
	var ac acquireConfig
	ac.apply(opts)
	ac.wait, ac.waitSet = 0, false
	return l.acquire(ctx, key, mode, false, ac)
}

// Acquire grants a lease on key in mode, waiting while the key is held in a
// conflicting mode. Waits poll with exponential backoff and full jitter from
// MinBackoff up to min(WithMaxBackoff, TTL), and never sleep past the
// blocking lease's expiry, so a crashed holder is taken over within one TTL
// plus one backoff step (SPEC W2).
//
// Writer preference (SPEC W1): a waiting exclusive acquire keeps a
// pending-writer marker on the key, refreshed while it polls, so no new
// shared lease is granted; shared leases already held finish, then the
// writer is granted. Several waiting writers: the earliest to place its
// marker keeps the claim until it is granted, gives up or its marker
// expires; the others are granted in no guaranteed order. Readers wait at
// most for one writer's hold; there is no global FIFO unless the FIFO
// option is given (SPEC W6).
//
// Readers of one Locker (SPEC W5): many goroutines may hold shared leases
// on key through this Locker at once, each its own lease. Each is a reader
// like any other: it waits behind a pending writer. The Locker cannot tell
// a nested acquire from a concurrent one, so a goroutine that already
// holds a shared lease on key and acquires it shared again may wait behind
// a pending writer that waits for the first lease, exactly as a nested
// RLock of a sync.RWMutex (a deadlock until ctx or the WaitTimeout ends).
// Acquires that certainly wait behind this Locker itself are refused with
// ErrReentrant instead (SPEC W4; see TryAcquire).
//
// Deadlines hold (SPEC H9): it returns within the context's deadline or the
// WaitTimeout, whichever is first, plus at most 500 ms, whatever the
// database does; no statement of it runs past that, and undo work that
// cannot finish in time goes on in the background for at most one TTL.
//
// Errors: as TryAcquire; ErrLocked when the WaitTimeout runs out; the
// context's error when ctx ends (a grant that committed anyway is released
// first; SPEC H6). Transient database errors while waiting (serialization
// failures, busy, dropped or refused connections, EOF) are retried.
func (l *Locker) Acquire(ctx context.Context, key string, mode Mode, opts ...AcquireOption) (*Lease, error) {
	var ac acquireConfig
	ac.apply(opts)
	return l.acquire(ctx, key, mode, true, ac)
}

// Do runs fn under a lease on key in mode and releases the lease when fn
// returns (or panics). fn's context ends when ctx ends or the lease is lost
// (cause ErrLeaseLost, SPEC H3).
//
// It returns fn's error; if the lease was lost before fn returned
// (including a trusted window that had ended by then), an error matching
// ErrLeaseLost joined with fn's error on one line ("; " between them), or
// fn's error alone when it already wraps the loss (as context.Cause(ctx)
// does). Without WaitTimeout or a deadline on ctx the acquire waits as
// long as the key is held; when the wait times out, the error matches
// ErrLocked. A renewal that fails after fn returned changes nothing (SPEC
// H4). A release that fails is logged and joined to the result (SPEC H5).
// Acquire errors are returned as from Acquire.
//
// For a scheduled job run by every replica (SPEC H10): HoldAtLeast(d) keeps
// the key taken until d after the grant when fn returns sooner, so
// replicas whose ticks differ by less than d run it once; HoldAtMost(d)
// ends fn's context (cause ErrLeaseLost, reason LossMaxLife) d after the
// grant, and Do then returns an error matching ErrLeaseLost.
func (l *Locker) Do(ctx context.Context, key string, mode Mode, fn func(ctx context.Context, lease *Lease) error, opts ...AcquireOption) (err error) {
	if fn == nil {
		return inputErr("function", "nil", "Do needs a function to run")
	}
	lease, err := l.Acquire(ctx, key, mode, opts...)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(context.WithValue(ctx, leaseKey{}, lease))
	stop := context.AfterFunc(lease.ctx, func() { cancel(context.Cause(lease.ctx)) })
	finished := false
	var returned time.Time
	defer func() {
		stop()
		cancel(nil)
		lost := lease.finish(returned)
		relErr := lease.Release(ctx)
		if !finished {
			return // panicking: released; the panic goes on
		}
		if lost != nil {
			err = join(lost, err)
			return
		}
		if relErr != nil && !errors.Is(relErr, ErrNotHeld) {
			err = join(err, relErr)
		}
	}()
	err = fn(fctx, lease)
	returned = time.Now()
	finished = true
	return err
}

// acquire checks its input, records the acquire in l.active and runs its
// waiter; a failed acquire leaves nothing behind (SPEC H6).
func (l *Locker) acquire(ctx context.Context, key string, mode Mode, wait bool, ac acquireConfig) (*Lease, error) {
	if err := l.checkAcquire(ctx, key, mode, ac); err != nil {
		return nil, err
	}
	leaseID := newID()
	if err := l.enroll(key, mode, leaseID); err != nil {
		return nil, fmt.Errorf("lock: acquire %s %q: %w", mode, key, err)
	}
	defer l.acquires.Done()
	// Close ends the acquire like a cancelled context, with cause
	// ErrClosed: what it wrote is undone before it returns (SPEC H6).
	ac.callerCancels = ctx.Done() != nil
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(l.closing, func() { cancel(ErrClosed) })
	defer stop()
	start := time.Now()
	if ac.waitSet && ac.wait == 0 {
		wait = false // WaitTimeout(0): try once
	}
	lease, err := l.newWaiter(ctx, key, mode, leaseID, wait, ac).run()
	if err == nil {
		lease, err = l.unlessClosed(ctx, lease)
	}
	if err != nil {
		if ac.fifo && wait {
			l.dequeue(ctx, key, leaseID)
		}
		l.forget(key, leaseID)
		if !errors.Is(err, ErrLocked) { // denials were reported by the waiter
			l.emit(Event{Kind: EventAcquireDenied, Key: key, Mode: mode, Wait: time.Since(start), Err: err})
		}
	}
	return lease, err
}

// checkAcquire returns the error of an acquire refused before it starts:
// bad input (SPEC I1), FIFO or Limit without dialect support, or an ended
// context.
func (l *Locker) checkAcquire(ctx context.Context, key string, mode Mode, ac acquireConfig) error {
	if ctx == nil {
		return inputErr("context", "nil", "pass a non-nil context")
	}
	if ac.bad != nil {
		return ac.bad
	}
	if err := CheckKey(key); err != nil {
		return err
	}
	if mode != Exclusive && mode != Shared {
		return inputErr("mode", mode.String(), "Exclusive or Shared")
	}
	if ac.waitSet && ac.wait < 0 {
		return inputErr("wait timeout", ac.wait.String(), "zero (try once) or a positive duration")
	}
	if err := checkHold(mode, ac); err != nil {
		return err
	}
	if ac.fifo && len(l.st.acquireFIFO) == 0 {
		return fmt.Errorf("lock: acquire %s %q: FIFO: dialect %q: %w", mode, key, l.d.Name(), errors.ErrUnsupported)
	}
	if err := l.checkLimit(key, mode, ac); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("lock: acquire %s %q: %w", mode, key, context.Cause(ctx))
	}
	return nil
}

// enroll claims key for the acquire leaseID (ErrReentrant, SPEC W4; once
// more after ending leases whose trusted window has passed) and counts the
// acquire for Close; it returns ErrClosed once Close has begun.
func (l *Locker) enroll(key string, mode Mode, leaseID string) error {
	for again := false; ; again = true {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return ErrClosed
		}
		err := l.claim(key, mode, leaseID)
		if err == nil {
			l.acquires.Add(1)
		}
		l.mu.Unlock()
		if err == nil || again || !l.endWindows(key) {
			return err
		}
	}
}

// unlessClosed releases a lease granted while Close ran, so that no lease
// outlives Close, and returns ErrClosed then; otherwise it returns lease.
func (l *Locker) unlessClosed(ctx context.Context, lease *Lease) (*Lease, error) {
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if !closed {
		return lease, nil
	}
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.releaseTimeout)
	defer rcancel()
	if rerr := lease.release(rctx, false); rerr != nil && !errors.Is(rerr, ErrNotHeld) {
		l.cfg.logger.Warn("sqlease: release of a lease granted during Close failed; it ends by expiry", "key", lease.key, "lease_id", lease.LeaseID(), "err", rerr)
	}
	return nil, fmt.Errorf("lock: acquire %s %q: %w", lease.mode, lease.key, ErrClosed)
}

// watchTTL is how long a blocked waiter's interest in release notifications
// for its key lasts after its last refresh (CapNotify); waiters refresh it
// when half has passed.
const watchTTL = 10 * time.Second

// notifyMinPoll is the shortest wait between polls while release
// notifications are available.
const notifyMinPoll = 100 * time.Millisecond

// acquireCancelGrace is how long an in-flight acquire statement may go on
// after the caller's context ended or its deadline passed, before it is
// cancelled.
const acquireCancelGrace = 150 * time.Millisecond

// undoGrace is how long past the caller's deadline an acquire may spend
// undoing attempts whose outcome it does not know; undo work left then
// goes on in the background for at most one TTL (SPEC H9: an acquire
// returns within its deadline plus 500 ms).
const undoGrace = 200 * time.Millisecond

// maxLockWait bounds one statement's wait in a lock-wait handler the
// context cannot interrupt (dialect.LockWaiter); the engine retries after.
const maxLockWait = 250 * time.Millisecond

// errNoOutcome: the Acquire script neither granted nor named a blocker
// (what blocked ended meanwhile); the attempt is simply repeated.
var errNoOutcome = errors.New("acquire neither granted nor reported holders")

// errUnconfirmed: a statement reported success after its own deadline
// passed, so the driver may have cancelled it while its commit waited for
// a synchronous standby; PostgreSQL then answers with success and a
// warning ("might not have been replicated"), and a failover can lose the
// commit. Such a grant or renewal is an unknown outcome: the grant is
// undone, the renewal extends nothing (SPEC S7, H1). It matches
// context.DeadlineExceeded, so both retry it as transient.
var errUnconfirmed = fmt.Errorf("statement reported success after its deadline, so its commit may not have reached a synchronous standby: %w", context.DeadlineExceeded)

// acquireResult is the outcome of one attempt: the grant, or the blockers
// and the database's time when it saw them.
type acquireResult struct {
	granted   bool
	grantedAt time.Time
	lease     Holder
	now       time.Time
	holders   []Holder
}

// Backoff is the wait schedule of blocked acquires: for poll attempt n (from
// 0) a duration drawn uniformly from [MinBackoff, min(limit,
// MinBackoff*2^n)] (full jitter). It never exceeds limit (at least
// MinBackoff). Exported so the schedule can be tested (SPEC W2).
func Backoff(attempt int, limit time.Duration) time.Duration {
	limit = max(limit, MinBackoff)
	ceil := limit
	if attempt < 30 {
		ceil = min(limit, MinBackoff<<attempt)
	}
	if ceil <= MinBackoff {
		return MinBackoff
	}
	return MinBackoff + rand.N(ceil-MinBackoff+1)
}

// ticketArgs are the FIFO arguments of one attempt (SPEC W6): the ticket
// ID and the ticket TTL to write (0: do not write).
type ticketArgs struct {
	id string
	us int64
}

// acquireBounds returns the timeout and the lock wait of one acquire
// attempt: the statement timeout, cut to the deadline hard (when set) plus
// acquireCancelGrace; lock waits end by hard plus lockWaitSlack (SPEC H9),
// and when the caller can cancel they are waits of maxLockWait, so a
// cancellation is seen between them, unless the pool's own bound ends
// within the statement timeout (a cancel then waits for the pool's bound:
// docs/operations.md). Without either, the connection's lock wait is left
// alone.
func acquireBounds(stmtTimeout time.Duration, hard time.Time, callerCancels bool) (time.Duration, lockWait) {
	timeout := stmtTimeout
	var wait lockWait
	if callerCancels {
		wait = lockWait{bound: maxLockWait, until: time.Now().Add(timeout)}
	}
	if !hard.IsZero() {
		left := time.Until(hard)
		timeout = min(timeout, max(left, 0)+acquireCancelGrace)
		wait = lockWait{bound: min(maxLockWait, max(left, time.Millisecond)), until: hard.Add(lockWaitSlack)}
	}
	return timeout, wait
}

// probe runs the read-only Probe on a pooled connection, read straight
// from the driver (queryConn). Like database/sql for a query on the pool,
// it takes another connection when the driver reports the one it got broken
// before the query was sent (driver.ErrBadConn), up to three tries, so a
// pool of stale connections (after a server restart, say) costs no poll.
func (l *Locker) probe(ctx context.Context, q string, args []any, scan func(rowScanner) error) error {
	var err error
	for range 3 {
		var conn *sql.Conn
		if conn, err = l.db.Conn(ctx); err != nil {
			return err
		}
		err = queryConn(ctx, conn, q, args, scan)
		_ = conn.Close()
		if !errors.Is(err, driver.ErrBadConn) {
			return err
		}
	}
	return err
}

// refreshMarker runs the Mark statement for a waiter the Probe found
// blocked, and lists the caller's marker in res when it is set (the
// Probe's row for it, if any, is replaced).
func (l *Locker) refreshMarker(ctx context.Context, key, leaseID string, vals namedArgs, res *acquireResult, wait lockWait) error {
	kept := res.holders[:0]
	for _, h := range res.holders {
		if h.Mode != PendingWriter || h.LeaseID != leaseID {
			kept = append(kept, h)
		}
	}
	res.holders = kept
	_, err := l.script(ctx, l.db, []dialect.Stmt{l.st.mark.Stmt}, vals, func(row rowScanner) error {
		var exp, now int64
		if err := row.Scan(&exp, &now); err != nil {
			return err
		}
		res.now = time.UnixMicro(now)
		res.holders = append(res.holders, Holder{Key: key, Mode: PendingWriter, LeaseID: leaseID, Owner: l.cfg.owner, Expiry: time.UnixMicro(exp)})
		return nil
	}, nil, wait)
	return err
}

// runAcquire runs the Acquire script: in autocommit (one round trip on
// PostgreSQL) until the script refuses the session's isolation level
// (ErrorIsolation, nothing done), then, for this Locker from then on, in a
// transaction begun at the dialect's Isolation (SPEC S6).
func (l *Locker) runAcquire(ctx context.Context, script []dialect.Stmt, vals namedArgs, scan func(rowScanner) error, res *acquireResult, wait lockWait) error {
	iso := l.st.isolation
	if iso == sql.LevelDefault || !l.isolated.Load() {
		_, err := l.script(ctx, l.db, script, vals, scan, nil, wait)
		if err == nil || iso == sql.LevelDefault || l.d.Classify(err) != dialect.ErrorIsolation {
			return err
		}
		if !l.isolated.Swap(true) {
			l.cfg.logger.Debug("sqlease: the session's isolation level is not the one acquire needs; acquires run in explicit transactions", "isolation", iso.String(), "err", err)
		}
		*res = acquireResult{}
	}
	_, err := l.script(ctx, l.db, script, vals, scan, &sql.TxOptions{Isolation: iso}, wait)
	return err
}

// uncertain reports whether a failed statement may still have taken effect
// (its reply was lost: timeout, cancellation, dropped connection), as
// opposed to failing before it was sent or being refused by the database.
func (l *Locker) uncertain(err error) bool {
	var ns *notSentError
	if errors.As(err, &ns) {
		return false
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || connFailed(err) ||
		l.d.Classify(err) == dialect.ErrorConnection
}

// freshen renews a just-granted lease whose grant was slow, moving the send
// time and expiry in res.
func (l *Locker) freshen(ctx context.Context, res *acquireResult, send *time.Time) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.renewTimeout)
	defer cancel()
	leave, err := l.enter(rctx)
	if err != nil {
		return err
	}
	defer leave()
	t := time.Now()
	var exp, now int64
	err = queryOne(rctx, l.st.replicated, l.renewDB, l.st.renew.SQL, l.st.renew.Args(map[string]any{
		"lease_id": res.lease.LeaseID, "token": res.lease.Token, "ttl_us": l.cfg.ttl.Microseconds(),
	}), &exp, &now)
	if err != nil {
		return err
	}
	*send = t
	res.lease.Expiry = time.UnixMicro(exp)
	return nil
}
