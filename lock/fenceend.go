package lock

// Fenced transactions on dialects whose Fence changes session settings that
// outlive the transaction (Statements.FenceEnd: MySQL's idle-transaction
// timeouts, SPEC F1): RunInTx runs them on a connection of its own and puts
// the settings back before the connection returns to the pool.

import (
	"context"
	"database/sql"
	"time"
)

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
