package conformance

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/internal/faultdb"
	"github.com/sqlease/sqlease/lock"
)

// Lease lifecycle under faults: the holder's view (SPEC H1-H7) and waiting
// (W2, W3). Faults reach the engine only through Env.Faults, matched on the
// exact SQL a Locker sends, rendered here from the dialect's own templates,
// so no case depends on a dialect's name.

func init() {
	register(
		Case{Name: "H1_RemainingIsTrustedWindow", Rule: "H1", Run: h1RemainingIsTrustedWindow},
		Case{Name: "H1_BlockedRenewalsEndWindowThenLost", Rule: "H1", Run: h1BlockedRenewalsEndWindow},
		Case{Name: "H2_TransientRenewalErrorKeepsLease", Rule: "H2", Run: h2TransientErrorKeepsLease},
		Case{Name: "H2_PersistentRenewalFailureLosesBeforeTakeover", Rule: "H2", Run: h2PersistentFailureLoses},
		Case{Name: "H2_RenewalRetriesBackOff", Rule: "H2", Run: h2RenewalRetriesBackOff},
		Case{Name: "H2_LostRenewalReplySettledByNextAttempt", Rule: "H2", Run: h2LostReplySettled},
		Case{Name: "H2_OversizedRenewalBatchIsSplit", Rule: "H2", Run: h2OversizedBatchSplit},
		Case{Name: "H3_DeletedLeaseRowSignalsLoss", Rule: "H3", Run: h3DeletedRowSignalsLoss},
		Case{Name: "H4_ExitRaceKeepsResult", Rule: "H4", Run: h4ExitRaceKeepsResult},
		Case{Name: "H5_ReleaseWithCancelledContextDeletes", Rule: "H5", Run: h5ReleaseWithCancelledContext},
		Case{Name: "H5_ReleaseAgainstHangingDatabaseIsBounded", Rule: "H5", Run: h5ReleaseHangingBounded},
		Case{Name: "H5_ReleaseAfterTakeoverIsNotHeld", Rule: "H5", Run: h5ReleaseAfterTakeover},
		Case{Name: "H6_CancelWhileAcquiringLeaksNothing", Rule: "H6", Run: h6CancelWhileAcquiring},
		Case{Name: "H6_DoneContextTakesNothing", Rule: "H6", Run: h6DoneContextTakesNothing},
		Case{Name: "H6_CloseEndsWaitingAcquires", Rule: "H6", Run: h6CloseEndsWaitingAcquires},
		Case{Name: "H7_RenewalNotStarvedByFullPool", Rule: "H7", Run: h7NotStarvedByFullPool},
		Case{Name: "H7_HangingRenewalAbandonedAfterRenewTimeout", Rule: "H7", Run: h7HangingRenewalAbandoned},
		Case{Name: "W2_BackoffScheduleBoundedAndGrowing", Rule: "W2", Run: w2BackoffSchedule},
		Case{Name: "W2_PollIntervalCappedByTTL", Rule: "W2", Run: w2PollIntervalCapped},
		Case{Name: "W2_CrashedHolderTakenOverWithinTTLPlusBackoff", Rule: "W2", Run: w2CrashedHolderTakeover},
		Case{Name: "W3_TryAcquireReportsHolders", Rule: "W3", Run: w3TryReportsHolders},
		Case{Name: "W3_WaitTimeoutReturnsLocked", Rule: "W3", Run: w3WaitTimeout},
		Case{Name: "W3_NegativeWaitTimeoutRejected", Rule: "W3", Run: w3NegativeWaitTimeout},
		Case{Name: "W3_BlockingAcquireBoundedByContext", Rule: "W3", Run: w3BoundedByContext},
	)
}

// lcSlack is added to every upper time bound of this file: the suite runs
// under -race, cases in parallel, on small loaded machines (a hold case
// missed 400 ms at load 20 on 2 cores).
const lcSlack = time.Second

// lcParamRE finds the @param markers of a statement template.
var lcParamRE = regexp.MustCompile(`@[_a-z0-9]+`)

// lcRendered returns the SQL text a Locker in the case's namespace sends for
// the statement template of operation name, for matching faultdb rules.
func lcRendered(e *Env, name, template string) string {
	e.T.Helper()
	e.Require(template != "", "dialect %q has no %s statement", e.Dialect.Name(), name)
	var params []string
	for _, p := range lcParamRE.FindAllString(template, -1) {
		params = append(params, p[1:])
	}
	st, err := dialect.Compile(e.Dialect, e.Namespace, template, params)
	e.Must(err, "render %s", name)
	return st.SQL
}

// lcRenewalSQL returns the rendered statements a Locker may renew its leases
// with: RenewBatch, when the dialect has it, and Renew.
func lcRenewalSQL(e *Env) []string {
	e.T.Helper()
	st := e.Dialect.Statements()
	out := []string{lcRendered(e, "Renew", st.Renew)}
	if st.RenewBatch != "" {
		out = append(out, lcRendered(e, "RenewBatch", st.RenewBatch))
	}
	return out
}

// lcRenewalFault installs r (its Match replaced) for every renewal
// statement and returns a function that removes it again.
func lcRenewalFault(e *Env, r faultdb.Rule) (remove func()) {
	e.T.Helper()
	var removes []func()
	for _, text := range lcRenewalSQL(e) {
		r.Match = text
		removes = append(removes, e.Faults.Add(r))
	}
	return func() {
		for _, f := range removes {
			f()
		}
	}
}

// lcAcquireSQL is the rendered statement that grants an uncontended
// acquire: the dialect's one-statement Grant when it has one, else the last
// statement of the Acquire script, the one that reports the outcome, run
// after any grant of the attempt was written.
func lcAcquireSQL(e *Env) string {
	e.T.Helper()
	if g := dialect.FastPathOf(e.Dialect).Grant; g != "" {
		return lcRendered(e, "Grant", g)
	}
	s := e.Dialect.Statements().Acquire
	e.Require(len(s) != 0, "dialect %q has no Acquire statement", e.Dialect.Name())
	return lcRendered(e, "Acquire", s[len(s)-1])
}

