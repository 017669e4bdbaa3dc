//go:build cgo

package sqlitedialect_test

import (
	"testing"

	_ "github.com/mattn/go-sqlite3" // registers "sqlite3" (cgo)

	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/conformance/conftest"
)

// mattnAvailable: this test binary has mattn/go-sqlite3 (a cgo build).
const mattnAvailable = true

// TestConformanceMattn runs the whole SPEC suite on SQLite files through
// github.com/mattn/go-sqlite3 (cgo builds only), at full length unless
// -short: under the race detector this is the full-length SQLite run
// (see TestConformance).
func TestConformanceMattn(t *testing.T) {
	cfg := conftest.SQLiteDriver(t.TempDir(), "sqlite3")
	cfg.Short = testing.Short()
	conformance.Run(t, cfg)
}

// TestClassifyMattn classifies real mattn/go-sqlite3 errors.
func TestClassifyMattn(t *testing.T) { testClassify(t, "sqlite3") }
