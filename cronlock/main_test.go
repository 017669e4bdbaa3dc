package cronlock_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/sqlease/sqlease/internal/testnote"
)

// TestMain says once when the PostgreSQL or MySQL tests are skipped (no DSN), and
// fails the package when a goroutine outlives its tests: a campaign, a
// renewer or a cron scheduler that was never stopped.
func TestMain(m *testing.M) {
	testnote.Skipped("sqlease/cronlock", testnote.PostgreSQL, testnote.MySQL)
	goleak.VerifyTestMain(m)
}
