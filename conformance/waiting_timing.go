package conformance

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/internal/faultdb"
	"github.com/sqlease/sqlease/lock"
)

// Waiting and fairness (docs/contract.md): the retry schedule (W2) and try, wait timeouts and contexts (W3).
func init() {
	register(
		Case{Name: "W2_PollIntervalCappedByTTL", Rule: "W2", Run: w2PollIntervalCapped},
		Case{Name: "W2_CrashedHolderTakenOverWithinTTLPlusBackoff", Rule: "W2", Run: w2CrashedHolderTakeover},
		Case{Name: "W3_TryAcquireReportsHolders", Rule: "W3", Run: w3TryReportsHolders},
		Case{Name: "W3_WaitTimeoutReturnsLocked", Rule: "W3", Run: w3WaitTimeout},
		Case{Name: "W3_BlockingAcquireBoundedByContext", Rule: "W3", Run: w3BoundedByContext},
	)
}

func w2PollIntervalCapped(e *Env) {
	ctx := e.Ctx()
	// The waiter's configured cap is huge; its TTL caps the waits instead.
	const waiterTTL = 200 * time.Millisecond
	holder := e.NewLocker(nil, lock.WithTTL(10*time.Second))
	waiter := e.NewLocker(nil, lock.WithTTL(waiterTTL), lock.WithMaxBackoff(time.Hour))
	h := e.MustTryAcquire(holder, "k", lock.Exclusive)
	defer h.Release(ctx)
	// A poll is the dialect's read-only Probe, when it has one and the
	// poll writes nothing, or the Acquire script. It starts with its first
	// statement and ends soon after its last one starts; the gap between
	// the two is the waiter's sleep plus at most one statement.
	st := e.Dialect.Statements()
	var probes, firsts, lasts atomic.Int64
	if p := dialect.FastPathOf(e.Dialect).Probe; p != "" {
		e.Faults.Add(faultdb.Rule{Match: lcRendered(e, "Probe", p), Action: faultdb.Delay, Hits: &probes})
	}
	first, last := lcRendered(e, "Acquire", st.Acquire[0]), lcRendered(e, "Acquire", st.Acquire[len(st.Acquire)-1])
	e.Faults.Add(faultdb.Rule{Match: first, Action: faultdb.Delay, Hits: &firsts})
	lastHits := &lasts
	if last == first {
		lastHits = &firsts
	} else {
		e.Faults.Add(faultdb.Rule{Match: last, Action: faultdb.Delay, Hits: &lasts})
	}
	started := func() int64 { return probes.Load() + firsts.Load() }
	ended := func() int64 { return probes.Load() + lastHits.Load() }
	// measure runs one blocked wait and returns the gaps between polls,
	// how many polls it saw, and how late its own sampling ran (a starved
	// process cannot time anything).
	measure := func() (gaps []time.Duration, polls int, lateness time.Duration) {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		e.Go(&wg, func() {
			s0, l0 := started(), ended()
			var lastEnd time.Time
			prev := time.Now()
			for {
				select {
				case <-stop:
					return
				default:
				}
				now := time.Now()
				lateness = max(lateness, now.Sub(prev)-time.Millisecond)
				prev = now
				if s := started(); s != s0 {
					if !lastEnd.IsZero() {
						gaps = append(gaps, now.Sub(lastEnd))
					}
					polls += int(s - s0)
					s0 = s
				}
				if l := ended(); l != l0 {
					lastEnd, l0 = now, l
				}
				time.Sleep(time.Millisecond)
			}
		})
		// Shared: no pending-writer marker, whose refresh would shorten
		// the waits.
		_, err := waiter.Acquire(ctx, "k", lock.Shared, lock.WaitTimeout(1500*time.Millisecond))
		close(stop)
		wg.Wait()
		e.Require(errors.Is(err, lock.ErrLocked), "waiter = %v, want ErrLocked after its wait timeout", err)
		return gaps, polls, lateness
	}
	for try := 1; try <= 3; try++ {
		gaps, polls, lateness := measure()
		if lateness > 100*time.Millisecond || len(gaps) == 0 {
			e.T.Logf("window %d: %d polls, sampling up to %s late: the process is starved; measuring again", try, polls, lateness)
			continue
		}
		longest := time.Duration(0)
		for _, g := range gaps {
			longest = max(longest, g)
		}
		e.Check(longest <= waiterTTL+lcSlack/2, "longest wait between polls %s, want at most min(cap, TTL) = %s plus a statement (gaps %v)", longest, waiterTTL, gaps)
		e.T.Logf("%d polls in the wait; longest gap %s", polls, longest)
		return
	}
	e.T.Logf("inconclusive: the process was too starved in every window to time the polls")
}

