package mysqldialect_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/mysqldialect"
	"github.com/sqlease/sqlease/lock"
)

// TestFIFOMigration7DownUp_MySQL: migration 00007 (FIFO tickets, SPEC W6)
// applies on a version-6 schema holding a lease; a FIFO waiter then queues
// behind it (its ticket listed by Holders with mode Queued and refused
// tries told about it) and is granted once the lease is released; Down to
// 6 with a ticket left removes the ticket table and the three procedures
// of the migration, and version 6's acquire still grants.
func TestFIFOMigration7DownUp_MySQL(t *testing.T) {
	if conformance.IsChild() {
		t.Skip("child process")
	}
	ctx := t.Context()
	d := mysqldialect.New()
	if !dialect.CapabilitiesOf(d).Has(dialect.CapFIFO) {
		t.Fatalf("capabilities %v: want fifo", dialect.CapabilitiesOf(d))
	}
	db, ns, p := tokenSchema(t, "sqlease_t_fifo_m7_", 6)
	const key = "w6/m7"
	call := func(proc, args string, vals ...any) (granted bool, modes []string) {
		t.Helper()
		rows, err := db.QueryContext(ctx, "CALL "+ns.Object(d, proc)+"("+args+")", vals...)
		if err != nil {
			t.Fatalf("CALL %s: %v", proc, err)
		}
		defer rows.Close()
		for rows.Next() {
			var g int
			var id, mode, owner string
			var token, expires, now int64
			if err := rows.Scan(&g, &id, &mode, &owner, &token, &expires, &now); err != nil {
				t.Fatal(err)
			}
			granted = granted || g == 1
			modes = append(modes, mode)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return granted, modes
	}
	if g, _ := call("acquire_limit", "?, 'x', 'old-1', 'old-build', 60000000, 0, 0, 0", key); !g {
		t.Fatal("version 6: exclusive grant refused")
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}

	l, err := lock.New(ctx, db, d, lock.WithSchema(ns.Schema))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	done := make(chan error, 1)
	go func() {
		le, err := l.Acquire(ctx, key, lock.Exclusive, lock.FIFO(), lock.WaitTimeout(30*time.Second))
		if err == nil {
			err = le.Release(ctx)
		}
		done <- err
	}()
	queued := func() bool {
		hs, _, err := l.Holders(ctx, key)
		for _, h := range hs {
			if err == nil && h.Mode == lock.Queued && h.Token > 0 {
				return true
			}
		}
		return false
	}
	if !conformance.Eventually(10*time.Second, queued) {
		t.Fatal("no ticket of the FIFO waiter listed by Holders")
	}
	other, err := lock.New(ctx, db, d, lock.WithSchema(ns.Schema))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	_, err = other.TryAcquire(ctx, key, lock.Shared, lock.FIFO())
	var le *lock.LockedError
	if !errors.As(err, &le) || !slices.ContainsFunc(le.Holders, func(h lock.Holder) bool { return h.Mode == lock.Queued }) {
		t.Fatalf("FIFO try behind a holder and a ticket: want a *LockedError naming the ticket, got %v", err)
	}
	if _, err := db.ExecContext(ctx, "CALL "+ns.Object(d, "release")+"('old-1', 0)"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("FIFO waiter after the release: %v", err)
	}

	// A ticket left behind (its waiter died): Down removes it with the table.
	if g, _ := call("acquire_limit", "?, 'x', 'old-2', 'old-build', 60000000, 0, 0, 0", key); !g {
		t.Fatal("version 7: exclusive grant refused")
	}
	g, modes := call("acquire_fifo", "?, 'x', 'L-3', 'dead-waiter', 60000000, 0, 0, 'T-3', 60000000, 0", key)
	if g || len(modes) != 1 || modes[0] != "x" {
		t.Fatalf("acquire_fifo behind a holder: granted %v, refusal modes %v; want refused by the one holder", g, modes)
	}
	if g, modes := call("acquire_fifo", "?, 's', 'L-4', 'try', 60000000, 0, 0, 'T-4', 0, 0", key); g || len(modes) != 2 || modes[1] != "q" {
		t.Fatalf("shared try behind a holder and a ticket: granted %v, refusal modes %v; want [x q]", g, modes)
	}
	if _, err := p.DownTo(ctx, 6); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT (SELECT COUNT(*) FROM information_schema.routines WHERE routine_schema = ?
		AND routine_name IN ('sqlease_acquire_fifo', 'sqlease_dequeue', 'sqlease_sweep_fifo'))
		+ (SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = ? AND table_name = 'sqlease_tickets')`,
		ns.Schema, ns.Schema).Scan(&n); err != nil || n != 0 {
		t.Errorf("after Down to 6: %d objects of migration 00007 left, %v", n, err)
	}
	if _, err := db.ExecContext(ctx, "CALL "+ns.Object(d, "release")+"('old-2', 0)"); err != nil {
		t.Fatal(err)
	}
	if g, _ := call("acquire_limit", "?, 's', 'old-5', 'old-build', 60000000, 0, 0, 0", key); !g {
		t.Error("after Down to 6: shared grant refused")
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
}
