package pgdialect_test

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"

	"github.com/sqlease/sqlease/conformance/conftest"
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/pgdialect"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// TestUpgradeToVersion6InlinesToUS: migration 00006 declares {to_us} STABLE
// so that PostgreSQL inlines it (an IMMUTABLE SQL function whose body is
// only STABLE never is, and ran through the SQL-function executor on every
// call). On a version-5 schema holding a lease, this build refuses to
// start; after 00006 the plan shows the expression instead of the call, the
// values are the same microseconds, and, with this build's Up applied, the
// lease granted before the upgrade still excludes, renews and releases
// (SPEC S1, H2, H5). Down to 5 restores the IMMUTABLE function and 00006
// applies again.
func TestUpgradeToVersion6InlinesToUS(t *testing.T) {
	ctx := context.Background()
	db, d, ns, p := schemaAt(t, "sqlease_up6_", 5)
	toUS := ns.Object(d, "to_us")
	inlined := func() bool {
		t.Helper()
		rows, err := db.QueryContext(ctx, "EXPLAIN (VERBOSE, COSTS OFF) SELECT "+toUS+"(clock_timestamp())")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var plan []string
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, line)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		text := strings.Join(plan, "\n")
		return !strings.Contains(text, "to_us") && strings.Contains(text, "EXTRACT(epoch FROM clock_timestamp())")
	}
	if inlined() {
		t.Fatal("version 5: {to_us} is already inlined; the test no longer shows what 00006 changes")
	}

	// A lease granted by a version-5 build (the acquire function of 00005).
	var granted bool
	var leaseID string
	var token int64
	err := db.QueryRowContext(ctx, "SELECT granted, lease_id, token FROM "+ns.Object(d, "acquire")+"('up6', 'x', 'L-old', 'old-build', 60000000, 0, 0)").Scan(&granted, &leaseID, &token)
	if err != nil || !granted {
		t.Fatalf("version-5 acquire: granted %v, %v", granted, err)
	}

	// This build refuses version 5; 00006 inlines the function.
	if _, err := lock.New(ctx, db, d, lock.WithSchema(ns.Schema)); err == nil {
		t.Fatal("lock.New on a version-5 schema: want a *lock.SchemaError, got nil")
	} else if se := (*lock.SchemaError)(nil); !errors.As(err, &se) || se.Current != 5 || se.Want < 6 {
		t.Fatalf("lock.New on a version-5 schema: %v, want a *lock.SchemaError at 5", err)
	}
	if _, err := p.UpTo(ctx, 6); err != nil {
		t.Fatal(err)
	}
	if !inlined() {
		t.Fatal("version 6: {to_us} is not inlined")
	}
	var viaFunc, viaExpr int64
	err = db.QueryRowContext(ctx, "SELECT "+toUS+"(t), (extract(epoch FROM t) * 1000000)::bigint FROM (SELECT timestamptz '2026-12-01 23:04:02.123456+00' AS t) s").Scan(&viaFunc, &viaExpr)
	if err != nil || viaFunc != viaExpr || viaFunc != time.Date(2026, 12, 1, 23, 4, 2, 123456000, time.UTC).UnixMicro() {
		t.Fatalf("{to_us} gives %d, the expression %d (%v); want both %d", viaFunc, viaExpr, err, time.Date(2026, 12, 1, 23, 4, 2, 123456000, time.UTC).UnixMicro())
	}

	// The old lease still excludes; renewed and released through this
	// build, the key is free again, and the next token is greater.
	if _, err := migrate.Up(ctx, db, d, migrate.WithNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	l, err := lock.New(ctx, db, d, lock.WithSchema(ns.Schema))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	if _, err := l.TryAcquire(ctx, "up6", lock.Exclusive); !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("TryAcquire of a key a version-5 build holds: %v, want ErrLocked", err)
	}
	var expUS, nowUS int64
	err = db.QueryRowContext(ctx, "UPDATE "+ns.Object(d, "holders")+" SET expires_at = clock_timestamp() + interval '1 minute' WHERE lease_id = $1 RETURNING "+toUS+"(expires_at), "+toUS+"(clock_timestamp())", leaseID).Scan(&expUS, &nowUS)
	if err != nil || expUS-nowUS < 59_000_000 || expUS-nowUS > 60_000_000 {
		t.Fatalf("renewal of the old lease: expires %d µs after now, %v; want about 60 s", expUS-nowUS, err)
	}
	if _, err := db.ExecContext(ctx, "DELETE FROM "+ns.Object(d, "holders")+" WHERE lease_id = $1", leaseID); err != nil {
		t.Fatal(err)
	}
	grantAbove(t, l, "up6", token)

	// Down to 5 restores the IMMUTABLE function; 00006 applies again.
	if _, err := p.DownTo(ctx, 5); err != nil {
		t.Fatal(err)
	}
	if inlined() {
		t.Fatal("after Down to 5: {to_us} is still inlined")
	}
	if applied, err := p.UpTo(ctx, 6); err != nil || len(applied) != 1 {
		t.Fatalf("Up to 6 after Down: %v, %v", applied, err)
	}
	if !inlined() {
		t.Fatal("after Up again: {to_us} is not inlined")
	}
}

