//go:build cgo

// The tests drive mattn/go-sqlite3 (cgo) through the wrapper; builds with
// CGO_ENABLED=0 skip them.

package faultdb_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/mattn/go-sqlite3"

	"github.com/sqlease/sqlease/internal/faultdb"
)

// env is one real database reached twice: through an Injector (db) and
// directly (plain), to check what really happened.
type env struct {
	pg    bool
	inj   *faultdb.Injector
	db    *sql.DB // through inj
	plain *sql.DB // same database, no injector
	table string
	base  driver.Connector
}

// postgresDSN returns the PostgreSQL DSN or skips (fails when PostgreSQL is
// required).
func postgresDSN(t *testing.T) string {
	t.Helper()
	dsn := os.Getenv("SQLEASE_POSTGRES_DSN")
	if dsn == "" {
		if os.Getenv("SQLEASE_REQUIRE_POSTGRES") == "1" {
			t.Fatal("SQLEASE_REQUIRE_POSTGRES=1 but SQLEASE_POSTGRES_DSN is not set")
		}
		t.Skip("SQLEASE_POSTGRES_DSN is not set; skipping the PostgreSQL run")
	}
	return dsn
}

func sqliteConnector(t *testing.T) driver.Connector {
	t.Helper()
	path := filepath.Join(t.TempDir(), "faultdb.db")
	dsn := "file:" + path + "?_busy_timeout=5000&_journal_mode=WAL&_synchronous=OFF&_txlock=immediate"
	c, err := faultdb.DSNConnector(&sqlite3.SQLiteDriver{}, dsn)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func pgConnector(t *testing.T) driver.Connector {
	t.Helper()
	cfg, err := pgx.ParseConfig(postgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	return stdlib.GetConnector(*cfg)
}

func newEnv(t *testing.T, pg bool) *env {
	t.Helper()
	e := &env{pg: pg, inj: faultdb.New()}
	var ddl string
	if pg {
		e.base = pgConnector(t)
		var b [6]byte
		if _, err := rand.Read(b[:]); err != nil {
			t.Fatal(err)
		}
		e.table = "faultdb_" + hex.EncodeToString(b[:])
		ddl = "CREATE TABLE " + e.table + " (id BIGSERIAL PRIMARY KEY, v TEXT NOT NULL)"
	} else {
		e.base = sqliteConnector(t)
		e.table = "items"
		ddl = "CREATE TABLE " + e.table + " (id INTEGER PRIMARY KEY, v TEXT NOT NULL)"
	}
	e.plain = sql.OpenDB(e.base)
	e.db = sql.OpenDB(e.inj.Connector(e.base))
	t.Cleanup(func() {
		e.db.Close()
		if pg {
			if _, err := e.plain.Exec("DROP TABLE IF EXISTS " + e.table); err != nil {
				t.Errorf("drop %s: %v", e.table, err)
			}
		}
		e.plain.Close()
	})
	if _, err := e.plain.Exec(ddl); err != nil {
		t.Fatal(err)
	}
	return e
}

// each runs f against SQLite and, when configured, PostgreSQL.
func each(t *testing.T, f func(t *testing.T, e *env)) {
	t.Run("sqlite", func(t *testing.T) { f(t, newEnv(t, false)) })
	t.Run("postgres", func(t *testing.T) { f(t, newEnv(t, true)) })
}

func (e *env) insertSQL() string { return "INSERT INTO " + e.table + " (v) VALUES ($1)" }

type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

func (e *env) insert(ctx context.Context, x execer, v string) error {
	_, err := x.ExecContext(ctx, e.insertSQL(), v)
	return err
}

// rows counts the table's rows without the injector.
func (e *env) rows(t *testing.T) int {
	t.Helper()
	var n int
	if err := e.plain.QueryRow("SELECT count(*) FROM " + e.table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (e *env) wantRows(t *testing.T, want int) {
	t.Helper()
	if got := e.rows(t); got != want {
		t.Fatalf("table has %d rows, want %d", got, want)
	}
}

// wantPoolWorks checks that a query through the injected pool succeeds.
func (e *env) wantPoolWorks(t *testing.T) {
	t.Helper()
	var n int
	if err := e.db.QueryRow("SELECT count(*) FROM " + e.table).Scan(&n); err != nil {
		t.Fatalf("query on the pool after the fault: %v", err)
	}
}

func wantCount(t *testing.T, inj *faultdb.Injector, substr string, want int) {
	t.Helper()
	if got := inj.Count(substr); got != want {
		t.Fatalf("Count(%q) = %d, want %d", substr, got, want)
	}
}

// waitFor polls cond until it holds, failing after a generous deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// baseConn returns the base driver connection that conn uses, unwrapped.
func baseConn(t *testing.T, conn *sql.Conn) driver.Conn {
	t.Helper()
	var bc driver.Conn
	err := conn.Raw(func(dc any) error {
		u, ok := dc.(interface{ Unwrap() driver.Conn })
		if !ok {
			return fmt.Errorf("raw conn %T has no Unwrap", dc)
		}
		bc = u.Unwrap()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return bc
}

var errBoom = errors.New("boom")

func TestFail(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		var hits atomic.Int64
		remove := e.inj.Add(faultdb.Rule{Match: "INSERT INTO", Action: faultdb.Fail, Err: errBoom, Hits: &hits})

		if err := e.insert(ctx, e.db, "direct"); !errors.Is(err, errBoom) {
			t.Fatalf("direct exec: err = %v, want %v", err, errBoom)
		}
		stmt, err := e.db.PrepareContext(ctx, e.insertSQL())
		if err != nil {
			t.Fatal(err)
		}
		defer stmt.Close()
		if _, err := stmt.ExecContext(ctx, "prepared"); !errors.Is(err, errBoom) {
			t.Fatalf("prepared exec: err = %v, want %v", err, errBoom)
		}
		if err := e.insert(ctx, e.db, "x"); !errors.Is(err, errBoom) {
			t.Fatal(err)
		}
		e.wantRows(t, 0)
		wantCount(t, e.inj, "INSERT", 0)
		if hits.Load() != 3 {
			t.Fatalf("hits = %d, want 3", hits.Load())
		}

		// Queries, direct and prepared.
		removeQ := e.inj.Add(faultdb.Rule{Match: "SELECT v FROM", Action: faultdb.Fail, Err: errBoom})
		var v string
		q := "SELECT v FROM " + e.table + " WHERE id = $1"
		if err := e.db.QueryRowContext(ctx, q, 1).Scan(&v); !errors.Is(err, errBoom) {
			t.Fatalf("query: err = %v, want %v", err, errBoom)
		}
		qs, err := e.db.PrepareContext(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		defer qs.Close()
		if err := qs.QueryRowContext(ctx, 1).Scan(&v); !errors.Is(err, errBoom) {
			t.Fatalf("prepared query: err = %v, want %v", err, errBoom)
		}
		removeQ()

		remove()
		remove() // harmless
		if _, err := stmt.ExecContext(ctx, "after"); err != nil {
			t.Fatal(err)
		}
		if err := e.insert(ctx, e.db, "after2"); err != nil {
			t.Fatal(err)
		}
		e.wantRows(t, 2)
		wantCount(t, e.inj, "INSERT", 2)

		// Driver-typed errors pass through unchanged; nil Err gives a generic error.
		if e.pg {
			defer e.inj.Add(faultdb.Rule{Match: "INSERT", Action: faultdb.Fail, Times: 1,
				Err: &pgconn.PgError{Code: "40001", Message: "injected serialization failure"}})()
			var pgErr *pgconn.PgError
			if err := e.insert(ctx, e.db, "typed"); !errors.As(err, &pgErr) || pgErr.Code != "40001" {
				t.Fatalf("err = %v, want PgError 40001", err)
			}
		} else {
			defer e.inj.Add(faultdb.Rule{Match: "INSERT", Action: faultdb.Fail, Times: 1,
				Err: sqlite3.Error{Code: sqlite3.ErrBusy}})()
			var sqErr sqlite3.Error
			if err := e.insert(ctx, e.db, "typed"); !errors.As(err, &sqErr) || sqErr.Code != sqlite3.ErrBusy {
				t.Fatalf("err = %v, want sqlite3 ErrBusy", err)
			}
		}
		defer e.inj.Add(faultdb.Rule{Match: "INSERT", Action: faultdb.Fail, Times: 1})()
		if err := e.insert(ctx, e.db, "generic"); err == nil || !strings.Contains(err.Error(), "faultdb") {
			t.Fatalf("err = %v, want the generic injected error", err)
		}
		e.wantRows(t, 2)
	})
}

// TestMinArgBytes: a rule with MinArgBytes acts only on statements whose
// string arguments are that long, direct or prepared, and the connection
// serves the next statement normally.
func TestMinArgBytes(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		var hits atomic.Int64
		e.inj.Add(faultdb.Rule{Match: "INSERT INTO", Action: faultdb.Fail, Err: errBoom, MinArgBytes: 100, Hits: &hits})
		long := strings.Repeat("x", 100)
		if err := e.insert(ctx, e.db, long); !errors.Is(err, errBoom) {
			t.Fatalf("100-byte argument: err = %v, want %v", err, errBoom)
		}
		if err := e.insert(ctx, e.db, long[:99]); err != nil {
			t.Fatalf("99-byte argument: %v", err)
		}
		stmt, err := e.db.PrepareContext(ctx, e.insertSQL())
		if err != nil {
			t.Fatal(err)
		}
		defer stmt.Close()
		if _, err := stmt.ExecContext(ctx, long+"y"); !errors.Is(err, errBoom) {
			t.Fatalf("prepared, 101 bytes: err = %v, want %v", err, errBoom)
		}
		if _, err := stmt.ExecContext(ctx, "short"); err != nil {
			t.Fatalf("prepared, short: %v", err)
		}
		e.wantRows(t, 2)
		if hits.Load() != 2 {
			t.Fatalf("hits = %d, want 2", hits.Load())
		}
	})
}

func TestFailCommitRollsBack(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		e.db.SetMaxOpenConns(1) // the next transaction must reuse the same connection
		e.inj.Add(faultdb.Rule{Match: "COMMIT", Action: faultdb.Fail, Err: errBoom, Times: 1})

		tx, err := e.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.insert(ctx, tx, "lost"); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); !errors.Is(err, errBoom) {
			t.Fatalf("commit: err = %v, want %v", err, errBoom)
		}
		e.wantRows(t, 0)
		wantCount(t, e.inj, "COMMIT", 0)
		wantCount(t, e.inj, "ROLLBACK", 1)

		tx, err = e.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.insert(ctx, tx, "kept"); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		e.wantRows(t, 1)
		wantCount(t, e.inj, "BEGIN", 2)
		wantCount(t, e.inj, "COMMIT", 1)
	})
}

