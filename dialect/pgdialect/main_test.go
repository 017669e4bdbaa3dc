package pgdialect_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/sqlease/sqlease/internal/testnote"
)

// TestMain says once when the PostgreSQL tests are skipped (no DSN), and
// fails the package when a goroutine outlives its tests: a lease
// renewer, a waiter, a sweeper or a listener that was never stopped.
// Ignored are only goroutines of database/sql and pgx that end on their own:
// the per-pool opener, and pgx's background reader and its cancel-and-close
// of a connection whose statement was cancelled in flight (which may take
// up to 15 s). Children started by multi-process cases exit from inside the
// test (conformance.Run), before this check.
func TestMain(m *testing.M) {
	testnote.Skipped("sqlease/dialect/pgdialect", testnote.PostgreSQL)
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
		goleak.IgnoreAnyFunction("github.com/jackc/pgx/v5/pgconn.(*PgConn).asyncClose.func1"),
		goleak.IgnoreAnyFunction("github.com/jackc/pgx/v5/pgconn/internal/bgreader.(*BGReader).bgRead"),
		goleak.IgnoreAnyFunction("github.com/jackc/pgx/v5/pgconn.(*CancelRequestContextWatcherHandler).HandleCancel.func1"),
	)
}
