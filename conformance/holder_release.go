package conformance

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/sqlease/sqlease/internal/faultdb"
	"github.com/sqlease/sqlease/lock"
)

// The holder's view (docs/contract.md): bounded release (H5) and release always lets go (H8).
func init() {
	register(
		Case{Name: "H5_ReleaseWithCancelledContextDeletes", Rule: "H5", Run: h5ReleaseWithCancelledContext},
		Case{Name: "H5_ReleaseAgainstHangingDatabaseIsBounded", Rule: "H5", Run: h5ReleaseHangingBounded},
		Case{Name: "H5_ReleaseAfterTakeoverIsNotHeld", Rule: "H5", Run: h5ReleaseAfterTakeover},
		Case{Name: "H8_TransientReleaseErrorsRetried", Rule: "H8", Run: h8TransientReleaseErrorsRetried},
		Case{Name: "H8_FailedReleaseThenReacquireWithinTTL", Rule: "H8", Run: h8FailedReleaseThenReacquire},
		Case{Name: "H8_NoRenewalAfterReleaseWithRenewPoolExhausted", Rule: "H8", Run: h8NoRenewalAfterRelease},
		Case{Name: "H8_ReleaseOfGoneLeaseMarksLost", Rule: "H8", Run: h8ReleaseOfGoneLeaseMarksLost},
	)
}

func h5ReleaseWithCancelledContext(e *Env) {
	ctx := e.Ctx()
	l := e.NewLocker(nil, lock.WithTTL(5*time.Second))
	other := e.NewLocker(nil, lock.WithTTL(5*time.Second))
	le := e.MustTryAcquire(l, "k", lock.Exclusive)
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
	e.CheckErr(le.Release(ctx), "second release")
	e.CheckErr(le.Release(cancelled), "third release")
	o := e.MustTryAcquire(other, "k", lock.Exclusive)
	e.CheckErr(le.Release(ctx), "release after the key was granted again")
	if hs := holders(e, l, "k"); len(hs) != 1 || hs[0].LeaseID != o.LeaseID() {
		e.T.Errorf("a repeated release touched the next holder: %v", hs)
	}
	_ = o.Release(ctx)

	// Do whose caller context is cancelled inside the function releases too.
	dctx, dcancel := context.WithCancel(ctx)
	defer dcancel()
	e.CheckErr(l.Do(dctx, "d", lock.Exclusive, func(context.Context, *lock.Lease) error {
		dcancel()
		return nil
	}), "Do with its context cancelled inside")
	if hs := holders(e, l, "d"); len(hs) != 0 {
		e.T.Errorf("Do with a cancelled context did not release: %v", hs)
	}
}

func h5ReleaseHangingBounded(e *Env) {
	ctx := e.Ctx()
	const ttl, releaseTimeout = 900 * time.Millisecond, 300 * time.Millisecond
	l := e.NewLocker(nil, lock.WithTTL(ttl), lock.WithReleaseTimeout(releaseTimeout))
	other := e.NewLocker(e.OpenDB(), lock.WithTTL(ttl))
	le := e.MustTryAcquire(l, "k", lock.Exclusive)
	remove := e.Faults.Add(faultdb.Rule{Match: lcRendered(e, "Release", e.Dialect.Statements().Release), Action: faultdb.Hang})
	start := time.Now()
	err := le.Release(ctx)
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
	la := e.MustTryAcquire(a, "k", lock.Exclusive)
	la.Orphan()
	lb := e.MustAcquire(b, "k", lock.Exclusive, lock.WaitTimeout(2*ttl+lcSlack))
	if err := la.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		e.T.Errorf("release of a lease taken over = %v, want ErrNotHeld", err)
	}
	if err := la.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		e.T.Errorf("second release of a lease taken over = %v, want ErrNotHeld again (idempotent)", err)
	}
	hs := holders(e, a, "k")
	e.Require(len(hs) == 1 && hs[0].LeaseID == lb.LeaseID() && hs[0].Token == lb.Token(), "stale release touched the successor: want only token %d, got %v", lb.Token(), hs)
	e.CheckErr(lb.Renew(ctx), "successor cannot renew after a stale release")
	e.CheckErr(lb.Err(), "successor's lease ended")
	e.CheckErr(lb.Release(ctx), "successor release")
}

// faultPool opens another pool to the case's database through e.Faults
// (so its statements are counted and can be faulted), with at most max
// connections; it is closed at cleanup.
func (e *Env) faultPool(max int) *sql.DB {
	e.T.Helper()
	raw, err := sql.Open(e.Config.DriverName, e.DSN)
	e.Must(err, "open %s", e.Config.DriverName)
	conn, err := faultdb.DSNConnector(raw.Driver(), e.DSN)
	_ = raw.Close()
	e.Must(err, "connector")
	db := sql.OpenDB(e.Faults.Connector(conn))
	db.SetMaxOpenConns(max)
	db.SetMaxIdleConns(max)
	e.T.Cleanup(func() { _ = db.Close() })
	return db
}

// h8TransientReleaseErrorsRetried: the release statement fails with a
// transient error several times in a row; Release retries, deletes the row
// and returns nil, and the same Locker takes the key again at once.
func h8TransientReleaseErrorsRetried(e *Env) {
	ctx := e.Ctx()
	l := e.NewLocker(nil, lock.WithTTL(2*time.Second))
	le := e.MustTryAcquire(l, "k", lock.Exclusive)
	release := lcRendered(e, "Release", e.Dialect.Statements().Release)
	// Only a retry can succeed: the first four attempts fail.
	remove := e.Faults.Add(faultdb.Rule{Match: release, Action: faultdb.Fail, Err: lcTransientError(e), Times: 4})
	err := le.Release(ctx)
	remove()
	e.Require(err == nil, "release with 4 transient failures = %v, want retried to success", err)
	if hs := holders(e, l, "k"); len(hs) != 0 {
		e.T.Errorf("rows left after a retried release: %v", hs)
	}
	e.Check(errors.Is(context.Cause(le.Context()), lock.ErrReleased), "lease context cause %v, want ErrReleased", context.Cause(le.Context()))
	again := e.MustTryAcquire(l, "k", lock.Exclusive)
	e.CheckErr(again.Release(ctx), "release")
}

