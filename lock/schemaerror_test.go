package lock_test

import (
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// TestSchemaErrorCautionsOnlyNamedMissingTables: the not-migrated error
// cautions about a mistyped namespace only when the lock tables are
// missing (version 0) from a schema or prefix the caller named; old
// tables, which exist, and the default namespace get the advice alone
// (SPEC D1). Every form matches ErrSchemaNotMigrated.
func TestSchemaErrorCautionsOnlyNamedMissingTables(t *testing.T) {
	const caution = "if it is mistyped, migrating creates a second, separate set of lock tables"
	named := dialect.Namespace{Schema: "locks"}
	for _, tc := range []struct {
		current     int64
		ns          dialect.Namespace
		wantCaution bool
		wantLead    string
	}{
		{0, named, true, "are not migrated (version table locks.sqlease_db_version is at version 0), this library needs 8"},
		{0, dialect.Namespace{}, false, "are not migrated"},
		{3, named, false, "are at version 3 (version table locks.sqlease_db_version), this library needs 8"},
	} {
		e := &lock.SchemaError{Dialect: "postgres", Table: tc.ns.Schema + "." + "sqlease_db_version", Current: tc.current, Want: 8, Namespace: tc.ns}
		if tc.ns.Schema == "" {
			e.Table = "sqlease_db_version"
		}
		msg := e.Error()
		if got := strings.Contains(msg, caution); got != tc.wantCaution {
			t.Errorf("version %d, namespace %+v: caution shown %v, want %v:\n%s", tc.current, tc.ns, got, tc.wantCaution, msg)
		}
		if !strings.Contains(msg, tc.wantLead) || !strings.Contains(msg, "sqlease migrate up") {
			t.Errorf("version %d, namespace %+v: want %q and the migrate advice in:\n%s", tc.current, tc.ns, tc.wantLead, msg)
		}
		if !errors.Is(e, lock.ErrSchemaNotMigrated) {
			t.Errorf("version %d: does not match ErrSchemaNotMigrated", tc.current)
		}
	}
}

// A forgotten WithTablePrefix: lock.New finds the lock tables under the
// other prefix and names the option that reaches them before it advises
// migrating, which would make a second set (SPEC D1).
func TestSchemaErrorFindsTablesUnderAnotherPrefix(t *testing.T) {
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(t.TempDir(), "app.db")+"?_journal_mode=WAL&_busy_timeout=5000")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := migrate.Up(t.Context(), db, nil, migrate.WithNamespace(dialect.Namespace{Prefix: "nc_"})); err != nil {
		t.Fatal(err)
	}
	_, err = lock.New(t.Context(), db, nil)
	var se *lock.SchemaError
	if !errors.As(err, &se) {
		t.Fatalf("lock.New without the prefix = %v, want a *SchemaError", err)
	}
	want := `found nc_db_version: did you mean lock.WithTablePrefix("nc_")? If not, run`
	if se.Elsewhere == "" || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "second, separate set") {
		t.Errorf("lock.New without the prefix:\n%v\nwant it to contain %q and the caution about a second set", err, want)
	}
	if l, err := lock.New(t.Context(), db, nil, lock.WithTablePrefix("nc_")); err != nil {
		t.Errorf("with the prefix it names: %v", err)
	} else {
		l.Close(t.Context())
	}
}
