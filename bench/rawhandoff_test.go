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
		t.Skip("SQLEASE_POSTGRES_DSN is not set: the raw+listen handoff baseline runs on PostgreSQL only")
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

// startRawListen sets up the raw+listen handoff sampler on a fresh bench
// environment and takes one sample, which must succeed. The sampler is
// closed at cleanup (closing it again is harmless).
func startRawListen(t *testing.T) (e *env, ctx context.Context, sample func() (handoff, error), closeAll func()) {
	t.Helper()
	e = pgEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	sample, closeAll, err := rawListenHandoff(ctx, e)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeAll)
	if _, err := sample(); err != nil {
		t.Fatalf("first sample: %v", err)
	}
	return e, ctx, sample, closeAll
}

// closeLeavesNoListener closes the sampler and checks that no connection
// of the pool still listens, so the figures after it are not slowed by
// notifications.
func closeLeavesNoListener(t *testing.T, ctx context.Context, e *env, closeAll func()) {
	t.Helper()
	closeAll()
	if n := listeners(t, ctx, e.db); n != 0 {
		t.Errorf("%d connections of the pool still listen after the baseline closed", n)
	}
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

// TestRawListenHandoff: the hand-rolled handoff baseline hands the key
// over (the waiter is granted only after the release is called), and when it is closed no connection of the pool is left
// listening, so the figures after it are not slowed by notifications.
func TestRawListenHandoff(t *testing.T) {
	e, ctx, sample, closeAll := startRawListen(t)
	for i := range 3 {
		d, err := sample()
		if err != nil {
			t.Fatalf("sample %d: %v", i, err)
		}
		// The notification may reach the waiter before the release's reply
		// reaches the holder, so only the call bounds the grant.
		if d.fromCall <= 0 {
			t.Errorf("sample %d: release call -> grant %v: the waiter was granted before the release was called", i, d.fromCall)
		}
	}
	closeLeavesNoListener(t, ctx, e, closeAll)
	var held int
	if err := e.db.QueryRowContext(ctx, `SELECT count(*) FROM `+e.table("raw_h")).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if held != 0 {
		t.Errorf("%d raw leases left held after the samples", held)
	}
}

// TestRawListenHandoffWaiterKilled: when the waiter's connection is
// terminated between samples, the next sample fails at once with an error
// that names the waiter (it does not hang), and closing the baseline
// still returns and leaves no listener.
func TestRawListenHandoffWaiterKilled(t *testing.T) {
	e, ctx, sample, closeAll := startRawListen(t)
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
	closeLeavesNoListener(t, ctx, e, closeAll)
}

// TestRawListenHandoffFailedSampleStops: a sample whose release fails
// returns the error, and stops the sampler: the next sample fails at once
// (it does not wait forever for a waiter still waiting on the failed
// sample's key), closing returns, and no connection is left listening.
func TestRawListenHandoffFailedSampleStops(t *testing.T) {
	e, ctx, sample, closeAll := startRawListen(t)
	tbl := e.table("raw_h")
	if _, err := e.db.ExecContext(ctx, `CREATE FUNCTION `+e.schema+`.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'injected: no deletes'; END $$;
CREATE TRIGGER refuse BEFORE DELETE ON `+tbl+` FOR EACH ROW EXECUTE FUNCTION `+e.schema+`.refuse()`); err != nil {
		t.Fatal(err)
	}
	if _, err := sample(); err == nil || !strings.Contains(err.Error(), "injected: no deletes") || !strings.Contains(err.Error(), "releasing the holder's lease") {
		t.Fatalf("sample whose release fails: err = %v, want the injected error, and the failed cleanup release reported", err)
	}
	if _, err := e.db.ExecContext(ctx, `DROP TRIGGER refuse ON `+tbl); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := sample(); err == nil || !strings.Contains(err.Error(), "stopped after an earlier failure") || !strings.Contains(err.Error(), "injected: no deletes") {
		t.Fatalf("sample after a failed one: err = %v, want stopped after the earlier failure, named", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the sample after a failed one took %v", d)
	}
	closeLeavesNoListener(t, ctx, e, closeAll)
}