// TransientErrorer is an optional interface of the Dialect under test:
// TransientError returns an error value its driver returns for a failure
// the dialect classifies as retryable (a serialization failure, a busy
// database). Cases inject it to prove retries (SPEC H2). Without it the
// cases try, in order, an error with SQLState() "40001", one with Code() 5
// (SQLITE_BUSY), io.ErrUnexpectedEOF and driver.ErrBadConn, and use the
// first the dialect classifies as retryable.
type TransientErrorer interface {
	TransientError() error
}

// sqlStateError is a driver error carrying a SQLSTATE, as pgx's, lib/pq's
// and other drivers' errors do.
type sqlStateError string

func (e sqlStateError) Error() string    { return "SQLSTATE " + string(e) + " (injected)" }
func (e sqlStateError) SQLState() string { return string(e) }

// codeError is a driver error carrying a numeric code through Code(), as
// modernc.org/sqlite's does.
type codeError int

func (e codeError) Error() string { return fmt.Sprintf("error code %d (injected)", int(e)) }
func (e codeError) Code() int     { return int(e) }

// lcTransientError returns an error the dialect classifies as retryable
// (SPEC H2: serialization failure, SQLITE_BUSY, a dropped connection): the
// dialect's own TransientError when it has one, else the first candidate
// it classifies as retryable. The choice is by classification, never by
// dialect name. driver.ErrBadConn comes last: database/sql retries it on
// another connection, which hides a single injected failure.
func lcTransientError(e *Env) error {
	e.T.Helper()
	if te, ok := e.Dialect.(TransientErrorer); ok {
		if err := te.TransientError(); e.Dialect.Classify(err) == dialect.ErrorRetryable {
			return err
		}
		e.T.Errorf("dialect %q: its TransientError() is not classified as retryable", e.Dialect.Name())
	}
	candidates := []error{
		sqlStateError("40001"),
		codeError(5),
		io.ErrUnexpectedEOF,
		driver.ErrBadConn,
	}
	for _, c := range candidates {
		if e.Dialect.Classify(c) == dialect.ErrorRetryable {
			return c
		}
	}
	e.T.Logf("dialect %q classifies none of %v as retryable; injecting %v", e.Dialect.Name(), candidates, io.ErrUnexpectedEOF)
	return io.ErrUnexpectedEOF
}

// lcWarm opens n connections of db at once and hands them back to its idle
// pool, as in a running application, so a renewal does not have to dial
// within its short timeout (slow on a loaded machine).
func lcWarm(e *Env, db *sql.DB, n int) {
	e.T.Helper()
	conns := make([]*sql.Conn, 0, n)
	for i := 0; i < n; i++ {
		c, err := db.Conn(e.Ctx())
		e.Must(err, "connect")
		conns = append(conns, c)
	}
	for _, c := range conns {
		_ = c.Close()
	}
}

// lcLiveInDatabase checks that le is the only row of its key and live in
// the database's time.
func lcLiveInDatabase(e *Env, l *lock.Locker, le *lock.Lease) {
	e.T.Helper()
	hs, now, err := l.Holders(e.Ctx(), le.Key())
	e.Must(err, "holders")
	e.Check(len(hs) == 1 && hs[0].LeaseID == le.LeaseID() && hs[0].Token == le.Token() && hs[0].Expiry.After(now), "want our lease live in the database (token %d), got %v at %v", le.Token(), hs, now)
}

// lcWaitDone waits for le's context to end; it returns when it did, or the
// zero time after timeout.
func lcWaitDone(le *lock.Lease, timeout time.Duration) time.Time {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-le.Done():
		return time.Now()
	case <-t.C:
		return time.Time{}
	}
}

func h1RemainingIsTrustedWindow(e *Env) {
	ctx := e.Ctx()
	const ttl, margin = 1200 * time.Millisecond, 120 * time.Millisecond
	const window, interval = ttl - margin, ttl / 3
	// Hold every renewal until the gate opens, so the first readings see
	// the window of the acquire alone.
	gate := make(chan struct{})
	remove := lcRenewalFault(e, faultdb.Rule{Action: faultdb.Hang, Release: gate})
	defer remove()
	l := e.NewLocker(nil, lock.WithTTL(ttl), lock.WithSafetyMargin(margin))
	before := time.Now()
	le, err := l.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "acquire")
	r0 := le.Remaining()
	took := time.Since(before)
	// The window starts when the acquire was sent: after before, before now.
	e.Check(r0 <= window && r0 >= window-took, "Remaining right after acquire = %s, want TTL - margin = %s minus at most the %s the acquire took", r0, window, took)
	time.Sleep(50 * time.Millisecond)
	r1 := le.Remaining()
	after1 := time.Now()
	e.Check(r1 <= r0-50*time.Millisecond, "Remaining did not decrease with time: %s, then %s 50ms later", r0, r1)
	exp0 := le.Expiry()
	remove()
	close(gate)
	e.Require(Eventually(window, func() bool { return le.Expiry().After(exp0) }), "no renewal within the trusted window (expiry still %v); lease err: %v", exp0, le.Err())
	before2 := time.Now()
	r2 := le.Remaining()
	e.Check(r2 <= window, "Remaining after renewal = %s, more than TTL - margin = %s", r2, window)
	// The window moved to the renewal's send time, at least one renewal
	// interval after the acquire was sent.
	end1, end2 := after1.Add(r1), before2.Add(r2)
	if moved := end2.Sub(end1); moved < interval/2 {
		e.T.Errorf("renewal moved the end of the trusted window by %s, want about the renewal interval %s or more", moved, interval)
	}
	e.Must(le.Err(), "lease ended")
	if err := le.Release(ctx); err != nil {
		e.T.Errorf("release: %v", err)
	}
	if r := le.Remaining(); r != 0 {
		e.T.Errorf("Remaining after Release = %s, want 0", r)
	}
}

