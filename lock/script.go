package lock

// Running a dialect's statements: write scripts, the write gate and
// bounded lock waits, rollback of failed scripts (SPEC S6, H9).

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/sqlease/sqlease/dialect"
)

// script runs statements in order on one connection (see writeConn; lw
// bounds its lock waits): one alone in autocommit, several in one write
// transaction; with txOpts, always in a transaction begun with them. With
// scan, the last statement is a query and scan is called for each of its
// rows (read straight from the driver, queryConn, unless the script runs in
// a database/sql transaction); otherwise it returns the last statement's
// RowsAffected.
func (l *Locker) script(ctx context.Context, db *sql.DB, stmts []dialect.Stmt, vals namedArgs, scan func(rowScanner) error, txOpts *sql.TxOptions, lw lockWait) (int64, error) {
	type runner interface {
		ExecContext(context.Context, string, ...any) (sql.Result, error)
		QueryContext(context.Context, string, ...any) (*sql.Rows, error)
	}
	run := func(r runner) (int64, error) {
		var affected int64
		for i, s := range stmts {
			args := bindArgs(s, vals)
			if i == len(stmts)-1 && scan != nil {
				if c, ok := r.(*sql.Conn); ok {
					return 0, queryConn(ctx, c, s.SQL, args, scan)
				}
				rows, err := r.QueryContext(ctx, s.SQL, args...)
				if err != nil {
					return 0, err
				}
				return 0, eachRow(rows, scan)
			}
			res, err := r.ExecContext(ctx, s.SQL, args...)
			if err != nil {
				return 0, err
			}
			if affected, err = res.RowsAffected(); err != nil {
				return 0, err
			}
		}
		return affected, nil
	}
	conn, done, err := l.writeConn(ctx, db, lw)
	if err != nil {
		return 0, err
	}
	defer done()
	if len(stmts) == 1 && txOpts == nil {
		return run(conn)
	}
	begin := l.st.beginWrite
	if begin == "" || txOpts != nil {
		tx, err := conn.BeginTx(ctx, txOpts)
		if err != nil {
			return 0, err
		}
		n, err := run(tx)
		if err != nil {
			_ = tx.Rollback()
			return 0, txDone(ctx, err)
		}
		return n, txDone(ctx, tx.Commit())
	}
	if _, err := conn.ExecContext(ctx, begin); err != nil {
		if ctx.Err() != nil || l.uncertain(err) {
			// The BEGIN may have taken effect although the call failed
			// (modernc.org/sqlite reports the context's error even when
			// BEGIN IMMEDIATE went through): end any transaction before
			// the connection goes back to the pool, or discard it, so no
			// pooled connection keeps the write lock (SPEC H9).
			l.rollbackOrDiscard(ctx, conn)
		}
		return 0, err
	}
	n, err := run(conn)
	if err == nil {
		_, err = conn.ExecContext(ctx, "COMMIT")
	}
	if err != nil {
		l.rollbackOrDiscard(ctx, conn)
		return 0, err
	}
	return n, nil
}

// txDone reports a transaction that database/sql ended because ctx ended
// (sql.ErrTxDone from a statement or Commit after it rolled back) as ctx's
// error, wrapping both: the caller then treats the outcome as unknown
// (uncertain) and retries or undoes it like any cancelled statement,
// instead of failing the acquire with ErrTxDone (seen under load with
// sessions defaulting to REPEATABLE READ, SPEC S6).
func txDone(ctx context.Context, err error) error {
	if err != nil && errors.Is(err, sql.ErrTxDone) && ctx.Err() != nil {
		return fmt.Errorf("%w: %w", ctx.Err(), err)
	}
	return err
}

// rollbackOrDiscard ends conn's transaction, if any, with a ROLLBACK on a
// context detached from ctx and bounded by rollbackTimeout; when that fails
// (no transaction was open, or the connection is broken) the connection is
// discarded instead of going back to the pool: a pooled connection must
// never keep a transaction, and with it the database's write lock, open.
func (l *Locker) rollbackOrDiscard(ctx context.Context, conn *sql.Conn) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	if _, err := conn.ExecContext(rctx, "ROLLBACK"); err != nil {
		_ = conn.Raw(func(any) error { return errBadConn })
	}
}

// rollbackTimeout bounds the ROLLBACK of a failed write script; it takes
// no lock, so it is quick unless the connection is broken.
const rollbackTimeout = 250 * time.Millisecond

// notSentError wraps an error that happened before a statement was sent
// (no connection, the write gate not entered): nothing took effect.
type notSentError struct{ err error }

func (e *notSentError) Error() string { return e.err.Error() }

func (e *notSentError) Unwrap() error { return e.err }

// lockWait says how one engine write may wait for a database lock in a
// handler its context cannot interrupt (dialect.LockWaiter: SQLite's busy
// handler). The pool's own bound (dialect.LockWaitReader, read once per
// pool) is left alone when it ends by until; otherwise the connection's
// bound is set to bound for the statement and restored afterwards. A zero
// bound leaves the connection alone; a zero until always sets it.
type lockWait struct {
	bound time.Duration
	until time.Time
}