func TestDropReply(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		e.db.SetMaxOpenConns(1)

		t.Run("conn exec", func(t *testing.T) {
			var hits atomic.Int64
			e.inj.Add(faultdb.Rule{Match: "INSERT", Action: faultdb.DropReply, Times: 1, Hits: &hits})
			conn, err := e.db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			before := baseConn(t, conn)
			if err := e.insert(ctx, conn, "dropped"); !errors.Is(err, driver.ErrBadConn) {
				t.Fatalf("err = %v, want driver.ErrBadConn", err)
			}
			conn.Close()
			e.wantRows(t, 1) // it did take effect
			wantCount(t, e.inj, "INSERT", 1)
			if hits.Load() != 1 {
				t.Fatalf("hits = %d", hits.Load())
			}
			e.wantPoolWorks(t)
			conn, err = e.db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if baseConn(t, conn) == before {
				t.Fatal("the pool still uses the connection whose reply was dropped")
			}
		})

		t.Run("commit", func(t *testing.T) {
			e.inj.Reset()
			e.inj.Add(faultdb.Rule{Match: "COMMIT", Action: faultdb.DropReply, Times: 1})
			n := e.rows(t)
			tx, err := e.db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := e.insert(ctx, tx, "committed"); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); !errors.Is(err, driver.ErrBadConn) {
				t.Fatalf("commit: err = %v, want driver.ErrBadConn", err)
			}
			e.wantRows(t, n+1)
			e.wantPoolWorks(t)
		})

		t.Run("query returning", func(t *testing.T) {
			e.inj.Reset()
			e.inj.Add(faultdb.Rule{Match: "RETURNING", Action: faultdb.DropReply, Times: 1})
			n := e.rows(t)
			conn, err := e.db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var id int64
			err = conn.QueryRowContext(ctx, "INSERT INTO "+e.table+" (v) VALUES ($1) RETURNING id", "ret").Scan(&id)
			if !errors.Is(err, driver.ErrBadConn) {
				t.Fatalf("err = %v, want driver.ErrBadConn", err)
			}
			conn.Close()
			e.wantRows(t, n+1)
			e.wantPoolWorks(t)
		})

		t.Run("prepared on conn", func(t *testing.T) {
			e.inj.Reset()
			e.inj.Add(faultdb.Rule{Match: "INSERT", Action: faultdb.DropReply, Times: 1})
			n := e.rows(t)
			conn, err := e.db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			stmt, err := conn.PrepareContext(ctx, e.insertSQL())
			if err != nil {
				t.Fatal(err)
			}
			// database/sql retries a *sql.Stmt on ErrBadConn even when it is
			// bound to a *sql.Conn; the retry finds the Conn closed.
			if _, err := stmt.ExecContext(ctx, "prep"); !errors.Is(err, driver.ErrBadConn) && !errors.Is(err, sql.ErrConnDone) {
				t.Fatalf("err = %v, want driver.ErrBadConn or sql.ErrConnDone", err)
			}
			stmt.Close()
			conn.Close()
			e.wantRows(t, n+1)
			e.wantPoolWorks(t)
		})

		t.Run("custom error on DB", func(t *testing.T) {
			// An error that is not ErrBadConn is not retried by database/sql:
			// the caller sees the lost reply, and the connection is discarded.
			e.inj.Reset()
			e.inj.Add(faultdb.Rule{Match: "INSERT", Action: faultdb.DropReply, Times: 1, Err: io.ErrUnexpectedEOF})
			n := e.rows(t)
			conn, err := e.db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			before := baseConn(t, conn)
			conn.Close()
			if err := e.insert(ctx, e.db, "eof"); !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("err = %v, want io.ErrUnexpectedEOF", err)
			}
			e.wantRows(t, n+1)
			e.wantPoolWorks(t)
			conn, err = e.db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if baseConn(t, conn) == before {
				t.Fatal("the pool still uses the connection whose reply was dropped")
			}
		})

		t.Run("ErrBadConn on DB is retried by database/sql", func(t *testing.T) {
			e.inj.Reset()
			e.inj.ResetCounts()
			e.inj.Add(faultdb.Rule{Match: "INSERT", Action: faultdb.DropReply, Times: 1})
			n := e.rows(t)
			if err := e.insert(ctx, e.db, "twice"); err != nil {
				t.Fatalf("err = %v, want nil (database/sql retried)", err)
			}
			e.wantRows(t, n+2)
			wantCount(t, e.inj, "INSERT", 2)
		})
	})
}