func h1BlockedRenewalsEndWindow(e *Env) {
	ctx := e.Ctx()
	const ttl, margin = time.Second, 100 * time.Millisecond
	const window = ttl - margin
	l := e.NewLocker(nil, lock.WithTTL(ttl), lock.WithSafetyMargin(margin))
	le, err := l.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "acquire")
	// Let one renewal through first, so the window that ends is a renewed one.
	exp0 := le.Expiry()
	e.Require(Eventually(window, func() bool { return le.Expiry().After(exp0) }), "no renewal within the trusted window; lease err: %v", le.Err())
	// The window cannot end before endLo (a renewal in flight may still
	// move it later) and must end by endHi: every renewal that can still
	// succeed was sent before the rule was in place.
	t0 := time.Now()
	endLo := t0.Add(le.Remaining())
	lcRenewalFault(e, faultdb.Rule{Action: faultdb.Hang})
	endHi := time.Now().Add(window)
	var zeroAt time.Time
	for zeroAt.IsZero() {
		tb := time.Now()
		r := le.Remaining()
		lostErr := le.Err()
		ta := time.Now()
		e.Require(r <= 0 || !tb.Add(r).After(endHi), "Remaining = %s at %s after renewals were blocked: it trusts the lease past the window of the last renewal sent (%s after blocking)", r, tb.Sub(t0), endHi.Sub(t0))
		e.Require(lostErr == nil || !ta.Before(endLo), "lease reported lost %s before its trusted window could end: %v", endLo.Sub(ta), lostErr)
		if r == 0 {
			zeroAt = tb
			break
		}
		e.Require(!tb.After(endHi.Add(lcSlack)), "Remaining still %s, %s after the latest possible end of the trusted window", r, tb.Sub(endHi))
		time.Sleep(2 * time.Millisecond)
	}
	lostAt := lcWaitDone(le, time.Until(endHi.Add(lcSlack)))
	e.Require(!lostAt.IsZero(), "lease not reported lost by %s after the trusted window ended (Remaining reached 0 %s after blocking)", lcSlack, zeroAt.Sub(t0))
	e.Check(!lostAt.Before(endLo), "lease reported lost %s before its trusted window ended", endLo.Sub(lostAt))
	if lost := wantLost(e, "blocked renewals", le.Err(), le); lost != nil && lost.Reason != lock.LossWindowExhausted {
		e.T.Errorf("loss reason %q, want %q", lost.Reason, lock.LossWindowExhausted)
	}
	if r := le.Remaining(); r != 0 {
		e.T.Errorf("Remaining after loss = %s, want 0", r)
	}
}

func h2TransientErrorKeepsLease(e *Env) {
	ctx := e.Ctx()
	const ttl = 1200 * time.Millisecond
	l := e.NewLocker(nil, lock.WithTTL(ttl))
	le, err := l.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "acquire")
	transient := lcTransientError(e)
	var hits atomic.Int64
	lcRenewalFault(e, faultdb.Rule{Action: faultdb.Fail, Err: transient, Times: 1, Hits: &hits})
	e.Require(Eventually(2*ttl, func() bool { return hits.Load() >= 1 }), "no renewal attempted within 2 TTLs")
	exp := le.Expiry()
	e.Require(Eventually(ttl, func() bool { return le.Expiry().After(exp) }), "no renewal succeeded after one transient failure (%v); lease err: %v", transient, le.Err())
	time.Sleep(ttl / 2)
	e.Must(le.Err(), "one transient renewal error (%v) lost the lease", transient)
	lcLiveInDatabase(e, l, le)
	if err := le.Release(ctx); err != nil {
		e.T.Errorf("release: %v", err)
	}
}

// h2RenewalRetriesBackOff: renewals that fail with a transient error eight
// times in a row are retried with backoff, not in a tight loop: each retry
// comes at least its documented wait after the failure before it (5 ms,
// doubling, at most TTL/10, which the last gap reaches; docs/design.md
// "Lease lifecycle"), and the
// renewal after the failures keeps the lease, live in the database
// (SPEC H2). Only lower bounds on the gaps are checked: a loaded machine
// makes them longer, never shorter.
func h2RenewalRetriesBackOff(e *Env) {
	ctx := e.Ctx()
	const ttl, failures = 3 * time.Second, 8
	var mu sync.Mutex
	var tries []time.Time
	l := e.NewLocker(nil, lock.WithTTL(ttl), lock.WithObserver(lock.ObserverFunc(func(ev lock.Event) {
		if ev.Kind == lock.EventRenewRetry {
			mu.Lock()
			tries = append(tries, time.Now())
			mu.Unlock()
		}
	})))
	le, err := l.TryAcquire(ctx, "h2/backoff", lock.Exclusive)
	e.Must(err, "acquire")
	seen := func() []time.Time {
		mu.Lock()
		defer mu.Unlock()
		return append([]time.Time(nil), tries...)
	}
	exp := le.Expiry()
	remove := lcRenewalFault(e, faultdb.Rule{Action: faultdb.Fail, Err: lcTransientError(e), Times: failures})
	defer remove()
	// Due after TTL/3; eight failures wait 5+10+...+160+300 ms (the cap).
	e.Require(Eventually(2*ttl, func() bool { return len(seen()) >= failures }), "%d failed renewals seen within 2 TTLs, want %d", len(seen()), failures)
	got := seen()
	for i := 1; i < failures; i++ {
		want := min(5*time.Millisecond<<(i-1), ttl/10)
		if gap := got[i].Sub(got[i-1]); gap < want-time.Millisecond {
			e.T.Errorf("retry %d came %v after the failure before it; want at least its backoff %v", i, gap, want)
		}
	}
	e.Require(Eventually(ttl, func() bool { return le.Expiry().After(exp) }), "no renewal succeeded after %d transient failures; lease err: %v", failures, le.Err())
	e.Must(le.Err(), "%d transient renewal failures within the window lost the lease", failures)
	lcLiveInDatabase(e, l, le)
	if err := le.Release(ctx); err != nil {
		e.T.Errorf("release: %v", err)
	}
	// The next operation works: the key is free again.
	le2, err := l.TryAcquire(ctx, "h2/backoff", lock.Exclusive)
	e.Must(err, "acquire after the release")
	if err := le2.Release(ctx); err != nil {
		e.T.Errorf("release: %v", err)
	}
}

