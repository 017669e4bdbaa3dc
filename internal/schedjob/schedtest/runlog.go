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
// differ by more than the job takes, ran more than once in at least half
// of the ticks; jobs/held, with HoldAtLeast, if present, never ran more
// than once per tick. Each job may miss maxMissed ticks in all, where no
// replica ran it: a loaded machine (the race detector on two cores) can
// stall every replica past a tick, and the schedulers then skip it (a
// missed tick is not a lock's doing; a duplicate would be).
func CheckSkewedRuns(t testing.TB, count map[string][]int) {
	t.Helper()
	const maxMissed = 2
	for key, runs := range count {
		missed, dup := 0, 0
		for _, c := range runs {
			if c == 0 {
				missed++
			}
			if c > 1 {
				dup++
			}
		}
		t.Logf("%s runs per tick: %v", key, runs)
		if missed > maxMissed {
			t.Errorf("%s: %d of %d ticks did not run on any replica, want at most %d (runs per tick %v)", key, missed, len(runs), maxMissed, runs)
		}
		switch {
		case key == "jobs/plain" && dup < len(runs)/2:
			t.Errorf("jobs/plain: only %d of %d ticks ran more than once (runs per tick %v); skewed replicas should run ticks again without HoldAtLeast", dup, len(runs), runs)
		case key == "jobs/held" && dup > 0:
			t.Errorf("jobs/held: %d of %d ticks ran more than once, want at most once with HoldAtLeast (runs per tick %v)", dup, len(runs), runs)
		}
	}
}
