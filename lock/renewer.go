package lock

import (
	"container/heap"
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sqlease/sqlease/dialect"
)

// The renewer runs on one timer per Locker, armed for the earliest lease
// due. It renews every lease due (TTL/3 after its last successful acquire
// or renew) in batches: one RenewBatch statement per batch of up to
// renewBatchSize leases, so a Locker holding 10,000 leases sends a handful
// of statements per renewal interval (4 or 5, plus, on SQLite, two
// busy-timeout statements per renewer run when the DSN's busy timeout
// outlasts the renew timeout). Batches go out on up to renewConns
// connections at once. A lease whose renewal failed is retried with
// backoff until its trusted window ends (SPEC H2); a lease the database no
// longer has is lost at once. A renewer that cannot keep up with the
// leases held says so in the log (renewload.go).
//
// Scheduling a lease starts no goroutine and wakes none: it re-arms the
// timer only when the lease is due before the time the timer is armed for.
// A goroutine runs only when the timer fires, and only one at a time (an
// acquire + release of a short lease costs no scheduler work; bench
// figures exclusive.1c and exclusive.8c, docs/performance.md).

const renewBatchSize = 2500

// renewerState is a Locker's renewer state, under its own mutex.
type renewerState struct {
	mu      sync.Mutex
	heap    leaseHeap     // the leases to renew, earliest due first
	timer   *time.Timer   // runs renewer; nil until the first lease
	armed   time.Time     // when timer fires; zero: not armed
	busy    bool          // a renewer run is in progress
	stopped bool          // Close stopped the renewer
	done    chan struct{} // closed when the current (or last) run ends
	limit   int           // leases per renewal batch now (see adaptBatch)
	shrunk  time.Time     // when limit last shrank
	load    renewLoad     // the renewer's load (renewload.go)
	wake    chan struct{} // wakes a run waiting for batches in flight (cap 1)
}

type leaseHeap []*Lease

func (h leaseHeap) Len() int           { return len(h) }
func (h leaseHeap) Less(i, j int) bool { return h[i].nextAt.Before(h[j].nextAt) }
func (h leaseHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIndex, h[j].heapIndex = i, j
}
func (h *leaseHeap) Push(x any) {
	le := x.(*Lease)
	le.heapIndex = len(*h)
	*h = append(*h, le)
}
func (h *leaseHeap) Pop() any {
	old := *h
	le := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	le.heapIndex = -1
	return le
}

// schedule (re)queues le for renewal at at, arming the renewer's timer for
// it when it is the earliest.
func (l *Locker) schedule(le *Lease, at time.Time) {
	l.ren.mu.Lock()
	defer l.ren.mu.Unlock()
	le.renewing = true
	l.queueLocked(le, at)
	l.armLocked()
}

// queueLocked puts le in the heap at at (l.ren.mu held).
func (l *Locker) queueLocked(le *Lease, at time.Time) {
	le.nextAt = at
	if le.heapIndex >= 0 && le.heapIndex < len(l.ren.heap) && l.ren.heap[le.heapIndex] == le {
		heap.Fix(&l.ren.heap, le.heapIndex)
	} else {
		heap.Push(&l.ren.heap, le)
	}
}

// armLocked makes sure the renewer runs when the earliest lease is due:
// it resets the timer when that lease is due before the timer is armed
// for (l.ren.mu held). A running renewer re-arms the timer itself when it
// finds nothing more due; after Close nothing is armed.
func (l *Locker) armLocked() {
	if l.ren.busy {
		l.wakeRenewer()
	}
	if l.ren.busy || l.ren.stopped || len(l.ren.heap) == 0 {
		return
	}
	at := l.ren.heap[0].nextAt
	if !l.ren.armed.IsZero() && !at.Before(l.ren.armed) {
		return
	}
	l.ren.armed = at
	if l.ren.timer == nil {
		l.ren.timer = time.AfterFunc(time.Until(at), l.renewer)
		return
	}
	l.ren.timer.Reset(time.Until(at))
}

