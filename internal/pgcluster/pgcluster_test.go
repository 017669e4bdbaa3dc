package pgcluster_test

import (
	"context"
	"database/sql"
	"os"
	"testing"
	"time"

	"github.com/sqlease/sqlease/internal/pgcluster"
)

// need skips t when private clusters with replication cannot run here,
// or fails it under SQLEASE_REQUIRE_POSTGRES=1.
func need(t *testing.T) {
	t.Helper()
	if why := pgcluster.ReplicationUnavailable(); why != "" {
		if os.Getenv("SQLEASE_REQUIRE_POSTGRES") == "1" {
			t.Fatalf("SQLEASE_REQUIRE_POSTGRES=1 but no private cluster: %s", why)
		}
		t.Skipf("no private PostgreSQL cluster: %s", why)
	}
}

func start(t *testing.T, ctx context.Context, cfg pgcluster.Config) *pgcluster.Cluster {
	t.Helper()
	c, err := pgcluster.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Remove)
	return c
}

func standby(t *testing.T, ctx context.Context, p *pgcluster.Cluster, name string) *pgcluster.Cluster {
	t.Helper()
	s, err := pgcluster.StartStandby(ctx, p, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Remove)
	return s
}

func open(t *testing.T, c *pgcluster.Cluster) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", c.DSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func count(t *testing.T, ctx context.Context, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestStandbyCutCatchUpPromote: a standby streams what the primary
// commits; cut off, it misses what is committed after the cut (and
// WaitCaughtUp times out) until replication resumes; promoted after the
// primary is killed, it takes writes.
func TestStandbyCutCatchUpPromote(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := start(t, ctx, pgcluster.Config{})
	s := standby(t, ctx, p, "standby1")
	pdb, sdb := open(t, p), open(t, s)
	if _, err := pdb.ExecContext(ctx, "CREATE TABLE t (i int)"); err != nil {
		t.Fatal(err)
	}
	if err := s.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, ctx, sdb); n != 0 {
		t.Fatalf("standby has %d rows, want 0", n)
	}
	if err := s.CutReplication(); err != nil {
		t.Fatal(err)
	}
	if _, err := pdb.ExecContext(ctx, "INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, time.Second)
	err := s.WaitCaughtUp(wctx)
	wcancel()
	if err == nil {
		t.Fatal("WaitCaughtUp succeeded while replication was cut")
	}
	if n := count(t, ctx, sdb); n != 0 {
		t.Fatalf("a row committed after the cut reached the standby (%d rows)", n)
	}
	if err := s.ResumeReplication(); err != nil {
		t.Fatal(err)
	}
	if err := s.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, ctx, sdb); n != 1 {
		t.Fatalf("after resuming, the standby has %d rows, want 1", n)
	}
	if _, err := sdb.ExecContext(ctx, "INSERT INTO t VALUES (2)"); err == nil {
		t.Fatal("a hot standby took a write")
	}
	p.Kill()
	if err := s.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sdb.ExecContext(ctx, "INSERT INTO t VALUES (2)"); err != nil {
		t.Fatalf("write on the promoted standby: %v", err)
	}
	if n := count(t, ctx, sdb); n != 2 {
		t.Fatalf("promoted standby has %d rows, want 2", n)
	}
}

// TestSynchronousCommitWaitsForStandby: with the standby as its
// synchronous standby (remote_apply), a commit on the primary waits while
// replication is cut, and completes, visible on the standby, once it
// resumes.
func TestSynchronousCommitWaitsForStandby(t *testing.T) {
	need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := start(t, ctx, pgcluster.Config{SynchronousStandby: "sync1", SynchronousCommit: "remote_apply"})
	s := standby(t, ctx, p, "sync1")
	pdb, sdb := open(t, p), open(t, s)
	if _, err := pdb.ExecContext(ctx, "CREATE TABLE t (i int)"); err != nil {
		t.Fatal(err)
	}
	// remote_apply: the table is on the standby when the commit returns.
	if n := count(t, ctx, sdb); n != 0 {
		t.Fatalf("standby has %d rows, want 0", n)
	}
	if err := s.CutReplication(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := pdb.ExecContext(ctx, "INSERT INTO t VALUES (1)")
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("a commit returned (%v) while its synchronous standby was cut off", err)
	case <-time.After(1500 * time.Millisecond):
	}
	if err := s.ResumeReplication(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the commit still waits 30s after replication resumed")
	}
	if n := count(t, ctx, sdb); n != 1 {
		t.Fatalf("after a remote_apply commit returned, the standby has %d rows, want 1", n)
	}
}
