package lock

// Running a dialect's statements: write scripts, the write gate and
// bounded lock waits, rollback of failed scripts (SPEC S6, H9).

import (
	"context"
	"database/sql"
	"time"

	"github.com/sqlease/sqlease/dialect"
)

// script runs statements in order on one connection (see writeConn; wait
// bounds its lock waits): one alone in autocommit, several in one write
// transaction; with txOpts, always in a transaction begun with them. With
// scan, the last statement is a query whose rows scan reads; otherwise it
// returns the last statement's RowsAffected.
func (l *Locker) script(ctx context.Context, db *sql.DB, stmts []dialect.Stmt, vals map[string]any, scan func(*sql.Rows) error, txOpts *sql.TxOptions, wait time.Duration) (int64, error) {
	type runner interface {
		ExecContext(context.Context, string, ...any) (sql.Result, error)
		QueryContext(context.Context, string, ...any) (*sql.Rows, error)
	}
	run := func(r runner) (int64, error) {
		var affected int64
		for i, s := range stmts {
			args := s.Args(vals)
			if i == len(stmts)-1 && scan != nil {
				rows, err := r.QueryContext(ctx, s.SQL, args...)
				if err != nil {
					return 0, err
				}
				err = scan(rows)
				if cerr := rows.Close(); err == nil {
					err = cerr
				}
				return 0, err
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
	conn, done, err := l.writeConn(ctx, db, wait)
	if err != nil {
		return 0, err
	}
	defer done()
	if len(stmts) == 1 && txOpts == nil {
		return run(conn)
	}
	begin := l.st.beginWrite
	if txOpts == nil && begin == "" && l.st.scriptIsolation != sql.LevelDefault {
		txOpts = &sql.TxOptions{Isolation: l.st.scriptIsolation}
	}
	if begin == "" || txOpts != nil {
		tx, err := conn.BeginTx(ctx, txOpts)
		if err != nil {
			return 0, err
		}
		n, err := run(tx)
		if err != nil {
			_ = tx.Rollback()
			return 0, err
		}
		return n, tx.Commit()
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

// writeConn takes the write gate and a connection of db for an engine
// statement. On a dialect.LockWaiter dialect, a positive wait bounds the
// connection's lock waits until done, which restores them (or discards the
// connection) and leaves the gate. Its errors are *notSentError.
func (l *Locker) writeConn(ctx context.Context, db *sql.DB, wait time.Duration) (*sql.Conn, func(), error) {
	leave, err := l.enter(ctx)
	if err != nil {
		return nil, nil, &notSentError{err}
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		leave()
		return nil, nil, &notSentError{err}
	}
	var restore func(context.Context) error
	if lw, ok := l.d.(dialect.LockWaiter); ok && wait > 0 && !l.lockWaitEndsInTime(ctx, conn) {
		if r, ok := l.d.(dialect.LockWaitReader); ok && l.lockWait.Load() > 0 {
			// The pool's bound is known: set ours, and put it back.
			pool := time.Duration(l.lockWait.Load() - 1)
			err = r.PutLockWait(ctx, conn, wait)
			restore = func(ctx context.Context) error { return r.PutLockWait(ctx, conn, pool) }
		} else {
			restore, err = lw.SetLockWait(ctx, conn, wait)
		}
		if err != nil {
			_ = conn.Raw(func(any) error { return errBadConn })
			_ = conn.Close()
			leave()
			return nil, nil, &notSentError{err}
		}
	}
	return conn, func() {
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
		leave()
	}, nil
}

// lockWaitSlack is how far past ctx's deadline the pool's own lock-wait
// bound may end and still be left alone: the statement's wait then ends at
// most this much late, well inside H9's documented slack (500 ms), and a
// release under the default 5 s release timeout on a pool with a 5 s busy
// timeout (mattn's default, the DSN the docs recommend) sends no lock-wait
// statements (SPEC H5, H9).
const lockWaitSlack = 100 * time.Millisecond

// lockWaitEndsInTime reports whether the pool's own lock-wait bound
// (dialect.LockWaitReader, read once per Locker) ends before ctx's
// deadline plus lockWaitSlack, so that no SetLockWait is needed for a
// statement under ctx.
func (l *Locker) lockWaitEndsInTime(ctx context.Context, conn *sql.Conn) bool {
	r, ok := l.d.(dialect.LockWaitReader)
	if !ok {
		return false
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		return false
	}
	v := l.lockWait.Load()
	if v == 0 {
		d, err := r.LockWait(ctx, conn)
		if err != nil {
			return false
		}
		v = int64(d) + 1
		l.lockWait.Store(v)
	}
	return time.Duration(v-1) <= time.Until(deadline)+lockWaitSlack
}
