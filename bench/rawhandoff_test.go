package main

import (
	"context"
	"database/sql"
	"os"
	"strings"
	"testing"
	"time"
)

// pgEnv sets up a bench environment on SQLEASE_POSTGRES_DSN, or skips
// (fails under SQLEASE_REQUIRE_POSTGRES=1).
func pgEnv(t *testing.T) *env {
	t.Helper()
	dsn := os.Getenv("SQLEASE_POSTGRES_DSN")
	if dsn == "" {
		if os.Getenv("SQLEASE_REQUIRE_POSTGRES") == "1" {
			t.Fatal("SQLEASE_REQUIRE_POSTGRES=1 but SQLEASE_POSTGRES_DSN is not set")
		}
		t.Skip("SQLEASE_POSTGRES_DSN is not set: the raw+notify handoff baseline runs on PostgreSQL only")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := setup(ctx, config{dsn: dsn})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.close)
	return e
}

// listeners returns how many of db's connections LISTEN on a channel: it
// takes every open connection of the pool at once and asks each.
func listeners(t *testing.T, ctx context.Context, db *sql.DB) int {
	t.Helper()
	n := db.Stats().OpenConnections
	var conns []*sql.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	listening := 0
	for range n {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		var k int
		if err := c.QueryRowContext(ctx, `SELECT count(*) FROM pg_listening_channels()`).Scan(&k); err != nil {
			t.Fatal(err)
		}
		if k > 0 {
			listening++
		}
	}
	return listening
}

// TestRawNotifyHandoff: the hand-rolled handoff baseline hands the key
// over (the waiter is granted only after the release is called), and when it is closed no connection of the pool is left
// listening, so the figures after it are not slowed by notifications.
func TestRawNotifyHandoff(t *testing.T) {
	e := pgEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sample, closeAll, err := rawNotifyHandoff(ctx, e)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		d, err := sample()
		if err != nil {
			closeAll()
			t.Fatalf("sample %d: %v", i, err)
		}
		// The notification may reach the waiter before the release's reply
		// reaches the holder, so only the call bounds the grant.
		if d.fromCall <= 0 {
			t.Errorf("sample %d: release call -> grant %v: the waiter was granted before the release was called", i, d.fromCall)
		}
	}
	closeAll()
	if n := listeners(t, ctx, e.db); n != 0 {
		t.Errorf("%d connections of the pool still listen after the baseline closed", n)
	}
	var held int
	if err := e.db.QueryRowContext(ctx, `SELECT count(*) FROM `+e.table("raw_h")).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if held != 0 {
		t.Errorf("%d raw leases left held after the samples", held)
	}
}

// TestRawNotifyHandoffWaiterKilled: when the waiter's connection is
// terminated while it waits, the sample fails at once with an error (it
// does not wait out its 30 s bound), and closing the baseline still
// returns.
func TestRawNotifyHandoffWaiterKilled(t *testing.T) {
	e := pgEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sample, closeAll, err := rawNotifyHandoff(ctx, e)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll()
	if _, err := sample(); err != nil {
		t.Fatalf("first sample: %v", err)
	}
	// Between samples the waiter's backend is the one whose last statement
	// was its own release of this schema's raw_h (the holder releases with
	// notifySQL).
	res, err := e.db.ExecContext(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND query = $1`, "DELETE FROM "+e.table("raw_h")+" WHERE key = $1 AND owner = $2")
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		t.Fatalf("terminated %d backends, want the waiter's one", n)
	}
	start := time.Now()
	_, err = sample()
	if err == nil || !strings.Contains(err.Error(), "waiter failed") {
		t.Fatalf("sample after the waiter's connection was terminated: err = %v, want the waiter failed", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the failed sample took %v", d)
	}
}
