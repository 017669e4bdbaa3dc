package lock

import (
	"container/heap"
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"
	"time"
)

// The renewer is one goroutine per Locker, running while the Locker holds
// leases. It renews every lease due (TTL/3 after its last successful acquire
// or renew) in batches: one RenewBatch statement per batch of up to
// renewBatchSize leases, so a Locker holding 10,000 leases sends O(1)
// statements per renewal interval. A lease whose renewal failed is retried
// with backoff until its trusted window ends (SPEC H2); a lease the
// database no longer has is lost at once.

const renewBatchSize = 1000

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

// schedule (re)queues le for renewal at at, starting the renewer if needed.
func (l *Locker) schedule(le *Lease, at time.Time) {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	le.renewing = true
	le.nextAt = at
	if le.heapIndex >= 0 && le.heapIndex < len(l.rheap) && l.rheap[le.heapIndex] == le {
		heap.Fix(&l.rheap, le.heapIndex)
	} else {
		heap.Push(&l.rheap, le)
	}
	if !l.rrunning {
		l.rrunning = true
		l.rdone = make(chan struct{})
		go l.renewer(l.rdone)
	}
	select {
	case l.rwake <- struct{}{}:
	default:
	}
}

// unschedule stops renewing le (Release, loss, Orphan).
func (l *Locker) unschedule(le *Lease) {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	le.renewing = false
	if le.heapIndex >= 0 && le.heapIndex < len(l.rheap) && l.rheap[le.heapIndex] == le {
		heap.Remove(&l.rheap, le.heapIndex)
		if len(l.rheap) == 0 {
			// Let the renewer see the empty heap and exit now.
			select {
			case l.rwake <- struct{}{}:
			default:
			}
		}
	}
}

func (l *Locker) renewer(done chan struct{}) {
	defer close(done)
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		l.rmu.Lock()
		if len(l.rheap) == 0 {
			l.rrunning = false
			l.rmu.Unlock()
			return
		}
		wait := time.Until(l.rheap[0].nextAt)
		l.rmu.Unlock()
		if wait > 0 {
			t.Reset(wait)
			select {
			case <-t.C:
			case <-l.rwake:
				if !t.Stop() {
					<-t.C
				}
				continue
			}
		}
		// Take every lease due now, or within a small slack so that
		// leases acquired close together share a batch.
		slack := l.cfg.ttl / 30
		now := time.Now()
		var due []*Lease
		l.rmu.Lock()
		for len(l.rheap) > 0 && !l.rheap[0].nextAt.After(now.Add(slack)) && len(due) < renewBatchSize {
			le := heap.Pop(&l.rheap).(*Lease)
			if le.renewing {
				due = append(due, le)
			}
		}
		l.rmu.Unlock()
		if len(due) > 0 {
			l.renewBatch(due)
		}
	}
}

// renewBatch renews leases in one statement (or one per lease when the
// dialect has no RenewBatch) and requeues each.
func (l *Locker) renewBatch(due []*Lease) {
	send := time.Now()
	var renewed map[string]int64
	var err error
	if l.st.renewBatch.ok {
		renewed, err = l.renewMany(due)
	} else {
		renewed = map[string]int64{}
		for _, le := range due {
			exp, e := l.renewOne(le)
			if e != nil && !errors.Is(e, errRenewNotFound) {
				err = e
				continue
			}
			if e == nil {
				renewed[le.id] = exp
			}
		}
	}
	for _, le := range due {
		exp, ok := renewed[le.id]
		switch {
		case ok:
			le.renewed(send, exp)
			le.retryWait = 0
			l.requeue(le, send.Add(l.cfg.ttl/3))
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

func (l *Locker) requeue(le *Lease, at time.Time) {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	if !le.renewing {
		return
	}
	le.nextAt = at
	if le.heapIndex >= 0 && le.heapIndex < len(l.rheap) && l.rheap[le.heapIndex] == le {
		heap.Fix(&l.rheap, le.heapIndex)
	} else {
		heap.Push(&l.rheap, le)
	}
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
// then bounds only the statement, not a busy pool or a slow dial.
func (l *Locker) renewConn(leases []*Lease) (*sql.Conn, func(), error) {
	window := time.Duration(0)
	for i, le := range leases {
		le.mu.Lock()
		d := time.Until(le.trustedUntil)
		le.mu.Unlock()
		if i == 0 || d < window {
			window = d
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(window, time.Millisecond))
	defer cancel()
	leave, err := l.enter(ctx)
	if err != nil {
		return nil, nil, err
	}
	conn, err := l.renewDB.Conn(ctx)
	if err != nil {
		leave()
		return nil, nil, err
	}
	return conn, func() { _ = conn.Close(); leave() }, nil
}

func (l *Locker) renewOne(le *Lease) (int64, error) {
	conn, leave, err := l.renewConn([]*Lease{le})
	if err != nil {
		return 0, err
	}
	defer leave()
	ctx, cancel := context.WithTimeout(context.Background(), l.renewTimeoutFor([]*Lease{le}))
	defer cancel()
	var exp, now int64
	err = conn.QueryRowContext(ctx, l.st.renew.SQL, l.st.renew.Args(map[string]any{
		"lease_id": le.id, "token": le.token, "ttl_us": l.cfg.ttl.Microseconds(),
	})...).Scan(&exp, &now)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, errRenewNotFound
	}
	return exp, err
}

// renewMany sends one RenewBatch statement. @leases is a JSON array of
// "leaseID:token" strings (lease IDs are hex).
func (l *Locker) renewMany(leases []*Lease) (map[string]int64, error) {
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
	conn, leave, err := l.renewConn(leases)
	if err != nil {
		return nil, err
	}
	defer leave()
	ctx, cancel := context.WithTimeout(context.Background(), l.renewTimeoutFor(leases))
	defer cancel()
	rows, err := conn.QueryContext(ctx, l.st.renewBatch.SQL, l.st.renewBatch.Args(map[string]any{
		"leases": b.String(), "ttl_us": l.cfg.ttl.Microseconds(),
	})...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[string]int64, len(leases))
	for rows.Next() {
		var id string
		var exp, now int64
		if err := rows.Scan(&id, &exp, &now); err != nil {
			return nil, err
		}
		out[id] = exp
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return out, nil
}
