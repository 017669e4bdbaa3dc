//go:build cgo

package sqlitedialect_test

import (
	"context"
	"fmt"
	"strings"
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
// (see TestConformance). The DSNs turn on mattn's per-connection statement
// cache (_stmt_cache_size=32), as docs/operations.md recommends for this
// driver; TestMattnWithoutStatementCache covers the driver's default.
func TestConformanceMattn(t *testing.T) {
	if conformance.IsChild() {
		conformance.Run(t, conformance.Config{}) // exits: the child needs no config (and no temp dir left behind)
	}
	cfg := conftest.SQLiteDriver(t.TempDir(), "sqlite3")
	newDB := cfg.NewDatabase
	cfg.NewDatabase = func(ctx context.Context, name string) (conformance.Database, error) {
		db, err := newDB(ctx, name)
		db.DSN += "&_stmt_cache_size=32"
		return db, err
	}
	cfg.Short = testing.Short()
	conformance.Run(t, cfg)
}

// TestMattnWithoutStatementCache runs the suite's short form on mattn's
// default DSN (no statement cache), so both settings stay covered, with a
// 10 s busy timeout: longer than the release timeout, so every release and
// renewal bounds its connection's busy timeout first (PRAGMA busy_timeout
// set and restored, SPEC H5, H7, H9), a path the 5 s DSNs of the other runs
// take only for acquires with a deadline. It is skipped under the race
// detector, where the full-length run above takes the time.
func TestMattnWithoutStatementCache(t *testing.T) {
	if raceEnabled {
		t.Skip("race build: TestConformanceMattn covers mattn/go-sqlite3 (with its statement cache); this run of mattn's default DSN is for non-race builds")
	}
	if conformance.IsChild() {
		conformance.Run(t, conformance.Config{}) // exits: the child needs no config (and no temp dir left behind)
	}
	cfg := conftest.SQLiteDriver(t.TempDir(), "sqlite3")
	newDB := cfg.NewDatabase
	cfg.NewDatabase = func(ctx context.Context, name string) (conformance.Database, error) {
		db, err := newDB(ctx, name)
		db.DSN = strings.Replace(db.DSN, "_busy_timeout=5000", "_busy_timeout=10000", 1)
		if err == nil && !strings.Contains(db.DSN, "_busy_timeout=10000") {
			err = fmt.Errorf("no 5 s busy timeout to lengthen in DSN %q", db.DSN)
		}
		return db, err
	}
	cfg.Short = true
	conformance.Run(t, cfg)
}

// TestClassifyMattn classifies real mattn/go-sqlite3 errors.
func TestClassifyMattn(t *testing.T) { testClassify(t, "sqlite3") }
