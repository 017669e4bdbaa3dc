package faultdb_test

import (
	"os"
	"testing"

	"github.com/sqlease/sqlease/internal/testnote"
)

// TestMain says once when the PostgreSQL tests are skipped (no DSN).
func TestMain(m *testing.M) {
	testnote.Skipped("sqlease/internal/faultdb", testnote.PostgreSQL)
	os.Exit(m.Run())
}
