package sqlitedialect_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// TestUpgradeToVersion4KeepsLeases upgrades a version-3 database holding
// leases (the rowid holder table an older build wrote) to version 4 (the
// WITHOUT ROWID table of migration 00004) and back, and checks that
// nothing a holder or a waiter relies on is lost: the rows, the counter
// (the next token is above every earlier one, SPEC S3), the live holder
// still excludes (S1), an expired one is still taken over (the trigger
// exists on the new table), and release and sweep work (the conformance suite runs every statement on version 4). Down
// restores the version-3 table, indexes and triggers, rows kept. Run on
// the driver named by each subtest.
func TestUpgradeToVersion4KeepsLeases(t *testing.T) {
	for _, drv := range []string{"sqlite", "sqlite3"} {
		if drv == "sqlite3" && !mattnAvailable {
			continue
		}
		t.Run(drv, func(t *testing.T) { upgradeToV4(t, drv) })
	}
}

func upgradeToV4(t *testing.T, drv string) {
	ctx := context.Background()
	d := sqlitedialect.New()
	ns := dialect.Namespace{Prefix: "up_"}
	db, err := sql.Open(drv, "file:"+filepath.Join(t.TempDir(), "up.db")+"?_journal_mode=WAL&_busy_timeout=5000")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	p := gooseProvider(t, db, d, ns)
	if _, err := p.UpTo(ctx, 3); err != nil {
		t.Fatal(err)
	}
	holders, counter := ns.Object(d, "holders"), ns.Object(d, "counter")
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// What an older build left: a live exclusive holder of "live", an
	// expired one of "gone", a live shared one of "read", and the counter
	// at the last token granted.
	const now = `CAST(unixepoch('subsec') * 1000000 AS INTEGER)`
	exec(`INSERT INTO ` + holders + ` (lease_id, lock_key, mode, owner, token, acquired_us, expires_us) VALUES
  ('L1', 'live', 'x', 'old', 5, ` + now + `, ` + now + ` + 60000000),
  ('L2', 'gone', 'x', 'old', 6, ` + now + ` - 9000000, ` + now + ` - 1000000),
  ('L3', 'read', 's', 'old', 7, ` + now + `, ` + now + ` + 60000000)`)
	exec(`UPDATE ` + counter + ` SET value = 7 WHERE id = 1`)
	before := holderRows(t, db, holders)
	if !strings.Contains(tableSQL(t, db, "up_holders"), "expires_us") || strings.Contains(tableSQL(t, db, "up_holders"), "WITHOUT ROWID") {
		t.Fatalf("version 3 holder table is not the rowid table:\n%s", tableSQL(t, db, "up_holders"))
	}

	// This build refuses version 3, and its Up applies only 00004.
	if _, err := lock.New(ctx, db, d, lock.WithTablePrefix(ns.Prefix)); err == nil {
		t.Fatal("lock.New on a version-3 database: want a *lock.SchemaError, got nil")
	} else if se := (*lock.SchemaError)(nil); !errors.As(err, &se) || se.Current != 3 || se.Want != 4 {
		t.Fatalf("lock.New on a version-3 database: %v, want a *lock.SchemaError at 3 of 4", err)
	}
	applied, err := migrate.Up(ctx, db, d, migrate.WithNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"00004_holders_without_rowid.sql"}; !reflect.DeepEqual(applied, want) {
		t.Fatalf("Up applied %v, want %v", applied, want)
	}
	if s := tableSQL(t, db, "up_holders"); !strings.Contains(s, "WITHOUT ROWID") {
		t.Fatalf("version 4 holder table is not WITHOUT ROWID:\n%s", s)
	}
	if got, want := schemaObjects(t, db, "up_holders"), []string{
		"index up_holders_lock_key_idx", "trigger up_holders_takeover", "trigger up_token_bump",
	}; !reflect.DeepEqual(got, want) {
		t.Fatalf("version 4 objects on the holder table: %v, want %v", got, want)
	}
	if got := holderRows(t, db, holders); !reflect.DeepEqual(got, before) {
		t.Fatalf("rows after Up:\n%v\nwant:\n%v", got, before)
	}

	l, err := lock.New(ctx, db, d, lock.WithTablePrefix(ns.Prefix), lock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	if _, err := l.TryAcquire(ctx, "live", lock.Shared); !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("TryAcquire of the old live exclusive holder's key: %v, want ErrLocked", err)
	}
	if _, err := l.TryAcquire(ctx, "read", lock.Exclusive); !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("TryAcquire exclusive of the old shared holder's key: %v, want ErrLocked", err)
	}
	le, err := l.TryAcquire(ctx, "gone", lock.Exclusive)
	if err != nil {
		t.Fatalf("TryAcquire of the old expired holder's key: %v", err)
	}
	if le.Token() <= 7 || le.Token() < le.GrantedAt().UnixMicro() {
		t.Fatalf("token after upgrade: %d, want above the counter (7) and at least the clock (%d µs; SPEC S3, S7)", le.Token(), le.GrantedAt().UnixMicro())
	}
	var left int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM `+holders+` WHERE lease_id = 'L2'`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("expired old holder still there after the takeover: %d rows (%v)", left, err)
	}
	if err := le.Release(ctx); err != nil {
		t.Fatalf("Release after upgrade: %v", err)
	}
	// The sweep finds expired rows without the expiry index.
	exec(`UPDATE ` + holders + ` SET expires_us = ` + now + ` - 1 WHERE lease_id = 'L3'`)
	if n, err := l.Sweep(ctx, 100); err != nil || n != 1 {
		t.Fatalf("Sweep after upgrade: %d rows, %v; want 1", n, err)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// Down to 3 restores the rowid table, its indexes and triggers, rows
	// kept; Up again works.
	exec(`INSERT INTO ` + holders + ` (lease_id, lock_key, mode, owner, token, acquired_us, expires_us) VALUES ('L9', 'k', 's', 'new', 9, 1, 2)`)
	mid := holderRows(t, db, holders)
	if _, err := p.DownTo(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if s := tableSQL(t, db, "up_holders"); strings.Contains(s, "WITHOUT ROWID") {
		t.Fatalf("Down left the WITHOUT ROWID table:\n%s", s)
	}
	if got, want := schemaObjects(t, db, "up_holders"), []string{
		"index up_holders_expiry_idx", "index up_holders_key_idx", "trigger up_holders_takeover", "trigger up_token_bump",
	}; !reflect.DeepEqual(got, want) {
		t.Fatalf("version 3 objects on the holder table after Down: %v, want %v", got, want)
	}
	if got := holderRows(t, db, holders); !reflect.DeepEqual(got, mid) {
		t.Fatalf("rows after Down:\n%v\nwant:\n%v", got, mid)
	}
	if _, err := migrate.Up(ctx, db, d, migrate.WithNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if got := holderRows(t, db, holders); !reflect.DeepEqual(got, mid) {
		t.Fatalf("rows after Up again:\n%v\nwant:\n%v", got, mid)
	}
}

// gooseProvider is a goose provider on ns's rendered migrations of d, for
// stepping to one version (migrate.Up always goes to the last).
func gooseProvider(t *testing.T, db *sql.DB, d dialect.Dialect, ns dialect.Namespace) *goose.Provider {
	t.Helper()
	fsys, err := migrate.FS(d, migrate.WithNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	store, err := database.NewStore(database.DialectSQLite3, ns.VersionTable())
	if err != nil {
		t.Fatal(err)
	}
	p, err := goose.NewProvider("", db, fsys, goose.WithStore(store), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// holderRows returns every row of the holder table, in lease ID order.
func holderRows(t *testing.T, db *sql.DB, holders string) []string {
	t.Helper()
	return queryStrings(t, db, `SELECT lease_id || '|' || lock_key || '|' || mode || '|' || owner || '|' || token || '|' || acquired_us || '|' || expires_us FROM `+holders+` ORDER BY lease_id`)
}

// tableSQL returns the CREATE statement of table name.
func tableSQL(t *testing.T, db *sql.DB, name string) string {
	t.Helper()
	var s string
	if err := db.QueryRow(`SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = ?`, name).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// schemaObjects lists the named indexes and the triggers on table, as
// "type name", sorted (automatic indexes of constraints left out).
func schemaObjects(t *testing.T, db *sql.DB, table string) []string {
	t.Helper()
	return queryStrings(t, db, `SELECT type || ' ' || name FROM sqlite_schema
WHERE tbl_name = ? AND type IN ('index', 'trigger') AND sql IS NOT NULL ORDER BY 1`, table)
}

// queryStrings runs q and returns its one text column, row by row.
func queryStrings(t *testing.T, db *sql.DB, q string, args ...any) []string {
	t.Helper()
	rows, err := db.Query(q, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
