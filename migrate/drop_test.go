package migrate_test

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // registers "mysql"

	"github.com/sqlease/sqlease/conformance/conftest"
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/mysqldialect"
	"github.com/sqlease/sqlease/dialect/pgdialect"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// testDrop migrates ns, takes a lease, drops the namespace, checks that
// nothing of it is left (leftovers lists what is), then migrates it afresh
// and takes a lease again (SPEC D1).
func testDrop(t *testing.T, db *sql.DB, d dialect.Dialect, ns dialect.Namespace, leftovers func() []string) {
	t.Helper()
	ctx := t.Context()
	opt := migrate.WithNamespace(ns)
	var results []migrate.MigrationResult
	progress := migrate.WithProgress(func(r migrate.MigrationResult) { results = append(results, r) })
	applied, err := migrate.Up(ctx, db, d, opt, progress)
	if err != nil || len(applied) == 0 {
		t.Fatalf("Up = %v, %v", applied, err)
	}
	if len(results) != len(applied) {
		t.Fatalf("WithProgress saw %d results for %d applied migrations", len(results), len(applied))
	}
	for i, r := range results {
		// The version is the file's number (numbers may have gaps).
		v, _ := strconv.ParseInt(strings.SplitN(applied[i], "_", 2)[0], 10, 64)
		if r.Name != applied[i] || r.Direction != "up" || r.Version != v || v == 0 || r.Duration <= 0 {
			t.Errorf("progress result %d = %+v; want %s up, version %d, a positive duration", i, r, applied[i], v)
		}
	}
	l, err := lock.New(ctx, db, d, lock.WithSchema(ns.Schema), lock.WithTablePrefix(ns.Prefix), lock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, "before-drop", lock.Exclusive); err != nil {
		t.Fatal(err)
	}
	l.Close(context.Background())

	results = nil
	reverted, err := migrate.Drop(ctx, db, d, opt, progress)
	if err != nil {
		t.Fatalf("Drop: %v", err)
	}
	if len(reverted) != len(applied) || reverted[0] != applied[len(applied)-1] {
		t.Errorf("Drop reverted %v; want %v newest first", reverted, applied)
	}
	for _, r := range results {
		if r.Direction != "down" {
			t.Errorf("Drop progress: %+v, want direction down", r)
		}
	}
	if left := leftovers(); len(left) > 0 {
		t.Fatalf("after Drop, left in the namespace: %v", left)
	}
	if cur, _, err := migrate.Version(ctx, db, d, opt); err != nil || cur != 0 {
		t.Errorf("Version after Drop = %d, %v; want 0", cur, err)
	}
	// Dropping again, and Down on nothing, do nothing.
	if r, err := migrate.Drop(ctx, db, d, opt); err != nil || len(r) != 0 {
		t.Errorf("second Drop = %v, %v; want nothing reverted", r, err)
	}
	if r, err := migrate.Down(ctx, db, d, opt); err != nil || len(r) != 0 {
		t.Errorf("Down after Drop = %v, %v; want nothing reverted", r, err)
	}
	if left := leftovers(); len(left) > 0 {
		t.Fatalf("Down on a dropped namespace created: %v", left)
	}

	// A fresh install works, and Down keeps only the version table and the
	// migration lock's table.
	again, err := migrate.Up(ctx, db, d, opt)
	if err != nil || len(again) != len(applied) {
		t.Fatalf("Up after Drop = %v, %v; want %v", again, err, applied)
	}
	l, err = lock.New(ctx, db, d, lock.WithSchema(ns.Schema), lock.WithTablePrefix(ns.Prefix), lock.WithTTL(time.Minute))
	if err != nil {
		t.Fatalf("lock.New after a fresh Up: %v", err)
	}
	le, err := l.TryAcquire(ctx, "before-drop", lock.Exclusive)
	if err != nil {
		t.Fatalf("the lease taken before Drop survived it: %v", err)
	}
	le.Release(ctx)
	l.Close(context.Background())
	reverted, err = migrate.Down(ctx, db, d, opt)
	if err != nil || len(reverted) != len(applied) {
		t.Fatalf("Down = %v, %v", reverted, err)
	}
	var want []string
	for _, name := range migrate.DropTables(d) {
		want = append(want, ns.Object(d, name))
	}
	sort.Strings(want)
	var left []string
	for _, n := range leftovers() {
		// PostgreSQL: the version table's serial sequence goes with it.
		if !strings.HasSuffix(n, `db_version_id_seq"`) {
			left = append(left, n)
		}
	}
	if fmt.Sprint(left) != fmt.Sprint(want) {
		t.Errorf("after Down, left %v; want only %v", left, want)
	}
	if _, err := migrate.Drop(ctx, db, d, opt); err != nil {
		t.Fatal(err)
	}
	if left := leftovers(); len(left) > 0 {
		t.Fatalf("after Down and Drop, left: %v", left)
	}
}

// query lists the first column of q's rows, sorted.
func query(t *testing.T, db *sql.DB, q string, args ...any) []string {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), q, args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
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
	sort.Strings(out)
	return out
}

func TestDropSQLite(t *testing.T) {
	db := openSQLite(t)
	d := sqlitedialect.New()
	testDrop(t, db, d, dialect.Namespace{Prefix: "app_"}, func() []string {
		// Every object but SQLite's own AUTOINCREMENT bookkeeping.
		var out []string
		for _, n := range query(t, db, `SELECT name FROM sqlite_master WHERE name <> 'sqlite_sequence'`) {
			out = append(out, d.QuoteIdent(n))
		}
		return out
	})
}

func TestDropPostgres(t *testing.T) {
	dsn := conftest.PostgresDSN(t)
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	schema := fmt.Sprintf("sqlease_drop_%d", time.Now().UnixNano()%1e9)
	t.Cleanup(func() {
		db.ExecContext(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
		db.Close()
	})
	d := pgdialect.New()
	testDrop(t, db, d, dialect.Namespace{Schema: schema}, func() []string {
		// Tables, sequences, indexes, views and functions in the schema.
		var out []string
		for _, n := range query(t, db, `SELECT relname::text FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
			WHERE s.nspname = $1 AND c.relkind IN ('r', 'S', 'v', 'm', 'p')
			UNION ALL SELECT proname::text FROM pg_proc p JOIN pg_namespace s ON s.oid = p.pronamespace WHERE s.nspname = $1`, schema) {
			out = append(out, d.QuoteIdent(schema)+"."+d.QuoteIdent(n))
		}
		return out
	})
}

func TestDropMySQL(t *testing.T) {
	db, err := sql.Open("mysql", conftest.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	schema := fmt.Sprintf("sqlease_drop_%d", time.Now().UnixNano()%1e9)
	t.Cleanup(func() {
		db.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+schema)
		db.Close()
	})
	d := mysqldialect.New()
	testDrop(t, db, d, dialect.Namespace{Schema: schema}, func() []string {
		var out []string
		for _, n := range query(t, db, `SELECT table_name FROM information_schema.tables WHERE table_schema = ?
			UNION ALL SELECT routine_name FROM information_schema.routines WHERE routine_schema = ?`, schema, schema) {
			out = append(out, d.QuoteIdent(schema)+"."+d.QuoteIdent(n))
		}
		return out
	})
}
