package mysqldialect_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/sqlease/sqlease/internal/testnote"
)

// TestMain says once when the MySQL tests are skipped (no DSN), and fails
// the package when a goroutine outlives its tests: a lease
// renewer, a waiter or a sweeper that was never stopped. Only database/sql's
// own per-pool opener is ignored (it ends when its pool is closed). Children
// started by multi-process cases exit from inside the test
// (conformance.Run), before this check.
func TestMain(m *testing.M) {
	testnote.Skipped("sqlease/dialect/mysqldialect", testnote.MySQL)
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
		goleak.Cleanup(func(code int) {
			removeDataTemplate()
			os.Exit(code)
		}),
	)
}
