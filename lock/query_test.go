package lock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/metrics"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/mattn/go-sqlite3"
	_ "modernc.org/sqlite"

	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/internal/faultdb"
)

// queryConn reads the engine's hot statements straight from the driver
// (query.go). These tests run it next to database/sql on every driver
// available here and check that it reads the same values, fails where
// database/sql fails, and starts fewer goroutines.

// queryDrivers opens one pool per driver available: both SQLite drivers on
// files, PostgreSQL and MySQL when their DSNs are set.
func queryDrivers(t *testing.T) map[string]*sql.DB {
	t.Helper()
	dir := t.TempDir()
	targets := map[string][2]string{
		"mattn":   {"sqlite3", "file:" + filepath.Join(dir, "mattn.db")},
		"modernc": {"sqlite", "file:" + filepath.Join(dir, "modernc.db")},
	}
	if dsn := os.Getenv("SQLEASE_POSTGRES_DSN"); dsn != "" {
		targets["pgx"] = [2]string{"pgx", dsn}
	}
	if dsn := os.Getenv("SQLEASE_MYSQL_DSN"); dsn != "" {
		targets["mysql"] = [2]string{"mysql", dsn}
	}
	out := map[string]*sql.DB{}
	for name, tg := range targets {
		db, err := sql.Open(tg[0], tg[1])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		out[name] = db
	}
	return out
}

func TestQueryConnScansLikeDatabaseSQL(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// Each query returns one column; each is scanned into each
	// destination the engine uses.
	queries := map[string]string{
		"true":        "SELECT 1 = 1",
		"false":       "SELECT 1 = 0",
		"one":         "SELECT 1",
		"zero":        "SELECT 0",
		"big":         "SELECT 1764633600123456",
		"negative":    "SELECT -42",
		"text digits": "SELECT '1764633600123456'",
		"text word":   "SELECT 'lease-7'",
		"text t":      "SELECT 't'",
		"empty":       "SELECT ''",
		"null":        "SELECT NULL",
		"whole float": "SELECT 2.0E0",
		"frac float":  "SELECT 2.5E0",
	}
	// MySQL's driver returns uint64 for unsigned integer columns (MariaDB's
	// sequence tables have one).
	unsigned := map[string]string{
		"unsigned":      "SELECT seq FROM seq_7_to_7",
		"unsigned huge": "SELECT seq FROM seq_18446744073709551614_to_18446744073709551614",
	}
	for name, db := range queryDrivers(t) {
		t.Run(name, func(t *testing.T) {
			conn, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			all := queries
			if name == "mysql" {
				all = map[string]string{}
				for k, v := range queries {
					all[k] = v
				}
				for k, v := range unsigned {
					all[k] = v
				}
			}
			for qn, q := range all {
				for _, kind := range []string{"bool", "string", "int64"} {
					want, wantErr := scanOne(func(dest any) error { return conn.QueryRowContext(ctx, q).Scan(dest) }, kind)
					got, gotErr := scanOne(func(dest any) error {
						n := 0
						err := queryConn(ctx, conn, q, nil, func(r rowScanner) error {
							n++
							return r.Scan(dest)
						})
						if err == nil && n != 1 {
							err = fmt.Errorf("%d rows", n)
						}
						return err
					}, kind)
					if (wantErr != nil) != (gotErr != nil) || got != want {
						t.Errorf("%s (%s) into *%s: queryConn %v, %v; database/sql %v, %v", qn, q, kind, got, gotErr, want, wantErr)
					}
				}
			}
			// Arguments are bound as database/sql binds them.
			var s string
			var n int64
			err = queryConn(ctx, conn, placeholderQuery(name), []any{"k/1", int64(7)}, func(r rowScanner) error { return r.Scan(&s, &n) })
			if err != nil || s != "k/1" || n != 7 {
				t.Errorf("bound arguments read back as %q, %d, %v; want k/1, 7", s, n, err)
			}
			// A failing statement reports the driver's error, and the
			// connection still works.
			if err := queryConn(ctx, conn, "SELECT * FROM no_such_table_here", nil, func(rowScanner) error { return nil }); err == nil {
				t.Error("query of a missing table: no error")
			}
			if err := queryConn(ctx, conn, "SELECT 1", nil, func(r rowScanner) error { return r.Scan(&n) }); err != nil || n != 1 {
				t.Errorf("after a failed query: %d, %v", n, err)
			}
		})
	}
}

// placeholderQuery selects its two arguments back in the driver's
// placeholder style.
func placeholderQuery(driver string) string {
	switch driver {
	case "pgx":
		return "SELECT $1::text, $2::bigint"
	case "mysql":
		return "SELECT CAST(? AS CHAR), CAST(? AS SIGNED)"
	}
	return "SELECT ?1, ?2"
}

