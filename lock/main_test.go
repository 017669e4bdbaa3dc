package lock_test

import (
	"os"
	"testing"

	"github.com/sqlease/sqlease/internal/testnote"
)

// TestMain says, in one line, when the PostgreSQL tests of this package
// (benchmarks, PgBouncer listening, probes) are skipped.
func TestMain(m *testing.M) {
	testnote.Skipped("sqlease/lock", testnote.PostgreSQL)
	os.Exit(m.Run())
}
