package chaos_test

import (
	"os"
	"testing"

	"github.com/sqlease/sqlease/chaos"
)

func TestMain(m *testing.M) {
	// Run re-executes this test binary for its worker processes.
	if chaos.IsWorker() {
		os.Exit(chaos.WorkerMain())
	}
	os.Exit(m.Run())
}
