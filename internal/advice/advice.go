// Package advice holds the advice that more than one package gives the
// user, so that it is worded once: lock's errors and the sqlease command
// (package cli) print the same text.
package advice

import (
	"fmt"
	"strings"

	"github.com/sqlease/sqlease/dialect"
)

// MigrateUp tells how to apply the lock table migrations of namespace ns,
// naming the command (sqlease migrate up, with --schema and --prefix when
// ns sets them) and the library call (migrate.Up, with
// migrate.WithNamespace when ns is not the default):
//
//	run `sqlease migrate up --dsn DSN --prefix app_` (from Go: migrate.Up with migrate.WithNamespace(dialect.Namespace{Prefix: "app_"})) before using the lock tables
//
// It is a clause for the end of a message, without a final full stop.
func MigrateUp(ns dialect.Namespace) string {
	return MigrateUpWith(ns, "--dsn DSN")
}

// MigrateUpWith is MigrateUp with the command's connection flags given:
// connFlags as the user passed them to the command that gives the advice
// ("--dialect postgres --dsn DSN"; "" when the DSN comes from
// $SQLEASE_DSN), so the advice can be run as printed.
func MigrateUpWith(ns dialect.Namespace, connFlags string) string {
	cmd := "sqlease migrate up"
	if connFlags != "" {
		cmd += " " + connFlags
	}
	var fields []string
	if ns.Schema != "" {
		cmd += " --schema " + ns.Schema
		fields = append(fields, fmt.Sprintf("Schema: %q", ns.Schema))
	}
	if ns.Prefix != "" {
		cmd += " --prefix " + ns.Prefix
		fields = append(fields, fmt.Sprintf("Prefix: %q", ns.Prefix))
	}
	call := "migrate.Up"
	if len(fields) > 0 {
		call += " with migrate.WithNamespace(dialect.Namespace{" + strings.Join(fields, ", ") + "})"
	}
	return "run `" + cmd + "` (from Go: " + call + ") before using the lock tables"
}

// NamespaceCaution warns, for lock tables missing from a namespace the
// user named (a schema, a table prefix), that migrating a mistyped one
// creates a second, separate set of lock tables whose leases do not
// exclude the leases in the tables meant. It is a sentence to append
// after MigrateUp's clause, starting with ". "; "" for the default
// namespace, which cannot be mistyped:
//
//	. Before you do, check the table prefix "app_": if it is mistyped, migrating creates a second, separate set of lock tables, and leases in it do not exclude leases in the tables you meant
func NamespaceCaution(ns dialect.Namespace) string {
	var named []string
	if ns.Schema != "" {
		named = append(named, fmt.Sprintf("the schema %q", ns.Schema))
	}
	if ns.Prefix != "" {
		named = append(named, fmt.Sprintf("the table prefix %q", ns.Prefix))
	}
	if len(named) == 0 {
		return ""
	}
	it := "it is"
	if len(named) > 1 {
		it = "either is"
	}
	return ". Before you do, check " + strings.Join(named, " and ") + ": if " + it + " mistyped, migrating creates a second, separate set of lock tables, and leases in it do not exclude leases in the tables you meant"
}

// ElsewhereCaution is NamespaceCaution for when lock tables were found in
// another namespace: migrating this one creates a second, separate set.
// Like NamespaceCaution, it starts with ". ".
const ElsewhereCaution = ". Migrating creates a second, separate set of lock tables here, and leases in it do not exclude leases in the tables found"

// Caution returns NamespaceCaution(ns), or ElsewhereCaution when ns is the
// default namespace and lock tables were found elsewhere.
func Caution(ns dialect.Namespace, foundElsewhere bool) string {
	if c := NamespaceCaution(ns); c != "" || !foundElsewhere {
		return c
	}
	return ElsewhereCaution
}
