package pgdialect_test

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"

	"github.com/sqlease/sqlease/conformance/conftest"
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/pgdialect"
	"github.com/sqlease/sqlease/migrate"
)

// TestAcquireFastPathDifferential compares the acquire function of
// migration 00005 (a fast path in front of the full path) with the one
// before it (the Down section of 00005, installed in a second schema) on
// 2,000 random states of one key's rows: live and expired holders of both
// modes on the key and on another key, the caller's own and another
// waiter's markers, live and expired, and both modes asked for. Each call
// runs on the state in a transaction that is rolled back. Both must give
// the same answer (granted or not, the same rows, the same token, where a
// newly issued one need only be greater than every token before it: the
// new schema's comes from the clock, migration 00009) and leave the same
// live rows (SPEC S1, S3, W1). The fast path may leave
// expired rows the full path would have taken over; the test counts those
// grants to show that the fast path ran.
func TestAcquireFastPathDifferential(t *testing.T) {
	ctx := context.Background()
	dsn := conftest.PostgresDSN(t)
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	d := pgdialect.New()
	var rnd [6]byte
	_, _ = crand.Read(rnd[:])
	newNS := dialect.Namespace{Schema: "sqlease_fast_" + hex.EncodeToString(rnd[:])}
	oldNS := dialect.Namespace{Schema: newNS.Schema + "_old"}
	for _, ns := range []dialect.Namespace{newNS, oldNS} {
		q := "DROP SCHEMA IF EXISTS " + d.QuoteIdent(ns.Schema) + " CASCADE"
		_, _ = db.ExecContext(ctx, q)
		defer db.ExecContext(context.Background(), q)
		if _, err := migrate.Up(ctx, db, d, migrate.WithNamespace(ns)); err != nil {
			t.Fatal(err)
		}
	}
	// The old function: the Down section of 00005, rendered for oldNS.
	rendered, err := migrate.FS(d, migrate.WithNamespace(oldNS))
	if err != nil {
		t.Fatal(err)
	}
	src, err := fs.ReadFile(rendered, "00005_acquire_fast_path.sql")
	if err != nil {
		t.Fatal(err)
	}
	down := string(src[strings.Index(string(src), "-- +goose Down"):])
	down = down[strings.Index(down, "-- +goose StatementBegin")+len("-- +goose StatementBegin") : strings.Index(down, "-- +goose StatementEnd")]
	if !strings.Contains(down, "CREATE OR REPLACE FUNCTION") || strings.Contains(down, "pg_try_advisory_xact_lock") {
		t.Fatalf("the Down section of 00005 is not the old function:\n%s", down)
	}
	// The function of migration 00011 takes an eighth argument (p_limit,
	// SPEC W7) with a default: drop it, or the seven-argument calls would
	// be ambiguous. The new schema's calls run it with p_limit 0.
	drop := "DROP FUNCTION " + oldNS.Object(d, "acquire") + "(text, text, text, text, bigint, bigint, bigint, bigint)"
	if _, err := db.ExecContext(ctx, drop); err != nil {
		t.Fatalf("dropping the new function from the old schema: %v", err)
	}
	if _, err := db.ExecContext(ctx, down); err != nil {
		t.Fatalf("installing the old function: %v", err)
	}

	rng := rand.New(rand.NewPCG(5, 7))
	granted, refused, leftExpired := 0, 0, 0
	diffs := map[string]int{}
	examples := map[string]string{}
	for i := 0; i < 2000; i++ {
		var setup []string
		ids := []string{"a", "b", "c", "d"}
		used := map[string]bool{}
		for j := rng.IntN(4); j > 0; j-- {
			id := ids[rng.IntN(len(ids))]
			if used[id] {
				continue
			}
			used[id] = true
			key := []string{"k", "k", "k2"}[rng.IntN(3)]
			mode := []string{"x", "s"}[rng.IntN(2)]
			off := []string{"-5 s", "5 s"}[rng.IntN(2)]
			setup = append(setup, fmt.Sprintf("INSERT INTO {holders} VALUES ('%s','%s','%s','o',%d,clock_timestamp(),clock_timestamp() + interval '%s')", id, key, mode, 10+rng.IntN(20), off))
		}
		if rng.IntN(2) == 0 {
			w := []string{"me", "other"}[rng.IntN(2)]
			off := []string{"-5 s", "5 s"}[rng.IntN(2)]
			setup = append(setup, fmt.Sprintf("INSERT INTO {markers} VALUES ('k','%s','o',clock_timestamp() + interval '%s')", w, off))
		}
		mode := []string{"x", "s"}[rng.IntN(2)]
		markerUS := []int64{0, 0, 10e6}[rng.IntN(3)]
		watchUS := []int64{0, 10e6}[rng.IntN(2)]
		var outs, states [2]string
		var expired [2]int
		for v, ns := range []dialect.Namespace{oldNS, newNS} {
			outs[v], states[v], expired[v] = fastPathCall(ctx, t, db, d, ns, setup, mode, markerUS, watchUS)
		}
		if strings.HasPrefix(outs[1], "granted") {
			granted++
			if expired[1] > expired[0] {
				leftExpired++
			}
		} else {
			refused++
		}
		if outs[0] != outs[1] || states[0] != states[1] {
			cls := fmt.Sprintf("old=%.30s new=%.30s sameLive=%v", outs[0], outs[1], states[0] == states[1])
			diffs[cls]++
			if _, ok := examples[cls]; !ok {
				examples[cls] = fmt.Sprintf("mode=%s marker=%d watch=%d setup=%q\n  old: %s | %s\n  new: %s | %s", mode, markerUS, watchUS, setup, outs[0], states[0], outs[1], states[1])
			}
		}
	}
	for cls, n := range diffs {
		t.Errorf("%d of 2000 states differ: %s\n  e.g. %s", n, cls, examples[cls])
	}
	if granted < 200 || refused < 200 || leftExpired < 20 {
		t.Errorf("the states exercised %d grants (%d by the fast path past expired rows) and %d refusals; want at least 200, 20 and 200", granted, leftExpired, refused)
	}
}

