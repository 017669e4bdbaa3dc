package gocronlock_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/sqlease/sqlease/internal/testnote"
)

// TestMain says once when the PostgreSQL or MySQL tests are skipped (no
// DSN), and fails the package when a goroutine outlives its tests: a
// campaign, a renewer or a scheduler that was never shut down.
func TestMain(m *testing.M) {
	testnote.Skipped("sqlease/gocronlock", testnote.PostgreSQL, testnote.MySQL)
	goleak.VerifyTestMain(m)
}