func TestDelay(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		const d = 50 * time.Millisecond
		remove := e.inj.Add(faultdb.Rule{Match: "INSERT", Action: faultdb.Delay, Delay: d})
		start := time.Now()
		if err := e.insert(ctx, e.db, "slow"); err != nil {
			t.Fatal(err)
		}
		if el := time.Since(start); el < d {
			t.Fatalf("insert took %v, want at least %v", el, d)
		}
		e.wantRows(t, 1)
		remove()

		// The context ends first: the statement is not run.
		e.inj.Add(faultdb.Rule{Match: "INSERT", Action: faultdb.Delay, Delay: time.Minute, Times: 1})
		tctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		start = time.Now()
		if err := e.insert(tctx, e.db, "never"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want context.DeadlineExceeded", err)
		}
		if el := time.Since(start); el > 10*time.Second {
			t.Fatalf("cancelled insert took %v", el)
		}
		e.wantRows(t, 1)
		wantCount(t, e.inj, "INSERT", 1)

		// A delayed COMMIT honours the transaction's context and rolls back.
		e.inj.Reset()
		e.db.SetMaxOpenConns(1)
		e.inj.Add(faultdb.Rule{Match: "COMMIT", Action: faultdb.Delay, Delay: time.Minute, Times: 1})
		cctx, ccancel := context.WithCancel(ctx)
		tx, err := e.db.BeginTx(cctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.insert(cctx, tx, "uncommitted"); err != nil {
			t.Fatal(err)
		}
		time.AfterFunc(20*time.Millisecond, ccancel)
		if err := tx.Commit(); !errors.Is(err, context.Canceled) {
			t.Fatalf("commit: err = %v, want context.Canceled", err)
		}
		e.wantRows(t, 1)
		if err := e.insert(ctx, e.db, "after"); err != nil {
			t.Fatal(err)
		}
		e.wantRows(t, 2)
	})
}

