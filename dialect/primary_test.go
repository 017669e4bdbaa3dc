package dialect_test

import (
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
	_ "modernc.org/sqlite"
)

// replicaDialect is SQLite with a Primary query whose answer the test
// chooses, as a replica's server would give it: the engine's handling of
// the answer is what is under test (SPEC S7). The real replicas are in the
// PostgreSQL and MySQL dialects' failover tests.
type replicaDialect struct {
	dialect.Dialect
	primary string
}

func (d replicaDialect) Statements() dialect.Statements {
	s := d.Dialect.Statements()
	s.Primary = d.primary
	return s
}

func TestCheckPrimaryRefusesAReplicaBeforeWriting(t *testing.T) {
	ctx := t.Context()
	for _, tc := range []struct {
		name, query string
		is          error // nil: accepted
		says        []string
	}{
		{"primary", "SELECT 0, NULL", nil, nil},
		{"primary, empty reason", "SELECT 0, ''", nil, nil},
		{"read-only replica", "SELECT 1, 'replica at db2:5432 (read_only is on)'", dialect.ErrReadOnly,
			[]string{`lock: sqlite server is read-only (a replica); connect to the primary: replica at db2:5432`}},
		{"unsupported server", "SELECT 0, 'a Galera node'", errors.ErrUnsupported,
			[]string{`lock: sqlite server cannot hold leases: a Galera node`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "db")+"?_pragma=busy_timeout(5000)")
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			d := replicaDialect{sqlitedialect.New(), tc.query}
			_, upErr := migrate.Up(ctx, db, d)
			l, err := lock.New(ctx, db, d, lock.WithoutSchemaCheck())
			if tc.is == nil {
				if upErr != nil || err != nil {
					t.Fatalf("a primary was refused: migrate %v, lock.New %v", upErr, err)
				}
				l.Close(ctx)
				return
			}
			var se *dialect.ServerError
			if !errors.Is(err, tc.is) || !errors.As(err, &se) {
				t.Fatalf("lock.New: want a *dialect.ServerError matching %v, got %v", tc.is, err)
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("lock.New error %q does not say %q", err, s)
				}
			}
			if !errors.Is(upErr, tc.is) || !strings.HasPrefix(upErr.Error(), "migrate: ") {
				t.Fatalf("migrate.Up: want an error matching %v from migrate, got %v", tc.is, upErr)
			}
			// Nothing was written: no table exists.
			var n int
			if err := db.QueryRowContext(ctx, "SELECT count(*) FROM sqlite_master").Scan(&n); err != nil || n != 0 {
				t.Errorf("migrate.Up wrote to a refused server: %d objects, %v", n, err)
			}
		})
	}
}
