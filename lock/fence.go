package lock

// Fenced writes (SPEC F1, F2): Fence inside the caller's transaction,
// RunInTx and RunFenced around one. On dialects whose Fence changes session
// settings that outlive the transaction (Statements.FenceEnd: MySQL's
// idle-transaction timeouts), RunInTx runs it on a connection of its own
// and puts the settings back before the connection returns to the pool.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Fence checks, inside the caller's transaction tx, that this exact lease is
// still live in database time, and keeps it from being taken over until tx
// ends (SPEC F1): PostgreSQL holds the holder row FOR KEY SHARE; SQLite
// takes the database write lock, so on SQLite Fence must be the first
// statement of tx. Renewals are not blocked on PostgreSQL (SPEC H7).
//
// With dialect.CapFenceIdleTimeout the server ends tx when it sits idle
// for about the TTL. PostgreSQL scopes that bound to tx; MySQL sets it on
// the session (MariaDB's idle_transaction_timeout, MySQL 8's
// wait_timeout, in whole seconds): RunInTx puts it back once the
// transaction ended, but after Fence in a transaction of your own the
// connection keeps it, so a later transaction on that pooled connection
// idle for longer than the TTL is ended too. Prefer RunInTx there.
//
// Errors: a *LeaseLostError (ErrLeaseLost) when the lease is lost, locally
// or in the database; tx must then not commit (RunInTx rolls it back; SPEC
// F2). An error matching ErrNotHeld and ErrReleased after Release (not a
// loss: the caller released the lease). errors.ErrUnsupported when the
// dialect has no fence. Otherwise the database's error.
func (le *Lease) Fence(ctx context.Context, tx *sql.Tx) error {
	l := le.l
	if tx == nil {
		return inputErr("transaction", "nil", "Fence needs the caller's *sql.Tx")
	}
	if !l.st.fence.ok {
		return fmt.Errorf("lock: fence %q: dialect %q: %w", le.key, l.d.Name(), errors.ErrUnsupported)
	}
	if err := le.Err(); err != nil {
		if errors.Is(err, ErrReleased) {
			// A programming error, not a loss (SPEC F1).
			return fmt.Errorf("lock: fence %q token %d: %w (%w)", le.key, le.token, ErrNotHeld, ErrReleased)
		}
		return err
	}
	var exp, now int64
	err := tx.QueryRowContext(ctx, l.st.fence.SQL, l.st.fence.Args(map[string]any{"lease_id": le.id, "token": le.token, "ttl_us": l.cfg.ttl.Microseconds()})...).Scan(&exp, &now)
	if errors.Is(err, sql.ErrNoRows) {
		return le.lose(LossFenceFailed, nil)
	}
	if err != nil {
		return fmt.Errorf("lock: fence %q token %d: %w", le.key, le.token, err)
	}
	return nil
}

// RunInTx runs fn in a transaction on db fenced by the lease: it begins the
// transaction with opts, runs Fence as its first statement, runs fn, and
// commits only if the fence held and the lease was not lost meanwhile;
// otherwise it rolls back (SPEC F1, F2). db must be the database the lease
// lives in.
//
// Errors: a *LeaseLostError (ErrLeaseLost) when the fence failed or the
// lease was lost before commit (nothing is committed); an error matching
// ErrNotHeld and ErrReleased when the lease was released before the fence
// (nothing is begun past it); fn's error (rolled back); or the database's
// error.
func (le *Lease) RunInTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions, fn func(ctx context.Context, tx *sql.Tx) error) error {
	if db == nil {
		return inputErr("database", "nil", "RunInTx needs the *sql.DB the lease lives in")
	}
	if le.l.st.fenceEnd.ok {
		return le.runOnConn(ctx, db, opts, fn)
	}
	return RunFenced(ctx, le, func(ctx context.Context) (*sql.Tx, *sql.Tx, error) {
		tx, err := db.BeginTx(ctx, opts)
		return tx, tx, err
	}, fn)
}

// RunFenced is the protocol of RunInTx for any transaction type that wraps
// a *sql.Tx (bun.Tx, *sqlx.Tx; used by the adapters): begin opens the
// transaction and returns it with its *sql.Tx; RunFenced fences that first,
// runs fn, and commits only if the fence held and the lease was not lost
// meanwhile; otherwise, or when fn fails or panics, it rolls back (SPEC F1,
// F2). A lease released meanwhile by another goroutine is not lost: the
// fence keeps its row until the transaction ends. A begin or fence that
// fails with a transient error is retried (rolled back, begun again) while
// the lease's trusted window lasts (SPEC S6).
//
// Errors: as RunInTx; a nil lease, begin or fn is an *InputError.
func RunFenced[T interface {
	Commit() error
	Rollback() error
}](ctx context.Context, lease *Lease, begin func(context.Context) (T, *sql.Tx, error), fn func(context.Context, T) error) error {
	switch {
	case lease == nil:
		return inputErr("lease", "nil", "pass the *Lease to fence with")
	case begin == nil:
		return inputErr("begin function", "nil", "pass a function that opens the transaction")
	case fn == nil:
		return inputErr("function", "nil", "RunInTx needs a function to run")
	}
	// The transaction is begun and fenced again when the fence fails with
	// a transient error (a serialization failure under a caller's
	// REPEATABLE READ or SERIALIZABLE default; SPEC S6), while the lease's
	// trusted window lasts: fn has not run yet.
	var tx T
	err := lease.l.retryTransient(ctx, lease.Remaining(), func(ctx context.Context) error {
		t, raw, err := begin(ctx)
		if err != nil {
			return fmt.Errorf("lock: fenced transaction %q: begin: %w", lease.key, err)
		}
		if err := lease.Fence(ctx, raw); err != nil {
			_ = t.Rollback()
			return err
		}
		tx = t
		return nil
	})
	if err != nil {
		return err
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback()
		}
	}()
	if err := fn(ctx, tx); err != nil {
		return err
	}
	if err := lease.Err(); err != nil && !errors.Is(err, ErrReleased) {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("lock: fenced transaction %q: commit: %w", lease.key, err)
	}
	committed = true
	return nil
}

// fenceEndTimeout bounds the FenceEnd statement; it takes no lock.
const fenceEndTimeout = time.Second

// runOnConn is RunInTx on a dialect with FenceEnd: each transaction RunFenced
// begins runs on a connection taken from db for it, which gets FenceEnd once
// the transaction ended (endFence).
func (le *Lease) runOnConn(ctx context.Context, db *sql.DB, opts *sql.TxOptions, fn func(ctx context.Context, tx *sql.Tx) error) error {
	var conn *sql.Conn
	end := func() {
		if conn != nil {
			le.l.endFence(ctx, conn)
			conn = nil
		}
	}
	defer end()
	return RunFenced(ctx, le, func(ctx context.Context) (*sql.Tx, *sql.Tx, error) {
		end() // a transaction begun before was rolled back: RunFenced begins again
		c, err := db.Conn(ctx)
		if err != nil {
			return nil, nil, err
		}
		conn = c
		tx, err := c.BeginTx(ctx, opts)
		return tx, tx, err
	}, fn)
}

// endFence runs FenceEnd on conn, whose fenced transaction ended, and
// returns it to its pool; a connection FenceEnd fails on (the server ended
// the session, say) is discarded instead.
func (l *Locker) endFence(ctx context.Context, conn *sql.Conn) {
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), fenceEndTimeout)
	defer cancel()
	if _, err := conn.ExecContext(ectx, l.st.fenceEnd.SQL); err != nil {
		_ = conn.Raw(func(any) error { return errBadConn })
	}
	_ = conn.Close()
}