func TestHang(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		ctx := context.Background()

		t.Run("until release", func(t *testing.T) {
			var hits atomic.Int64
			release := make(chan struct{})
			e.inj.Add(faultdb.Rule{Match: "INSERT", Action: faultdb.Hang, Release: release, Times: 1, Hits: &hits})
			done := make(chan error, 1)
			go func() { done <- e.insert(ctx, e.db, "held") }()
			waitFor(t, "the insert to be held", func() bool { return hits.Load() == 1 })
			select {
			case err := <-done:
				t.Fatalf("held insert returned early: %v", err)
			case <-time.After(20 * time.Millisecond):
			}
			e.wantRows(t, 0)
			wantCount(t, e.inj, "INSERT", 0)
			// Other statements are not held.
			if err := e.insert(ctx, e.db, "free"); err != nil {
				t.Fatal(err)
			}
			close(release)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			e.wantRows(t, 2)
			wantCount(t, e.inj, "INSERT", 2)
		})

		t.Run("until context", func(t *testing.T) {
			e.inj.Reset()
			var hits atomic.Int64
			e.inj.Add(faultdb.Rule{Match: "INSERT", Action: faultdb.Hang, Hits: &hits})
			cctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- e.insert(cctx, e.db, "never") }()
			waitFor(t, "the insert to be held", func() bool { return hits.Load() == 1 })
			select {
			case err := <-done:
				t.Fatalf("held insert returned early: %v", err)
			case <-time.After(20 * time.Millisecond):
			}
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Fatalf("err = %v, want context.Canceled", err)
			}
			e.inj.Reset()
			e.wantRows(t, 2)
			e.wantPoolWorks(t)
		})
	})
}

