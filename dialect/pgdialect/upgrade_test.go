package pgdialect_test

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

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
// start, Up applies only 00006, the plan shows the expression instead of
// the call, the values are the same microseconds, and the lease granted
// before the upgrade still excludes, renews and releases (SPEC S1, H2, H5).
// Down to 5 restores the IMMUTABLE function and Up applies 00006 again.
func TestUpgradeToVersion6InlinesToUS(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("pgx", conftest.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	d := pgdialect.New()
	var rnd [5]byte
	_, _ = crand.Read(rnd[:])
	ns := dialect.Namespace{Schema: "sqlease_up6_" + hex.EncodeToString(rnd[:])}
	drop := "DROP SCHEMA IF EXISTS " + d.QuoteIdent(ns.Schema) + " CASCADE"
	defer db.ExecContext(context.Background(), drop)
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
	if _, err := p.UpTo(ctx, 5); err != nil {
		t.Fatal(err)
	}
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
	err = db.QueryRowContext(ctx, "SELECT granted, lease_id, token FROM "+ns.Object(d, "acquire")+"('up6', 'x', 'L-old', 'old-build', 60000000, 0, 0)").Scan(&granted, &leaseID, &token)
	if err != nil || !granted {
		t.Fatalf("version-5 acquire: granted %v, %v", granted, err)
	}

	// This build refuses version 5, and its Up applies only 00006.
	if _, err := lock.New(ctx, db, d, lock.WithSchema(ns.Schema)); err == nil {
		t.Fatal("lock.New on a version-5 schema: want a *lock.SchemaError, got nil")
	} else if se := (*lock.SchemaError)(nil); !errors.As(err, &se) || se.Current != 5 || se.Want != 6 {
		t.Fatalf("lock.New on a version-5 schema: %v, want a *lock.SchemaError at 5 of 6", err)
	}
	applied, err := migrate.Up(ctx, db, d, migrate.WithNamespace(ns))
	if err != nil || len(applied) != 1 || !strings.HasPrefix(applied[0], "00006_") {
		t.Fatalf("Up from version 5 applied %v, %v; want 00006 alone", applied, err)
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
	le, err := l.TryAcquire(ctx, "up6", lock.Exclusive)
	if err != nil {
		t.Fatalf("TryAcquire after the old lease was released: %v", err)
	}
	if le.Token() <= token {
		t.Errorf("token %d after %d: want it greater (SPEC S3)", le.Token(), token)
	}
	if err := le.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// Down to 5 restores the IMMUTABLE function; Up applies 00006 again.
	if _, err := p.DownTo(ctx, 5); err != nil {
		t.Fatal(err)
	}
	if inlined() {
		t.Fatal("after Down to 5: {to_us} is still inlined")
	}
	if applied, err := migrate.Up(ctx, db, d, migrate.WithNamespace(ns)); err != nil || len(applied) != 1 {
		t.Fatalf("Up after Down: %v, %v", applied, err)
	}
	if !inlined() {
		t.Fatal("after Up again: {to_us} is not inlined")
	}
}
