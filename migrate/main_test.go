package migrate_test

import (
	"os"
	"testing"

	"github.com/sqlease/sqlease/internal/testnote"
)

// TestMain says, in one line, when the PostgreSQL or MySQL tests of this
// package are skipped.
func TestMain(m *testing.M) {
	testnote.Skipped("sqlease/migrate", testnote.PostgreSQL, testnote.MySQL)
	os.Exit(m.Run())
}