// h2OversizedBatchSplit: renewal statements that carry more than about 40
// leases never finish: they hang until their renew timeout ends them, as a
// batch too big for a slow database would. A Locker holding 240 leases must
// still keep all of them, renewing in batches small enough to go through
// (SPEC H2: only an exhausted window or a lease gone from the database
// means lost). Then the same with batches that fail at once.
func h2OversizedBatchSplit(e *Env) {
	ctx := e.Ctx()
	// A dialect without RenewBatch renews one lease per statement, one
	// after the other: there is no batch to split, and the case checks
	// that the faults on oversized statements leave its renewals alone,
	// with as many leases as one connection renews well within a third of
	// the TTL on a loaded machine (40 leases at a 2 s TTL were lost once
	// on MariaDB under the race detector while other test binaries ran).
	leases, ttl := 240, 2*time.Second
	if e.Dialect.Statements().RenewBatch == "" {
		leases, ttl = 20, 4*time.Second
	}
	// A hung batch costs its leases a renew timeout of their windows; a
	// tenth of the TTL leaves room for the few it takes to find a size
	// that goes through, on a loaded machine too.
	l := e.NewLocker(nil, lock.WithTTL(ttl), lock.WithRenewTimeout(ttl/10))
	held := make([]*lock.Lease, 0, leases)
	defer func() {
		for _, le := range held {
			_ = le.Release(ctx)
		}
	}()
	for i := 0; i < leases; i++ {
		le, err := l.TryAcquire(ctx, fmt.Sprintf("h2/batch/%d", i), lock.Exclusive)
		e.Must(err, "acquire %d", i)
		held = append(held, le)
	}
	// A lease in a RenewBatch argument is "<32 hex>:<token>" plus JSON
	// quoting and a comma: 35 bytes and the token's digits (tokens follow
	// the database clock in microseconds, SPEC S7: about 16 digits). The
	// one-lease Renew statement carries less. Statements bigger than 40
	// leases' worth fail.
	maxBytes := 40 * (35 + len(strconv.FormatInt(held[len(held)-1].Token(), 10)))
	for _, fault := range []faultdb.Rule{
		{Action: faultdb.Hang},
		{Action: faultdb.Fail, Err: lcTransientError(e)},
	} {
		what := "hung until their timeout"
		if fault.Action == faultdb.Fail {
			what = "failed at once"
		}
		var hits atomic.Int64
		fault.MinArgBytes, fault.Hits = maxBytes, &hits
		remove := lcRenewalFault(e, fault)
		first := make([]time.Time, len(held))
		for i, le := range held {
			first[i] = le.Expiry()
		}
		// Every lease must renew several times, none may be lost.
		time.Sleep(5 * ttl / 2)
		remove()
		lost, stale := 0, 0
		for i, le := range held {
			if err := le.Err(); err != nil {
				e.Check(lost != 0, "lease %s lost: %v", le.Key(), err)
				lost++
				continue
			}
			if !le.Expiry().After(first[i].Add(ttl)) {
				stale++
			}
		}
		e.Check(lost <= 0 && stale <= 0, "%d of %d leases lost and %d not renewed past their first TTL while renewal statements with more than %d bytes of arguments %s (%d such statements)", lost, leases, stale, maxBytes, what, hits.Load())
		e.Check(e.Dialect.Statements().RenewBatch == "" || hits.Load() != 0 || fault.Action != faultdb.Hang, "no renewal batch was big enough to hang: the case did not exercise the split")
		e.T.Logf("%d renewal statements %s for their size", hits.Load(), what)
		if lost > 0 {
			return
		}
	}
}

func h2PersistentFailureLoses(e *Env) {
	ctx := e.Ctx()
	// A larger margin than the default keeps the gap between the holder's
	// deadline and the database expiry clear of timer jitter under load.
	const ttl, margin = 900 * time.Millisecond, 250 * time.Millisecond
	const window = ttl - margin
	holder := e.NewLocker(nil, lock.WithTTL(ttl), lock.WithSafetyMargin(margin))
	// The contender has its own pool, out of reach of the faults.
	contender := e.NewLocker(e.OpenDB(), lock.WithTTL(ttl))
	le, err := holder.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "acquire")
	transient := lcTransientError(e)
	t0 := time.Now()
	endLo := t0.Add(le.Remaining())
	lcRenewalFault(e, faultdb.Rule{Action: faultdb.Fail, Err: transient})
	endHi := time.Now().Add(window)

	type grant struct {
		lease      *lock.Lease
		err        error
		holderDone bool
	}
	got := make(chan grant, 1)
	var wg sync.WaitGroup
	e.Go(&wg, func() {
		c, err := contender.Acquire(ctx, "k", lock.Exclusive, lock.WaitTimeout(3*ttl+lcSlack))
		g := grant{lease: c, err: err}
		select {
		case <-le.Done():
			g.holderDone = true
		default:
		}
		got <- g
	})
	defer wg.Wait()

	lostAt := lcWaitDone(le, time.Until(endHi.Add(lcSlack)))
	e.Require(!lostAt.IsZero(), "renewals failing with %v: lease not lost %s after the trusted window ended", transient, lcSlack)
	e.Check(!lostAt.Before(endLo), "lease lost %s before its trusted window ended: failures must be retried until then", endLo.Sub(lostAt))
	if lost := wantLost(e, "persistent renewal failure", le.Err(), le); lost != nil && lost.Reason != lock.LossWindowExhausted {
		e.T.Errorf("loss reason %q, want %q", lost.Reason, lock.LossWindowExhausted)
	}
	g := <-got
	if g.err != nil {
		e.T.Fatalf("contender: %v", g.err)
	}
	defer g.lease.Release(ctx)
	e.Check(g.holderDone, "contender was granted the key while the holder's context was not done yet")
	if grantedAt, expired := g.lease.Expiry().Add(-ttl), le.Expiry(); grantedAt.Before(expired) {
		e.T.Errorf("contender granted at %v (database time), before the holder's lease expired at %v", grantedAt, expired)
	}
}

func h2LostReplySettled(e *Env) {
	ctx := e.Ctx()
	const ttl = 1200 * time.Millisecond
	l := e.NewLocker(nil, lock.WithTTL(ttl))
	lcWarm(e, e.DB, 3) // the connection that loses the reply is discarded
	le, err := l.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "acquire")
	// The renewal's UPDATE commits, its reply is lost.
	var hits atomic.Int64
	lcRenewalFault(e, faultdb.Rule{Action: faultdb.DropReply, Err: io.ErrUnexpectedEOF, Times: 1, Hits: &hits})
	e.Require(Eventually(2*ttl, func() bool { return hits.Load() >= 1 }), "no renewal attempted within 2 TTLs")
	exp := le.Expiry()
	e.Require(Eventually(ttl, func() bool { return le.Expiry().After(exp) }), "no renewal succeeded after a lost reply; lease err: %v", le.Err())
	time.Sleep(ttl / 2)
	e.Must(le.Err(), "a renewal whose reply was lost lost the lease")
	hs := holders(e, l, "k")
	e.Check(len(hs) == 1 && hs[0].LeaseID == le.LeaseID() && hs[0].Token == le.Token(), "want exactly our lease (token %d) in the database, got %v", le.Token(), hs)
	if err := le.Release(ctx); err != nil {
		e.T.Errorf("release of the kept lease: %v", err)
	}
}

