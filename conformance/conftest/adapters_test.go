package conftest_test

import (
	"testing"

	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/conformance/conftest"
)

// TestAdapterSmokeNamesCases: every name in AdapterSmoke is a case. The
// adapters are modules of their own, which a root `go test ./...` does not
// enter: a renamed case is caught here first.
func TestAdapterSmokeNamesCases(t *testing.T) {
	cases := make(map[string]conformance.Case)
	for _, c := range conformance.Cases() {
		cases[c.Name] = c
	}
	seen := make(map[string]bool)
	for _, n := range conftest.AdapterSmoke {
		c, ok := cases[n]
		if !ok {
			t.Errorf("AdapterSmoke names %q, which is not a conformance case", n)
			continue
		}
		if seen[n] {
			t.Errorf("AdapterSmoke names %q twice", n)
		}
		seen[n] = true
		if c.Needs != 0 {
			t.Errorf("AdapterSmoke case %q needs capabilities %s: a dialect without them would skip it", n, c.Needs)
		}
	}
}
