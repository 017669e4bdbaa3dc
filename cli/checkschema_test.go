package cli

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/conformance/conftest"
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/migrate"
)

// schemaCases selects, for check --schema, the cases that look at other
// namespaces (unmigrated ones, lock tables elsewhere, the longest prefix,
// a migration race with child processes), a case with tables of its own
// (Env.Table) and a plain one.
const schemaCases = `^(D1_\w+|I1_UnknownDialectAndUnmigratedSchema|D3_BadSchemaAndPrefixRejected|D3_KeysAreBoundAndByteExact|S1_ExclusiveExcludesAll)$`

// testCheckSchema runs check --schema in schema, which the test creates
// (create) holding what an application's schema might: an application
// table, goose's own version table and lock tables under another prefix
// (which the unmigrated-namespace cases find "elsewhere"). The cases must
// pass, each under a prefix of its own, and leave the schema as it was.
func testCheckSchema(t *testing.T, dsnArg, driver, dsn, schema, create, drop string) {
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		db.ExecContext(context.Background(), drop)
		db.Close()
	})
	ctx := t.Context()
	if _, err := db.ExecContext(ctx, create); err != nil {
		t.Fatalf("%s: %v", create, err)
	}
	d, err := dialect.Lookup(map[string]string{"pgx": "postgres", "mysql": "mysql"}[driver])
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{"CREATE TABLE %s.app_orders (id INTEGER)", "CREATE TABLE %s.goose_db_version (version_id BIGINT)"} {
		if _, err := db.ExecContext(ctx, fmt.Sprintf(stmt, schema)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := migrate.Up(ctx, db, d, migrate.WithNamespace(dialect.Namespace{Schema: schema, Prefix: "app_"})); err != nil {
		t.Fatal(err)
	}
	objects := func() []string {
		var out []string
		for _, q := range []string{
			"SELECT table_name FROM information_schema.tables WHERE table_schema = " + d.Placeholder(1),
			"SELECT routine_name FROM information_schema.routines WHERE routine_schema = " + d.Placeholder(1),
		} {
			rows, err := db.QueryContext(ctx, q, schema)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var n string
				rows.Scan(&n)
				out = append(out, n)
			}
			rows.Close()
		}
		slices.Sort(out)
		return out
	}
	before := objects()

	var mu sync.Mutex
	var nss []dialect.Namespace
	newDatabaseHook = func(db conformance.Database) {
		mu.Lock()
		nss = append(nss, db.Namespace)
		mu.Unlock()
	}
	defer func() { newDatabaseHook = nil }()
	r := checkRun(t, func() result {
		return cli(t, "check", "--dsn", dsnArg, "--schema", schema, "--run", schemaCases, "--parallel", "2")
	})
	passed, failed, _ := summary(t, r)
	if r.code != 0 || failed != 0 || passed == 0 {
		t.Fatalf("check --schema %s: want exit 0 and passing cases, got %v", schema, r)
	}
	for _, c := range conformance.Cases() {
		if regexp.MustCompile(schemaCases).MatchString(c.Name) && !regexp.MustCompile(`(?m)^`+c.Name+`\s+PASS\s`).MatchString(r.stdout) {
			t.Errorf("%s did not pass: %v", c.Name, r)
		}
	}
	mu.Lock()
	prefixes := map[string]bool{}
	for _, ns := range nss {
		if ns.Schema != schema || !regexp.MustCompile(`^t[0-9a-f]{8}_$`).MatchString(ns.Prefix) || prefixes[ns.Prefix] {
			t.Errorf("case namespace %+v: want schema %s and a fresh prefix t<8 hex digits>_", ns, schema)
		}
		prefixes[ns.Prefix] = true
	}
	mu.Unlock()
	if after := objects(); !slices.Equal(after, before) {
		t.Errorf("check --schema changed the schema's tables and routines:\nbefore %q\nafter  %q", before, after)
	}

	// A schema that does not exist is refused before any case runs.
	r = cli(t, "check", "--dsn", dsnArg, "--schema", schema+"_absent", "--run", schemaCases)
	want := fmt.Sprintf(`invalid --schema %q: no such %s in the %s database`, schema+"_absent", schemaWord(d.Name()), d.Name())
	if r.code != 2 || !strings.Contains(r.stderr, want) || strings.Contains(r.stdout, "PASS") || (d.Name() != "mysql" && strings.Contains(r.stderr, "MySQL")) {
		t.Errorf("check --schema on a missing schema: want exit 2 and %q, got %v", want, r)
	}
}

func TestCheckSchemaPostgres(t *testing.T) {
	dsn := conftest.PostgresDSN(t)
	schema := fmt.Sprintf("sqlease_cli_check_%d", time.Now().UnixNano()%1e9)
	testCheckSchema(t, dsn, "pgx", dsn, schema, "CREATE SCHEMA "+schema, "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
}

func TestCheckSchemaMySQL(t *testing.T) {
	dsn := conftest.MySQLDSN(t)
	schema := fmt.Sprintf("sqlease_cli_check_%d", time.Now().UnixNano()%1e9)
	testCheckSchema(t, dsn, "mysql", dsn, schema, "CREATE DATABASE "+schema, "DROP DATABASE IF EXISTS "+schema)
}

// TestCheckSchemaOnSQLite: SQLite has no schemas, so check --schema is a
// usage error naming the flag and the dialect, with or without a DSN, as
// for the other commands; an empty --schema is refused too.
func TestCheckSchemaOnSQLite(t *testing.T) {
	t.Setenv(dsnEnv, "")
	path := filepath.Join(t.TempDir(), "locks.db")
	const want = `sqlease check: invalid --schema "app": sqlite databases have no schemas; omit --schema (check gives every case a database file of its own)`
	for _, args := range [][]string{
		{"check", "--schema", "app"},
		{"check", "--dsn", path, "--schema", "app"},
		{"check", "--dialect", "sqlite", "--schema", "app", "--run", "S1_"},
	} {
		r := cli(t, args...)
		if r.code != 2 || !strings.HasPrefix(r.stderr, want) || strings.Count(r.stderr, "\n") != 1 || r.stdout != "" {
			t.Errorf("%q: want exit 2 and the line %q, got %v", args, want, r)
		}
	}
	if r := cli(t, "check", "--schema", ""); r.code != 2 || !strings.Contains(r.stderr, "--schema") || !strings.Contains(r.stderr, "empty") {
		t.Errorf("check --schema '': want exit 2 naming the flag, got %v", r)
	}
	if r := cli(t, "check", "--dsn", unreachableDSN, "--schema", "Bad-Name"); r.code != 2 || !strings.Contains(r.stderr, `invalid --schema "Bad-Name"`) {
		t.Errorf("check --schema Bad-Name: want exit 2 naming the value before connecting, got %v", r)
	}
}