func TestTimesOrderAndReset(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		errA, errB := errors.New("A"), errors.New("B")
		var hitsA, hitsB atomic.Int64
		e.inj.Add(faultdb.Rule{Match: "INSERT", Action: faultdb.Fail, Err: errA, Times: 2, Hits: &hitsA})
		e.inj.Add(faultdb.Rule{Match: "INSERT", Action: faultdb.Fail, Err: errB, Times: 1, Hits: &hitsB})
		for i, want := range []error{errA, errA, errB, nil, nil} {
			if err := e.insert(ctx, e.db, "t"); !errors.Is(err, want) {
				t.Fatalf("insert %d: err = %v, want %v", i, err, want)
			}
		}
		if hitsA.Load() != 2 || hitsB.Load() != 1 {
			t.Fatalf("hits = %d, %d; want 2, 1", hitsA.Load(), hitsB.Load())
		}
		e.wantRows(t, 2)

		e.inj.Add(faultdb.Rule{Action: faultdb.Fail, Err: errA})
		if err := e.insert(ctx, e.db, "t"); !errors.Is(err, errA) {
			t.Fatal(err)
		}
		if _, err := e.db.BeginTx(ctx, nil); !errors.Is(err, errA) {
			t.Fatalf("begin: err = %v, want %v (empty Match matches BEGIN)", err, errA)
		}
		e.inj.Reset()
		if err := e.insert(ctx, e.db, "t"); err != nil {
			t.Fatal(err)
		}

		// Fail with ErrBadConn on *sql.DB is retried by database/sql.
		e.inj.ResetCounts()
		e.inj.Add(faultdb.Rule{Match: "INSERT", Action: faultdb.Fail, Err: driver.ErrBadConn, Times: 1})
		if err := e.insert(ctx, e.db, "t"); err != nil {
			t.Fatalf("err = %v, want nil after database/sql's retry", err)
		}
		wantCount(t, e.inj, "INSERT", 1)
		e.wantRows(t, 4)
	})
}