// schemaAt creates a private schema (named prefix + random hex) whose lock
// tables are at version v (0: this build's latest, through migrate.Up),
// and returns the pool, the dialect, the
// namespace and a goose provider over this build's migrations, for moving
// between versions. The schema is dropped when the test ends.
func schemaAt(t testing.TB, prefix string, v int64) (*sql.DB, pgdialect.Dialect, dialect.Namespace, *goose.Provider) {
	t.Helper()
	ctx := context.Background()
	db, err := sql.Open("pgx", conftest.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	d := pgdialect.New()
	var rnd [5]byte
	_, _ = crand.Read(rnd[:])
	ns := dialect.Namespace{Schema: prefix + hex.EncodeToString(rnd[:])}
	t.Cleanup(func() {
		db.ExecContext(context.Background(), "DROP SCHEMA IF EXISTS "+d.QuoteIdent(ns.Schema)+" CASCADE")
	})
	if _, err := db.ExecContext(ctx, "CREATE SCHEMA "+d.QuoteIdent(ns.Schema)); err != nil {
		t.Fatal(err)
	}
	fsys, err := migrate.FS(d, migrate.WithNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	store, err := database.NewStore(database.DialectPostgres, ns.VersionTable())
	if err != nil {
		t.Fatal(err)
	}
	p, err := goose.NewProvider("", db, fsys, goose.WithStore(store), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	if v > 0 {
		_, err = p.UpTo(ctx, v)
	} else {
		_, err = migrate.Up(ctx, db, d, migrate.WithNamespace(ns))
	}
	if err != nil {
		t.Fatal(err)
	}
	return db, d, ns, p
}

// TestUpgradeToVersion7PlansOnce: migration 00007 gives both acquire
// functions plan_cache_mode = force_generic_plan, so a connection plans
// their statements once instead of on each of its first five calls, and
// enable_seqscan = off, so those plans are index scans whatever the
// statistics (TestAcquirePlansStayOnIndexes), and keeps the settings
// earlier migrations gave them. On a version-6 schema
// with a lease and a pending-writer marker, this build refuses to start,
// Up applies only 00007, and the lease granted before the upgrade still
// excludes; the marked waiter gets the key when it is released, through
// the function's full path, with a greater token (SPEC S1, S3, W1). Down
// to 6 removes the setting alone, and Up applies 00007 again.
func TestUpgradeToVersion7PlansOnce(t *testing.T) {
	ctx := context.Background()
	db, d, ns, p := schemaAt(t, "sqlease_up7_", 6)
	settings := func(fn string) string {
		t.Helper()
		var cfg sql.NullString
		err := db.QueryRowContext(ctx, "SELECT array_to_string(proconfig, ' ') FROM pg_proc WHERE oid = $1::regproc", ns.Object(d, fn)).Scan(&cfg)
		if err != nil {
			t.Fatal(err)
		}
		return cfg.String
	}
	added := []string{"plan_cache_mode=force_generic_plan", "enable_seqscan=off"}
	kept := []string{"lock_timeout=2s", "enable_bitmapscan=off"}
	check := func(when string, wantAdded bool) {
		t.Helper()
		for _, fn := range []string{"acquire", "acquire_fifo"} {
			got := settings(fn)
			for _, a := range added {
				if strings.Contains(got, a) != wantAdded {
					t.Errorf("%s: {%s} has settings %q; want %s: %v", when, fn, got, a, wantAdded)
				}
			}
			for _, k := range kept {
				if !strings.Contains(got, k) {
					t.Errorf("%s: {%s} has settings %q; want %s kept", when, fn, got, k)
				}
			}
		}
	}
	check("version 6", false)

	// A lease granted by a version-6 build, and a waiter's marker on its key.
	acquire := "SELECT granted, lease_id, token FROM " + ns.Object(d, "acquire") + "($1, 'x', $2, 'old-build', 60000000, $3, 0) WHERE granted OR lease_id = $2"
	var granted bool
	var leaseID string
	var token int64
	if err := db.QueryRowContext(ctx, acquire, "up7", "L-old", 0).Scan(&granted, &leaseID, &token); err != nil || !granted {
		t.Fatalf("version-6 acquire: granted %v, %v", granted, err)
	}
	if err := db.QueryRowContext(ctx, acquire, "up7", "L-waiter", 5_000_000).Scan(&granted, &leaseID, new(int64)); err != nil || granted || leaseID != "L-waiter" {
		t.Fatalf("version-6 waiter: granted %v, marker %q, %v; want refused with its marker", granted, leaseID, err)
	}

	if _, err := lock.New(ctx, db, d, lock.WithSchema(ns.Schema)); err == nil {
		t.Fatal("lock.New on a version-6 schema: want a *lock.SchemaError, got nil")
	} else if se := (*lock.SchemaError)(nil); !errors.As(err, &se) || se.Current != 6 || se.Want < 7 {
		t.Fatalf("lock.New on a version-6 schema: %v, want a *lock.SchemaError at 6 of 7 or later", err)
	}
	applied, err := p.UpTo(ctx, 7)
	if err != nil || len(applied) != 1 || applied[0].Source.Version != 7 {
		t.Fatalf("Up to 7 from version 6 applied %v, %v; want 00007 alone", applied, err)
	}
	check("version 7", true)
	// This build needs later migrations too (00008 changes neither function).
	if _, err := migrate.Up(ctx, db, d, migrate.WithNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	check("latest", true)

	l, err := lock.New(ctx, db, d, lock.WithSchema(ns.Schema))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	if _, err := l.TryAcquire(ctx, "up7", lock.Exclusive); !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("TryAcquire of a key a version-6 build holds: %v, want ErrLocked", err)
	}
	// The old holder releases; the marked waiter (still the version-6
	// build's waiter) is granted through the full path, which clears its
	// marker, and its token is greater.
	if _, err := db.ExecContext(ctx, "DELETE FROM "+ns.Object(d, "holders")+" WHERE lease_id = 'L-old'"); err != nil {
		t.Fatal(err)
	}
	var next int64
	if err := db.QueryRowContext(ctx, acquire, "up7", "L-waiter", 5_000_000).Scan(&granted, &leaseID, &next); err != nil || !granted || leaseID != "L-waiter" {
		t.Fatalf("marked waiter after the release: granted %v (%q), %v", granted, leaseID, err)
	}
	if next <= token {
		t.Errorf("token %d after %d: want it greater (SPEC S3)", next, token)
	}
	var markers int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+ns.Object(d, "markers")).Scan(&markers); err != nil || markers != 0 {
		t.Fatalf("markers after the waiter's grant: %d, %v; want 0", markers, err)
	}
	if _, err := db.ExecContext(ctx, "DELETE FROM "+ns.Object(d, "holders")+" WHERE lease_id = 'L-waiter'"); err != nil {
		t.Fatal(err)
	}
	grantAbove(t, l, "up7", next)

	if _, err := p.DownTo(ctx, 6); err != nil {
		t.Fatal(err)
	}
	check("after Down to 6", false)
	if applied, err := p.UpTo(ctx, 7); err != nil || len(applied) != 1 {
		t.Fatalf("Up after Down: %v, %v", applied, err)
	}
	check("after Up again", true)
}

// releaseV7 is the Release statement of the builds before migration 00008,
// which they keep sending while a newer build upgrades the tables.
const releaseV7 = `WITH gone AS (
    DELETE FROM {holders} WHERE lease_id = @lease_id AND (token = @token OR @token::bigint = 0)
    RETURNING lock_key, set_config('synchronous_commit', 'off', true)
), seen AS (
    SELECT g.lock_key,
           EXISTS (SELECT 1 FROM {watches} w WHERE w.lock_key = g.lock_key AND w.expires_at > clock_timestamp()) AS watched
    FROM gone g
), st AS (
    SELECT s.lock_key, s.watched,
           s.watched AND NOT EXISTS (SELECT 1 FROM {holders} h
                       WHERE h.lock_key = s.lock_key AND h.lease_id <> @lease_id AND h.expires_at > clock_timestamp()) AS free,
           CASE WHEN s.watched
                THEN (SELECT m.waiter_id FROM {markers} m WHERE m.lock_key = s.lock_key AND m.expires_at > clock_timestamp()) END AS marked
    FROM seen s
), woke AS (
    DELETE FROM {watches} w USING st
    WHERE w.lock_key = st.lock_key AND st.free AND st.marked IS NULL
)
SELECT st.lock_key,
       CASE WHEN st.watched AND st.free
            THEN pg_notify(@channel, coalesce(chr(30) || st.marked || chr(30), '') || st.lock_key) END
FROM st`

// TestUpgradeToVersion8ReleasesWithWake: migration 00008 drops the holders
// table's CHECK on mode (the acquire functions refuse any other mode) and
// adds the {wake} function this build's Release calls for watched keys.
// On a version-7 schema where an old build holds a key that its own marked
// waiter watches, this build refuses to start and Up applies only 00008.
// The old build's release (its common table expression) still works on
// version 8 and names the marked waiter, which is then granted with a
// greater token (SPEC S3, W1); this build's Locker works on the key after
// it. A mode other than x or s is still refused, by the function. Down to 7
// restores the CHECK and drops {wake}; Up applies 00008 again.
func TestUpgradeToVersion8ReleasesWithWake(t *testing.T) {
	ctx := context.Background()
	db, d, ns, p := schemaAt(t, "sqlease_up8_", 7)
	holders := ns.Object(d, "holders")
	hasCheck := func() bool {
		t.Helper()
		var n int
		if err := db.QueryRowContext(ctx, "SELECT count(*) FROM pg_constraint WHERE conrelid = $1::regclass AND contype = 'c'", holders).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	hasWake := func() bool {
		t.Helper()
		var ok bool
		if err := db.QueryRowContext(ctx, "SELECT to_regprocedure($1) IS NOT NULL", ns.Object(d, "wake")+"(text, text, text)").Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !hasCheck() || hasWake() {
		t.Fatalf("version 7: CHECK %v, {wake} %v; want the CHECK and no {wake}", hasCheck(), hasWake())
	}

	// An old build's lease, and its waiter's marker and watch on the key.
	acquire := "SELECT granted, lease_id, token FROM " + ns.Object(d, "acquire") + "($1, 'x', $2, 'old-build', 60000000, $3, $4) WHERE granted OR lease_id = $2"
	var granted bool
	var leaseID string
	var token int64
	if err := db.QueryRowContext(ctx, acquire, "up8", "L-old", 0, 0).Scan(&granted, &leaseID, &token); err != nil || !granted {
		t.Fatalf("version-7 acquire: granted %v, %v", granted, err)
	}
	if err := db.QueryRowContext(ctx, acquire, "up8", "L-waiter", 5_000_000, 5_000_000).Scan(&granted, &leaseID, new(int64)); err != nil || granted || leaseID != "L-waiter" {
		t.Fatalf("version-7 waiter: granted %v, marker %q, %v; want refused with its marker", granted, leaseID, err)
	}

	if _, err := lock.New(ctx, db, d, lock.WithSchema(ns.Schema)); err == nil {
		t.Fatal("lock.New on a version-7 schema: want a *lock.SchemaError, got nil")
	} else if se := (*lock.SchemaError)(nil); !errors.As(err, &se) || se.Current != 7 || se.Want < 8 {
		t.Fatalf("lock.New on a version-7 schema: %v, want a *lock.SchemaError at 7 of 8 or later", err)
	}
	applied, err := p.UpTo(ctx, 8)
	if err != nil || len(applied) != 1 || applied[0].Source.Version != 8 {
		t.Fatalf("Up to 8 from version 7 applied %v, %v; want 00008 alone", applied, err)
	}
	if hasCheck() || !hasWake() {
		t.Fatalf("version 8: CHECK %v, {wake} %v; want no CHECK and {wake}", hasCheck(), hasWake())
	}

	// The old build releases with its own statement; the notification
	// names its marked waiter.
	const channel = "sqlease_up8_test"
	listener := listen(t, channel)
	old, err := dialect.Compile(d, ns, releaseV7, []string{"lease_id", "token", "channel"})
	if err != nil {
		t.Fatal(err)
	}
	var key string
	var payload sql.NullString
	if err := db.QueryRowContext(ctx, old.SQL, old.Args(map[string]any{"lease_id": "L-old", "token": token, "channel": channel})...).Scan(&key, &payload); err != nil || key != "up8" {
		t.Fatalf("old build's release on version 8: key %q, %v", key, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	n, err := listener.WaitForNotification(wctx)
	cancel()
	if err != nil || n.Payload != (dialect.Wake{Key: "up8", WaiterID: "L-waiter"}).Payload() {
		t.Fatalf("notification of the old build's release: %+v, %v; want the marked waiter named", n, err)
	}
	var next int64
	if err := db.QueryRowContext(ctx, acquire, "up8", "L-waiter", 5_000_000, 5_000_000).Scan(&granted, &leaseID, &next); err != nil || !granted || leaseID != "L-waiter" {
		t.Fatalf("marked waiter after the release: granted %v (%q), %v", granted, leaseID, err)
	}
	if next <= token {
		t.Errorf("token %d after %d: want it greater (SPEC S3)", next, token)
	}

	// This build needs later migrations too (00009 changes only how the
	// acquire functions compute a token).
	if _, err := migrate.Up(ctx, db, d, migrate.WithNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	l, err := lock.New(ctx, db, d, lock.WithSchema(ns.Schema))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	if _, err := l.TryAcquire(ctx, "up8", lock.Exclusive); !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("TryAcquire of a key the old build's waiter holds: %v, want ErrLocked", err)
	}
	if _, err := db.ExecContext(ctx, "DELETE FROM "+holders+" WHERE lease_id = 'L-waiter'"); err != nil {
		t.Fatal(err)
	}
	grantAbove(t, l, "up8", next)

	// Without the CHECK, the function still refuses another mode, and
	// writes nothing.
	_, err = db.ExecContext(ctx, "SELECT * FROM "+ns.Object(d, "acquire")+"('up8', 'z', 'L-bad', 'test', 60000000, 0, 0)")
	if pe := (*pgconn.PgError)(nil); !errors.As(err, &pe) || pe.Code != "22023" {
		t.Fatalf("acquire with mode z: %v, want SQLSTATE 22023", err)
	}
	var rows int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+holders).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("holder rows after the refused mode: %d, %v; want 0", rows, err)
	}

	if _, err := p.DownTo(ctx, 7); err != nil {
		t.Fatal(err)
	}
	if !hasCheck() || hasWake() {
		t.Fatalf("after Down to 7: CHECK %v, {wake} %v; want the CHECK back and no {wake}", hasCheck(), hasWake())
	}
	if applied, err := p.UpTo(ctx, 8); err != nil || len(applied) != 1 {
		t.Fatalf("Up after Down: %v, %v", applied, err)
	}
	if hasCheck() || !hasWake() {
		t.Fatalf("after Up again: CHECK %v, {wake} %v", hasCheck(), hasWake())
	}
}

// grantAbove checks that key is free for l: TryAcquire grants it with a
// token greater than after (SPEC S3), and the lease is released.
func grantAbove(t *testing.T, l *lock.Locker, key string, after int64) {
	t.Helper()
	ctx := context.Background()
	le, err := l.TryAcquire(ctx, key, lock.Exclusive)
	if err != nil {
		t.Fatalf("TryAcquire of the free key %q: %v", key, err)
	}
	if le.Token() <= after {
		t.Errorf("token %d after %d: want it greater (SPEC S3)", le.Token(), after)
	}
	if err := le.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// listen returns a connection of its own that LISTENs on channel, closed
// when t ends.
func listen(t *testing.T, channel string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, conftest.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	if _, err := c.Exec(ctx, "LISTEN "+channel); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestUpgradeToVersion8KeepsLeasesMoving: dropping the CHECK locks the
// holders table ACCESS EXCLUSIVE, and every statement on the table queues
// behind a waiting lock request. With a fenced transaction holding a
// holder row for 3 s, migration 00008 waits for the table in steps of at
// most 200 ms, so an acquire of another key during the wait still
// completes within a second (unbounded, it would queue until the acquire
// function's own 2 s lock_timeout failed it), and the migration completes
// once the transaction ends.
func TestUpgradeToVersion8KeepsLeasesMoving(t *testing.T) {
	ctx := context.Background()
	db, d, ns, _ := schemaAt(t, "sqlease_up8w_", 7)
	acquire := "SELECT granted FROM " + ns.Object(d, "acquire") + "($1, 'x', $2, 'test', 60000000, 0, 0) WHERE granted"
	var granted bool
	if err := db.QueryRowContext(ctx, acquire, "fenced", "L-fenced").Scan(&granted); err != nil {
		t.Fatal(err)
	}
	// The fenced transaction: the holder row FOR KEY SHARE, as Lease.Fence.
	fence, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fence.Rollback()
	if _, err := fence.ExecContext(ctx, "SELECT 1 FROM "+ns.Object(d, "holders")+" WHERE lease_id = 'L-fenced' FOR KEY SHARE"); err != nil {
		t.Fatal(err)
	}
	const hold = 3 * time.Second
	fenceEnds := time.AfterFunc(hold, func() { _ = fence.Commit() })
	defer fenceEnds.Stop()

	migrated := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := migrate.Up(ctx, db, d, migrate.WithNamespace(ns))
		migrated <- err
	}()
	time.Sleep(500 * time.Millisecond) // the migration is waiting for the table by now
	for i := range 3 {
		t0 := time.Now()
		if err := db.QueryRowContext(ctx, acquire, fmt.Sprintf("other%d", i), fmt.Sprintf("L-other%d", i)).Scan(&granted); err != nil || !granted {
			t.Fatalf("acquire of another key while the migration waits: granted %v, %v", granted, err)
		}
		if took := time.Since(t0); took > time.Second {
			t.Errorf("acquire of another key while the migration waits took %v; want well under 1 s (the migration waits in steps of 200 ms)", took)
		}
	}
	select {
	case err := <-migrated:
		if took := time.Since(start); err != nil || took < hold-500*time.Millisecond {
			t.Fatalf("migrate.Up returned after %v: %v; want success after the fenced transaction ended (%v)", took, err, hold)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("migrate.Up did not finish within 30 s of the fenced transaction's start")
	}
	var v int64
	if err := db.QueryRowContext(ctx, "SELECT max(version_id) FROM "+ns.VersionTable()).Scan(&v); err != nil || v < 8 {
		t.Fatalf("version after the migration: %d, %v; want 8 or later", v, err)
	}
}

// TestUpgradeToVersion8GrantsWakeLikeAcquire: where EXECUTE on the acquire
// function was revoked from PUBLIC and granted to a service role, migration
// 00008 gives {wake} the same privileges, so that role's releases of
// watched keys keep working; where nothing was revoked, {wake} keeps the
// default (PUBLIC).
func TestUpgradeToVersion8GrantsWakeLikeAcquire(t *testing.T) {
	ctx := context.Background()
	for _, revoked := range []bool{false, true} {
		db, d, ns, _ := schemaAt(t, "sqlease_up8g_", 7)
		role := ns.Schema + " Svc-Role" // a name that needs quoting
		other := ns.Schema + "_other"
		for _, r := range []string{role, other} {
			if _, err := db.ExecContext(ctx, "CREATE ROLE "+d.QuoteIdent(r)); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				db.ExecContext(context.Background(), "DROP OWNED BY "+d.QuoteIdent(r))
				db.ExecContext(context.Background(), "DROP ROLE IF EXISTS "+d.QuoteIdent(r))
			})
		}
		acq := ns.Object(d, "acquire") + "(text, text, text, text, bigint, bigint, bigint)"
		if revoked {
			for _, q := range []string{"REVOKE EXECUTE ON FUNCTION " + acq + " FROM PUBLIC", "GRANT EXECUTE ON FUNCTION " + acq + " TO " + d.QuoteIdent(role) + " WITH GRANT OPTION"} {
				if _, err := db.ExecContext(ctx, q); err != nil {
					t.Fatal(err)
				}
			}
		}
		if _, err := migrate.Up(ctx, db, d, migrate.WithNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		wake := ns.Object(d, "wake") + "(text, text, text)"
		may := func(r string) bool {
			t.Helper()
			var ok bool
			if err := db.QueryRowContext(ctx, "SELECT has_function_privilege($1, $2, 'EXECUTE')", r, wake).Scan(&ok); err != nil {
				t.Fatal(err)
			}
			return ok
		}
		if !may(role) {
			t.Errorf("revoked %v: the service role may not execute {wake}", revoked)
		}
		if got := may(other); got == revoked {
			t.Errorf("revoked %v: a role without EXECUTE on {acquire} may execute {wake}: %v, want %v", revoked, got, !revoked)
		}
		if revoked {
			// The grant option came along: the service role may pass
			// {wake} on, as it may pass {acquire} on.
			var grantable bool
			if err := db.QueryRowContext(ctx, "SELECT has_function_privilege($1, $2, 'EXECUTE WITH GRANT OPTION')", role, wake).Scan(&grantable); err != nil || !grantable {
				t.Errorf("the service role may not grant {wake} on (%v); want the grant option of {acquire} copied", err)
			}
		}
	}
}

// TestUpgradeToVersion11KeepsCallsAndGrants: migration 00011 (semaphores,
// SPEC W7) drops and creates the acquire functions with a last parameter
// p_limit DEFAULT 0. On a version-10 schema whose functions' EXECUTE was
// revoked from PUBLIC and granted to a service role (with grant option),
// holding a shared lease granted by a version-10 call: after the upgrade
// the role keeps its grants and PUBLIC gets none, a call as older builds
// send it (seven arguments) still grants and refuses as before, this
// build's Locker counts the old lease against lock.Limit, and Down to 10
// restores the seven-argument function with the same grants.
func TestUpgradeToVersion11KeepsCallsAndGrants(t *testing.T) {
	ctx := context.Background()
	db, d, ns, p := schemaAt(t, "sqlease_up11_", 10)
	role := ns.Schema + " Svc-Role"
	createRole(t, db, d, role)
	acq, fifo := ns.Object(d, "acquire"), ns.Object(d, "acquire_fifo")
	old := []string{acq + "(text, text, text, text, bigint, bigint, bigint)", fifo + "(text, text, text, text, bigint, bigint, bigint, text, bigint)"}
	now := []string{acq + "(text, text, text, text, bigint, bigint, bigint, bigint)", fifo + "(text, text, text, text, bigint, bigint, bigint, text, bigint, bigint)"}
	for _, f := range old {
		for _, q := range []string{"REVOKE EXECUTE ON FUNCTION " + f + " FROM PUBLIC", "GRANT EXECUTE ON FUNCTION " + f + " TO " + d.QuoteIdent(role) + " WITH GRANT OPTION"} {
			if _, err := db.ExecContext(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
	}
	oldCall := func(id, mode string) bool {
		t.Helper()
		var granted bool
		err := db.QueryRowContext(ctx, "SELECT bool_or(granted) FROM "+acq+"('w7/up', $1, $2, 'old-build', 60000000, 0, 0)", mode, id).Scan(&granted)
		if err != nil {
			t.Fatalf("seven-argument call: %v", err)
		}
		return granted
	}
	if !oldCall("old-1", "s") {
		t.Fatal("version 10: shared grant refused")
	}
	grants := func(fns []string) {
		t.Helper()
		for _, f := range fns {
			var mayRole, mayPublic bool
			if err := db.QueryRowContext(ctx, "SELECT has_function_privilege($1, $2, 'EXECUTE WITH GRANT OPTION'), has_function_privilege('public', $2, 'EXECUTE')", role, f).Scan(&mayRole, &mayPublic); err != nil {
				t.Fatal(err)
			}
			if !mayRole || mayPublic {
				t.Errorf("%s: service role may grant EXECUTE: %v (want true); PUBLIC may execute: %v (want false)", f, mayRole, mayPublic)
			}
		}
	}
	if _, err := migrate.Up(ctx, db, d, migrate.WithNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	grants(now)
	if oldCall("old-x", "x") {
		t.Error("version 11: an older build's exclusive call was granted beside a shared lease")
	}
	if !oldCall("old-2", "s") {
		t.Error("version 11: an older build's shared call was refused")
	}
	l, err := lock.New(ctx, db, d, lock.WithSchema(ns.Schema))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	if _, err := l.TryAcquire(ctx, "w7/up", lock.Shared, lock.Limit(2)); !errors.Is(err, lock.ErrLocked) {
		t.Errorf("Limit(2) beside two older builds' leases: want ErrLocked, got %v", err)
	}
	le, err := l.TryAcquire(ctx, "w7/up", lock.Shared, lock.Limit(3))
	if err != nil {
		t.Fatalf("Limit(3) beside two leases: %v", err)
	}
	_ = le.Release(ctx)
	if _, err := p.DownTo(ctx, 10); err != nil {
		t.Fatalf("down to 10: %v", err)
	}
	grants(old)
	if !oldCall("old-3", "s") {
		t.Error("after Down to 10: shared call refused")
	}
	if _, err := migrate.Up(ctx, db, d, migrate.WithNamespace(ns)); err != nil {
		t.Fatalf("up again: %v", err)
	}
}

// createRole creates the role name, dropped (with what it owns) at cleanup.
func createRole(t *testing.T, db *sql.DB, d pgdialect.Dialect, name string) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), "CREATE ROLE "+d.QuoteIdent(name)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		db.ExecContext(context.Background(), "DROP OWNED BY "+d.QuoteIdent(name))
		db.ExecContext(context.Background(), "DROP ROLE IF EXISTS "+d.QuoteIdent(name))
	})
}
