package mysqldialect_test

import (
	"errors"
	"testing"

	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/dialect/mysqldialect"
	"github.com/sqlease/sqlease/lock"
)

// TestSemaphoreMigration4DownUp_MySQL: on a version-3 schema holding a
// shared lease, migration 00004 (semaphores, SPEC W7) keeps older builds'
// seven-argument CALL {acquire} granting and refusing as before (it now
// calls {acquire_limit} with no limit), this build's Locker counts their
// leases against lock.Limit, and Down to 3 removes {acquire_limit} and
// restores the procedure older builds call.
func TestSemaphoreMigration4DownUp_MySQL(t *testing.T) {
	if conformance.IsChild() {
		t.Skip("child process")
	}
	ctx := t.Context()
	d := mysqldialect.New()
	db, ns, p := tokenSchema(t, "sqlease_sem_m4_", 3)
	oldCall := func(id, mode string) bool {
		t.Helper()
		var granted int
		var leaseID, m, owner string
		var token, expires, now int64
		rows, err := db.QueryContext(ctx, "CALL "+ns.Object(d, "acquire")+"('w7/m4', ?, ?, 'old-build', 60000000, 0, 0)", mode, id)
		if err != nil {
			t.Fatalf("seven-argument CALL: %v", err)
		}
		defer rows.Close()
		for rows.Next() {
			if err := rows.Scan(&granted, &leaseID, &m, &owner, &token, &expires, &now); err != nil {
				t.Fatal(err)
			}
			if granted == 1 {
				return true
			}
		}
		return false
	}
	if !oldCall("old-1", "s") {
		t.Fatal("version 3: shared grant refused")
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if oldCall("old-x", "x") {
		t.Error("version 4: an older build's exclusive CALL was granted beside a shared lease")
	}
	if !oldCall("old-2", "s") {
		t.Error("version 4: an older build's shared CALL was refused")
	}
	l, err := lock.New(ctx, db, d, lock.WithSchema(ns.Schema))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	if _, err := l.TryAcquire(ctx, "w7/m4", lock.Shared, lock.Limit(2)); !errors.Is(err, lock.ErrLocked) {
		t.Errorf("Limit(2) beside two older builds' leases: want ErrLocked, got %v", err)
	}
	le, err := l.TryAcquire(ctx, "w7/m4", lock.Shared, lock.Limit(3))
	if err != nil {
		t.Fatalf("Limit(3) beside two leases: %v", err)
	}
	_ = le.Release(ctx)
	if _, err := p.DownTo(ctx, 3); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.routines WHERE routine_schema = ? AND routine_name = 'sqlease_acquire_limit'`, ns.Schema).Scan(&n); err != nil || n != 0 {
		t.Errorf("after Down to 3: %d acquire_limit procedures left, %v", n, err)
	}
	if !oldCall("old-3", "s") {
		t.Error("after Down to 3: shared CALL refused")
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
}
