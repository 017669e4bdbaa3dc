package chaos

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
)

// ledgerSQL is the SQL of the suite's own tables for one dialect: a ledger
// of fenced writes and a per-key counter whose value orders a key's writes
// by commit (the counter row is locked until the writing transaction ends).
type ledgerSQL struct {
	create []string
	seed   string // insert a counter row (key)
	bump   string // increment a key's counter, returning the new value
	insert string // insert a ledger row, returning its database time
	nowUS  string // the database time in Unix microseconds
	rows   string // every ledger row
}

const (
	pgNowUS     = `(extract(epoch from clock_timestamp()) * 1000000)::bigint`
	sqliteNowUS = `(CAST(unixepoch('subsec') * 1000 AS INTEGER) * 1000)`
)

// newLedgerSQL returns the ledger SQL of dialectName ("postgres" or
// "sqlite"); schema qualifies the tables on PostgreSQL when not empty.
func newLedgerSQL(dialectName, schema string) (ledgerSQL, error) {
	var ph func(int) string
	var now, ledger, counter string
	switch dialectName {
	case "postgres":
		ph = func(n int) string { return fmt.Sprintf("$%d", n) }
		now = pgNowUS
		ledger, counter = "chaos_ledger", "chaos_counter"
		if schema != "" {
			ledger, counter = `"`+schema+`".`+ledger, `"`+schema+`".`+counter
		}
	case "sqlite":
		ph = func(int) string { return "?" }
		now = sqliteNowUS
		ledger, counter = "chaos_ledger", "chaos_counter"
	default:
		return ledgerSQL{}, fmt.Errorf("chaos: dialect %q is not supported (allowed: postgres, sqlite)", dialectName)
	}
	phs := func(n int) string {
		var s []string
		for i := 1; i <= n; i++ {
			s = append(s, ph(i))
		}
		return strings.Join(s, ", ")
	}
	return ledgerSQL{
		create: []string{
			`CREATE TABLE ` + ledger + ` (write_id TEXT PRIMARY KEY, lock_key TEXT NOT NULL, token BIGINT NOT NULL, lease_id TEXT NOT NULL,
  worker TEXT NOT NULL, mode TEXT NOT NULL, n BIGINT NOT NULL, at_us BIGINT NOT NULL)`,
			`CREATE TABLE ` + counter + ` (lock_key TEXT PRIMARY KEY, n BIGINT NOT NULL)`,
		},
		seed:   `INSERT INTO ` + counter + ` (lock_key, n) VALUES (` + ph(1) + `, 0)`,
		bump:   `UPDATE ` + counter + ` SET n = n + 1 WHERE lock_key = ` + ph(1) + ` RETURNING n`,
		insert: `INSERT INTO ` + ledger + ` (write_id, lock_key, token, lease_id, worker, mode, n, at_us) VALUES (` + phs(7) + `, ` + now + `) RETURNING at_us`,
		nowUS:  `SELECT ` + now,
		rows:   `SELECT write_id, lock_key, token, lease_id, worker, mode, n, at_us FROM ` + ledger,
	}, nil
}

// ledgerRow is one committed ledger write.
type ledgerRow struct {
	WriteID, Key string
	Token        int64
	Lease        string
	Worker, Mode string
	N, AtUS      int64
}

// writeLedger bumps key's counter and records one write in tx.
func (q ledgerSQL) writeLedger(ctx context.Context, tx *sql.Tx, r ledgerRow) (n, atUS int64, err error) {
	if err := tx.QueryRowContext(ctx, q.bump, r.Key).Scan(&n); err != nil {
		return 0, 0, fmt.Errorf("bump counter: %w", err)
	}
	if err := tx.QueryRowContext(ctx, q.insert, r.WriteID, r.Key, r.Token, r.Lease, r.Worker, r.Mode, n).Scan(&atUS); err != nil {
		return 0, 0, fmt.Errorf("insert ledger row: %w", err)
	}
	return n, atUS, nil
}

func (q ledgerSQL) readLedger(ctx context.Context, db *sql.DB) ([]ledgerRow, error) {
	rows, err := db.QueryContext(ctx, q.rows)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []ledgerRow
	for rows.Next() {
		var r ledgerRow
		if err := rows.Scan(&r.WriteID, &r.Key, &r.Token, &r.Lease, &r.Worker, &r.Mode, &r.N, &r.AtUS); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}