// unschedule stops renewing le (Release, loss, Orphan). It returns a
// channel closed when a renewal of le already on its way to the database
// has finished, or nil when there is none. The timer stays armed: when it
// fires for a lease no longer queued, the renewer finds nothing due and
// re-arms it for the next one.
func (l *Locker) unschedule(le *Lease) <-chan struct{} {
	l.ren.mu.Lock()
	defer l.ren.mu.Unlock()
	le.renewing = false
	inflight := le.inflight
	if le.heapIndex >= 0 && le.heapIndex < len(l.ren.heap) && l.ren.heap[le.heapIndex] == le {
		heap.Remove(&l.ren.heap, le.heapIndex)
	}
	return inflight
}

// renewer runs when the timer fires. It renews the leases due in batches
// until none is due, then re-arms the timer for the earliest lease left.
// One runs at a time: a run that finds another running leaves (the
// running one re-reads the heap before it ends).
//
// Where the database takes concurrent writers, up to renewConns batches
// go out at once, each on its own connection, each with its own outcome:
// a batch that fails or times out costs only its own leases (retried until
// their windows end, SPEC H2), never another batch's. Where it serializes
// writers (SQLite) the batches go one after the other through one
// connection kept for the run while no other writer waits for the write
// gate and the pool has room (renewConn), so a busy timeout shortened for
// renewals is set and restored once per run, not once per batch (SPEC H9).
func (l *Locker) renewer() {
	l.ren.mu.Lock()
	if l.ren.busy || l.ren.stopped {
		l.ren.mu.Unlock()
		return
	}
	l.ren.busy, l.ren.armed = true, time.Time{}
	done := make(chan struct{})
	l.ren.done = done
	l.ren.mu.Unlock()
	defer close(done)
	conns := l.renewConns()
	var held boundConn // conns == 1: the connection kept for the run
	defer held.finish()
	slots := make(chan struct{}, conns) // one per batch in flight
	var horizon time.Time               // the current round takes leases due by then
	for {
		due := l.takeDue(&horizon)
		switch {
		case len(due) == 0 && len(slots) > 0:
			l.awaitRenewals()
			continue
		case len(due) == 0:
			l.ren.mu.Lock()
			if l.nothingDueLocked(time.Now()) {
				l.ren.busy = false
				l.armLocked()
				l.ren.mu.Unlock()
				return
			}
			l.ren.mu.Unlock()
			continue
		case conns == 1:
			l.renewBatch(due, conns, &held)
			continue
		}
		slots <- struct{}{}
		go func() {
			l.renewBatch(due, conns, nil)
			<-slots
			l.wakeRenewer()
		}()
	}
}

// awaitRenewals waits, while batches are in flight and no lease is due,
// until a batch ends, a lease is scheduled or the earliest lease is due.
// Batches in flight requeue their leases, some for a retry soon; waiting
// for all of them would hold up leases due meanwhile behind a slow batch.
func (l *Locker) awaitRenewals() {
	wait := time.Hour
	l.ren.mu.Lock()
	if len(l.ren.heap) > 0 {
		wait = time.Until(l.ren.heap[0].nextAt)
	}
	l.ren.mu.Unlock()
	t := time.NewTimer(max(wait, 0))
	defer t.Stop()
	select {
	case <-l.ren.wake:
	case <-t.C:
	}
}

// wakeRenewer wakes a renewer run waiting in awaitRenewals.
func (l *Locker) wakeRenewer() {
	select {
	case l.ren.wake <- struct{}{}:
	default:
	}
}

// takeDue takes the next batch of leases due from the heap. A round
// starts when the earliest lease is due: it takes every lease due now or
// within TTL/12 (*horizon), in as many batches of up to the batch limit as
// that needs, so that leases acquired over a few seconds share a round: a
// lease is renewed at most TTL/12 early (after TTL/4 instead of TTL/3), and
// a Locker holding 10,000 leases sends 4 batches per interval instead of
// 11 (bench: batchrenew.batches_per_interval). Until the earliest is due
// nothing is taken, and a lease whose renewal failed waits out its backoff
// (renewBatch requeues it at now + retryWait) whatever the round.
func (l *Locker) takeDue(horizon *time.Time) []*Lease {
	now := time.Now()
	l.ren.mu.Lock()
	defer l.ren.mu.Unlock()
	if len(l.ren.heap) == 0 {
		return nil
	}
	if l.ren.heap[0].nextAt.After(*horizon) {
		if l.ren.heap[0].nextAt.After(now) {
			return nil
		}
		*horizon = now.Add(l.cfg.ttl / 12) // a new round
	}
	var due []*Lease
	for len(l.ren.heap) > 0 && len(due) < l.ren.limit {
		next := l.ren.heap[0]
		if next.nextAt.After(*horizon) || (next.retryWait > 0 && next.nextAt.After(now)) {
			break
		}
		heap.Pop(&l.ren.heap)
		if next.renewing {
			due = append(due, next)
		}
	}
	return due
}

