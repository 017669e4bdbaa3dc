package lock

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/internal/faultdb"
	"github.com/sqlease/sqlease/migrate"
)

// The renewer runs on one timer per Locker (renewer.go). Releasing a lease
// leaves the timer armed for it; these tests check that a lease acquired
// afterwards, due later than the timer, is still renewed (the run that
// finds nothing due re-arms the timer), that several leases due at
// different times are each renewed, and that nothing is renewed after
// Close (SPEC H2, H8).

// renewals reports how often le's expiry moved forward while it was
// watched for d, checking every 50 ms.
func renewals(le *Lease, d time.Duration) int {
	n, last := 0, le.Expiry()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if e := le.Expiry(); e.After(last) {
			n, last = n+1, e
		}
	}
	return n
}

func TestRenewerRenewsLeaseAcquiredAfterARelease(t *testing.T) {
	ctx := context.Background()
	l := windowLocker(t) // TTL 1 s: renewals every third of it
	a, err := l.TryAcquire(ctx, "a", Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	// The timer is armed for a's renewal; a goes, and b comes later.
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond)
	b, err := l.TryAcquire(ctx, "b", Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	if n := renewals(b, 2500*time.Millisecond); n < 3 {
		t.Errorf("lease b renewed %d times in 2.5 s at a 1 s TTL; want at least 3", n)
	}
	if err := b.Err(); err != nil {
		t.Fatalf("lease b ended: %v", err)
	}
	// Leases due at different times, acquired while the renewer runs.
	var leases []*Lease
	for _, k := range []string{"c", "d", "e"} {
		le, err := l.TryAcquire(ctx, k, Shared)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, le)
		time.Sleep(110 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	for _, le := range append(leases, b) {
		if err := le.Err(); err != nil {
			t.Errorf("lease %s ended after 2 s at a 1 s TTL: %v", le.Key(), err)
		}
		if left := time.Until(le.Expiry()); left < 200*time.Millisecond {
			t.Errorf("lease %s expires in %v; a renewed lease has more than two thirds of its TTL soon after", le.Key(), left)
		}
	}
	// After Close nothing is renewed: the rows stay as Close left them
	// (released) and no run of the timer is left.
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	l.ren.mu.Lock()
	busy, stopped, queued := l.ren.busy, l.ren.stopped, len(l.ren.heap)
	l.ren.mu.Unlock()
	if busy || !stopped || queued != 0 {
		t.Errorf("after Close: renewer busy %v, stopped %v, %d leases queued; want false, true, 0", busy, stopped, queued)
	}
}

// faultySQLite opens a migrated SQLite file (mattn, WAL, 5 s busy timeout)
// whose statements go through a faultdb Injector; t closes it.
func faultySQLite(t *testing.T) (*sql.DB, *faultdb.Injector) {
	t.Helper()
	dsn := "file:" + filepath.Join(t.TempDir(), "app.db") + "?_journal_mode=WAL&_busy_timeout=5000"
	raw, err := sql.Open("sqlite3", dsn)
	if err != nil {
		t.Fatal(err)
	}
	connector, err := faultdb.DSNConnector(raw.Driver(), dsn)
	_ = raw.Close()
	if err != nil {
		t.Fatal(err)
	}
	inj := faultdb.New()
	db := sql.OpenDB(inj.Connector(connector))
	t.Cleanup(func() { db.Close() })
	if _, err := migrate.Up(t.Context(), db, sqlitedialect.New()); err != nil {
		t.Fatal(err)
	}
	return db, inj
}