func TestCount(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		wantCount(t, e.inj, "", 0)
		tx, err := e.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := e.insert(ctx, tx, "c"); err != nil {
				t.Fatal(err)
			}
		}
		var n int
		if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM "+e.table).Scan(&n); err != nil || n != 2 {
			t.Fatalf("n = %d, err = %v", n, err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		wantCount(t, e.inj, "BEGIN", 1)
		wantCount(t, e.inj, "INSERT INTO", 2)
		wantCount(t, e.inj, "SELECT count(*)", 1)
		wantCount(t, e.inj, "COMMIT", 1)
		wantCount(t, e.inj, "ROLLBACK", 0)
		wantCount(t, e.inj, "", 5)

		tx, err = e.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		wantCount(t, e.inj, "ROLLBACK", 1)

		stmt, err := e.db.PrepareContext(ctx, e.insertSQL())
		if err != nil {
			t.Fatal(err)
		}
		defer stmt.Close()
		wantCount(t, e.inj, "INSERT", 2) // preparing is not counted
		for range 3 {
			if _, err := stmt.ExecContext(ctx, "p"); err != nil {
				t.Fatal(err)
			}
		}
		wantCount(t, e.inj, "INSERT", 5)
		wantCount(t, e.inj, "", 10)

		e.inj.ResetCounts()
		wantCount(t, e.inj, "", 0)
	})
}

