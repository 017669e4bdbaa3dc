package conformance

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"
	_ "github.com/mattn/go-sqlite3"    // registers "sqlite3"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/pgdialect"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
)

// SQLiteDSN returns the DSN sqlease uses for a SQLite file: WAL journal and a
// 10 s busy timeout.
func SQLiteDSN(path string) string {
	return "file:" + path + "?_journal_mode=WAL&_busy_timeout=10000"
}

// SQLite returns a Config that gives every case a new SQLite file in dir.
func SQLite(dir string) Config {
	return Config{
		Dialect:    sqlitedialect.New(),
		DriverName: "sqlite3",
		NewDatabase: func(ctx context.Context, name string) (Database, error) {
			path := filepath.Join(dir, safeName(name)+"-"+randHex(4)+".db")
			return Database{DSN: SQLiteDSN(path), Cleanup: func() {
				for _, suffix := range []string{"", "-wal", "-shm"} {
					_ = os.Remove(path + suffix)
				}
			}}, nil
		},
	}
}

// Postgres returns a Config that gives every case a new schema in the
// database at dsn, dropped after the case.
func Postgres(dsn string) Config {
	return Config{
		Dialect:    pgdialect.New(),
		DriverName: "pgx",
		NewDatabase: func(ctx context.Context, name string) (Database, error) {
			schema := "sqlease_t_" + randHex(6)
			return Database{DSN: dsn, Namespace: dialect.Namespace{Schema: schema}, Cleanup: func() {
				db, err := sql.Open("pgx", dsn)
				if err != nil {
					return
				}
				defer db.Close()
				_, _ = db.ExecContext(context.Background(), "DROP SCHEMA IF EXISTS "+pgdialect.New().QuoteIdent(schema)+" CASCADE")
			}}, nil
		},
	}
}

// PostgresDSN returns $SQLEASE_POSTGRES_DSN, or skips t with the reason; with
// SQLEASE_REQUIRE_POSTGRES=1 a missing DSN or unreachable server fails t
// instead.
func PostgresDSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv("SQLEASE_POSTGRES_DSN")
	require := os.Getenv("SQLEASE_REQUIRE_POSTGRES") == "1"
	if dsn == "" {
		if require {
			t.Fatal("SQLEASE_REQUIRE_POSTGRES=1 but SQLEASE_POSTGRES_DSN is not set")
		}
		t.Skip("SQLEASE_POSTGRES_DSN is not set; set it (e.g. postgres://root@127.0.0.1:5432/test?sslmode=disable) to run the PostgreSQL cases")
	}
	db, err := sql.Open("pgx", dsn)
	if err == nil {
		err = db.PingContext(context.Background())
		db.Close()
	}
	if err != nil {
		if require {
			t.Fatalf("SQLEASE_REQUIRE_POSTGRES=1 but PostgreSQL at SQLEASE_POSTGRES_DSN is unreachable: %v", err)
		}
		t.Skipf("PostgreSQL at SQLEASE_POSTGRES_DSN is unreachable: %v", err)
	}
	return dsn
}

var unsafe = regexp.MustCompile(`[^A-Za-z0-9_]+`)

func safeName(s string) string {
	s = unsafe.ReplaceAllString(s, "_")
	if len(s) > 60 {
		s = s[:60]
	}
	return strings.Trim(s, "_")
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = crand.Read(b)
	return hex.EncodeToString(b)
}

var _ = fmt.Sprint
