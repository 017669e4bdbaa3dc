package sqlitedialect_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a goroutine outlives its tests: a lease
// renewer, a waiter, a sweeper or a listener that was never stopped. Only
// database/sql's own per-pool opener is ignored (it ends when its pool is
// closed). Children started by multi-process cases exit from inside the
// test (conformance.Run), before this check.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
	)
}