func TestConcurrent(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		e.db.SetMaxOpenConns(4)
		const (
			workers   = 6
			perWorker = 20
			failures  = 10
		)
		var hits atomic.Int64
		e.inj.Add(faultdb.Rule{Match: "INSERT", Action: faultdb.Fail, Err: errBoom, Times: failures, Hits: &hits})
		e.inj.Add(faultdb.Rule{Match: "SELECT", Action: faultdb.Delay, Delay: time.Millisecond})

		var failed, ok atomic.Int64
		var wg sync.WaitGroup
		stop := make(chan struct{})
		// Churn rules and read counts while statements run.
		churned := make(chan struct{})
		go func() {
			defer close(churned)
			for {
				select {
				case <-stop:
					return
				default:
				}
				rm := e.inj.Add(faultdb.Rule{Match: "no such statement", Action: faultdb.Fail})
				_ = e.inj.Count("INSERT")
				rm()
				time.Sleep(100 * time.Microsecond)
			}
		}()
		errs := make(chan error, workers)
		for w := range workers {
			wg.Go(func() {
				for i := range perWorker {
					var err error
					if i%5 == 0 {
						err = func() error {
							tx, err := e.db.BeginTx(ctx, nil)
							if err != nil {
								return err
							}
							if err := e.insert(ctx, tx, fmt.Sprint(w, i)); err != nil {
								tx.Rollback()
								return err
							}
							return tx.Commit()
						}()
					} else {
						err = e.insert(ctx, e.db, fmt.Sprint(w, i))
					}
					switch {
					case err == nil:
						ok.Add(1)
					case errors.Is(err, errBoom):
						failed.Add(1)
					default:
						errs <- err
						return
					}
					if i%7 == 0 {
						var n int
						if err := e.db.QueryRowContext(ctx, "SELECT count(*) FROM "+e.table).Scan(&n); err != nil {
							errs <- err
							return
						}
					}
				}
			})
		}
		wg.Wait()
		close(stop)
		<-churned
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		total := int64(workers * perWorker)
		if failed.Load() != failures || hits.Load() != failures || ok.Load() != total-failures {
			t.Fatalf("failed = %d, hits = %d, ok = %d; want %d, %d, %d",
				failed.Load(), hits.Load(), ok.Load(), failures, failures, total-failures)
		}
		e.wantRows(t, int(total-failures))
		wantCount(t, e.inj, "INSERT", int(total-failures))
	})
}

