package schedtest

import (
	"context"
	"database/sql"
	"strings"
	"testing"
)

// Run is one run of a job recorded by a replica.
type Run struct {
	Key     string
	Tick    int64 // the tick's scheduled time or number, as the test defines it
	Replica int
}

// table is the run log's table, in the Backend's schema if it has one.
func (b Backend) table() string {
	name := b.NS.Prefix + "test_runs"
	if b.NS.Schema == "" {
		return b.Dialect.QuoteIdent(name)
	}
	return b.Dialect.QuoteIdent(b.NS.Schema) + "." + b.Dialect.QuoteIdent(name)
}

// CreateRunLog creates the table RecordRun writes to.
func (b Backend) CreateRunLog(t testing.TB, db *sql.DB) {
	t.Helper()
	if _, err := db.Exec(`CREATE TABLE ` + b.table() + ` (job_key VARCHAR(64) NOT NULL, tick BIGINT NOT NULL, replica INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
}

// RecordRun adds one run to the run log.
func (b Backend) RecordRun(ctx context.Context, db *sql.DB, r Run) error {
	q := `INSERT INTO ` + b.table() + ` (job_key, tick, replica) VALUES (?, ?, ?)`
	if b.Name == "postgres" {
		q = strings.NewReplacer("(?, ?, ?)", "($1, $2, $3)").Replace(q)
	}
	_, err := db.ExecContext(ctx, q, r.Key, r.Tick, r.Replica)
	return err
}

// Runs returns the run log in tick order.
func (b Backend) Runs(t testing.TB, db *sql.DB) []Run {
	t.Helper()
	rows, err := db.Query(`SELECT job_key, tick, replica FROM ` + b.table() + ` ORDER BY tick, replica`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var runs []Run
	for rows.Next() {
		var r Run
		if err := rows.Scan(&r.Key, &r.Tick, &r.Replica); err != nil {
			t.Fatal(err)
		}
		runs = append(runs, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return runs
}

// CheckSkewedRuns checks the runs per tick (count[key][tick]) of the skew
// tests: jobs/plain, run without lock.HoldAtLeast by replicas whose ticks
// differ by more than the job takes, ran every tick, and more than once
// in at least half of them; jobs/held, with HoldAtLeast, if present, ran
// exactly once per tick.
func CheckSkewedRuns(t testing.TB, count map[string][]int) {
	t.Helper()
	plain := count["jobs/plain"]
	dup := 0
	for n, c := range plain {
		if c == 0 {
			t.Errorf("jobs/plain: tick %d did not run (runs per tick %v)", n, plain)
		}
		if c > 1 {
			dup++
		}
	}
	if dup < len(plain)/2 {
		t.Errorf("jobs/plain: only %d of %d ticks ran more than once (runs per tick %v); skewed replicas should run ticks again without HoldAtLeast", dup, len(plain), plain)
	}
	t.Logf("jobs/plain (no HoldAtLeast) runs per tick: %v", plain)
	if held, ok := count["jobs/held"]; ok {
		for n, c := range held {
			if c != 1 {
				t.Errorf("jobs/held: tick %d ran %d times, want exactly once (runs per tick %v)", n, c, held)
			}
		}
		t.Logf("jobs/held (HoldAtLeast) runs per tick: %v", held)
	}
}