func h3DeletedRowSignalsLoss(e *Env) {
	ctx := e.Ctx()
	const ttl = 1200 * time.Millisecond
	l := e.NewLocker(nil, lock.WithTTL(ttl))
	holders := e.Namespace.Object(e.Dialect, "holders")
	errFn := errors.New("guarded function's own error")
	var (
		lease         *lock.Lease
		deleted, lost time.Time
		cause         error
	)
	err := l.Do(ctx, "k", lock.Exclusive, func(fctx context.Context, le *lock.Lease) error {
		lease = le
		res, err := e.DB.ExecContext(ctx, "DELETE FROM "+holders+" WHERE lease_id = "+e.Dialect.Placeholder(1), le.LeaseID())
		if err != nil {
			e.T.Errorf("delete lease row: %v", err)
			return errFn
		}
		if n, _ := res.RowsAffected(); n != 1 {
			e.T.Errorf("deleted %d lease rows, want 1", n)
		}
		deleted = time.Now()
		t := time.NewTimer(ttl + lcSlack)
		defer t.Stop()
		select {
		case <-fctx.Done():
			lost = time.Now()
			cause = context.Cause(fctx)
		case <-t.C:
			e.T.Errorf("guarded function's context not cancelled %s after its lease row was deleted", ttl+lcSlack)
		}
		return errFn
	})
	if lost.IsZero() {
		return
	}
	if d := lost.Sub(deleted); d > ttl/3+lcSlack {
		e.T.Errorf("loss signalled %s after the row was deleted, want within about one renewal interval (%s)", d, ttl/3)
	}
	if lost := wantLost(e, "context cause", cause, lease); lost != nil && lost.Reason != lock.LossNotOurs {
		e.T.Errorf("loss reason %q, want %q", lost.Reason, lock.LossNotOurs)
	}
	wantLost(e, "lease.Err", lease.Err(), lease)
	e.Check(errors.Is(err, lock.ErrLeaseLost) && errors.Is(err, errFn), "Do = %v, want ErrLeaseLost joined with the function's error", err)
	if r := lease.Remaining(); r != 0 {
		e.T.Errorf("Remaining after loss = %s, want 0", r)
	}
}

func h4ExitRaceKeepsResult(e *Env) {
	ctx := e.Ctx()
	const ttl = 600 * time.Millisecond
	l := e.NewLocker(nil, lock.WithTTL(ttl), lock.WithRenewTimeout(ttl/3))
	// The first renewal hangs until released; every later one fails.
	release := make(chan struct{})
	var hung atomic.Int64
	lcRenewalFault(e, faultdb.Rule{Action: faultdb.Hang, Release: release, Times: 1, Hits: &hung})
	lcRenewalFault(e, faultdb.Rule{Action: faultdb.Fail, Err: lcTransientError(e)})
	var lease *lock.Lease
	var fnCause error
	err := l.Do(ctx, "k", lock.Exclusive, func(fctx context.Context, le *lock.Lease) error {
		lease = le
		e.Check(Eventually(2*ttl, func() bool { return hung.Load() >= 1 }), "no renewal started within 2 TTLs")
		// Return while that renewal is in flight.
		fnCause = context.Cause(fctx)
		return nil
	})
	close(release)
	e.Require(fnCause == nil, "guarded function's context ended before it returned: %v", fnCause)
	e.Check(err == nil, "Do = %v, want the function's nil: a renewal failing after it returned must not rewrite it", err)
	if hs := holders(e, l, "k"); len(hs) != 0 {
		e.T.Errorf("lease not released after the function returned: %v", hs)
	}
	// Let the released renewal finish and fail, then look again.
	time.Sleep(ttl / 2)
	if err := lease.Err(); !errors.Is(err, lock.ErrReleased) || errors.Is(err, lock.ErrLeaseLost) {
		e.T.Errorf("lease context cause = %v, want ErrReleased: the late renewal failure must not turn it into a loss", err)
	}
	if hs := holders(e, l, "k"); len(hs) != 0 {
		e.T.Errorf("late renewal brought the lease back: %v", hs)
	}
}

func h5ReleaseWithCancelledContext(e *Env) {
	ctx := e.Ctx()
	l := e.NewLocker(nil, lock.WithTTL(5*time.Second))
	other := e.NewLocker(nil, lock.WithTTL(5*time.Second))
	le, err := l.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "acquire")
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	e.Must(le.Release(cancelled), "release with a cancelled context")
	if hs := holders(e, l, "k"); len(hs) != 0 {
		e.T.Errorf("release with a cancelled context left rows: %v", hs)
	}
	if err := le.Err(); !errors.Is(err, lock.ErrReleased) {
		e.T.Errorf("lease context cause after release = %v, want ErrReleased", err)
	}
	// Idempotent.
	if err := le.Release(ctx); err != nil {
		e.T.Errorf("second release: %v", err)
	}
	if err := le.Release(cancelled); err != nil {
		e.T.Errorf("third release: %v", err)
	}
	o, err := other.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "key not free after release")
	if err := le.Release(ctx); err != nil {
		e.T.Errorf("release after the key was granted again: %v", err)
	}
	if hs := holders(e, l, "k"); len(hs) != 1 || hs[0].LeaseID != o.LeaseID() {
		e.T.Errorf("a repeated release touched the next holder: %v", hs)
	}
	_ = o.Release(ctx)

	// Do whose caller context is cancelled inside the function releases too.
	dctx, dcancel := context.WithCancel(ctx)
	defer dcancel()
	if err := l.Do(dctx, "d", lock.Exclusive, func(context.Context, *lock.Lease) error {
		dcancel()
		return nil
	}); err != nil {
		e.T.Errorf("Do with its context cancelled inside: %v", err)
	}
	if hs := holders(e, l, "d"); len(hs) != 0 {
		e.T.Errorf("Do with a cancelled context did not release: %v", hs)
	}
}

