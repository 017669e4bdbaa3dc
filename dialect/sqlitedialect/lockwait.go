package sqlitedialect

import (
	"context"
	"database/sql"
	"strconv"
	"time"

	"github.com/sqlease/sqlease/dialect"
)

var (
	_ dialect.LockWaiter     = Dialect{}
	_ dialect.LockWaitReader = Dialect{}
)

// LockWait returns conn's busy timeout (PRAGMA busy_timeout).
func (Dialect) LockWait(ctx context.Context, conn *sql.Conn) (time.Duration, error) {
	var ms int64
	if err := conn.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&ms); err != nil {
		return 0, err
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// PutLockWait sets conn's busy timeout to d, at least 1 ms.
func (Dialect) PutLockWait(ctx context.Context, conn *sql.Conn, d time.Duration) error {
	_, err := conn.ExecContext(ctx, "PRAGMA busy_timeout = "+strconv.FormatInt(max(d.Milliseconds(), 1), 10))
	return err
}

// SetLockWait sets conn's busy timeout (PRAGMA busy_timeout) to d, at
// least 1 ms, and returns a function that puts the previous one back. The
// engine uses it so that no statement of an acquire sits in the busy
// handler past the caller's deadline (SPEC H9).
func (Dialect) SetLockWait(ctx context.Context, conn *sql.Conn, d time.Duration) (func(context.Context) error, error) {
	var old int64
	if err := conn.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&old); err != nil {
		return nil, err
	}
	ms := max(d.Milliseconds(), 1)
	if _, err := conn.ExecContext(ctx, "PRAGMA busy_timeout = "+strconv.FormatInt(ms, 10)); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		_, err := conn.ExecContext(ctx, "PRAGMA busy_timeout = "+strconv.FormatInt(old, 10))
		return err
	}, nil
}
