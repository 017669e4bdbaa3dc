package sqlitedialect_test

import (
	"testing"

	"github.com/sqlease/sqlease/conformance"
)

// TestConformance runs the whole SPEC suite on SQLite files (always).
func TestConformance(t *testing.T) {
	cfg := conformance.SQLite(t.TempDir())
	cfg.Short = testing.Short()
	conformance.Run(t, cfg)
}