// scanOne scans into a fresh destination of kind and returns its value.
func scanOne(scan func(dest any) error, kind string) (any, error) {
	switch kind {
	case "bool":
		var v bool
		err := scan(&v)
		return v, err
	case "string":
		var v string
		err := scan(&v)
		return v, err
	default:
		var v int64
		err := scan(&v)
		return v, err
	}
}

// TestQueryConnStartsNoGoroutineOfItsOwn: under a context that can end,
// database/sql starts a goroutine per query (sql.Rows watches the
// context); queryConn leaves cancellation to the driver, so it starts at
// least one goroutine fewer per query (none on pgx and MySQL).
func TestQueryConnStartsNoGoroutineOfItsOwn(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	created := func() uint64 {
		s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	const n = 50
	for name, db := range queryDrivers(t) {
		t.Run(name, func(t *testing.T) {
			conn, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			var v int64
			before := created()
			for range n {
				if err := conn.QueryRowContext(ctx, "SELECT 1").Scan(&v); err != nil {
					t.Fatal(err)
				}
			}
			viaSQL := created() - before
			before = created()
			for range n {
				if err := queryConn(ctx, conn, "SELECT 1", nil, func(r rowScanner) error { return r.Scan(&v) }); err != nil {
					t.Fatal(err)
				}
			}
			direct := created() - before
			if direct+n*9/10 > viaSQL {
				t.Errorf("%d queries started %d goroutines through queryConn and %d through database/sql; want at least %d fewer", n, direct, viaSQL, n*9/10)
			}
			if (name == "pgx" || name == "mysql") && direct > n/10 {
				t.Errorf("%d queries through queryConn started %d goroutines; want about none", n, direct)
			}
		})
	}
}

// TestProbeTakesAnotherConnectionAfterABadOne: the Probe runs on a pooled
// connection read straight from the driver; like database/sql's query on
// the pool, it takes another connection when the driver reports the one it
// got broken before the query was sent (driver.ErrBadConn), up to three
// tries. A refused TryAcquire after three bad connections still reports
// the holder (ErrLocked, not a connection error) promptly, and the next
// acquire works.
func TestProbeTakesAnotherConnectionAfterABadOne(t *testing.T) {
	ctx := context.Background()
	db, inj := faultySQLite(t)
	l, err := New(ctx, db, sqlitedialect.New())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	holder, err := New(ctx, db, sqlitedialect.New())
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(ctx)
	held, err := holder.TryAcquire(ctx, "k", Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	hits := new(atomic.Int64)
	inj.Add(faultdb.Rule{Match: "SELECT 0 AS granted", Action: faultdb.Fail, Err: driver.ErrBadConn, Times: 3, Hits: hits})
	start := time.Now()
	_, err = l.TryAcquire(ctx, "k", Exclusive)
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("TryAcquire of a held key after three bad connections: %v, want ErrLocked", err)
	}
	if hits.Load() != 3 {
		t.Fatalf("the Probe met %d bad connections, want 3 (the rule did not act)", hits.Load())
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("refused TryAcquire took %v after three bad connections; want it prompt", d)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	le, err := l.TryAcquire(ctx, "k", Exclusive)
	if err != nil {
		t.Fatalf("TryAcquire after the fault: %v", err)
	}
	if err := le.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestDenialAfterRetriedErrorIsObserved: a blocking acquire whose wait runs
// out while its attempts fail with a transient error is denied with a
// *LockedError carrying that error, and observers see the denial
// (EventAcquireDenied) like any other; once the fault is gone the next
// acquire is granted.
func TestDenialAfterRetriedErrorIsObserved(t *testing.T) {
	ctx := context.Background()
	db, inj := faultySQLite(t)
	var denied atomic.Int64
	l, err := New(ctx, db, sqlitedialect.New(), WithObserver(ObserverFunc(func(e Event) {
		if e.Kind == EventAcquireDenied {
			denied.Add(1)
		}
	})))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	hits := new(atomic.Int64)
	remove := inj.Add(faultdb.Rule{Match: "INSERT", Action: faultdb.Fail, Err: driver.ErrBadConn, Hits: hits})
	_, err = l.Acquire(ctx, "k", Exclusive, WaitTimeout(300*time.Millisecond))
	remove()
	var le *LockedError
	if !errors.As(err, &le) || le.Err == nil {
		t.Fatalf("acquire whose attempts all failed until the wait ran out: %v, want a *LockedError with the attempts' error", err)
	}
	if hits.Load() == 0 {
		t.Fatal("the fault never acted")
	}
	if n := denied.Load(); n != 1 {
		t.Errorf("observers saw %d denials, want 1", n)
	}
	le2, err := l.TryAcquire(ctx, "k", Exclusive)
	if err != nil {
		t.Fatalf("acquire after the fault was removed: %v", err)
	}
	_ = le2.Release(ctx)
}
