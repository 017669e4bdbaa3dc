package mysqldialect_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/conformance/conftest"
	"github.com/sqlease/sqlease/dialect/mysqldialect"
	"github.com/sqlease/sqlease/lock"
)

// TestFenceIdleTimeoutIsPutBack_MySQL: a fenced transaction on MariaDB runs
// with the session's idle_transaction_timeout lowered to the TTL (whole
// seconds), so the server ends it when it sits idle longer (SPEC F1; the
// SIGSTOP case is conformance's F1_StoppedHolderInFencedTxEndedByDatabase);
// RunInTx puts the session's value back once the transaction ended, so a
// later transaction on the same pooled connection may sit idle longer than
// the TTL. A transaction fenced with Lease.Fence and ended by the caller
// leaves the lowered value on its connection (documented).
func TestFenceIdleTimeoutIsPutBack_MySQL(t *testing.T) {
	if conformance.IsChild() {
		t.Skip("child process")
	}
	ctx := t.Context()
	db, ns, _ := tokenSchema(t, "sqlease_fenceidle_", 0)
	var mariadb bool
	if err := db.QueryRowContext(ctx, "SELECT VERSION() LIKE '%MariaDB%'").Scan(&mariadb); err != nil {
		t.Fatal(err)
	}
	if !mariadb {
		t.Skip("MySQL 8 bounds fenced transactions with wait_timeout, not checked here")
	}
	db.SetMaxOpenConns(1) // every statement below runs on the same session
	renewDB, err := sql.Open("mysql", conftest.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer renewDB.Close()
	const ttl = time.Second
	l, err := lock.New(ctx, db, mysqldialect.New(), lock.WithSchema(ns.Schema), lock.WithTTL(ttl), lock.WithRenewDB(renewDB))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	idle := func(q sqlQueryer) int64 {
		var v int64
		if err := q.QueryRowContext(ctx, "SELECT @@SESSION.idle_transaction_timeout").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	before := idle(db)
	le, err := l.TryAcquire(ctx, "k", lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(context.Background())
	if err := le.RunInTx(ctx, db, nil, func(ctx context.Context, tx *sql.Tx) error {
		if v := idle(tx); v != 1 {
			t.Errorf("idle_transaction_timeout inside the fenced transaction = %d, want 1 (the TTL in whole seconds)", v)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if v := idle(db); v != before {
		t.Errorf("idle_transaction_timeout after RunInTx = %d, want %d put back", v, before)
	}
	// A transaction on that pooled connection may sit idle past the TTL.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "DO 1"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(ttl + 1500*time.Millisecond)
	if _, err := tx.ExecContext(ctx, "DO 2"); err != nil {
		t.Errorf("an unfenced transaction idle for %s after RunInTx: %v", ttl+1500*time.Millisecond, err)
	}
	_ = tx.Rollback()

	// Lease.Fence in the caller's own transaction: the value stays.
	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := le.Fence(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if v := idle(db); v != 1 {
		t.Errorf("idle_transaction_timeout after a bare Fence = %d, want 1 (left on the session)", v)
	}
}

type sqlQueryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}
