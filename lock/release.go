package lock

// Letting go: deleting lease rows, undoing abandoned acquires, removing
// markers and FIFO tickets (SPEC H5, H6, H8).

import (
	"context"
	"time"
)

// undo removes what acquire attempts under leaseID may have committed
// without the engine seeing it: the lease (grant) and the waiter's marker
// (SPEC H6). It works synchronously until hard plus undoGrace (or for the
// release timeout when hard is zero), then hands what is left to a
// background cleanup bounded by one TTL, so the caller's deadline holds
// (SPEC H9). An unfinished undo of a possible grant is logged at WARN; the
// lease then ends by expiry.
func (l *Locker) undo(ctx context.Context, key, leaseID string, grant, marker bool, hard time.Time) {
	if !grant && !marker {
		return
	}
	budget := l.cfg.releaseTimeout
	if !hard.IsZero() {
		budget = min(budget, max(time.Until(hard), 0)+undoGrace)
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), budget)
	err := l.undoOnce(uctx, key, leaseID, &grant, &marker)
	cancel()
	if err == nil {
		return
	}
	l.mu.Lock()
	closed := l.closed
	if !closed {
		l.cleanups.Add(1)
	}
	l.mu.Unlock()
	warn := func(err error) {
		if grant {
			l.cfg.logger.Warn("sqlease: undo of an abandoned acquire failed; the lease, if granted, ends by expiry", "key", key, "lease_id", leaseID, "err", err)
		} else {
			l.cfg.logger.Debug("sqlease: clearing a pending-writer marker failed; it ends by expiry", "key", key, "lease_id", leaseID, "err", err)
		}
	}
	if closed {
		warn(err)
		return
	}
	go func() {
		defer l.cleanups.Done()
		bctx, cancel := context.WithTimeout(context.Background(), l.cfg.ttl)
		defer cancel()
		if err := l.undoOnce(bctx, key, leaseID, &grant, &marker); err != nil {
			warn(err)
		}
	}()
}

// undoOnce deletes the lease leaseID (when *grant) and its marker on key
// (when *marker), retrying transient errors until ctx ends; it clears each
// flag once done.
func (l *Locker) undoOnce(ctx context.Context, key, leaseID string, grant, marker *bool) error {
	return l.retryTransient(ctx, untilCtx, func(ctx context.Context) error {
		if *grant {
			if _, err := l.releaseRows(ctx, leaseID, 0); err != nil {
				return err
			}
			*grant = false
		}
		if *marker {
			if err := l.deleteMarker(ctx, key, leaseID); err != nil {
				return err
			}
			*marker = false
		}
		return nil
	})
}

// releaseRows runs the Release statement and returns how many holder rows
// it deleted; its lock waits end by ctx's deadline (waitUntil).
func (l *Locker) releaseRows(ctx context.Context, leaseID string, token int64) (int64, error) {
	conn, done, err := l.writeConn(ctx, l.db, waitUntil(ctx))
	if err != nil {
		return 0, err
	}
	defer done()
	var n int64
	err = queryConn(ctx, conn, l.st.release.SQL, bindArgs(l.st.release.Stmt, l.releaseVals(leaseID, token)), func(rowScanner) error { n++; return nil })
	if err != nil {
		return 0, err
	}
	return n, nil
}

// dequeue deletes the FIFO ticket ticketID of key when its waiter gives up
// (SPEC W6), and wakes the waiters of key in this process: one behind it
// may be next. It takes at most undoGrace, so the acquire's deadline holds
// (SPEC H9); on failure the ticket ends by expiry (one marker TTL).
func (l *Locker) dequeue(ctx context.Context, key, ticketID string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoGrace)
	defer cancel()
	err := l.retryTransient(rctx, untilCtx, func(ctx context.Context) error {
		conn, done, err := l.writeConn(ctx, l.db, waitUntil(ctx))
		if err != nil {
			return err
		}
		defer done()
		_, err = conn.ExecContext(ctx, l.st.dequeue.SQL, l.st.dequeue.Args(map[string]any{"key": key, "ticket_id": ticketID})...)
		return err
	})
	if err != nil {
		l.cfg.logger.Debug("sqlease: deleting a FIFO ticket failed; it ends by expiry", "key", key, "ticket_id", ticketID, "err", err)
		return
	}
	hubWake(l.channel, key, "")
}

// deleteMarker runs the ClearMarker statement; its lock waits end by
// ctx's deadline (waitUntil).
func (l *Locker) deleteMarker(ctx context.Context, key, leaseID string) error {
	conn, done, err := l.writeConn(ctx, l.db, waitUntil(ctx))
	if err != nil {
		return err
	}
	defer done()
	_, err = conn.ExecContext(ctx, l.st.clearMarker.SQL, l.st.clearMarker.Args(map[string]any{"key": key, "lease_id": leaseID})...)
	return err
}
