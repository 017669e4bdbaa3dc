package conformance

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sqlease/sqlease/lock"
)

func init() {
	register(
		Case{Name: "S1_ExclusiveExcludesAll", Rule: "S1", Run: s1ExclusiveExcludesAll},
		Case{Name: "S1_SharedCoexistAndExcludeExclusive", Rule: "S1", Run: s1SharedCoexist},
		Case{Name: "S3_TokensIncreasePerKey", Rule: "S3", Run: s3TokensIncrease},
		Case{Name: "S3_TokenStableUnderRenewal", Rule: "S3", Run: s3TokenStable},
	)
}

func s1ExclusiveExcludesAll(e *Env) {
	ctx := e.Ctx()
	a, b := e.NewLocker(nil), e.NewLocker(nil)
	x, err := a.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "first exclusive")
	for _, m := range []lock.Mode{lock.Exclusive, lock.Shared} {
		_, err := b.TryAcquire(ctx, "k", m)
		var le *lock.LockedError
		e.Require(errors.As(err, &le) && errors.Is(err, lock.ErrLocked), "%s while exclusive held: want *LockedError matching ErrLocked, got %v", m, err)
		e.Check(len(le.Holders) == 1 && le.Holders[0].Token == x.Token() && le.Holders[0].Mode == lock.Exclusive && le.Holders[0].Owner == a.Owner(), "%s: conflict should name the holder (token %d, owner %q), got %+v", m, x.Token(), a.Owner(), le.Holders)
	}
	e.Must(x.Release(ctx), "release")
	y, err := b.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "exclusive after release")
	_ = y.Release(ctx)
}

func s1SharedCoexist(e *Env) {
	ctx := e.Ctx()
	var shared []*lock.Lease
	for i := 0; i < 3; i++ {
		l := e.NewLocker(nil)
		s, err := l.TryAcquire(ctx, "k", lock.Shared)
		e.Must(err, "shared %d", i)
		shared = append(shared, s)
	}
	w := e.NewLocker(nil)
	_, err := w.TryAcquire(ctx, "k", lock.Exclusive)
	var le *lock.LockedError
	e.Require(errors.As(err, &le) && len(le.Holders) == 3, "exclusive while 3 shared held: want LockedError with 3 holders, got %v", err)
	for _, s := range shared[:2] {
		_ = s.Release(ctx)
	}
	if _, err := w.TryAcquire(ctx, "k", lock.Exclusive); !errors.Is(err, lock.ErrLocked) {
		e.T.Fatalf("exclusive while 1 shared held: want ErrLocked, got %v", err)
	}
	_ = shared[2].Release(ctx)
	x, err := w.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "exclusive after all shared released")
	_ = x.Release(ctx)
}

func s3TokensIncrease(e *Env) {
	ctx := e.Ctx()
	l := e.NewLocker(nil, lock.WithTTL(lock.MinTTL))
	other := e.NewLocker(nil, lock.WithTTL(lock.MinTTL))
	var last int64
	check := func(what string, le *lock.Lease) {
		e.T.Helper()
		e.Require(le.Token() > last, "%s: token %d not greater than previous %d", what, le.Token(), last)
		last = le.Token()
	}
	for i := 0; i < 5; i++ {
		m := lock.Exclusive
		if i%2 == 1 {
			m = lock.Shared
		}
		le, err := l.TryAcquire(ctx, "k", m)
		e.Must(err, "acquire %d", i)
		check(fmt.Sprintf("after release #%d (%s)", i, m), le)
		_ = le.Release(ctx)
	}
	// Concurrent shared grants: all distinct and increasing in grant order.
	s1, err := l.TryAcquire(ctx, "k", lock.Shared)
	e.Must(err, "")
	check("shared 1", s1)
	s2, err := other.TryAcquire(ctx, "k", lock.Shared)
	e.Must(err, "")
	check("shared 2", s2)
	_ = s1.Release(ctx)
	_ = s2.Release(ctx)
	// Across expiry and takeover.
	x, err := l.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "")
	check("before expiry", x)
	x.Orphan()
	y, err := other.Acquire(ctx, "k", lock.Exclusive, lock.WaitTimeout(5*time.Second))
	e.Must(err, "takeover")
	check("after takeover", y)
	_ = y.Release(ctx)
	// Across a sweep: every row of the key is gone (SPEC D2).
	if _, err := l.Sweep(ctx, 100); err != nil {
		e.T.Fatalf("sweep: %v", err)
	}
	if n, err := l.RowCount(ctx); err != nil || n != 0 {
		e.T.Fatalf("rows left after release and sweep: %d, %v", n, err)
	}
	z, err := l.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "")
	check("after sweep", z)
	// Concurrently on several keys: tokens per key strictly increase.
	var mu sync.Mutex
	perKey := map[string][]int64{}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		e.Go(&wg, func() {
			lk, err := e.TryNewLocker(nil)
			if err != nil {
				e.T.Errorf("locker: %v", err)
				return
			}
			defer lk.Close(ctx)
			for i := 0; i < 10; i++ {
				key := fmt.Sprintf("c%d", i%2)
				le, err := lk.Acquire(ctx, key, lock.Exclusive, lock.WaitTimeout(10*time.Second))
				if err != nil {
					e.T.Errorf("acquire %s: %v", key, err)
					return
				}
				mu.Lock()
				perKey[key] = append(perKey[key], le.Token())
				mu.Unlock()
				_ = le.Release(ctx)
			}
		})
	}
	wg.Wait()
	for key, ts := range perKey {
		for i := 1; i < len(ts); i++ {
			if ts[i] <= ts[i-1] {
				e.T.Errorf("key %s: grant %d got token %d after %d", key, i, ts[i], ts[i-1])
			}
		}
	}
}

func s3TokenStable(e *Env) {
	ctx := e.Ctx()
	l := e.NewLocker(nil, lock.WithTTL(time.Second))
	le, err := l.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "")
	tok, exp := le.Token(), le.Expiry()
	time.Sleep(1500 * time.Millisecond) // past one TTL: renewed at least once
	e.Must(le.Err(), "lease ended")
	e.Must(le.Renew(ctx), "renew")
	e.Check(le.Expiry().After(exp), "expiry did not move: %v then %v", exp, le.Expiry())
	hs, _, err := l.Holders(ctx, "k")
	e.Must(err, "")
	e.Check(len(hs) == 1 && hs[0].Token == tok && le.Token() == tok, "token changed under renewal: was %d, handle %d, database %+v", tok, le.Token(), hs)
	_ = le.Release(ctx)
}
