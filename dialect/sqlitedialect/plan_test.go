package sqlitedialect_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/migrate"
)

// TestHotStatementsNeedNoEphemeralTable guards the plans of the statements
// of an uncontended TryAcquire: SQLite copies a CTE read twice, and the
// SELECT of an INSERT that reads its own target table, into an ephemeral
// table, each with a fresh page cache that cost more than the statement
// itself (issue 12: Grant went from 442 to 131 µs when it stopped doing
// so). Probe needs none; Grant and Release one each, for RETURNING.
func TestHotStatementsNeedNoEphemeralTable(t *testing.T) {
	ctx := context.Background()
	d := sqlitedialect.New()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "plan.db")+"?_journal_mode=WAL&_busy_timeout=5000")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := migrate.Up(ctx, db, d); err != nil {
		t.Fatal(err)
	}
	st, fp := d.Statements(), d.FastPath()
	params := []string{"key", "mode", "lease_id", "owner", "ttl_us", "token", "channel", dialect.ParamSharedLimit}
	for _, tc := range []struct {
		name     string
		template string
		want     int // OpenEphemeral instructions
	}{
		{"Probe", fp.Probe, 0},
		{"Grant", fp.Grant, 1},
		{"Release", st.Release, 1},
	} {
		s, err := dialect.Compile(d, dialect.Namespace{}, tc.template, params)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		args := s.Args(map[string]any{"key": "k", "mode": "x", "lease_id": "l", "owner": "o", "ttl_us": int64(1e6), "token": int64(1), dialect.ParamSharedLimit: int64(2)})
		rows, err := db.QueryContext(ctx, "EXPLAIN "+s.SQL, args...)
		if err != nil {
			t.Fatalf("%s: EXPLAIN: %v", tc.name, err)
		}
		cols, _ := rows.Columns()
		n := 0
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(vals[1]) == "OpenEphemeral" {
				n++
			}
		}
		if err := rows.Close(); err != nil {
			t.Fatal(err)
		}
		if n != tc.want {
			t.Errorf("%s: the plan opens %d ephemeral tables, want %d (a CTE read twice, or an INSERT ... SELECT reading its target, copies rows into one on every run)", tc.name, n, tc.want)
		}
	}
}
