package advice

import (
	"testing"

	"github.com/sqlease/sqlease/dialect"
)

func TestMigrateUp(t *testing.T) {
	for _, tc := range []struct {
		ns   dialect.Namespace
		want string
	}{
		{dialect.Namespace{}, "run `sqlease migrate up --dsn DSN` (from Go: migrate.Up) before using the lock tables"},
		{dialect.Namespace{Prefix: "app_"}, "run `sqlease migrate up --dsn DSN --prefix app_` (from Go: migrate.Up with migrate.WithNamespace(dialect.Namespace{Prefix: \"app_\"})) before using the lock tables"},
		{dialect.Namespace{Schema: "locks", Prefix: "app_"}, "run `sqlease migrate up --dsn DSN --schema locks --prefix app_` (from Go: migrate.Up with migrate.WithNamespace(dialect.Namespace{Schema: \"locks\", Prefix: \"app_\"})) before using the lock tables"},
	} {
		if got := MigrateUp(tc.ns); got != tc.want {
			t.Errorf("MigrateUp(%+v) =\n  %s\nwant\n  %s", tc.ns, got, tc.want)
		}
	}
}

// TestNamespaceCaution: a named schema or prefix gets the caution naming
// each; the default namespace gets none.
func TestNamespaceCaution(t *testing.T) {
	const rest = " mistyped, migrating creates a second, separate set of lock tables, and leases in it do not exclude leases in the tables you meant"
	for _, tc := range []struct {
		ns   dialect.Namespace
		want string
	}{
		{dialect.Namespace{}, ""},
		{dialect.Namespace{Prefix: "app_"}, `. Before you do, check the table prefix "app_": if it is` + rest},
		{dialect.Namespace{Schema: "locks"}, `. Before you do, check the schema "locks": if it is` + rest},
		{dialect.Namespace{Schema: "locks", Prefix: "app_"}, `. Before you do, check the schema "locks" and the table prefix "app_": if either is` + rest},
	} {
		if got := NamespaceCaution(tc.ns); got != tc.want {
			t.Errorf("NamespaceCaution(%+v) =\n  %s\nwant\n  %s", tc.ns, got, tc.want)
		}
	}
}
