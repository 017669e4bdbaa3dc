package lock_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/lock"
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
