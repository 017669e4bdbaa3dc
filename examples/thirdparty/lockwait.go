package thirdparty

import (
	"context"
	"database/sql"
	"strconv"
	"time"

	"github.com/sqlease/sqlease/dialect"
)

// SQLite waits for its write lock inside the driver's busy handler, which a
// context cannot cut short: implementing dialect.LockWaiter lets the engine
// bound every write statement's wait by the caller's deadline (rule H9 of
// the contract) and retry busy errors itself.
var _ dialect.LockWaiter = Dialect{}

// SetLockWait sets conn's busy timeout to d (at least 1 ms) and returns a
// function that restores the previous one.
func (Dialect) SetLockWait(ctx context.Context, conn *sql.Conn, d time.Duration) (func(context.Context) error, error) {
	var old int64
	if err := conn.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&old); err != nil {
		return nil, err
	}
	if _, err := conn.ExecContext(ctx, "PRAGMA busy_timeout = "+strconv.FormatInt(max(d.Milliseconds(), 1), 10)); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		_, err := conn.ExecContext(ctx, "PRAGMA busy_timeout = "+strconv.FormatInt(old, 10))
		return err
	}, nil
}