// fastPathCall sets up one state in ns inside a READ COMMITTED transaction,
// calls the acquire function as the lease "me", and returns its answer, the
// live rows afterwards and the number of expired rows left; the transaction
// is rolled back.
func fastPathCall(ctx context.Context, t *testing.T, db *sql.DB, d pgdialect.Dialect, ns dialect.Namespace, setup []string, mode string, markerUS, watchUS int64) (string, string, int) {
	t.Helper()
	obj := func(s string) string {
		for _, n := range []string{"holders", "markers", "watches", "token_seq", "acquire"} {
			s = strings.ReplaceAll(s, "{"+n+"}", ns.Object(d, n))
		}
		return s
	}
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	// setval is not transactional: both schemas start every state at 100.
	for _, s := range append([]string{"SELECT setval('{token_seq}', 100)"}, setup...) {
		if _, err := tx.ExecContext(ctx, obj(s)); err != nil {
			t.Fatalf("%s: %v", obj(s), err)
		}
	}
	rows, err := tx.QueryContext(ctx, obj(`SELECT granted, lease_id, mode, owner, token, expires_us - now_us FROM {acquire}('k', $1, 'me', 'me-owner', 30000000, $2, $3)`), mode, markerUS, watchUS)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		var g bool
		var id, m, owner string
		var tok, ttl int64
		if err := rows.Scan(&g, &id, &m, &owner, &tok, &ttl); err != nil {
			t.Fatal(err)
		}
		// The rows set up have tokens 10 to 29 and the sequence is at
		// 100: a token above 100 is the one this call issued, 101 from the
		// old function and the database clock in microseconds from the
		// current one (migration 00009); either is greater than every
		// token before it (SPEC S3).
		ts := fmt.Sprint(tok)
		if tok > 100 {
			ts = "issued"
		}
		if g {
			out = append(out, fmt.Sprintf("granted{%s %s %s tok=%s ttl=%ds}", id, m, owner, ts, (ttl+500000)/1000000))
		} else {
			out = append(out, fmt.Sprintf("refused{%s %s tok=%s}", id, m, ts))
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	var live []string
	var expired int
	r, err := tx.QueryContext(ctx, obj(`SELECT 'h:' || lease_id || ':' || lock_key || ':' || mode, expires_at > clock_timestamp() FROM {holders}
UNION ALL SELECT 'm:' || waiter_id || ':' || lock_key, expires_at > clock_timestamp() FROM {markers}
UNION ALL SELECT 'w:' || lock_key, expires_at > clock_timestamp() FROM {watches}`))
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var s string
		var isLive bool
		if err := r.Scan(&s, &isLive); err != nil {
			t.Fatal(err)
		}
		if isLive {
			live = append(live, s)
		} else {
			expired++
		}
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	sort.Strings(live)
	return strings.Join(out, " "), strings.Join(live, " "), expired
}
