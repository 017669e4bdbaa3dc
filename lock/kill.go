package lock

// Stopping an abandoned acquire statement on the server, for dialects whose
// driver only drops the connection when a statement's context ends
// (dialect.Killer: MySQL), so that nothing is granted after the acquire
// returned (SPEC H6).

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"

	"github.com/sqlease/sqlease/dialect"
)

// killWait bounds how long an abandoned acquire waits for its killed
// statement's reply (the kill included) before it drops the connection.
const killWait = 250 * time.Millisecond

// killSlot is the acquire statement in flight of one attempt, on a
// dialect.Killer dialect: its connection and session ID, and whether the
// caller gave up (stopped) and the statement was killed.
type killSlot struct {
	l       *Locker
	k       dialect.Killer
	mu      sync.Mutex
	conn    *sql.Conn // the statement's connection while it runs
	id      int64
	stopped bool          // the caller gave up: no statement starts any more
	killed  bool          // a kill was sent while a statement ran
	done    chan struct{} // closed when the statement in flight returns
}

type killSlotKey struct{}

// watchCaller arranges what happens to the statements of one attempt
// (run under sctx, cancelled by cancel) when the caller gives up: its
// context ends, or the hard deadline passes. Without dialect.Killer the
// statement may finish for acquireCancelGrace, then the driver cancels it.
// With it, a statement in flight is killed on the server at once and its
// reply awaited (killWait); the returned slot, nil without Killer, is in
// the returned context for writeConn.
func (w *waiter) watchCaller(sctx context.Context, cancel context.CancelFunc) (context.Context, *killSlot, func()) {
	k, ok := w.l.d.(dialect.Killer)
	if !ok {
		stop := context.AfterFunc(w.ctx, func() { time.AfterFunc(acquireCancelGrace, cancel) })
		return sctx, nil, func() { stop() }
	}
	s := &killSlot{l: w.l, k: k}
	var once sync.Once
	giveUp := func() {
		once.Do(func() {
			if !s.stop() {
				time.AfterFunc(acquireCancelGrace, cancel)
				return
			}
			cancel()
		})
	}
	stop := context.AfterFunc(w.ctx, giveUp)
	var timer *time.Timer
	if !w.hard.IsZero() {
		timer = time.AfterFunc(time.Until(w.hard), giveUp)
	}
	return context.WithValue(sctx, killSlotKey{}, s), s, func() {
		stop()
		if timer != nil {
			timer.Stop()
		}
	}
}

// stop marks the slot stopped and kills the statement in flight, if any,
// waiting for its reply for up to killWait. It reports whether a statement
// was in flight.
func (s *killSlot) stop() bool {
	s.mu.Lock()
	s.stopped = true
	if s.conn == nil {
		s.mu.Unlock()
		return false
	}
	s.killed = true
	id, done := s.id, s.done
	s.mu.Unlock()
	kctx, cancel := context.WithTimeout(context.Background(), killWait)
	defer cancel()
	if err := s.k.Kill(kctx, s.l.db, id); err != nil {
		s.l.cfg.logger.Debug("sqlease: killing an abandoned acquire statement failed; dropping its connection", "session", id, "err", err)
		return true
	}
	select {
	case <-done:
	case <-kctx.Done():
	}
	return true
}

// enter records conn, about to run a statement of the attempt, and its
// session ID. It fails, so that nothing is sent, once the caller gave up.
func (s *killSlot) enter(ctx context.Context, conn *sql.Conn) error {
	id, err := s.k.SessionID(ctx, conn)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return fmt.Errorf("acquire abandoned: %w", context.Canceled)
	}
	s.conn, s.id, s.done = conn, id, make(chan struct{})
	return nil
}

// leave records that the statement on conn returned; a connection whose
// statement was killed is discarded (its session may still hold what the
// statement began: a transaction, named locks).
func (s *killSlot) leave(conn *sql.Conn) {
	s.mu.Lock()
	killed := s.killed && s.conn == conn
	if s.conn == conn {
		close(s.done)
		s.conn = nil
	}
	s.mu.Unlock()
	if killed {
		_ = conn.Raw(func(any) error { return errBadConn })
	}
}

// outcome returns the attempt's error once the caller gave up: a killed
// statement's outcome is unknown to the caller, so its error, or its
// success, is reported as a cancellation, which the waiter undoes
// (uncertain). A success is not to be trusted either: it may have
// committed before the kill landed, but MariaDB can also interrupt a read
// inside the acquire procedure without an error (the read returns no row,
// which the procedure takes for "no holder"), so a killed CALL can grant
// over a live conflicting lease and report success (SPEC S1).
func (s *killSlot) outcome(err error) error {
	if s == nil {
		return err
	}
	s.mu.Lock()
	killed := s.killed
	s.mu.Unlock()
	if !killed {
		return err
	}
	if err == nil {
		return fmt.Errorf("%w: acquire statement killed on the server", context.Canceled)
	}
	return fmt.Errorf("%w: acquire statement killed on the server: %w", context.Canceled, err)
}

// killSlotFrom returns the attempt's slot carried by ctx, or nil.
func killSlotFrom(ctx context.Context) *killSlot {
	s, _ := ctx.Value(killSlotKey{}).(*killSlot)
	return s
}