// lockWaitSlack is how far past a write's deadline the pool's own
// lock-wait bound may end and still be left alone: the wait then ends at
// most this much late, well inside H9's documented slack (500 ms), and a
// release under the default 5 s release timeout on a pool with a 5 s busy
// timeout (mattn's default, the DSN the docs recommend) sends no lock-wait
// statements (SPEC H5, H9).
const lockWaitSlack = 100 * time.Millisecond

// waitUntil is the lockWait of a write that must end by ctx's deadline
// and may be cut short by nothing else (release, undo, clearing a marker
// or a ticket): waits of at most maxLockWait (the engine retries after),
// or the pool's own bound when it ends within lockWaitSlack of the
// deadline. Without a deadline the bound is always set.
func waitUntil(ctx context.Context) lockWait {
	d, ok := ctx.Deadline()
	if !ok {
		return lockWait{bound: maxLockWait}
	}
	return lockWait{bound: min(maxLockWait, max(time.Until(d), time.Millisecond)), until: d.Add(lockWaitSlack)}
}

// writeConn takes the write gate and a connection of db for an engine
// statement. On a dialect.LockWaiter dialect it bounds the connection's
// lock waits as lw says until done, which restores them (or discards the
// connection) and leaves the gate. When ctx carries an acquire attempt's
// killSlot (dialect.Killer), the connection is recorded there until done,
// so the caller giving up can stop its statement on the server (SPEC H6).
// Its errors are *notSentError.
func (l *Locker) writeConn(ctx context.Context, db *sql.DB, lw lockWait) (*sql.Conn, func(), error) {
	leave, err := l.enter(ctx)
	if err != nil {
		return nil, nil, &notSentError{err}
	}
	c, err := l.boundConn(ctx, db, lw)
	if err != nil {
		leave()
		return nil, nil, err
	}
	slot := killSlotFrom(ctx)
	if slot != nil {
		if err := slot.enter(ctx, c.conn); err != nil {
			c.finish()
			leave()
			return nil, nil, &notSentError{err}
		}
	}
	return c.conn, func() {
		if slot != nil {
			slot.leave(c.conn)
		}
		c.finish()
		leave()
	}, nil
}

// boundConn is a connection whose lock waits are bounded for the engine
// (dialect.LockWaiter); finish restores the bound and returns it to its
// pool.
type boundConn struct {
	conn    *sql.Conn
	restore func(context.Context) error // nil: nothing to restore
	wait    time.Duration               // conn's lock-wait bound now; 0: none the engine knows of
}

// finish restores c's lock wait (discarding it when that fails) and
// returns it to its pool; on a zero boundConn it does nothing.
func (c *boundConn) finish() {
	if c.conn != nil {
		finish(c.conn, c.restore)
	}
	*c = boundConn{}
}

// boundConn takes a connection of db and, on a dialect.LockWaiter
// dialect, bounds its lock waits as lw says. Its errors are
// *notSentError.
func (l *Locker) boundConn(ctx context.Context, db *sql.DB, lw lockWait) (boundConn, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return boundConn{}, &notSentError{err}
	}
	c := boundConn{conn: conn}
	w, ok := l.d.(dialect.LockWaiter)
	if !ok || lw.bound <= 0 {
		return c, nil
	}
	pool, known := l.poolLockWait(ctx, db, conn)
	switch {
	case known && !lw.until.IsZero() && pool <= time.Until(lw.until):
		// The pool's own bound ends in time: leave it.
		c.wait = pool
	case known:
		// The pool's bound is known (so the dialect is a
		// LockWaitReader): set ours, and put it back.
		r := l.d.(dialect.LockWaitReader)
		err = r.PutLockWait(ctx, conn, lw.bound)
		c.restore = func(ctx context.Context) error { return r.PutLockWait(ctx, conn, pool) }
		c.wait = lw.bound
	default:
		c.restore, err = w.SetLockWait(ctx, conn, lw.bound)
		c.wait = lw.bound
	}
	if err != nil {
		_ = conn.Raw(func(any) error { return errBadConn })
		_ = conn.Close()
		return boundConn{}, &notSentError{err}
	}
	return c, nil
}

// finish restores conn's lock wait (discarding it when that fails) and
// returns it to its pool.
func finish(conn *sql.Conn, restore func(context.Context) error) {
	if restore != nil {
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if err := restore(rctx); err != nil {
			// Never hand the application a connection with the
			// engine's lock wait.
			_ = conn.Raw(func(any) error { return errBadConn })
		}
		cancel()
	}
	_ = conn.Close()
}

// poolLockWait returns db's own lock-wait bound (dialect.LockWaitReader),
// read through conn the first time and cached per pool (the main pool and
// WithRenewDB's may differ), and whether it is known.
func (l *Locker) poolLockWait(ctx context.Context, db *sql.DB, conn *sql.Conn) (time.Duration, bool) {
	r, ok := l.d.(dialect.LockWaitReader)
	if !ok {
		return 0, false
	}
	if v, ok := l.lockWaits.Load(db); ok {
		return v.(time.Duration), true
	}
	d, err := r.LockWait(ctx, conn)
	if err != nil {
		return 0, false
	}
	l.lockWaits.Store(db, d)
	return d, true
}
