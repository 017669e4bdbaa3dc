// Package conftest holds the conformance configurations of the built-in
// dialects: a fresh SQLite file per case, a fresh PostgreSQL schema per case,
// a fresh MySQL/MariaDB database per case, each removed after the case, or
// (InSchema) one existing schema shared under a table prefix per case. It
// imports (and so registers) the built-in dialects and their pure-Go drivers
// (pgx, modernc.org/sqlite, go-sql-driver/mysql; mattn/go-sqlite3 is the
// caller's to import, see SQLiteDriver); package conformance itself imports
// no driver and registers nothing, so a third-party dialect's tests pull in
// only what they use.
package conftest

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	_ "github.com/go-sql-driver/mysql" // registers "mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"
	_ "modernc.org/sqlite"             // registers "sqlite" (pure Go)

	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/mysqldialect"
	"github.com/sqlease/sqlease/dialect/pgdialect"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
)

// SQLiteDSN returns the DSN sqlease uses for a SQLite file: WAL journal, a
// 5 s busy timeout (mattn/go-sqlite3's default, and no longer than the
// default release timeout, so a release needs no lock-wait statements) and,
// on modernc.org/sqlite (mattn ignores the key), a journal_size_limit of
// 4 MiB, so the WAL file does not keep its largest size.
func SQLiteDSN(path string) string {
	return "file:" + path + "?_journal_mode=WAL&_busy_timeout=5000&_pragma=journal_size_limit(4194304)"
}

// SQLite returns a Config that gives every case a new SQLite file in dir,
// opened with modernc.org/sqlite (driver "sqlite", pure Go: it needs no C
// compiler and works with CGO_ENABLED=0).
func SQLite(dir string) conformance.Config {
	return SQLiteDriver(dir, "sqlite")
}

// SQLiteDriver is SQLite with the database/sql driver registered as
// driverName: "sqlite" (modernc.org/sqlite, registered by this package) or
// "sqlite3" (github.com/mattn/go-sqlite3, cgo: the caller imports it). Both
// accept the DSN of SQLiteDSN.
func SQLiteDriver(dir, driverName string) conformance.Config {
	return conformance.Config{
		Dialect:    sqlitedialect.New(),
		DriverName: driverName,
		NewDatabase: func(ctx context.Context, name string) (conformance.Database, error) {
			path := filepath.Join(dir, safeName(name)+"-"+randHex(4)+".db")
			return conformance.Database{DSN: SQLiteDSN(path), Cleanup: func() {
				for _, suffix := range []string{"", "-wal", "-shm"} {
					_ = os.Remove(path + suffix)
				}
			}}, nil
		},
		IsolationDSN: SQLiteIsolationDSN,
	}
}

// Postgres returns a Config that gives every case a new schema in the
// database at dsn, dropped after the case.
func Postgres(dsn string) conformance.Config {
	return conformance.Config{
		Dialect:    pgdialect.New(),
		DriverName: "pgx",
		NewDatabase: func(ctx context.Context, name string) (conformance.Database, error) {
			schema := "sqlease_t_" + randHex(6)
			return conformance.Database{DSN: dsn, Namespace: dialect.Namespace{Schema: schema}, Cleanup: func() {
				_ = DropNamespace("pgx", dsn, "DROP SCHEMA IF EXISTS "+pgdialect.New().QuoteIdent(schema)+" CASCADE")
			}}, nil
		},
		IsolationDSN: PostgresIsolationDSN,
	}
}

// PostgresDSN returns $SQLEASE_POSTGRES_DSN, or skips t with the reason; with
// SQLEASE_REQUIRE_POSTGRES=1 a missing DSN or unreachable server fails t
// instead.
func PostgresDSN(t testing.TB) string {
	t.Helper()
	return serverDSN(t, "POSTGRES", "pgx", "PostgreSQL", "postgres://root@127.0.0.1:5432/test?sslmode=disable")
}

// MySQL returns a Config that gives every case a new database (a Namespace
// schema) on the MySQL or MariaDB server at dsn (a go-sql-driver/mysql DSN,
// used as given: sqlease needs no DSN option), dropped after the case.
func MySQL(dsn string) conformance.Config {
	return conformance.Config{
		Dialect:    mysqldialect.New(),
		DriverName: "mysql",
		NewDatabase: func(ctx context.Context, name string) (conformance.Database, error) {
			schema := "sqlease_t_" + randHex(6)
			return conformance.Database{DSN: dsn, Namespace: dialect.Namespace{Schema: schema}, Cleanup: func() {
				_ = DropNamespace("mysql", dsn, "DROP DATABASE IF EXISTS "+mysqldialect.New().QuoteIdent(schema))
			}}, nil
		},
		IsolationDSN: MySQLIsolationDSN,
	}
}

// MySQLDSN returns $SQLEASE_MYSQL_DSN, or skips t with the reason; with
// SQLEASE_REQUIRE_MYSQL=1 a missing DSN or unreachable server fails t
// instead.
func MySQLDSN(t testing.TB) string {
	t.Helper()
	return serverDSN(t, "MYSQL", "mysql", "MySQL", "root@tcp(127.0.0.1:3306)/test")
}

