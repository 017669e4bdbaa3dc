package lock

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sqlease/sqlease/dialect/sqlitedialect"
)

// TestRenewalCadence: a held lease is renewed between TTL/4 and TTL/3
// after the last successful renewal was sent (SPEC H2, as docs/contract.md
// words it): due at TTL/3, up to TTL/12 early to share a batch. Two leases
// acquired less than TTL/12 apart are renewed together; neither renewal is
// earlier than TTL/4 nor, beyond scheduling delay, later than TTL/3.
func TestRenewalCadence(t *testing.T) {
	const ttl = time.Second
	var mu sync.Mutex
	sends := map[string][]time.Time{} // lease ID -> send times of the acquire and each successful renewal
	obs := ObserverFunc(func(e Event) {
		if e.Kind == EventRenewOK {
			mu.Lock()
			sends[e.LeaseID] = append(sends[e.LeaseID], time.Now().Add(-e.Latency))
			mu.Unlock()
		}
	})
	ctx := t.Context()
	l, err := New(ctx, migratedSQLite(t), sqlitedialect.New(), WithTTL(ttl), WithObserver(obs))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	var leases []*Lease
	for _, k := range []string{"cadence/a", "cadence/b"} {
		sent := time.Now() // just before the acquire is sent
		le, err := l.TryAcquire(ctx, k, Exclusive)
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		sends[le.LeaseID()] = append([]time.Time{sent}, sends[le.LeaseID()]...)
		mu.Unlock()
		leases = append(leases, le)
		time.Sleep(ttl / 20) // less than TTL/12
	}
	time.Sleep(1500 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	for _, le := range leases {
		got := sends[le.LeaseID()]
		if len(got) < 4 {
			t.Errorf("%s: %d renewals in 1.5 s at a %s TTL, want at least 3", le.Key(), len(got), ttl)
		}
		for i := 1; i < len(got); i++ {
			// Early: the batching bound is exact (minus the send-time
			// estimate's error); late: a loaded machine delays timers.
			if d := got[i].Sub(got[i-1]); d < ttl/4-20*time.Millisecond || d > ttl/3+250*time.Millisecond {
				t.Errorf("%s: renewal %d sent %s after the acquire or renewal before, want between TTL/4 (%s) and TTL/3 (%s)", le.Key(), i, d.Round(time.Millisecond), ttl/4, ttl/3)
			}
		}
	}
}
