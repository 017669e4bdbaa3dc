package migrate_test

import (
	"database/sql"
	"errors"
	"strings"
	"testing"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/sqlease/sqlease/conformance/conftest"
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/mysqldialect"
	"github.com/sqlease/sqlease/dialect/pgdialect"
	"github.com/sqlease/sqlease/migrate"
)

// schemaExists reports whether schema (a MySQL database) exists.
func schemaExists(t *testing.T, db *sql.DB, schema string) bool {
	t.Helper()
	var n int
	if err := db.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = '`+schema+`'`).Scan(&n); err != nil {
		t.Fatalf("look up schema %q: %v", schema, err)
	}
	return n > 0
}

// tablesIn counts the sqlease tables (default prefix) in schema.
func tablesIn(t *testing.T, db *sql.DB, schema string) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = '`+schema+`' AND table_name LIKE 'sqlease%'`).Scan(&n); err != nil {
		t.Fatalf("count tables in %q: %v", schema, err)
	}
	return n
}

func wantInputError(t *testing.T, err error, wants ...string) {
	t.Helper()
	var ie *dialect.InputError
	if !errors.Is(err, dialect.ErrInvalidInput) || !errors.As(err, &ie) {
		t.Fatalf("%v: want a *dialect.InputError matching dialect.ErrInvalidInput", err)
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "migrate: invalid ") {
		t.Errorf("message %q: want one prefix, migrate:", msg)
	}
	for _, w := range wants {
		if !strings.Contains(msg, w) {
			t.Errorf("message %q: want it to mention %q", msg, w)
		}
	}
}

// Reserved schemas are refused before anything is written (SPEC D3, I1).
func TestUpRejectsReservedSchemaPostgres(t *testing.T) {
	db, err := sql.Open("pgx", conftest.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, schema := range []string{"information_schema", "pg_catalog", "pg_sqlease_test"} {
		_, err := migrate.Up(t.Context(), db, pgdialect.New(), migrate.WithNamespace(dialect.Namespace{Schema: schema}))
		wantInputError(t, err, `schema "`+schema+`"`, "reserved")
		if !errors.Is(err, dialect.ErrInvalidName) {
			t.Errorf("%v: want it to match dialect.ErrInvalidName", err)
		}
		if n := tablesIn(t, db, schema); n != 0 {
			t.Errorf("Up with schema %q created %d tables there", schema, n)
		}
		if schema == "pg_sqlease_test" && schemaExists(t, db, schema) {
			t.Errorf("Up with schema %q created it", schema)
		}
	}
}

func TestUpRejectsReservedSchemaMySQL(t *testing.T) {
	db, err := sql.Open("mysql", conftest.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, schema := range []string{"mysql", "sys", "performance_schema", "information_schema"} {
		_, err := migrate.Up(t.Context(), db, mysqldialect.New(), migrate.WithNamespace(dialect.Namespace{Schema: schema}))
		wantInputError(t, err, `schema "`+schema+`"`, "reserved")
		if n := tablesIn(t, db, schema); n != 0 {
			t.Errorf("Up with schema %q created %d tables there", schema, n)
		}
	}
}

// A pool of one connection is refused before CREATE SCHEMA runs.
func TestUpOneConnectionRejectedBeforeWriting(t *testing.T) {
	db, err := sql.Open("pgx", conftest.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	schema := "sqlease_oneconn_" + strings.ReplaceAll(strings.ToLower(t.Name()[:4]), "-", "_")
	_, _ = db.ExecContext(t.Context(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
	_, err = migrate.Up(t.Context(), db, pgdialect.New(), migrate.WithNamespace(dialect.Namespace{Schema: schema}))
	wantInputError(t, err, "1 open connection", "at least 2")
	if schemaExists(t, db, schema) {
		_, _ = db.ExecContext(t.Context(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
		t.Errorf("Up refused the pool but created schema %q first", schema)
	}
}
