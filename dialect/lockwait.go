package dialect

import (
	"context"
	"database/sql"
	"time"
)

// LockWaiter is an optional interface for dialects whose driver waits for
// a database lock inside a handler that a context cannot cut short
// (SQLite's busy handler, set by the DSN's busy timeout). The engine runs
// its write statements on a connection whose lock wait it bounded with
// SetLockWait to what is left of the caller's deadline, and retries the
// busy errors (ErrorRetryable) itself until then (SPEC H9).
type LockWaiter interface {
	// SetLockWait bounds conn's wait for a lock to d (at least 1 ms) and
	// returns a function that restores the previous bound; the engine
	// discards the connection when restoring fails.
	SetLockWait(ctx context.Context, conn *sql.Conn, d time.Duration) (restore func(context.Context) error, err error)
}

// LockWaitReader is optional for LockWaiter dialects: LockWait reports
// conn's current bound on a lock wait (SQLite: PRAGMA busy_timeout). The
// engine reads it once per Locker and pool (the main pool and WithRenewDB's
// may differ), assuming every connection of one pool has the same bound
// (the DSN's), and skips SetLockWait (and its restore) when that bound
// ends in time by itself: by the write's deadline plus 100 ms (an acquire
// with a deadline, a release, a renewal's renew timeout), or within the
// statement timeout for an acquire whose context can be cancelled. An
// uncontended acquire or release then sends no lock-wait statements
// (SPEC H5, H7, H9 still hold, since the driver's wait ends in time).
// When the bound is needed, the engine sets it with PutLockWait and puts
// the pool's bound back the same way: two statements instead of
// SetLockWait's three.
type LockWaitReader interface {
	LockWait(ctx context.Context, conn *sql.Conn) (time.Duration, error)
	// PutLockWait sets conn's lock-wait bound to d (at least 1 ms).
	PutLockWait(ctx context.Context, conn *sql.Conn, d time.Duration) error
}
