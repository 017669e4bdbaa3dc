package sqlitedialect_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/conformance/conftest"
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
)

// TestConformance runs the whole SPEC suite on SQLite files through
// modernc.org/sqlite (pure Go; runs with CGO_ENABLED=0 too): at full length
// in a build without cgo (CI's CGO_ENABLED=0 job), short where
// TestConformanceMattn runs the long cases, and not at all under the race
// detector, which slows modernc's compiled-C Go code past the suite's
// timing bounds (the cases are the same; the mattn run covers them there).
func TestConformance(t *testing.T) {
	if raceEnabled {
		t.Skip("modernc.org/sqlite under the race detector is too slow for the timing cases; TestConformanceMattn runs the suite in race builds, and CI runs this one in its CGO_ENABLED=0 job")
	}
	if conformance.IsChild() {
		conformance.Run(t, conformance.Config{}) // exits: the child needs no config (and no temp dir left behind)
	}
	cfg := conftest.SQLite(t.TempDir())
	cfg.Short = testing.Short() || mattnAvailable
	conformance.Run(t, cfg)
}

// TestClassifyModernc classifies real modernc.org/sqlite errors.
func TestClassifyModernc(t *testing.T) { testClassify(t, "sqlite") }

// testClassify provokes real SQLITE_BUSY, SQLITE_CONSTRAINT and "no such
// table" errors through the database/sql driver driverName and checks that
// Classify sees them the way the engine needs, and that the database still
// works afterwards.
func testClassify(t *testing.T, driverName string) {
	ctx := context.Background()
	d := sqlitedialect.New()
	path := filepath.Join(t.TempDir(), "classify.db")
	// Busy timeout 0: the second writer fails at once with SQLITE_BUSY.
	db, err := sql.Open(driverName, "file:"+path+"?_journal_mode=WAL&_busy_timeout=0")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `CREATE TABLE t (id INTEGER PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}

	// SQLITE_CONSTRAINT (extended: SQLITE_CONSTRAINT_PRIMARYKEY).
	if _, err := db.ExecContext(ctx, `INSERT INTO t (id) VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	_, err = db.ExecContext(ctx, `INSERT INTO t (id) VALUES (1)`)
	wantClass(t, d, "duplicate primary key", err, dialect.ErrorConflict, 19)

	// "no such table".
	_, err = db.ExecContext(ctx, `SELECT * FROM missing`)
	wantClass(t, d, "missing table", err, dialect.ErrorUndefinedTable, 1)

	// SQLITE_BUSY: one connection holds the write lock, another asks for it.
	holder, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	other, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = other.ExecContext(ctx, "BEGIN IMMEDIATE")
	wantClass(t, d, "second BEGIN IMMEDIATE", err, dialect.ErrorRetryable, 5)
	// Wrapped, as the engine wraps it.
	wantClass(t, d, "wrapped busy", fmt.Errorf("lock: acquire %q: %w", "k", err), dialect.ErrorRetryable, 5)
	if _, err := holder.ExecContext(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	holder.Close()

	// After the faults, the retried write goes through.
	if _, err := other.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatalf("retry after busy: %v", err)
	}
	if _, err := other.ExecContext(ctx, `INSERT INTO t (id) VALUES (2)`); err != nil {
		t.Fatal(err)
	}
	if _, err := other.ExecContext(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	other.Close()
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM t`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("rows = %d, %v; want 2", n, err)
	}

	if got := d.Classify(errors.New("some other failure")); got != dialect.ErrorOther {
		t.Errorf("plain error classified %v, want other", got)
	}
	if _, ok := sqlitedialect.ResultCode(errors.New("x")); ok {
		t.Error("ResultCode found a code in a plain error")
	}
}

func wantClass(t *testing.T, d sqlitedialect.Dialect, what string, err error, class dialect.ErrorClass, primary int) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error", what)
	}
	if got := d.Classify(err); got != class {
		t.Errorf("%s: Classify(%T %v) = %v, want %v", what, err, err, got, class)
	}
	code, ok := sqlitedialect.ResultCode(err)
	if !ok || code&0xff != primary {
		t.Errorf("%s: ResultCode(%T %v) = %d, %v; want primary code %d", what, err, err, code, ok, primary)
	}
}