// nothingDueLocked reports whether no lease is due at now (l.ren.mu held).
func (l *Locker) nothingDueLocked(now time.Time) bool {
	return len(l.ren.heap) == 0 || l.ren.heap[0].nextAt.After(now)
}

// maxRenewConns bounds the renewal batches one Locker sends at once
// (renewConns).
const maxRenewConns = 4

// renewConns is how many renewal batches one renewer run sends at once: 1
// where the database serializes writers (the write gate would queue them
// anyway), else maxRenewConns, and at most half the renew pool's limit on
// open connections (sql.DB.SetMaxOpenConns), so that renewals leave the
// other half to the application and to acquires.
func (l *Locker) renewConns() int {
	if !l.caps.Has(dialect.CapConcurrentWriters) {
		return 1
	}
	n := maxRenewConns
	if m := l.renewDB.Stats().MaxOpenConnections; m > 0 {
		n = min(n, max(m/2, 1))
	}
	return n
}

// stopRenewer disarms the timer and waits, until ctx ends, for a renewer
// run in progress (Close, after it released every lease).
func (l *Locker) stopRenewer(ctx context.Context) {
	l.ren.mu.Lock()
	l.ren.stopped = true
	if l.ren.timer != nil {
		l.ren.timer.Stop()
	}
	busy, done := l.ren.busy, l.ren.done
	l.ren.mu.Unlock()
	if busy {
		select {
		case <-done:
		case <-ctx.Done():
		}
	}
}

// renewBatch renews leases in one statement (or one per lease when the
// dialect has no RenewBatch) and requeues each. Once it has a connection
// it drops the leases whose renewal was stopped meanwhile (released, lost,
// orphaned) and marks the rest in flight until the statement returns, so
// Release can wait for them: no renewal of a lease reaches the database
// after its Release returned (SPEC H8). conns is how many batches the run
// sends at once; held, when not nil, is the connection kept across the
// run's batches (see renewer).
func (l *Locker) renewBatch(due []*Lease, conns int, held *boundConn) {
	n := len(due)
	l.batchStarted(n)
	conn, leave, err := l.renewConn(due, held)
	send := time.Now()
	var renewed map[string]renewal
	if err == nil {
		done := make(chan struct{})
		l.ren.mu.Lock()
		live := due[:0]
		for _, le := range due {
			if le.renewing {
				le.inflight = done
				live = append(live, le)
			}
		}
		l.ren.mu.Unlock()
		due = live
		send = time.Now()
		if len(due) > 0 {
			renewed, err = l.renewOn(conn, due, send)
		}
		if err != nil && held != nil {
			held.finish() // not kept after a failure
		}
		leave()
		l.ren.mu.Lock()
		for _, le := range due {
			le.inflight = nil
		}
		l.ren.mu.Unlock()
		close(done)
	}
	l.adaptBatch(len(due), err)
	l.requeueBatch(due, renewed, send, err)
	l.batchEnded(n, conns)
}

// requeueBatch settles each lease of a batch after its renewal: renewed
// (requeued for the next one), lost, or requeued for a retry.
func (l *Locker) requeueBatch(due []*Lease, renewed map[string]renewal, send time.Time, err error) {
	for _, le := range due {
		r, ok := renewed[le.id]
		switch {
		case r.skipped:
			// At its end of life (SPEC H10): nothing to renew, no
			// renewal follows; the watchdog ends the lease.
		case ok:
			le.renewed(send, r.exp, r.final)
			le.retryWait = 0
			if !r.final {
				l.requeue(le, le.hold.nextRenewal(l.cfg.ttl, send))
			}
		case err == nil:
			// The database answered and this lease was not among the
			// renewed: gone, expired or not ours (SPEC S4).
			le.lose(LossNotOurs, nil)
		default:
			le.mu.Lock()
			left := time.Until(le.trustedUntil)
			le.mu.Unlock()
			if left <= 0 {
				le.lose(LossWindowExhausted, err)
				continue
			}
			le.retryWait = min(max(2*le.retryWait, 5*time.Millisecond), max(l.cfg.ttl/10, 5*time.Millisecond))
			l.emit(Event{Kind: EventRenewRetry, Key: le.key, Mode: le.mode, LeaseID: le.id, Token: le.token, Err: err})
			l.cfg.logger.Debug("sqlease: renewal failed, retrying", "key", le.key, "lease_id", le.id, "token", le.token, "err", err, "window_left", left)
			l.requeue(le, time.Now().Add(min(le.retryWait, left)))
		}
	}
}

