package conftest_test

import (
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/sqlease/sqlease/conformance/conftest"
)

// TestPostgresIsolationDSN: every level it accepts gives sessions that
// really default to that level, in both DSN forms.
func TestPostgresIsolationDSN(t *testing.T) {
	base := conftest.PostgresDSN(t)
	for _, iso := range []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable} {
		dsn, err := conftest.PostgresIsolationDSN(base, iso)
		if err != nil {
			t.Fatalf("%s: %v", iso, err)
		}
		db, err := sql.Open("pgx", dsn)
		if err != nil {
			t.Fatal(err)
		}
		var got string
		err = db.QueryRow("SHOW default_transaction_isolation").Scan(&got)
		_ = db.Close()
		if err != nil {
			t.Fatalf("%s: %v", iso, err)
		}
		if want := strings.ToLower(iso.String()); got != want {
			t.Errorf("sessions default to %q, want %q", got, want)
		}
	}
	if _, err := conftest.PostgresIsolationDSN(base, sql.LevelSnapshot); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("snapshot level: err = %v, want errors.ErrUnsupported", err)
	}
}

// TestPostgresIsolationDSNBehindPgBouncer: PgBouncer refuses the startup
// parameter, so the S6 cases must skip there (errors.ErrUnsupported), not
// fail while connecting; this failed `sqlease check` through PgBouncer once.
func TestPostgresIsolationDSNBehindPgBouncer(t *testing.T) {
	pgb := conftest.PgBouncerDSN(t)
	_, err := conftest.PostgresIsolationDSN(pgb, sql.LevelRepeatableRead)
	if !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("err = %v, want errors.ErrUnsupported", err)
	}
	t.Logf("refused as expected: %v", err)
}
