package adaptertest

import (
	"testing"

	_ "github.com/mattn/go-sqlite3" // registers "sqlite3"
	"go.uber.org/goleak"

	"github.com/sqlease/sqlease/internal/testnote"
)

// TestMain says once when the PostgreSQL tests are skipped (no DSN), and
// fails the package when a goroutine outlives its tests: a lease
// renewer or a waiter that was never stopped.
func TestMain(m *testing.M) {
	testnote.Skipped("sqlease/internal/adaptertest", testnote.PostgreSQL)
	goleak.VerifyTestMain(m)
}
