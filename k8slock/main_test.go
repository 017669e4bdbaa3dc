package k8slock_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/sqlease/sqlease/internal/testnote"
)

// TestMain runs a candidate's work when the test binary was started as one
// (see runCandidate); otherwise it says once when the PostgreSQL or MySQL
// tests are skipped and fails the package when a goroutine outlives its
// tests.
func TestMain(m *testing.M) {
	if os.Getenv(candidateEnv) != "" {
		os.Exit(runCandidate())
	}
	testnote.Skipped("sqlease/k8slock", testnote.PostgreSQL, testnote.MySQL)
	goleak.VerifyTestMain(m)
}
