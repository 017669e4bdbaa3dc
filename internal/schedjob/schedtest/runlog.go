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