// serverDSN returns $SQLEASE_<name>_DSN after pinging it through driver,
// or skips t with the reason; with SQLEASE_REQUIRE_<name>=1 a missing DSN
// or an unreachable server fails t instead. what names the server in
// messages, example is a DSN to suggest.
func serverDSN(t testing.TB, name, driver, what, example string) string {
	t.Helper()
	dsnVar, requireVar := "SQLEASE_"+name+"_DSN", "SQLEASE_REQUIRE_"+name
	dsn := os.Getenv(dsnVar)
	require := os.Getenv(requireVar) == "1"
	if dsn == "" {
		if require {
			t.Fatalf("%s=1 but %s is not set", requireVar, dsnVar)
		}
		t.Skipf("%s is not set; set it (e.g. %s) to run the %s cases", dsnVar, example, what)
	}
	db, err := sql.Open(driver, dsn)
	if err == nil {
		err = db.PingContext(context.Background())
		db.Close()
	}
	if err != nil {
		if require {
			t.Fatalf("%s=1 but %s at %s is unreachable: %v", requireVar, what, dsnVar, err)
		}
		t.Skipf("%s at %s is unreachable: %v", what, dsnVar, err)
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

// PostgresIsolationDSN returns dsn (a postgres:// URL or a keyword/value
// string) with a startup option that makes every session default to iso
// (default_transaction_isolation), for Config.IsolationDSN. It connects
// once (driver "pgx") to check that the server honours the option. Levels
// other than read committed, repeatable read and serializable, and servers
// that refuse the startup parameter (PgBouncer), are errors.ErrUnsupported.
func PostgresIsolationDSN(dsn string, iso sql.IsolationLevel) (string, error) {
	var level string
	switch iso {
	case sql.LevelReadCommitted:
		level = `read\ committed`
	case sql.LevelRepeatableRead:
		level = `repeatable\ read`
	case sql.LevelSerializable:
		level = "serializable"
	default:
		return "", fmt.Errorf("PostgreSQL has no such level: %w", errors.ErrUnsupported)
	}
	opt := "-c default_transaction_isolation=" + level
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("conftest: parse PostgreSQL DSN: %w", err)
		}
		q := u.Query()
		if old := q.Get("options"); old != "" {
			opt = old + " " + opt
		}
		q.Set("options", opt)
		// Spaces as %20: not every driver decodes '+' in a query.
		u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
		return probePostgresIsolation(u.String(), iso)
	}
	// Keyword/value form: single-quote the value, escaping \ and '.
	quoted := strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(opt)
	return probePostgresIsolation(dsn+" options='"+quoted+"'", iso)
}

// probePostgresIsolation connects once with dsn and checks that the
// session defaults to iso. A server that refuses the startup parameter
// (PgBouncer and other poolers answer "unsupported startup parameter",
// SQLSTATE 08P01, and in transaction pooling could not keep a session
// default anyway) gives errors.ErrUnsupported, so the case skips; a server
// that accepts it but reports another level is an error.
func probePostgresIsolation(dsn string, iso sql.IsolationLevel) (string, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return "", fmt.Errorf("conftest: open PostgreSQL: %w", err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var got string
	err = db.QueryRowContext(ctx, "SHOW default_transaction_isolation").Scan(&got)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "08P01" && strings.Contains(pgErr.Message, "startup parameter") {
		return "", fmt.Errorf("conftest: the server refuses the startup parameter that sets default_transaction_isolation (a pooler such as PgBouncer in front of PostgreSQL?): %s: %w", pgErr.Message, errors.ErrUnsupported)
	}
	if err != nil {
		return "", fmt.Errorf("conftest: check default_transaction_isolation: %w", err)
	}
	if want := strings.ToLower(iso.String()); got != want {
		return "", fmt.Errorf("conftest: sessions opened with the options parameter default to %q, want %q", got, want)
	}
	return dsn, nil
}

// SQLiteIsolationDSN returns dsn for sql.LevelSerializable (SQLite
// transactions are always serializable) and errors.ErrUnsupported for any
// other level, for Config.IsolationDSN.
func SQLiteIsolationDSN(dsn string, iso sql.IsolationLevel) (string, error) {
	if iso == sql.LevelSerializable {
		return dsn, nil
	}
	return "", fmt.Errorf("SQLite transactions are always serializable: %w", errors.ErrUnsupported)
}

// MySQLIsolationDSN returns dsn (a go-sql-driver/mysql DSN) with a system
// variable that makes every session default to iso, for
// Config.IsolationDSN: transaction_isolation on MySQL 8, tx_isolation on
// MariaDB before 11.1 (it asks the server which it is). Levels other than
// read committed, repeatable read and serializable are
// errors.ErrUnsupported.
func MySQLIsolationDSN(dsn string, iso sql.IsolationLevel) (string, error) {
	var level string
	switch iso {
	case sql.LevelReadCommitted:
		level = "READ-COMMITTED"
	case sql.LevelRepeatableRead:
		level = "REPEATABLE-READ"
	case sql.LevelSerializable:
		level = "SERIALIZABLE"
	default:
		return "", fmt.Errorf("MySQL has no such level: %w", errors.ErrUnsupported)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return "", fmt.Errorf("conftest: open MySQL: %w", err)
	}
	defer db.Close()
	name := "transaction_isolation"
	var v sql.NullString
	if err := db.QueryRow("SELECT @@transaction_isolation").Scan(&v); err != nil {
		name = "tx_isolation" // MariaDB before 11.1
	}
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + name + "=" + url.QueryEscape("'"+level+"'"), nil
}