func h5ReleaseHangingBounded(e *Env) {
	ctx := e.Ctx()
	const ttl, releaseTimeout = 900 * time.Millisecond, 300 * time.Millisecond
	l := e.NewLocker(nil, lock.WithTTL(ttl), lock.WithReleaseTimeout(releaseTimeout))
	other := e.NewLocker(e.OpenDB(), lock.WithTTL(ttl))
	le, err := l.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "acquire")
	remove := e.Faults.Add(faultdb.Rule{Match: lcRendered(e, "Release", e.Dialect.Statements().Release), Action: faultdb.Hang})
	start := time.Now()
	err = le.Release(ctx)
	took := time.Since(start)
	remove()
	e.Check(err != nil && !errors.Is(err, lock.ErrNotHeld), "release against a hanging database = %v, want its failure", err)
	e.Check(took <= releaseTimeout+lcSlack, "release against a hanging database took %s, want about the release timeout %s", took, releaseTimeout)
	e.Check(le.Err() != nil, "lease context still live after release")
	// The row stays and is no longer renewed: it ends by expiry, and a
	// contender takes the key over then.
	hs := holders(e, l, "k")
	e.Require(len(hs) == 1 && hs[0].LeaseID == le.LeaseID(), "after a failed release want our row still in the database, got %v", hs)
	c, err := other.Acquire(ctx, "k", lock.Exclusive, lock.WaitTimeout(ttl+2*lcSlack))
	if err != nil {
		e.T.Fatalf("row did not end by expiry: %v (holders %v)", err, holders(e, l, "k"))
	}
	defer c.Release(ctx)
	if d := time.Since(start); d > ttl+2*lcSlack {
		e.T.Errorf("takeover %s after the failed release; the row was renewed after it", d)
	}
	if granted := c.Expiry().Add(-ttl); granted.Before(hs[0].Expiry) {
		e.T.Errorf("contender granted at %v, before our row expired at %v", granted, hs[0].Expiry)
	}
	if err := le.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		e.T.Errorf("retried release after takeover = %v, want ErrNotHeld", err)
	}
	if hs := holders(e, l, "k"); len(hs) != 1 || hs[0].LeaseID != c.LeaseID() {
		e.T.Errorf("retried release touched the successor: %v", hs)
	}
}

func h5ReleaseAfterTakeover(e *Env) {
	ctx := e.Ctx()
	const ttl = 600 * time.Millisecond
	a := e.NewLocker(nil, lock.WithTTL(ttl))
	b := e.NewLocker(nil, lock.WithTTL(ttl))
	la, err := a.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "acquire")
	la.Orphan()
	lb, err := b.Acquire(ctx, "k", lock.Exclusive, lock.WaitTimeout(2*ttl+lcSlack))
	e.Must(err, "takeover")
	if err := la.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		e.T.Errorf("release of a lease taken over = %v, want ErrNotHeld", err)
	}
	if err := la.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		e.T.Errorf("second release of a lease taken over = %v, want ErrNotHeld again (idempotent)", err)
	}
	hs := holders(e, a, "k")
	e.Require(len(hs) == 1 && hs[0].LeaseID == lb.LeaseID() && hs[0].Token == lb.Token(), "stale release touched the successor: want only token %d, got %v", lb.Token(), hs)
	if err := lb.Renew(ctx); err != nil {
		e.T.Errorf("successor cannot renew after a stale release: %v", err)
	}
	if err := lb.Err(); err != nil {
		e.T.Errorf("successor's lease ended: %v", err)
	}
	if err := lb.Release(ctx); err != nil {
		e.T.Errorf("successor release: %v", err)
	}
}

func h6CancelWhileAcquiring(e *Env) {
	ctx := e.Ctx()
	const ttl = 900 * time.Millisecond
	l := e.NewLocker(nil, lock.WithTTL(ttl))
	other := e.NewLocker(nil, lock.WithTTL(ttl))
	acq := lcAcquireSQL(e)
	// cancelDuring delays the next acquire statement and cancels the
	// caller's context shortly before the delay ends, so the statement
	// runs (and may commit a grant) after the caller gave up.
	const delay, cancelAfter = 300 * time.Millisecond, 250 * time.Millisecond
	cancelDuring := func(acquire func(ctx context.Context) (*lock.Lease, error)) {
		var hits atomic.Int64
		remove := e.Faults.Add(faultdb.Rule{Match: acq, Action: faultdb.Delay, Delay: delay, Times: 1, Hits: &hits})
		defer remove()
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var wg sync.WaitGroup
		e.Go(&wg, func() {
			e.Check(Eventually(5*time.Second, func() bool { return hits.Load() >= 1 }), "acquire statement never reached the database")
			time.Sleep(cancelAfter)
			cancel()
		})
		le, err := acquire(cctx)
		wg.Wait()
		if le != nil {
			e.T.Errorf("acquire with a cancelled context returned a lease (token %d)", le.Token())
			_ = le.Release(ctx)
		}
		e.Check(errors.Is(err, context.Canceled), "acquire cancelled while in flight = %v, want the context's error", err)
	}

	// The token of a grant just before, to see that the cancelled grant
	// did commit (SPEC S3: tokens of a key strictly increase).
	first, err := l.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "acquire")
	e.Must(first.Release(ctx), "release")
	// A grant that commits after the caller gave up is released before
	// the error is returned.
	cancelDuring(func(c context.Context) (*lock.Lease, error) { return l.TryAcquire(c, "k", lock.Exclusive) })
	if hs := holders(e, l, ""); len(hs) != 0 {
		e.T.Errorf("cancelled acquire left rows: %v", hs)
	}
	o, err := other.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "key not free after a cancelled acquire")
	if o.Token() < first.Token()+2 {
		// Legitimate (the engine may abort the statement instead), but
		// then this run did not see a grant commit after the cancel.
		e.T.Logf("note: token %d follows %d: the cancelled acquire's statement did not commit a grant", o.Token(), first.Token())
	}
	// The Locker forgot the abandoned attempt: no ErrReentrant.
	if _, err := l.TryAcquire(ctx, "k", lock.Exclusive); !errors.Is(err, lock.ErrLocked) {
		e.T.Errorf("acquire after a cancelled one = %v, want ErrLocked (the key is held by another)", err)
	}

	// A blocked writer cancelled during a poll leaves no pending-writer
	// marker behind.
	cancelDuring(func(c context.Context) (*lock.Lease, error) { return l.Acquire(c, "k", lock.Exclusive) })
	hs := holders(e, l, "")
	e.Check(len(hs) == 1 && hs[0].LeaseID == o.LeaseID(), "cancelled waiter left rows: want only the holder's lease, got %v", hs)
	if err := o.Release(ctx); err != nil {
		e.T.Errorf("release: %v", err)
	}
	// Nothing blocks readers now.
	s, err := other.TryAcquire(ctx, "k", lock.Shared)
	e.Must(err, "shared after the cancelled waiter")
	_ = s.Release(ctx)
}