// h8FailedReleaseThenReacquire: every release attempt fails until the
// release deadline. Release returns the error, the Locker no longer counts
// the key as held, no renewal keeps the row alive, and the same Locker is
// granted the key within one TTL.
func h8FailedReleaseThenReacquire(e *Env) {
	ctx := e.Ctx()
	const ttl, releaseTimeout = 900 * time.Millisecond, 300 * time.Millisecond
	l := e.NewLocker(nil, lock.WithTTL(ttl), lock.WithReleaseTimeout(releaseTimeout))
	le := e.MustTryAcquire(l, "k", lock.Exclusive)
	release := lcRendered(e, "Release", e.Dialect.Statements().Release)
	remove := e.Faults.Add(faultdb.Rule{Match: release, Action: faultdb.Fail, Err: lcTransientError(e)})
	start := time.Now()
	err := le.Release(ctx)
	took := time.Since(start)
	e.Check(err != nil && !errors.Is(err, lock.ErrNotHeld), "release failing until its deadline = %v, want the failure", err)
	e.Check(took <= releaseTimeout+lcSlack, "failing release took %s, want about the release timeout %s", took, releaseTimeout)
	e.Check(le.Err() != nil, "lease context still live after a failed release")
	// The same Locker waits for the row to expire and gets the key: no
	// ErrReentrant, and within one TTL of the release.
	again, err := l.Acquire(ctx, "k", lock.Exclusive, lock.WaitTimeout(ttl+lcSlack))
	remove()
	e.Must(err, "re-acquire from the same locker after a failed release")
	if d := time.Since(start); d > ttl+2*lcSlack {
		e.T.Errorf("re-acquired %s after the failed release, want within one TTL (%s)", d, ttl)
	}
	e.Check(again.Token() > le.Token(), "re-acquired token %d not above %d", again.Token(), le.Token())
	e.CheckErr(again.Release(ctx), "release after re-acquire")
	if hs := holders(e, l, "k"); len(hs) != 0 {
		e.T.Errorf("rows left: %v", hs)
	}
}

// h8NoRenewalAfterRelease: a renewal falls due while the renew pool's only
// connection is taken, so the renewer waits for it; the lease is released
// meanwhile. When the connection comes back, no renewal statement reaches
// the database.
func h8NoRenewalAfterRelease(e *Env) {
	ctx := e.Ctx()
	const ttl = 900 * time.Millisecond
	renewDB := e.faultPool(1)
	l := e.NewLocker(nil, lock.WithTTL(ttl), lock.WithRenewDB(renewDB))
	le := e.MustTryAcquire(l, "k", lock.Exclusive)
	conn, err := renewDB.Conn(ctx)
	e.Must(err, "take the renew pool's connection")
	var one int
	e.Must(conn.QueryRowContext(ctx, "SELECT 1").Scan(&one), "query on the held connection")
	renewals := func() int {
		n := 0
		for _, text := range lcRenewalSQL(e) {
			n += e.Faults.Count(text)
		}
		return n
	}
	before := renewals()
	time.Sleep(ttl/3 + ttl/10) // the renewal is due and waits for the connection
	e.Must(le.Release(ctx), "release")
	released := renewals()
	_ = conn.Close() // the renewer gets the connection now
	time.Sleep(ttl / 2)
	after := renewals()
	if before != released {
		e.T.Logf("a renewal was sent before Release returned (%d statements)", released-before)
	}
	e.Check(after == released, "%d renewal statements reached the database after Release returned", after-released)
	e.CheckErr(renewDB.PingContext(ctx), "renew pool unusable afterwards")
	if again, err := l.TryAcquire(ctx, "k", lock.Exclusive); err != nil {
		e.T.Errorf("re-acquire: %v", err)
	} else {
		_ = again.Release(ctx)
	}
}

// h8ReleaseOfGoneLeaseMarksLost: the lease row disappears (deleted behind
// the holder's back) before the renewer notices; Release reports
// ErrNotHeld, again when called again (idempotent, SPEC H5), and the lease
// reports the loss (Err, Context cause).
func h8ReleaseOfGoneLeaseMarksLost(e *Env) {
	ctx := e.Ctx()
	l := e.NewLocker(nil, lock.WithTTL(3*time.Second))
	le := e.MustTryAcquire(l, "k", lock.Exclusive)
	holders := e.Namespace.Object(e.Dialect, "holders")
	if _, err := e.DB.ExecContext(ctx, "DELETE FROM "+holders+" WHERE lease_id = "+e.Dialect.Placeholder(1), le.LeaseID()); err != nil {
		e.T.Fatalf("delete lease row: %v", err)
	}
	err := le.Release(ctx)
	e.Check(errors.Is(err, lock.ErrNotHeld), "release of a deleted lease = %v, want ErrNotHeld", err)
	wantLost(e, "lease.Err after release found the row gone", le.Err(), le)
	wantLost(e, "context cause", context.Cause(le.Context()), le)
	if err := le.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		e.T.Errorf("second release = %v, want ErrNotHeld again (idempotent)", err)
	}
	again := e.MustTryAcquire(l, "k", lock.Exclusive)
	_ = again.Release(ctx)
}
