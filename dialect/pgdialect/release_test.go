package pgdialect_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/lock"
)

// TestReleaseCommitsWithoutWaitingForFlush: the Release statement turns
// synchronous_commit off for its own transaction only (a release lost in a
// crash leaves the lease to expire, SPEC H5; the next grant's synchronous
// commit flushes it). Inside a transaction it shows "off" until the end;
// in autocommit, as the engine runs it, the connection's setting is the
// same after the release as before, whether the release deleted a row or
// not, and the released key can be acquired again at once.
func TestReleaseCommitsWithoutWaitingForFlush(t *testing.T) {
	ctx := context.Background()
	db, d, ns, _ := schemaAt(t, "sqlease_rel_", 0)
	// One connection, so the SHOWs below read the connection the Locker's
	// statements ran on.
	db.SetMaxOpenConns(1)
	show := func(q interface {
		QueryRowContext(context.Context, string, ...any) *sql.Row
	}) string {
		t.Helper()
		var v string
		if err := q.QueryRowContext(ctx, "SHOW synchronous_commit").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	if got := show(db); got != "on" {
		t.Skipf("the server's synchronous_commit is %q; the test needs the default, on", got)
	}
	l, err := lock.New(ctx, db, d, lock.WithSchema(ns.Schema))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)

	le, err := l.TryAcquire(ctx, "rel", lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	release, err := dialect.Compile(d, ns, d.Statements().Release, []string{"lease_id", "token", "channel"})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var key string
	var notified sql.NullString
	args := release.Args(map[string]any{"lease_id": le.LeaseID(), "token": le.Token(), "channel": "sqlease_rel_test"})
	if err := tx.QueryRowContext(ctx, release.SQL, args...).Scan(&key, &notified); err != nil || key != "rel" {
		t.Fatalf("Release in a transaction: key %q, %v; want the row of %q", key, err, "rel")
	}
	if got := show(tx); got != "off" {
		t.Errorf("synchronous_commit after the Release statement, same transaction: %q, want off", got)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := show(db); got != "on" {
		t.Errorf("synchronous_commit after the transaction that released: %q, want on (transaction-local)", got)
	}

	// As the engine runs it: autocommit, deleting no row (the lease was
	// released by hand above: the release reports it), then deleting one.
	if err := le.Release(ctx); err != nil {
		t.Logf("release of a lease released by hand: %v", err)
	}
	if got := show(db); got != "on" {
		t.Errorf("synchronous_commit after a release that deleted nothing: %q, want on", got)
	}
	le2, err := l.TryAcquire(ctx, "rel", lock.Exclusive)
	if err != nil {
		t.Fatalf("TryAcquire after the release: %v", err)
	}
	if err := le2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := show(db); got != "on" {
		t.Errorf("synchronous_commit after Lease.Release: %q, want on", got)
	}
	le3, err := l.TryAcquire(ctx, "rel", lock.Exclusive)
	if err != nil {
		t.Fatalf("TryAcquire after two releases: %v", err)
	}
	if le3.Token() <= le2.Token() {
		t.Errorf("token %d after %d: want it greater (SPEC S3)", le3.Token(), le2.Token())
	}
	if err := le3.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