func h6DoneContextTakesNothing(e *Env) {
	ctx := e.Ctx()
	l := e.NewLocker(nil, lock.WithTTL(900*time.Millisecond))
	done, cancel := context.WithCancel(ctx)
	cancel()
	if le, err := l.TryAcquire(done, "k", lock.Exclusive); le != nil || !errors.Is(err, context.Canceled) {
		e.T.Errorf("TryAcquire with a done context = %v, %v; want the context's error", le, err)
	}
	if le, err := l.Acquire(done, "k", lock.Exclusive); le != nil || !errors.Is(err, context.Canceled) {
		e.T.Errorf("Acquire with a done context = %v, %v; want the context's error", le, err)
	}
	called := false
	if err := l.Do(done, "k", lock.Shared, func(context.Context, *lock.Lease) error { called = true; return nil }); !errors.Is(err, context.Canceled) {
		e.T.Errorf("Do with a done context = %v, want the context's error", err)
	}
	e.Check(!called, "Do ran its function with a done context")
	if hs := holders(e, l, ""); len(hs) != 0 {
		e.T.Errorf("a done context took something: %v", hs)
	}
	le, err := l.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "acquire after refused ones")
	_ = le.Release(ctx)
}

func h7NotStarvedByFullPool(e *Env) {
	ctx := e.Ctx()
	const ttl = time.Second
	e.DB.SetMaxOpenConns(1)
	renewDB := e.OpenDB()
	lcWarm(e, renewDB, 2)
	l := e.NewLocker(nil, lock.WithTTL(ttl), lock.WithRenewDB(renewDB))
	le, err := l.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "acquire")
	// The application takes the only connection of its pool and keeps it.
	conn, err := e.DB.Conn(ctx)
	e.Must(err, "conn")
	defer conn.Close()
	var one int
	e.Must(conn.QueryRowContext(ctx, "SELECT 1").Scan(&one), "query on the held connection")
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	err = e.DB.QueryRowContext(short, "SELECT 1").Scan(&one)
	cancel()
	e.Require(err != nil, "scenario not exercised: the application pool is not exhausted")
	exp := le.Expiry()
	time.Sleep(3 * ttl)
	e.Must(le.Err(), "lease lost while the application pool was full")
	if moved := le.Expiry().Sub(exp); moved < ttl {
		e.T.Errorf("expiry moved only %s in 3 TTLs: renewals starved", moved)
	}
	_ = conn.Close()
	if err := le.Release(ctx); err != nil {
		e.T.Errorf("release: %v", err)
	}
}

func h7HangingRenewalAbandoned(e *Env) {
	ctx := e.Ctx()
	// The window leaves room for several retries after the hang ends.
	const ttl, renewTimeout = 1500 * time.Millisecond, 200 * time.Millisecond
	l := e.NewLocker(nil, lock.WithTTL(ttl), lock.WithRenewTimeout(renewTimeout))
	lcWarm(e, e.DB, 3)
	le, err := l.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "acquire")
	// One renewal hangs forever (until its own timeout ends it).
	var hits atomic.Int64
	lcRenewalFault(e, faultdb.Rule{Action: faultdb.Hang, Times: 1, Hits: &hits})
	e.Require(Eventually(2*ttl, func() bool { return hits.Load() >= 1 }), "no renewal attempted within 2 TTLs")
	hungAt := time.Now()
	exp := le.Expiry()
	e.Require(Eventually(ttl, func() bool { return le.Expiry().After(exp) }), "a hanging renewal was not abandoned and retried; lease err: %v", le.Err())
	if d := time.Since(hungAt); d > renewTimeout+lcSlack {
		e.T.Errorf("renewal retried %s after it hung, want about the renew timeout %s", d, renewTimeout)
	}
	time.Sleep(ttl / 2)
	e.Must(le.Err(), "lease lost after one hanging renewal")
	if err := le.Release(ctx); err != nil {
		e.T.Errorf("release: %v", err)
	}
}

func w2BackoffSchedule(e *Env) {
	for _, limit := range []time.Duration{0, lock.MinBackoff, 3 * time.Millisecond, 50 * time.Millisecond, lock.DefaultMaxBackoff, 10 * time.Second} {
		hi := max(limit, lock.MinBackoff)
		for attempt := 0; attempt < 70; attempt++ {
			for i := 0; i < 50; i++ {
				if d := lock.Backoff(attempt, limit); d < lock.MinBackoff || d > hi {
					e.T.Fatalf("Backoff(%d, %s) = %s, outside [%s, %s]", attempt, limit, d, lock.MinBackoff, hi)
				}
			}
		}
	}
	// Exponential growth with full jitter, up to the cap.
	const limit, draws = time.Second, 2000
	prevMean := time.Duration(0)
	for attempt := 0; attempt < 12; attempt++ {
		ceil := min(limit, lock.MinBackoff<<attempt)
		var sum, lo, hi time.Duration
		lo = limit
		for i := 0; i < draws; i++ {
			d := lock.Backoff(attempt, limit)
			sum += d
			lo, hi = min(lo, d), max(hi, d)
		}
		mean := sum / draws
		e.Check(hi <= ceil, "attempt %d: draw %s above min(cap, %s·2^n) = %s", attempt, hi, lock.MinBackoff, ceil)
		if ceil > lock.MinBackoff {
			spread := ceil - lock.MinBackoff
			e.Check(hi >= ceil-spread/4 && lo <= lock.MinBackoff+spread/4, "attempt %d: draws span [%s, %s], want full jitter over [%s, %s]", attempt, lo, hi, lock.MinBackoff, ceil)
		}
		e.Check(ceil >= limit || attempt <= 0 || mean > prevMean, "attempt %d: mean wait %s did not grow from %s", attempt, mean, prevMean)
		prevMean = mean
	}
}