// adaptBatch sizes the next renewal batches after one of n leases ended
// with err. A failed batch of at least minSplit leases shrinks the limit:
// to a quarter when it ran out of time (each such failure costs its leases
// a renew timeout of their windows, so few may happen), else to half; so
// leases whose batch is too big to go through in time are retried in
// smaller ones instead of failing together until their windows end (SPEC
// H2). A smaller failed batch says nothing about size. A full batch that
// succeeds more than a TTL after the last shrink grows the limit by a
// quarter, up to renewBatchSize: probing for a bigger size again sooner
// could fail the same leases twice within their windows.
func (l *Locker) adaptBatch(n int, err error) {
	l.ren.mu.Lock()
	defer l.ren.mu.Unlock()
	limit := l.ren.limit
	switch {
	case err != nil && n >= minSplit:
		div := 2
		if errors.Is(err, context.DeadlineExceeded) {
			div = 4
		}
		limit = max(min(limit, n)/div, minSplit/2)
		l.ren.shrunk = time.Now()
	case err == nil && n >= limit && time.Since(l.ren.shrunk) > l.cfg.ttl:
		limit = min(limit+max(limit/4, 1), renewBatchSize)
	}
	l.ren.limit = limit
}

// minSplit is the smallest failed renewal batch that shrinks the batch
// limit (see adaptBatch).
const minSplit = 32

func (l *Locker) requeue(le *Lease, at time.Time) {
	l.ren.mu.Lock()
	defer l.ren.mu.Unlock()
	if !le.renewing {
		return
	}
	l.queueLocked(le, at)
}

// renewTimeoutFor bounds a renewal statement: the renew timeout, and never
// past the earliest trusted window of the batch.
func (l *Locker) renewTimeoutFor(leases []*Lease) time.Duration {
	timeout := l.cfg.renewTimeout
	for _, le := range leases {
		le.mu.Lock()
		d := time.Until(le.trustedUntil)
		le.mu.Unlock()
		if d > 0 && d < timeout {
			timeout = d
		}
	}
	return max(timeout, time.Millisecond)
}

// renewConn takes the write gate and a connection for a renewal, waiting
// no longer than the earliest trusted window of leases: the renew timeout
// then bounds only the statement, not a busy pool or a slow dial. Its
// errors are *notSentError.
//
// With held (see renewer) it keeps the connection across batches: it
// reuses held's when it enters the gate without waiting, held's lock wait
// ends in time for this batch and the pool has room (poolHasRoom);
// otherwise it returns held's to the pool first, so it never waits for the gate while holding a connection
// (the writer in the gate may be waiting for one). The returned func then
// leaves only the gate.
func (l *Locker) renewConn(leases []*Lease, held *boundConn) (*sql.Conn, func(), error) {
	window := time.Duration(0)
	for i, le := range leases {
		le.mu.Lock()
		d := time.Until(le.trustedUntil)
		le.mu.Unlock()
		if i == 0 || d < window {
			window = d
		}
	}
	// The renew timeout bounds the statement's lock waits too, also where
	// the driver's busy handler ignores the context (dialect.LockWaiter):
	// the renew pool's own bound is left alone only when it ends within
	// lockWaitSlack of the renew timeout.
	rt := l.renewTimeoutFor(leases)
	lw := lockWait{bound: rt, until: time.Now().Add(rt + lockWaitSlack)}
	if held != nil && held.conn != nil {
		if leave, ok := l.tryEnter(); ok {
			if held.wait <= time.Until(lw.until) && poolHasRoom(l.renewDB) {
				return held.conn, leave, nil
			}
			leave()
		}
		held.finish()
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(window, time.Millisecond))
	defer cancel()
	if held == nil {
		return l.writeConn(ctx, l.renewDB, lw)
	}
	leave, err := l.enter(ctx)
	if err != nil {
		return nil, nil, &notSentError{err}
	}
	c, err := l.boundConn(ctx, l.renewDB, lw)
	if err != nil {
		leave()
		return nil, nil, err
	}
	*held = c
	return c.conn, leave, nil
}

