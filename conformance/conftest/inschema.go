package conftest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/migrate"
)

// InSchema returns cfg with every case placed in schema (an existing
// PostgreSQL schema, a MySQL/MariaDB database) of the database at dsn,
// under a fresh table prefix of its own ("t", 8 random hex digits, "_"),
// instead of in a database of its own: for a role that may use one schema
// only, or to check the schema the lock tables will live in. Cases never
// meet there: each keeps every table it makes under its prefix
// (conformance.Env.Table, Env.SubNamespace). Each case's Cleanup removes
// everything under its prefix: migrate.Drop of every namespace migrated
// there (which drops the dialect's functions and procedures with the
// tables), then the case's own tables; Leftovers checks that it did. The
// dialect must list its tables in information_schema.tables (PostgreSQL
// and MySQL do). cfg's own NewDatabase is not called.
func InSchema(cfg conformance.Config, dsn, schema string) conformance.Config {
	cfg.NewDatabase = func(ctx context.Context, _ string) (conformance.Database, error) {
		ns := dialect.Namespace{Schema: schema, Prefix: "t" + randHex(4) + "_"}
		return conformance.Database{DSN: dsn, Namespace: ns, Cleanup: func() {
			if err := dropPrefixed(cfg.DriverName, dsn, cfg.Dialect, ns); err != nil {
				fmt.Fprintf(os.Stderr, "conftest: remove the tables under %s in %s: %v\n", ns.Prefix, schema, err)
			}
		}}, nil
	}
	return cfg
}

// dropPrefixed removes what a case left under ns's prefix in ns's schema:
// migrate.Drop of every namespace there with a version table, then the
// other tables. It retries for up to a minute, as DropNamespace does: a
// drop can fail with a deadlock or a lock timeout against a connection
// that is still closing.
func dropPrefixed(driverName, dsn string, d dialect.Dialect, ns dialect.Namespace) error {
	db, err := sql.Open(driverName, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	deadline := time.Now().Add(time.Minute)
	wait := 100 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err = dropPrefixedOnce(ctx, db, d, ns)
		cancel()
		if err == nil || time.Now().Add(wait).After(deadline) {
			return err
		}
		time.Sleep(wait)
		wait = min(2*wait, 5*time.Second)
	}
}

func dropPrefixedOnce(ctx context.Context, db *sql.DB, d dialect.Dialect, ns dialect.Namespace) error {
	tables, err := schemaObjects(ctx, db, d, ns.Schema, "tables", "table")
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range tables {
		p, ok := strings.CutSuffix(name, "db_version")
		if !ok || !strings.HasPrefix(p, ns.Prefix) {
			continue
		}
		if _, err := migrate.Drop(ctx, db, d, migrate.WithNamespace(dialect.Namespace{Schema: ns.Schema, Prefix: p})); err != nil {
			errs = append(errs, fmt.Errorf("drop the lock tables under %s: %w", p, err))
		}
	}
	if tables, err = schemaObjects(ctx, db, d, ns.Schema, "tables", "table"); err != nil {
		return err
	}
	for _, name := range tables {
		if !strings.HasPrefix(name, ns.Prefix) {
			continue
		}
		if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS "+d.QuoteIdent(ns.Schema)+"."+d.QuoteIdent(name)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Leftovers lists the tables and routines (functions, procedures) of
// schema, in the database at dsn, whose names start with the prefix of one
// of namespaces: what the Cleanups of InSchema should have removed. Names
// are schema-qualified and sorted; none is nil.
func Leftovers(ctx context.Context, driverName, dsn string, d dialect.Dialect, schema string, namespaces []dialect.Namespace) ([]string, error) {
	db, err := sql.Open(driverName, dsn)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	tables, err := schemaObjects(ctx, db, d, schema, "tables", "table")
	if err != nil {
		return nil, err
	}
	routines, err := schemaObjects(ctx, db, d, schema, "routines", "routine")
	if err != nil {
		return nil, err
	}
	var left []string
	for _, name := range append(tables, routines...) {
		for _, ns := range namespaces {
			if ns.Schema == schema && ns.Prefix != "" && strings.HasPrefix(name, ns.Prefix) {
				left = append(left, schema+"."+name)
				break
			}
		}
	}
	sort.Strings(left)
	return left, nil
}

// schemaObjects lists the names in information_schema.<view> (tables,
// routines) of schema; column is the view's column prefix (table_name,
// routine_name).
func schemaObjects(ctx context.Context, db *sql.DB, d dialect.Dialect, schema, view, column string) ([]string, error) {
	q := fmt.Sprintf("SELECT %[2]s_name FROM information_schema.%[1]s WHERE %[2]s_schema = %[3]s", view, column, d.Placeholder(1))
	rows, err := db.QueryContext(ctx, q, schema)
	if err != nil {
		return nil, fmt.Errorf("list the %s of schema %s: %w", view, schema, err)
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		names = append(names, n)
	}
	return names, rows.Err()
}