func w2PollIntervalCapped(e *Env) {
	ctx := e.Ctx()
	// The waiter's configured cap is huge; its TTL caps the waits instead.
	const waiterTTL = 200 * time.Millisecond
	holder := e.NewLocker(nil, lock.WithTTL(10*time.Second))
	waiter := e.NewLocker(nil, lock.WithTTL(waiterTTL), lock.WithMaxBackoff(time.Hour))
	h, err := holder.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "acquire")
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
	la, err := a.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "acquire")
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
	if r.err != nil {
		e.T.Fatalf("takeover of a crashed holder: %v", r.err)
	}
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
	la, err := a.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "acquire")
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
	la, err := a.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "acquire")
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

func w3NegativeWaitTimeout(e *Env) {
	ctx := e.Ctx()
	l := e.NewLocker(nil)
	_, err := l.Acquire(ctx, "k", lock.Exclusive, lock.WaitTimeout(-1500*time.Millisecond))
	var ie *lock.InputError
	e.Require(errors.Is(err, lock.ErrInvalidInput) && errors.As(err, &ie), "negative wait timeout = %v, want *InputError matching ErrInvalidInput", err)
	e.Check(strings.Contains(err.Error(), "-1.5s"), "error %q does not name the value -1.5s", err)
	called := false
	err = l.Do(ctx, "k", lock.Exclusive, func(context.Context, *lock.Lease) error { called = true; return nil }, lock.WaitTimeout(-time.Nanosecond))
	e.Check(errors.Is(err, lock.ErrInvalidInput) && !called, "Do with a negative wait timeout = %v (function called: %v), want ErrInvalidInput", err, called)
	if hs := holders(e, l, ""); len(hs) != 0 {
		e.T.Errorf("rejected input changed the database: %v", hs)
	}
	le, err := l.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "acquire after rejected input")
	_ = le.Release(ctx)
}

func w3BoundedByContext(e *Env) {
	ctx := e.Ctx()
	a := e.NewLocker(nil, lock.WithTTL(10*time.Second))
	b := e.NewLocker(nil, lock.WithTTL(10*time.Second))
	la, err := a.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "acquire")
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

// h6CloseEndsWaitingAcquires: Close ends acquires that wait for a key held
// by another Locker: they return ErrClosed before Close returns, having
// removed their pending-writer markers (and FIFO tickets), and no lease is
// granted to the closed Locker when the holder lets go.
func h6CloseEndsWaitingAcquires(e *Env) {
	ctx := e.Ctx()
	const ttl = time.Second
	l, err := e.TryNewLocker(nil, lock.WithTTL(ttl), lock.WithMaxBackoff(50*time.Millisecond))
	e.Must(err, "new locker")
	other := e.NewLocker(nil, lock.WithTTL(ttl))
	keys := []string{"x", "s"}
	fifo := dialect.CapabilitiesOf(e.Dialect).Has(dialect.CapFIFO)
	if fifo {
		keys = append(keys, "q")
	}
	var held []*lock.Lease
	for _, k := range keys {
		le, err := other.TryAcquire(ctx, k, lock.Exclusive)
		e.Must(err, "acquire %q", k)
		held = append(held, le)
	}
	type result struct {
		key string
		le  *lock.Lease
		err error
	}
	results := make(chan result, len(keys))
	var wg sync.WaitGroup
	start := func(key string, mode lock.Mode, opts ...lock.AcquireOption) {
		e.Go(&wg, func() {
			le, err := l.Acquire(ctx, key, mode, opts...)
			results <- result{key, le, err}
		})
	}
	start("x", lock.Exclusive) // writes a pending-writer marker
	start("s", lock.Shared)
	if fifo {
		start("q", lock.Exclusive, lock.FIFO()) // writes a ticket
	}
	// Wait until the writers' marker (and ticket) are in the table.
	want := 1
	if fifo {
		want = 2
	}
	if !Eventually(5*time.Second, func() bool {
		n := 0
		for _, h := range holders(e, other, "") {
			if h.Mode == lock.PendingWriter || h.Mode == lock.Queued {
				n++
			}
		}
		return n >= want
	}) {
		e.T.Fatalf("waiters never wrote their marker/ticket: %v", holders(e, other, ""))
	}
	time.Sleep(100 * time.Millisecond) // the shared waiter is polling too
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	began := time.Now()
	if err := l.Close(cctx); err != nil {
		e.T.Errorf("close: %v", err)
	}
	took := time.Since(began)
	if limit := 2*time.Second + lcSlack; took > limit {
		e.T.Errorf("close with waiting acquires took %v, want under %v", took, limit)
	}
	// Close waited for the acquires: each has returned, and its goroutine
	// hands the result over at once (the short grace covers only the
	// hand-over between Acquire's return and the send).
	for range keys {
		select {
		case r := <-results:
			if r.le != nil {
				e.T.Errorf("acquire %q on a closing Locker returned a lease (token %d)", r.key, r.le.Token())
				_ = r.le.Release(ctx)
			}
			e.Check(errors.Is(r.err, lock.ErrClosed), "acquire %q waiting during Close = %v, want ErrClosed", r.key, r.err)
		case <-time.After(time.Second):
			e.T.Errorf("Close returned while an acquire was still waiting")
			for _, le := range held {
				_ = le.Release(ctx)
			}
			wg.Wait()
			close(results)
			for r := range results {
				if r.le != nil {
					e.T.Errorf("acquire %q returned a lease after Close (token %d)", r.key, r.le.Token())
					_ = r.le.Release(ctx)
				}
			}
			return
		}
	}
	wg.Wait()
	for _, h := range holders(e, other, "") {
		e.Check(h.Mode != lock.PendingWriter && h.Mode != lock.Queued, "closed Locker's waiter left a row behind: %+v", h)
	}
	// The holder lets go: nothing is granted to the closed Locker.
	for _, le := range held {
		e.Must(le.Release(ctx), "release")
	}
	time.Sleep(300 * time.Millisecond)
	if hs := holders(e, other, ""); len(hs) != 0 {
		e.T.Errorf("rows after the holder released and the waiter's Locker closed: %v", hs)
	}
	if _, err := l.TryAcquire(ctx, "x", lock.Exclusive); !errors.Is(err, lock.ErrClosed) {
		e.T.Errorf("acquire after Close = %v, want ErrClosed", err)
	}
}