func TestUnwrap(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		conn, err := e.db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		err = conn.Raw(func(dc any) error {
			if _, ok := dc.(*faultdb.Conn); !ok {
				return fmt.Errorf("raw conn is %T, want *faultdb.Conn", dc)
			}
			if u, ok := dc.(interface{ Unwrap() driver.Conn }); ok {
				dc = u.Unwrap()
			}
			if e.pg {
				pc, ok := dc.(*stdlib.Conn)
				if !ok {
					return fmt.Errorf("unwrapped conn is %T", dc)
				}
				var one int
				return pc.Conn().QueryRow(ctx, "SELECT 1").Scan(&one)
			}
			if _, ok := dc.(*sqlite3.SQLiteConn); !ok {
				return fmt.Errorf("unwrapped conn is %T", dc)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		wantCount(t, e.inj, "", 0) // the native connection bypasses the injector
	})
}

func TestNamedValueChecker(t *testing.T) {
	each(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		arg := []string{"a", "b", "c"}
		if !e.pg {
			// mattn has no NamedValueChecker: database/sql's default
			// conversion still applies (and rejects a slice).
			_, err := e.db.ExecContext(ctx, e.insertSQL(), arg)
			if err == nil || !strings.Contains(err.Error(), "unsupported type") {
				t.Fatalf("err = %v, want database/sql's unsupported type error", err)
			}
			return
		}
		// pgx accepts a []string for text[] only through its CheckNamedValue.
		q := "SELECT array_length($1::text[], 1)"
		var n int
		if err := e.db.QueryRowContext(ctx, q, arg).Scan(&n); err != nil || n != 3 {
			t.Fatalf("direct: n = %d, err = %v", n, err)
		}
		stmt, err := e.db.PrepareContext(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		defer stmt.Close()
		if err := stmt.QueryRowContext(ctx, arg).Scan(&n); err != nil || n != 3 {
			t.Fatalf("prepared: n = %d, err = %v", n, err)
		}
	})
}

// minimalConn hides every optional interface of a real connection, to
// exercise the fallbacks database/sql uses for minimal drivers.
type minimalConn struct{ c driver.Conn }

func (m minimalConn) Prepare(q string) (driver.Stmt, error) {
	s, err := m.c.Prepare(q)
	if err != nil {
		return nil, err
	}
	return minimalStmt{s}, nil
}
func (m minimalConn) Close() error { return m.c.Close() }

//nolint:staticcheck // deliberately the legacy method
func (m minimalConn) Begin() (driver.Tx, error) { return m.c.Begin() }

type minimalStmt struct{ s driver.Stmt }

func (m minimalStmt) Close() error  { return m.s.Close() }
func (m minimalStmt) NumInput() int { return m.s.NumInput() }

//nolint:staticcheck // deliberately the legacy method
func (m minimalStmt) Exec(a []driver.Value) (driver.Result, error) { return m.s.Exec(a) }

//nolint:staticcheck // deliberately the legacy method
func (m minimalStmt) Query(a []driver.Value) (driver.Rows, error) { return m.s.Query(a) }

type minimalConnector struct{ base driver.Connector }

func (m minimalConnector) Connect(ctx context.Context) (driver.Conn, error) {
	c, err := m.base.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return minimalConn{c}, nil
}
func (m minimalConnector) Driver() driver.Driver { return m.base.Driver() }

func TestMinimalBaseConnFallsBack(t *testing.T) {
	e := newEnv(t, false)
	ctx := context.Background()
	db := sql.OpenDB(e.inj.Connector(minimalConnector{e.base}))
	defer db.Close()

	e.inj.Add(faultdb.Rule{Match: "INSERT", Action: faultdb.Fail, Err: errBoom, Times: 1})
	if err := e.insert(ctx, db, "x"); !errors.Is(err, errBoom) {
		t.Fatalf("err = %v, want %v", err, errBoom)
	}
	if err := e.insert(ctx, db, "y"); err != nil {
		t.Fatal(err)
	}
	var v string
	if err := db.QueryRowContext(ctx, "SELECT v FROM "+e.table).Scan(&v); err != nil || v != "y" {
		t.Fatalf("v = %q, err = %v", v, err)
	}
	wantCount(t, e.inj, "INSERT", 1)
	wantCount(t, e.inj, "SELECT", 1)

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.insert(ctx, tx, "z"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	wantCount(t, e.inj, "BEGIN", 1)
	wantCount(t, e.inj, "COMMIT", 1)
	if _, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true}); err == nil {
		t.Fatal("read-only transaction on a driver without BeginTx: want an error")
	}

	e.inj.Add(faultdb.Rule{Match: "INSERT", Action: faultdb.DropReply, Times: 1})
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.insert(ctx, conn, "dropped"); !errors.Is(err, driver.ErrBadConn) {
		t.Fatalf("err = %v, want driver.ErrBadConn", err)
	}
	conn.Close()
	e.wantRows(t, 3)
}

func TestConnectors(t *testing.T) {
	t.Run("sqlite driver", func(t *testing.T) {
		inj := faultdb.New()
		path := filepath.Join(t.TempDir(), "d.db")
		c, err := faultdb.DSNConnector(&sqlite3.SQLiteDriver{}, path)
		if err != nil {
			t.Fatal(err)
		}
		db := sql.OpenDB(inj.Connector(c))
		defer db.Close()
		dc, err := db.Driver().Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer dc.Close()
		if _, ok := dc.(*faultdb.Conn); !ok {
			t.Fatalf("Driver().Open gave %T, want *faultdb.Conn", dc)
		}
		if err := db.Ping(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("pgx driver context", func(t *testing.T) {
		dsn := postgresDSN(t)
		inj := faultdb.New()
		c, err := faultdb.DSNConnector(stdlib.GetDefaultDriver(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		db := sql.OpenDB(inj.Connector(c))
		defer db.Close()
		var one int
		if err := db.QueryRow("SELECT 1").Scan(&one); err != nil || one != 1 {
			t.Fatalf("one = %d, err = %v", one, err)
		}
		wantCount(t, inj, "SELECT 1", 1)
	})
}
