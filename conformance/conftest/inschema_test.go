package conftest_test

import (
	"context"
	"database/sql"
	"fmt"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/sqlease/sqlease/conformance/conftest"
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/migrate"
)

// TestInSchemaCleanupAndLeftovers: a case's Cleanup under InSchema removes
// everything under its prefix, lock tables and functions of a namespace
// migrated under it included, and nothing else in the schema; Leftovers
// lists what is under a prefix and only that.
func TestInSchemaCleanupAndLeftovers(t *testing.T) {
	dsn := conftest.PostgresDSN(t)
	ctx := t.Context()
	schema := fmt.Sprintf("sqlease_conftest_%d", time.Now().UnixNano()%1e9)
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		db.ExecContext(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
		db.Close()
	})
	for _, q := range []string{"CREATE SCHEMA " + schema, "CREATE TABLE " + schema + ".app_orders (id INTEGER)"} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	cfg := conftest.InSchema(conftest.Postgres(dsn), dsn, schema)
	case1, err := cfg.NewDatabase(ctx, "A")
	if err != nil {
		t.Fatal(err)
	}
	case2, _ := cfg.NewDatabase(ctx, "B")
	if case1.DSN != dsn || case1.Namespace.Schema != schema || !regexp.MustCompile(`^t[0-9a-f]{8}_$`).MatchString(case1.Namespace.Prefix) ||
		case1.Namespace.Prefix == case2.Namespace.Prefix || case1.Namespace.Validate(cfg.Dialect) != nil {
		t.Fatalf("case databases %+v and %+v: want the DSN, schema %s and two different valid prefixes t<8 hex digits>_", case1, case2, schema)
	}
	// The case migrates its namespace and one under it, and makes a table.
	ns := case1.Namespace
	sub := dialect.Namespace{Schema: schema, Prefix: ns.Prefix + "d1_"}
	for _, n := range []dialect.Namespace{ns, sub} {
		if _, err := migrate.Up(ctx, db, cfg.Dialect, migrate.WithNamespace(n)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+ns.Object(cfg.Dialect, "case_log")+" (id INTEGER)"); err != nil {
		t.Fatal(err)
	}
	left, err := conftest.Leftovers(ctx, "pgx", dsn, cfg.Dialect, schema, []dialect.Namespace{ns, case2.Namespace})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(left, schema+"."+ns.Prefix+"case_log") || !slices.Contains(left, schema+"."+sub.Prefix+"acquire") || slices.Contains(left, schema+".app_orders") {
		t.Fatalf("Leftovers = %q: want the case's tables and functions, not app_orders", left)
	}
	case1.Cleanup()
	case2.Cleanup()
	if left, err := conftest.Leftovers(ctx, "pgx", dsn, cfg.Dialect, schema, []dialect.Namespace{ns, case2.Namespace}); err != nil || len(left) != 0 {
		t.Fatalf("after the Cleanups, Leftovers = %q, %v; want none", left, err)
	}
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM information_schema.tables WHERE table_schema = $1 AND table_name = 'app_orders'", schema).Scan(&n); err != nil || n != 1 {
		t.Fatalf("app_orders after the Cleanups: %d, %v; want it kept", n, err)
	}
}
