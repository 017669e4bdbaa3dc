package sqlxlock_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a goroutine outlives its tests: a lease
// renewer or a waiter that was never stopped.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
