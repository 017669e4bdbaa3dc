package pgdialect_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sqlease/sqlease/lock"
)

// TestFailoverPauseSeesANewServer checks the failover pause (migration
// 00010, lock.WithFailoverPause; SPEC S7) on the shared server, where a new
// primary is simulated by recording another server in the epoch row (as
// the row replicated from the old primary reads on a promoted standby).
// Turning the pause on does not pause the primary it is turned on at; a
// server the row does not name grants nothing for the pause after it was
// first seen, shared and exclusive, Try and blocking alike, while a lease
// granted before renews; the pause applies to Lockers built without the
// option too; and grants resume when it ends.
func TestFailoverPauseSeesANewServer(t *testing.T) {
	ctx := context.Background()
	db, d, ns, _ := schemaAt(t, "sqlease_pause_", 0)
	const ttl = 2 * time.Second
	opts := []lock.Option{lock.WithSchema(ns.Schema), lock.WithTTL(ttl)}
	a, err := lock.New(ctx, db, d, append(opts, lock.WithFailoverPause(ttl))...)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(ctx)
	plain, err := lock.New(ctx, db, d, opts...) // no option: the namespace's pause applies
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close(ctx)

	held, err := a.TryAcquire(ctx, "held", lock.Exclusive)
	if err != nil {
		t.Fatalf("grant on the primary the pause was turned on at: %v", err)
	}
	if _, err := db.ExecContext(ctx, `UPDATE `+d.QuoteIdent(ns.Schema)+`.sqlease_epoch SET server = 'another/00000001'`); err != nil {
		t.Fatal(err)
	}
	seen := time.Now()
	for _, l := range []*lock.Locker{a, plain} {
		for _, m := range []lock.Mode{lock.Exclusive, lock.Shared} {
			_, err := l.TryAcquire(ctx, "k", m)
			var le *lock.LockedError
			if !errors.Is(err, lock.ErrLocked) || !errors.As(err, &le) || len(le.Holders) != 1 || le.Holders[0].Mode != lock.FailoverPause {
				t.Fatalf("%s try on a new server: %v, want ErrLocked naming the failover pause", m, err)
			}
			if left := le.Holders[0].Expiry.Sub(time.Now()); left <= 0 || left > ttl+time.Second {
				t.Errorf("the pause ends in %v, want within the pause %v", left, ttl)
			}
		}
	}
	if err := held.Renew(ctx); err != nil {
		t.Errorf("a lease granted before the change did not renew during the pause: %v", err)
	}
	le, err := plain.Acquire(ctx, "k", lock.Exclusive, lock.WaitTimeout(3*ttl))
	if err != nil {
		t.Fatalf("blocking acquire across the pause: %v", err)
	}
	if waited := time.Since(seen); waited < ttl-100*time.Millisecond {
		t.Errorf("granted %v after the new server was first seen, inside the %v pause", waited, ttl)
	}
	_ = le.Release(ctx)
	_ = held.Release(ctx)

	// The option's own checks.
	if _, err := lock.New(ctx, db, d, lock.WithSchema(ns.Schema), lock.WithTTL(ttl), lock.WithFailoverPause(ttl/2)); !errors.Is(err, lock.ErrInvalidInput) {
		t.Errorf("a pause shorter than the TTL: %v, want ErrInvalidInput", err)
	}
}
