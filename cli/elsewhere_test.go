package cli

import (
	"strings"
	"testing"
)

// TestStatusFindsTablesUnderAnotherPrefix: status, sweep and migrate
// status with a forgotten or wrong --prefix name the lock tables they find
// under another prefix before advising to migrate, which would make a
// second, disjoint set of lock tables (SPEC D1).
func TestStatusFindsTablesUnderAnotherPrefix(t *testing.T) {
	path := sqliteFile(t)
	if r := cli(t, "migrate", "up", "--dsn", path, "--prefix", "nc_"); r.code != 0 {
		t.Fatalf("migrate --prefix nc_: %v", r)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "--dsn", path}, "found nc_db_version: did you mean --prefix nc_? If not, run `sqlease migrate up"},
		{[]string{"status", "--dsn", path}, "Migrating creates a second, separate set of lock tables here"},
		{[]string{"sweep", "--dsn", path, "--prefix", "nd_"}, "found nc_db_version: did you mean --prefix nc_? If not, run `sqlease migrate up"},
	} {
		r := cli(t, c.args...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
			t.Errorf("%q: want exit 2 and one line with %q, got %v", c.args, c.want, r)
		}
	}
	r := cli(t, "migrate", "status", "--dsn", path)
	if want := "database at version 0 of "; r.code != 0 || !strings.Contains(r.stdout, want) || !strings.Contains(r.stdout, "found nc_db_version: did you mean --prefix nc_? If not, run `sqlease migrate up") {
		t.Errorf("migrate status without --prefix: want version 0 and the tables under nc_ named, got %v", r)
	}
	if r := cli(t, "migrate", "up", "--dsn", path); r.code != 0 {
		t.Fatalf("migrate: %v", r)
	}
	r = cli(t, "status", "--dsn", path, "--prefix", "nd_")
	if want := "Found sqlease_db_version: did you mean to leave out --prefix (the default is sqlease_)?"; r.code != 2 || !strings.Contains(r.stderr, want) {
		t.Errorf("status --prefix nd_ with the default tables there: want %q, got %v", want, r)
	}
}

// TestStatusFindsTablesInAnotherSchema: on PostgreSQL, status with a
// wrong --schema, or a wrong --prefix in the right schema, names the lock
// tables it finds.
func TestStatusFindsTablesInAnotherSchema(t *testing.T) {
	dsn, schema, _ := postgresSchema(t, "sqlease_cli_nc_")
	if r := cli(t, "migrate", "up", "--dsn", dsn, "--schema", schema, "--prefix", "nc_"); r.code != 0 {
		t.Fatalf("migrate: %v", r)
	}
	r := cli(t, "status", "--dsn", dsn, "--schema", schema)
	if want := "found " + schema + ".nc_db_version: did you mean --prefix nc_? "; r.code != 2 || !strings.Contains(r.stderr, want) {
		t.Errorf("status in the right schema without --prefix: want %q, got %v", want, r)
	}
	other := schema + "_x"
	r = cli(t, "status", "--dsn", dsn, "--schema", other, "--prefix", "nc_")
	if want := "found " + schema + ".nc_db_version: did you mean --schema " + schema + "?"; r.code != 2 || !strings.Contains(r.stderr, want) {
		t.Errorf("status in a mistyped schema: want %q, got %v", want, r)
	}
}