func w2CrashedHolderTakeover(e *Env) {
	ctx := e.Ctx()
	const ttl, maxBackoff = time.Second, 100 * time.Millisecond
	a := e.NewLocker(nil, lock.WithTTL(ttl))
	b := e.NewLocker(nil, lock.WithTTL(ttl), lock.WithMaxBackoff(maxBackoff))
	la := e.MustTryAcquire(a, "k", lock.Exclusive)
	type res struct {
		lease *lock.Lease
		err   error
		at    time.Time
	}
	got := make(chan res, 1)
	var wg sync.WaitGroup
	e.Go(&wg, func() {
		lb, err := b.Acquire(ctx, "k", lock.Exclusive, lock.WaitTimeout(5*ttl))
		got <- res{lb, err, time.Now()}
	})
	defer wg.Wait()
	// Crash only once the contender is blocked (its marker is visible).
	e.Require(Eventually(5*time.Second, func() bool {
		for _, h := range holders(e, a, "k") {
			if h.Mode == lock.PendingWriter {
				return true
			}
		}
		return false
	}), "contender never started waiting")
	crashed := time.Now()
	la.Orphan()
	r := <-got
	e.Must(r.err, "takeover of a crashed holder")
	defer r.lease.Release(ctx)
	if d := r.at.Sub(crashed); d > ttl+maxBackoff+lcSlack {
		e.T.Errorf("crashed holder taken over %s after its last renewal, want within TTL %s + one backoff step %s", d, ttl, maxBackoff)
	}
	// In database time: granted after the crashed lease expired, and
	// within one backoff step (plus a poll) of that.
	expired, granted := la.Expiry(), r.lease.Expiry().Add(-ttl)
	e.Check(!granted.Before(expired), "takeover granted at %v, before the crashed lease expired at %v", granted, expired)
	if d := granted.Sub(expired); d > maxBackoff+lcSlack {
		e.T.Errorf("takeover granted %s after the crashed lease expired, want within one backoff step %s", d, maxBackoff)
	}
}

func w3TryReportsHolders(e *Env) {
	ctx := e.Ctx()
	a := e.NewLocker(nil, lock.WithTTL(10*time.Second), lock.WithOwner("holder-a"))
	b := e.NewLocker(nil, lock.WithTTL(10*time.Second), lock.WithOwner("contender-b"))
	la := e.MustTryAcquire(a, "k", lock.Exclusive)
	defer la.Release(ctx)
	for _, m := range []lock.Mode{lock.Exclusive, lock.Shared} {
		start := time.Now()
		lb, err := b.TryAcquire(ctx, "k", m)
		took := time.Since(start)
		e.Require(lb == nil, "try %s granted a held key", m)
		var le *lock.LockedError
		e.Require(errors.Is(err, lock.ErrLocked) && errors.As(err, &le), "try %s on a held key = %v, want *LockedError matching ErrLocked", m, err)
		e.Check(took <= time.Second, "try %s took %s: it must not wait", m, took)
		e.Check(le.Key == "k" && le.Mode == m && le.Waited == 0, "try %s: LockedError{Key: %q, Mode: %s, Waited: %s}, want key \"k\", the requested mode, no wait", m, le.Key, le.Mode, le.Waited)
		e.Require(len(le.Holders) == 1, "try %s: want the one holder, got %v", m, le.Holders)
		h := le.Holders[0]
		e.Check(h.Mode == lock.Exclusive && h.Owner == "holder-a" && h.Token == la.Token() && h.LeaseID == la.LeaseID() && h.Key == "k", "try %s: holder %v, want exclusive owner \"holder-a\" token %d lease %q", m, h, la.Token(), la.LeaseID())
		e.Check(h.Expiry.Equal(la.Expiry()), "try %s: holder expiry %v, want the lease's %v", m, h.Expiry, la.Expiry())
		e.Check(strings.Contains(err.Error(), "holder-a"), "try %s: message %q does not name the holder", m, err)
	}
	// A try never leaves a pending-writer marker.
	if hs := holders(e, a, "k"); len(hs) != 1 {
		e.T.Errorf("try left rows: %v", hs)
	}
}

