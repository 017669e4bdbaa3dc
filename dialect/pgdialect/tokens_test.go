package pgdialect_test

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sqlease/sqlease/conformance/conftest"
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/pgdialect"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// dbClockUS is the database clock in microseconds since the Unix epoch.
func dbClockUS(t *testing.T, db *sql.DB) int64 {
	t.Helper()
	var us int64
	if err := db.QueryRowContext(context.Background(), "SELECT (extract(epoch FROM clock_timestamp()) * 1e6)::bigint").Scan(&us); err != nil {
		t.Fatal(err)
	}
	return us
}

// prefixNamespace migrates a namespace in the connection's default schema
// (a table prefix, no schema), whose object names render unqualified in
// the migrations; it is dropped when t ends.
func prefixNamespace(t *testing.T, db *sql.DB, d pgdialect.Dialect) dialect.Namespace {
	t.Helper()
	ctx := context.Background()
	var rnd [4]byte
	_, _ = crand.Read(rnd[:])
	ns := dialect.Namespace{Prefix: "sqlease_s7_" + hex.EncodeToString(rnd[:]) + "_"}
	t.Cleanup(func() { _, _ = migrate.Drop(context.Background(), db, d, migrate.WithNamespace(ns)) })
	if _, err := migrate.Up(ctx, db, d, migrate.WithNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	return ns
}

// TestS7_TokensFollowDatabaseClock_Postgres: a token is at least the
// database clock in microseconds when it is granted (migration 00009), and
// after the token sequence is set back (as after the promotion of a standby
// that lost grants, or a restore from a dump) the next grants, by Acquire
// and by the FIFO function, still get tokens greater than every token
// granted before (SPEC S3, S7). Tokens of one key granted back to back
// strictly increase, and come from the sequence while it is ahead of the
// clock (as after the clock stepped back). Both in a schema (names
// rendered schema-qualified) and under a table prefix alone (unqualified).
func TestS7_TokensFollowDatabaseClock_Postgres(t *testing.T) {
	ctx := context.Background()
	for _, qualified := range []bool{true, false} {
		t.Run(fmt.Sprintf("qualified=%v", qualified), func(t *testing.T) {
			var db *sql.DB
			var ns dialect.Namespace
			d := pgdialect.New()
			if qualified {
				db, d, ns, _ = schemaAt(t, "sqlease_s7_", 0)
			} else {
				var err error
				db, err = sql.Open("pgx", conftest.PostgresDSN(t))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { db.Close() })
				ns = prefixNamespace(t, db, d)
			}
			l, err := lock.New(ctx, db, d, lock.WithSchema(ns.Schema), lock.WithTablePrefix(ns.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close(ctx)

			var highest int64
			clockBound := true
			grant := func(key string) int64 {
				t.Helper()
				before := dbClockUS(t, db)
				le, err := l.TryAcquire(ctx, key, lock.Exclusive)
				if err != nil {
					t.Fatalf("TryAcquire %q: %v", key, err)
				}
				after := dbClockUS(t, db)
				tok := le.Token()
				if err := le.Release(ctx); err != nil {
					t.Fatal(err)
				}
				if clockBound && (tok < before || tok > after) {
					t.Errorf("token %d of %q: want the database clock of its grant, between %d and %d µs", tok, key, before, after)
				}
				if tok <= highest {
					t.Errorf("token %d of %q after %d: want it greater (SPEC S3)", tok, key, highest)
				}
				if tok >= 1<<53 {
					t.Errorf("token %d: want it below 2^53", tok)
				}
				highest = tok
				return tok
			}
			for range 3 {
				grant("s7")
				grant("s7/other")
			}
			// Back to back: the clock may not have moved, the sequence has.
			for range 200 {
				grant("s7")
			}

			// The sequence goes back, as after a promotion that lost grants.
			seq := ns.Object(d, "token_seq")
			if _, err := db.ExecContext(ctx, "SELECT setval($1, 1)", seq); err != nil {
				t.Fatal(err)
			}
			grant("s7")
			// The sequence is the high-water mark again.
			var last int64
			if err := db.QueryRowContext(ctx, "SELECT last_value FROM "+seq).Scan(&last); err != nil || last < highest {
				t.Errorf("sequence after a grant: %d, %v; want at least the token %d", last, err, highest)
			}
			if _, err := db.ExecContext(ctx, "SELECT setval($1, 1)", seq); err != nil {
				t.Fatal(err)
			}
			grant("s7/other")

			// The FIFO function takes its token the same way.
			if _, err := db.ExecContext(ctx, "SELECT setval($1, 1)", seq); err != nil {
				t.Fatal(err)
			}
			var granted bool
			var tok int64
			q := "SELECT granted, token FROM " + ns.Object(d, "acquire_fifo") + "('s7/fifo', 'x', 'L-fifo', 'test', 60000000, 0, 0, 'T-fifo', 60000000) WHERE granted"
			if err := db.QueryRowContext(ctx, q).Scan(&granted, &tok); err != nil || !granted {
				t.Fatalf("FIFO acquire: granted %v, %v", granted, err)
			}
			if tok <= highest {
				t.Errorf("FIFO token %d after %d: want it greater (SPEC S3)", tok, highest)
			}

			// The sequence ahead of the clock, as after the clock stepped
			// back 10 s: tokens come from the sequence, one apart.
			if _, err := db.ExecContext(ctx, "SELECT setval($1, $2)", seq, dbClockUS(t, db)+10_000_000); err != nil {
				t.Fatal(err)
			}
			clockBound = false
			for i := range 3 {
				prev := highest
				if tok := grant("s7"); i > 0 && tok != prev+1 {
					t.Errorf("token %d after %d with the sequence ahead of the clock: want the sequence's next value", tok, prev)
				}
			}
			clockBound = true
		})
	}
}

// TestUpgradeToVersion9TokensFollowClock: on a version-8 schema holding
// leases, this build refuses to start; migration 00009 makes both acquire
// functions take tokens from the {next_token} function instead of the
// sequence alone, keeping their settings, and every token issued after it
// is greater than every token issued before it, while the leases granted
// before it still exclude (SPEC S1, S3). Where EXECUTE on the acquire
// functions was revoked from PUBLIC and granted to a service role with
// USAGE only on the sequence (docs/operations.md), that role still
// acquires after the migration: {next_token}, which needs UPDATE for
// setval, runs as its owner, and the role gets EXECUTE on it. Down to 8
// restores nextval (tokens go on from the sequence, then at the clock) and
// drops {next_token}; Up applies 00009 again.
func TestUpgradeToVersion9TokensFollowClock(t *testing.T) {
	ctx := context.Background()
	db, d, ns, p := schemaAt(t, "sqlease_up9_", 8)
	acq := ns.Object(d, "acquire") + "(text, text, text, text, bigint, bigint, bigint)"
	fifo := ns.Object(d, "acquire_fifo") + "(text, text, text, text, bigint, bigint, bigint, text, bigint)"
	nextToken := ns.Object(d, "next_token") + "()"
	seq := ns.Object(d, "token_seq")
	uses := func(what string) {
		t.Helper()
		for _, f := range []string{acq, fifo} {
			var def string
			if err := db.QueryRowContext(ctx, "SELECT pg_get_functiondef($1::regprocedure)", f).Scan(&def); err != nil {
				t.Fatal(err)
			}
			clock := strings.Contains(def, nextToken)
			seqOnly := strings.Contains(def, "nextval('"+seq+"')")
			if clock == seqOnly || clock != (what == "clock") {
				t.Errorf("%s: %s calls {next_token} %v, nextval of the sequence %v; want %s", what, f, clock, seqOnly, what)
			}
			for _, set := range []string{"lock_timeout", "enable_bitmapscan", "enable_seqscan", "plan_cache_mode"} {
				if !strings.Contains(def, "SET "+set) {
					t.Errorf("%s: %s lost its setting %s:\n%s", what, f, set, def)
				}
			}
		}
		var exists bool
		if err := db.QueryRowContext(ctx, "SELECT to_regprocedure($1) IS NOT NULL", nextToken).Scan(&exists); err != nil {
			t.Fatal(err)
		}
		if exists != (what == "clock") {
			t.Errorf("%s: {next_token} exists %v", what, exists)
		}
		if exists {
			// It runs as its owner, on a search_path of its own.
			var definer bool
			var config string
			if err := db.QueryRowContext(ctx, "SELECT prosecdef, array_to_string(proconfig, ' ') FROM pg_proc WHERE oid = $1::regprocedure", nextToken).Scan(&definer, &config); err != nil {
				t.Fatal(err)
			}
			if want := "search_path=pg_catalog, " + d.QuoteIdent(ns.Schema) + ", pg_temp"; !definer || config != want && config != strings.ReplaceAll(want, `"`, "") {
				t.Errorf("%s: {next_token} SECURITY DEFINER %v, settings %q; want true and %q", what, definer, config, want)
			}
		}
	}
	uses("sequence")

	// A service role with the documented privileges of version 8.
	role := ns.Schema + " Svc-Role"
	createRole(t, db, d, role)
	r := d.QuoteIdent(role)
	for _, q := range []string{
		"GRANT USAGE ON SCHEMA " + d.QuoteIdent(ns.Schema) + " TO " + r,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA " + d.QuoteIdent(ns.Schema) + " TO " + r,
		"GRANT USAGE ON SEQUENCE " + seq + ", " + ns.Object(d, "ticket_seq") + " TO " + r,
		"REVOKE EXECUTE ON FUNCTION " + acq + ", " + fifo + " FROM PUBLIC",
		"GRANT EXECUTE ON FUNCTION " + acq + ", " + fifo + " TO " + r,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// Calls as the service role.
	asRole := func(key, leaseID string) (bool, int64, error) {
		tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			return false, 0, err
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, "SET LOCAL ROLE "+r); err != nil {
			return false, 0, err
		}
		var granted bool
		var tok int64
		err = tx.QueryRowContext(ctx, "SELECT granted, token FROM "+ns.Object(d, "acquire")+"($1, 'x', $2, 'svc', 60000000, 0, 0) WHERE granted OR lease_id = $2", key, leaseID).Scan(&granted, &tok)
		if err != nil {
			return false, 0, err
		}
		return granted, tok, tx.Commit()
	}

	// Leases granted by a version-8 build: exclusive, shared, FIFO, and
	// the service role's.
	var before []int64
	old := func(q string, args ...any) {
		t.Helper()
		var granted bool
		var tok int64
		if err := db.QueryRowContext(ctx, q, args...).Scan(&granted, &tok); err != nil || !granted {
			t.Fatalf("version-8 acquire: granted %v, %v", granted, err)
		}
		before = append(before, tok)
	}
	acquireSQL := "SELECT granted, token FROM " + ns.Object(d, "acquire") + "($1, $2, $3, 'old-build', 60000000, 0, 0) WHERE granted"
	fifoSQL := "SELECT granted, token FROM " + ns.Object(d, "acquire_fifo") + "($1, 'x', $2, 'old-build', 60000000, 0, 0, $3, 60000000) WHERE granted"
	old(acquireSQL, "up9/x", "x", "L-x")
	old(acquireSQL, "up9/s", "s", "L-s1")
	old(acquireSQL, "up9/s", "s", "L-s2")
	old(fifoSQL, "up9/fifo", "L-fifo", "T-fifo")
	if granted, tok, err := asRole("up9/svc", "L-svc"); err != nil || !granted {
		t.Fatalf("version-8 acquire as the service role: granted %v, %v", granted, err)
	} else {
		before = append(before, tok)
	}
	maxBefore := before[0]
	for _, tok := range before {
		maxBefore = max(maxBefore, tok)
	}

	if _, err := lock.New(ctx, db, d, lock.WithSchema(ns.Schema)); err == nil {
		t.Fatal("lock.New on a version-8 schema: want a *lock.SchemaError, got nil")
	} else if se := (*lock.SchemaError)(nil); !errors.As(err, &se) || se.Current != 8 || se.Want < 9 {
		t.Fatalf("lock.New on a version-8 schema: %v, want a *lock.SchemaError at 8 of 9 or later", err)
	}
	applied, err := p.UpTo(ctx, 9)
	if err != nil || len(applied) != 1 || applied[0].Source.Version != 9 {
		t.Fatalf("Up to 9 from version 8 applied %v, %v; want 00009 alone", applied, err)
	}
	uses("clock")
	if _, err := migrate.Up(ctx, db, d, migrate.WithNamespace(ns)); err != nil {
		t.Fatal(err)
	}

	var mayUpdate bool
	if err := db.QueryRowContext(ctx, "SELECT has_sequence_privilege($1, $2, 'UPDATE')", role, seq).Scan(&mayUpdate); err != nil || mayUpdate {
		t.Fatalf("the service role may update the sequence: %v, %v; want USAGE only", mayUpdate, err)
	}
	clock := dbClockUS(t, db)
	if granted, tok, err := asRole("up9/svc2", "L-svc2"); err != nil || !granted {
		t.Fatalf("version-9 acquire as the service role: granted %v, %v", granted, err)
	} else if tok <= maxBefore || tok < clock {
		t.Errorf("the service role's token %d: want it above %d (before the migration) and at least the clock %d", tok, maxBefore, clock)
	}

	l, err := lock.New(ctx, db, d, lock.WithSchema(ns.Schema))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	// The version-8 leases still exclude.
	for _, key := range []string{"up9/x", "up9/s", "up9/fifo", "up9/svc"} {
		if _, err := l.TryAcquire(ctx, key, lock.Exclusive); !errors.Is(err, lock.ErrLocked) {
			t.Fatalf("TryAcquire of %q, held since version 8: %v, want ErrLocked", key, err)
		}
	}
	// Shared with the version-8 readers, then every key once free.
	le, err := l.TryAcquire(ctx, "up9/s", lock.Shared)
	if err != nil {
		t.Fatal(err)
	}
	if le.Token() <= maxBefore {
		t.Errorf("shared token %d after %d: want it greater (SPEC S3)", le.Token(), maxBefore)
	}
	if err := le.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "DELETE FROM "+ns.Object(d, "holders")); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"up9/x", "up9/s", "up9/fifo", "up9/svc"} {
		grantAbove(t, l, key, maxBefore)
	}

	// Down to 8: the sequence alone again, from where the clock left it.
	var highest int64
	if err := db.QueryRowContext(ctx, "SELECT last_value FROM "+seq).Scan(&highest); err != nil {
		t.Fatal(err)
	}
	if _, err := p.DownTo(ctx, 8); err != nil {
		t.Fatal(err)
	}
	uses("sequence")
	var granted bool
	var tok int64
	if err := db.QueryRowContext(ctx, acquireSQL, "up9/down", "x", "L-down").Scan(&granted, &tok); err != nil || !granted || tok <= highest {
		t.Fatalf("version-8 acquire after Down: granted %v, token %d, %v; want a token above %d", granted, tok, err, highest)
	}
	if applied, err := p.UpTo(ctx, 9); err != nil || len(applied) != 1 {
		t.Fatalf("Up after Down: %v, %v", applied, err)
	}
	uses("clock")
	if granted, next, err := asRole("up9/svc3", "L-svc3"); err != nil || !granted || next <= tok {
		t.Fatalf("acquire as the service role after Up again: granted %v, token %d after %d, %v", granted, next, tok, err)
	}
}