// poolHasRoom reports whether db could open or hand out another
// connection now: with every connection in use, another goroutine may be
// waiting for the one the renewer keeps between batches (an application
// query on a pool of one, say), so the renewer gives it back.
func poolHasRoom(db *sql.DB) bool {
	st := db.Stats()
	return st.MaxOpenConnections == 0 || st.InUse < st.MaxOpenConnections
}

// renewal is the outcome of one lease's renewal in a batch.
type renewal struct {
	exp     int64 // the new expiry, database microseconds
	final   bool  // it took the row to the lease's end of life (SPEC H10)
	skipped bool  // nothing sent: the lease is at its end of life
}

// renewOn renews leases through conn: one RenewBatch statement (for the
// leases renewed by the full TTL), or one Renew per lease. A lease near
// the end of its life (HoldAtMost, SPEC H10) is renewed alone, to that
// end. It returns the outcome of every lease renewed or skipped.
func (l *Locker) renewOn(conn *sql.Conn, leases []*Lease, send time.Time) (map[string]renewal, error) {
	renewed := map[string]renewal{}
	var full []*Lease
	var err error
	for _, le := range leases {
		ttl, final := le.hold.renewTTL(l.cfg.ttl, send)
		switch {
		case !final && l.st.renewBatch.ok:
			full = append(full, le)
			continue
		case ttl <= 0:
			renewed[le.id] = renewal{skipped: true}
			continue
		}
		exp, e := l.renewOne(conn, le, ttl)
		if e != nil && !errors.Is(e, errRenewNotFound) {
			err = e
			continue
		}
		if e == nil {
			renewed[le.id] = renewal{exp: exp, final: final}
		}
	}
	if len(full) > 0 {
		batch, e := l.renewMany(conn, full)
		if e != nil {
			return renewed, e
		}
		for id, exp := range batch {
			renewed[id] = renewal{exp: exp}
		}
	}
	return renewed, err
}

func (l *Locker) renewOne(conn *sql.Conn, le *Lease, ttl time.Duration) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), l.renewTimeoutFor([]*Lease{le}))
	defer cancel()
	var exp, now int64
	err := queryOne(ctx, l.st.replicated, conn, l.st.renew.SQL, l.st.renew.Args(map[string]any{
		"lease_id": le.id, "token": le.token, "ttl_us": ttl.Microseconds(),
	}), &exp, &now)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, errRenewNotFound
	}
	return exp, err
}

// renewMany sends one RenewBatch statement. @leases is a JSON array of
// "leaseID:token" strings (lease IDs are hex).
func (l *Locker) renewMany(conn *sql.Conn, leases []*Lease) (map[string]int64, error) {
	var b strings.Builder
	b.WriteByte('[')
	for i, le := range leases {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		b.WriteString(le.id)
		b.WriteByte(':')
		b.WriteString(strconv.FormatInt(le.token, 10))
		b.WriteByte('"')
	}
	b.WriteByte(']')
	ctx, cancel := context.WithTimeout(context.Background(), l.renewTimeoutFor(leases))
	defer cancel()
	rows, err := conn.QueryContext(ctx, l.st.renewBatch.SQL, l.st.renewBatch.Args(map[string]any{
		"leases": b.String(), "ttl_us": l.cfg.ttl.Microseconds(),
	})...)
	if err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(leases))
	for rows.Next() {
		var id string
		var exp, now int64
		if err := rows.Scan(&id, &exp, &now); err != nil {
			_ = rows.Close()
			return nil, err
		}
		out[id] = exp
	}
	// An error that arrives after the rows (a procedure's COMMIT that
	// failed, a connection lost before the statement completed) means the
	// renewal may not have taken effect: the batch failed (SPEC H1).
	drainResults(rows)
	if err := rows.Err(); err != nil {
		_ = rows.Close()
		return nil, err
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	if l.st.replicated && ctx.Err() != nil {
		return nil, errUnconfirmed
	}
	return out, nil
}
