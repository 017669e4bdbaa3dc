package lock

import (
	"database/sql"
	"testing"
	"time"
)

// TestWatchBudgetBurstThenRate: a waiter's change wake-ups are free up to
// the burst, then one per 1/watchRate, and the bucket refills while quiet
// (synthetic clock).
func TestWatchBudgetBurstThenRate(t *testing.T) {
	var b watchBudget
	now := time.Unix(1000, 0)
	for i := 0; i < watchBurst; i++ {
		if d, ok := b.take(now, watchRate, watchBurst); !ok {
			t.Fatalf("wake-up %d of a burst at one instant: refused, wait %s", i, d)
		}
	}
	d, ok := b.take(now, watchRate, watchBurst)
	every := time.Second / watchRate
	if ok || d <= 0 || d > every {
		t.Fatalf("after the burst: allowed %v, wait %s, want refused with a wait in (0, %s]", ok, d, every)
	}
	// A steady stream of changes every millisecond for 2 s: wake-ups at
	// about watchRate per second.
	n := 0
	for i := 1; i <= 2000; i++ {
		if _, ok := b.take(now.Add(time.Duration(i)*time.Millisecond), watchRate, watchBurst); ok {
			n++
		}
	}
	if want := 2 * watchRate; n < want-1 || n > want+1 {
		t.Errorf("%d wake-ups in a 2 s stream after the burst, want about %d", n, want)
	}
	// Quiet for the time a full refill takes: a burst again.
	later := now.Add(2*time.Second + time.Duration(watchBurst)*every)
	for i := 0; i < watchBurst; i++ {
		if d, ok := b.take(later, watchRate, watchBurst); !ok {
			t.Fatalf("wake-up %d after a quiet spell: refused, wait %s", i, d)
		}
	}
}

// TestHubWakeAllPacedPerWaiter: a waiter whose budget is spent is woken
// once when a token is back, however many changes come meanwhile, and a
// waiter that leaves meanwhile is not woken; other pools' waiters are never
// woken by this pool's changes.
func TestHubWakeAllPacedPerWaiter(t *testing.T) {
	pool, other := &sql.DB{}, &sql.DB{}
	const channel = "test-pace"
	w, leave := hubAdd(pool, channel, "k", "id-1")
	defer leave()
	o, leaveO := hubAdd(other, channel, "k2", "id-2")
	defer leaveO()
	drain := func(ch chan struct{}) int {
		n := 0
		for {
			select {
			case <-ch:
				n++
			default:
				return n
			}
		}
	}
	woken := 0
	for i := 0; i < watchBurst; i++ {
		hubWakeAll(pool, channel)
		woken += drain(w.ch)
	}
	if woken != watchBurst {
		t.Fatalf("%d of %d changes woke the waiter within its burst", woken, watchBurst)
	}
	for i := 0; i < 50; i++ {
		hubWakeAll(pool, channel)
	}
	if n := drain(w.ch); n != 0 {
		t.Fatalf("woken %d times with its budget spent", n)
	}
	select {
	case <-w.ch:
	case <-time.After(10 * time.Second):
		t.Fatal("the delayed wake-up never came")
	}
	time.Sleep(3 * time.Second / watchRate)
	if n := drain(w.ch); n != 0 {
		t.Errorf("%d more wake-ups after the delayed one, want 0 (changes meanwhile merge into it)", n)
	}
	if n := drain(o.ch); n != 0 {
		t.Errorf("a waiter of another pool woken %d times", n)
	}

	// Spent again, then it leaves before the delayed wake-up.
	for i := 0; i < watchBurst+1; i++ {
		hubWakeAll(pool, channel)
		drain(w.ch)
	}
	leave()
	time.Sleep(3 * time.Second / watchRate)
	if n := drain(w.ch); n != 0 {
		t.Errorf("woken %d times after it left", n)
	}
}

// TestWatchPaceSharedByKeys: with many keys blocked in one pool, a stream
// of changes wakes them all together at about watchPoolRate per second
// (each at least once per second), not watchRate each.
func TestWatchPaceSharedByKeys(t *testing.T) {
	if r, b := watchPace(1); r != watchRate || b != watchBurst {
		t.Errorf("one key: rate %v, burst %v, want %v, %v", r, b, watchRate, watchBurst)
	}
	const keys = 100
	rate, burst := watchPace(keys)
	if rate*keys > watchPoolRate+1e-9 || rate < 1 || burst < 2 {
		t.Fatalf("%d keys: rate %v, burst %v each", keys, rate, burst)
	}
	budgets := make([]watchBudget, keys)
	now := time.Unix(1000, 0)
	n := 0
	// A change every millisecond for 10 s.
	for i := 0; i < 10000; i++ {
		at := now.Add(time.Duration(i) * time.Millisecond)
		for k := range budgets {
			if _, ok := budgets[k].take(at, rate, burst); ok {
				n++
			}
		}
	}
	// The bursts, then the rate.
	if max := float64(keys)*burst + 10*watchPoolRate + keys; float64(n) > max {
		t.Errorf("%d wake-ups for %d keys in 10 s of changes, want at most %.0f", n, keys, max)
	}
	if min := 10 * keys; n < min {
		t.Errorf("%d wake-ups for %d keys in 10 s, want at least %d (one per key per second)", n, keys, min)
	}
}