// BenchmarkTokenAcquireRelease measures one grant and its release (the
// acquire function, then this build's Release statement, each its own
// statement on one connection) at migration 8 (tokens from the sequence
// alone) and 9 (tokens from {next_token}), in schemas of their own. Run
// with -count to interleave the two:
//
//	go test -run '^$' -bench TokenAcquireRelease -count 5 ./dialect/pgdialect
func BenchmarkTokenAcquireRelease(b *testing.B) {
	for _, v := range []int64{8, 9} {
		b.Run(fmt.Sprintf("v%d", v), func(b *testing.B) {
			ctx := context.Background()
			db, d, ns, _ := schemaAt(b, "sqlease_bench9_", v)
			acq := "SELECT granted, token FROM " + ns.Object(d, "acquire") + "('k', 'x', $1, 'bench', 60000000, 0, 0) WHERE granted"
			rel, err := dialect.Compile(d, ns, d.Statements().Release, []string{"lease_id", "token", "channel"})
			if err != nil {
				b.Fatal(err)
			}
			conn, err := db.Conn(ctx)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			for i := 0; b.Loop(); i++ {
				id := fmt.Sprintf("L%d", i)
				var granted bool
				var tok int64
				if err := conn.QueryRowContext(ctx, acq, id).Scan(&granted, &tok); err != nil || !granted {
					b.Fatalf("acquire: %v %v", granted, err)
				}
				rows, err := conn.QueryContext(ctx, rel.SQL, rel.Args(map[string]any{"lease_id": id, "token": tok, "channel": "sqlease_bench9"})...)
				if err != nil {
					b.Fatal(err)
				}
				if err := rows.Close(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestTokenCostMeasure (run only with SQLEASE_MEASURE_TOKENS=1) logs the
// cost of a grant at migration 8 and 9, in interleaved rounds on schemas
// of their own: a grant and its release as the engine sends them (each
// statement its own transaction, so the grant waits for its WAL flush), and
// the acquire function alone (2,000 grants of different keys in one
// transaction that is rolled back: server time only).
func TestTokenCostMeasure(t *testing.T) {
	if os.Getenv("SQLEASE_MEASURE_TOKENS") != "1" {
		t.Skip("set SQLEASE_MEASURE_TOKENS=1 to measure")
	}
	measureGrantCost(t, "sqlease_cost", map[int64]string{8: "", 9: ""})
}

// TestLimitCostMeasure (run only with SQLEASE_MEASURE_LIMIT=1) logs the
// cost of a plain exclusive grant at migration 10 and 11 (semaphores, SPEC
// W7), called as each build calls it (at 11 with p_limit 0), as
// TestTokenCostMeasure does.
func TestLimitCostMeasure(t *testing.T) {
	if os.Getenv("SQLEASE_MEASURE_LIMIT") != "1" {
		t.Skip("set SQLEASE_MEASURE_LIMIT=1 to measure")
	}
	measureGrantCost(t, "sqlease_limcost", map[int64]string{10: "", 11: ", 0::bigint"})
}

// measureGrantCost logs the cost of a grant at each schema version of
// extra (on schemas of their own named prefix + version), in interleaved
// rounds: a grant and its release as the engine sends them (each statement
// its own transaction, so the grant waits for its WAL flush), and the
// acquire function alone (2,000 grants of different keys in one
// transaction that is rolled back: server time only). extra is appended to
// the acquire function's arguments.
func measureGrantCost(t *testing.T, prefix string, extra map[int64]string) {
	ctx := context.Background()
	type target struct {
		conn         *sql.Conn
		acq, bulk    string
		rel          dialect.Stmt
		pair, server []float64
	}
	var targets []*target
	versions := slices.Sorted(maps.Keys(extra))
	for _, v := range versions {
		db, d, ns, _ := schemaAt(t, fmt.Sprintf("%s%d_", prefix, v), v)
		rel, err := dialect.Compile(d, ns, d.Statements().Release, []string{"lease_id", "token", "channel"})
		if err != nil {
			t.Fatal(err)
		}
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		targets = append(targets, &target{conn: conn, rel: rel,
			acq:  "SELECT granted, token FROM " + ns.Object(d, "acquire") + "('k', 'x', $1, 'bench', 60000000, 0, 0" + extra[v] + ") WHERE granted",
			bulk: "SELECT count(*) FROM generate_series(1, 2000) g, LATERAL " + ns.Object(d, "acquire") + "('k' || g, 'x', 'L' || g, 'bench', 60000000, 0, 0" + extra[v] + ") a WHERE a.granted"})
	}
	const pairs = 1000
	for round := range 6 {
		for _, tg := range targets {
			start := time.Now()
			for i := range pairs {
				id := fmt.Sprintf("R%dL%d", round, i)
				var granted bool
				var tok int64
				if err := tg.conn.QueryRowContext(ctx, tg.acq, id).Scan(&granted, &tok); err != nil || !granted {
					t.Fatalf("acquire: %v %v", granted, err)
				}
				rows, err := tg.conn.QueryContext(ctx, tg.rel.SQL, tg.rel.Args(map[string]any{"lease_id": id, "token": tok, "channel": "sqlease_cost"})...)
				if err != nil {
					t.Fatal(err)
				}
				if err := rows.Close(); err != nil {
					t.Fatal(err)
				}
			}
			tg.pair = append(tg.pair, float64(time.Since(start).Microseconds())/pairs)

			tx, err := tg.conn.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
			if err != nil {
				t.Fatal(err)
			}
			start = time.Now()
			var n int
			if err := tx.QueryRowContext(ctx, tg.bulk).Scan(&n); err != nil || n != 2000 {
				t.Fatalf("bulk acquire: %d, %v", n, err)
			}
			tg.server = append(tg.server, float64(time.Since(start).Microseconds())/2000)
			_ = tx.Rollback()
		}
	}
	med := func(xs []float64) float64 {
		s := slices.Clone(xs)
		slices.Sort(s)
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	for i, tg := range targets {
		t.Logf("migration %d: acquire+release %.1f µs (median of 6 rounds of %d; rounds %.0f), acquire function alone %.1f µs (minimum %.1f; rounds %.1f)",
			versions[i], med(tg.pair), pairs, tg.pair, med(tg.server), slices.Min(tg.server), tg.server)
	}
}
