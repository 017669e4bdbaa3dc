package pgdialect_test

import (
	"context"
	"fmt"
	"testing"
)

// TestAcquirePlansStayOnIndexes: a connection keeps the plans of the
// acquire functions' statements (migration 00007 makes them generic from
// the first call; before it, from the sixth). Plans made while the lock
// tables were analyzed empty must still read by index after the tables
// grew to 20,000 rows of other keys: no call of either function, on any of
// its paths (fast grant, read-only pass, blocked writer with marker and
// watch, blocked reader, FIFO), may scan a lock table sequentially. (With
// sequential scans each call read every row until the next ANALYZE: 5.6 ms
// instead of 0.1 ms per blocked call.) The scans are counted by
// pg_stat_xact_user_tables in a transaction that is rolled back.
func TestAcquirePlansStayOnIndexes(t *testing.T) {
	ctx := context.Background()
	db, d, ns, _ := schemaAt(t, "sqlease_plans_", 0)
	tables := []string{"holders", "markers", "watches", "tickets"}
	for _, tb := range tables {
		// No autoanalyze may replan in between (the plans would then fit
		// the grown tables and the test would prove nothing).
		for _, q := range []string{"ALTER TABLE " + ns.Object(d, tb) + " SET (autovacuum_enabled = false)", "VACUUM ANALYZE " + ns.Object(d, tb)} {
			if _, err := db.ExecContext(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	acquire := "SELECT count(*) FROM " + ns.Object(d, "acquire") + "($1, $2, $3, 'o', 600000000, $4, $5)"
	fifo := "SELECT count(*) FROM " + ns.Object(d, "acquire_fifo") + "($1, $2, $3, 'o', 600000000, $4, $5, $3, $6)"
	n := 0
	call := func(q string, args ...any) {
		t.Helper()
		var rows int
		if err := conn.QueryRowContext(ctx, q, args...).Scan(&rows); err != nil || rows == 0 {
			t.Fatalf("%s %v: %d rows, %v", q, args, rows, err)
		}
	}
	// Every path, eight times each: enough for the default plan cache
	// mode to settle on its generic plans too.
	paths := func() {
		n++
		call(acquire, "hot", "x", "L-wait", int64(5_000_000), int64(30_000_000)) // blocked writer: marker, watch
		call(acquire, "hot", "x", "L-wait", int64(0), int64(0))                  // read-only pass
		call(acquire, "hot", "s", "L-read", int64(0), int64(30_000_000))         // blocked reader
		call(acquire, fmt.Sprintf("free-%d", n), "x", fmt.Sprintf("L-free-%d", n), int64(0), int64(0))
		call(fifo, "hot", "x", "T-wait", int64(5_000_000), int64(30_000_000), int64(5_000_000))
		call(fifo, fmt.Sprintf("ffree-%d", n), "x", fmt.Sprintf("T-free-%d", n), int64(0), int64(0), int64(0))
	}
	call(acquire, "hot", "x", "L-hold", int64(0), int64(0)) // the holder
	for range 8 {
		paths()
	}

	// The tables grow (another connection; nothing replans this one's).
	fill := []string{
		"INSERT INTO " + ns.Object(d, "holders") + " SELECT 'F'||g, 'other'||g, 'x', 'o', g, now(), now() + interval '1 hour' FROM generate_series(1, 20000) g",
		"INSERT INTO " + ns.Object(d, "markers") + " SELECT 'other'||g, 'W'||g, 'o', now() + interval '1 hour' FROM generate_series(1, 20000) g",
		"INSERT INTO " + ns.Object(d, "watches") + " SELECT 'other'||g, now() + interval '1 hour' FROM generate_series(1, 20000) g",
		"INSERT INTO " + ns.Object(d, "tickets") + " SELECT 'Q'||g, 'other'||g, 'x', 'o', g, now(), now() + interval '1 hour' FROM generate_series(1, 20000) g",
	}
	for _, q := range fill {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}

	// pg_stat_xact_user_tables shows this connection's counts not yet
	// flushed to the shared statistics (from earlier transactions too):
	// flush them first, so the transaction below counts its own calls.
	if _, err := conn.ExecContext(ctx, "SELECT pg_stat_force_next_flush()"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	defer conn.ExecContext(context.Background(), "ROLLBACK")
	paths()
	var relids []any
	for _, tb := range tables {
		relids = append(relids, ns.Object(d, tb))
	}
	rows, err := conn.QueryContext(ctx, "SELECT relname, seq_scan, idx_scan FROM pg_stat_xact_user_tables WHERE relid IN ($1::regclass, $2::regclass, $3::regclass, $4::regclass) ORDER BY relname", relids...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	idx := int64(0)
	for rows.Next() {
		var rel string
		var seq, ix int64
		if err := rows.Scan(&rel, &seq, &ix); err != nil {
			t.Fatal(err)
		}
		idx += ix
		if seq != 0 {
			t.Errorf("%s: %d sequential scans in one round of acquire calls (index scans: %d); want none", rel, seq, ix)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if idx == 0 {
		t.Fatal("no index scans counted either: pg_stat_xact_user_tables saw none of the calls")
	}
}