func w3WaitTimeout(e *Env) {
	ctx := e.Ctx()
	a := e.NewLocker(nil, lock.WithTTL(10*time.Second), lock.WithOwner("holder-a"))
	b := e.NewLocker(nil, lock.WithTTL(10*time.Second))
	la := e.MustTryAcquire(a, "k", lock.Exclusive)
	defer la.Release(ctx)
	const wait = 300 * time.Millisecond
	for _, m := range []lock.Mode{lock.Exclusive, lock.Shared} {
		start := time.Now()
		lb, err := b.Acquire(ctx, "k", m, lock.WaitTimeout(wait))
		took := time.Since(start)
		e.Require(lb == nil, "%s wait granted a held key", m)
		var le *lock.LockedError
		e.Require(errors.Is(err, lock.ErrLocked) && errors.As(err, &le), "%s wait on a held key = %v, want *LockedError matching ErrLocked", m, err)
		e.Check(took >= wait && took <= wait+lcSlack, "%s wait returned after %s, want about the wait timeout %s", m, took, wait)
		e.Check(le.Waited >= wait-5*time.Millisecond && le.Waited <= took, "%s wait: LockedError.Waited = %s, want about %s", m, le.Waited, wait)
		found := false
		for _, h := range le.Holders {
			found = found || (h.LeaseID == la.LeaseID() && h.Owner == "holder-a")
		}
		e.Check(found, "%s wait: LockedError holders %v do not name the holder", m, le.Holders)
		// The waiter gave up: its marker is gone.
		if hs := holders(e, a, "k"); len(hs) != 1 || hs[0].LeaseID != la.LeaseID() {
			e.T.Errorf("%s waiter that timed out left rows: %v", m, hs)
		}
	}
	// WaitTimeout(0) tries once.
	start := time.Now()
	if _, err := b.Acquire(ctx, "k", lock.Exclusive, lock.WaitTimeout(0)); !errors.Is(err, lock.ErrLocked) {
		e.T.Errorf("WaitTimeout(0) on a held key = %v, want ErrLocked", err)
	}
	if took := time.Since(start); took > lcSlack {
		e.T.Errorf("WaitTimeout(0) took %s", took)
	}
}

func w3BoundedByContext(e *Env) {
	ctx := e.Ctx()
	a := e.NewLocker(nil, lock.WithTTL(10*time.Second))
	b := e.NewLocker(nil, lock.WithTTL(10*time.Second))
	la := e.MustTryAcquire(a, "k", lock.Exclusive)
	defer la.Release(ctx)
	const bound = 300 * time.Millisecond
	// By deadline.
	dctx, cancel := context.WithTimeout(ctx, bound)
	start := time.Now()
	lb, err := b.Acquire(dctx, "k", lock.Exclusive)
	took := time.Since(start)
	cancel()
	e.Check(lb == nil && errors.Is(err, context.DeadlineExceeded), "blocking acquire past its context deadline = %v, want the context's error", err)
	e.Check(took <= bound+lcSlack, "blocking acquire returned %s after start, want about its context's %s", took, bound)
	// By cancellation, with a longer wait timeout.
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(bound, cancel)
	start = time.Now()
	lb, err = b.Acquire(cctx, "k", lock.Shared, lock.WaitTimeout(time.Minute))
	took = time.Since(start)
	cancel()
	e.Check(lb == nil && errors.Is(err, context.Canceled), "blocking acquire whose context was cancelled = %v, want context.Canceled", err)
	e.Check(took <= bound+lcSlack, "blocking acquire returned %s after start, cancelled at %s", took, bound)
	if hs := holders(e, a, "k"); len(hs) != 1 || hs[0].LeaseID != la.LeaseID() {
		e.T.Errorf("waiters that gave up left rows: %v", hs)
	}
}
