package conformance

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/sqlease/sqlease/internal/faultdb"
	"github.com/sqlease/sqlease/lock"
)

// H8: Release always lets go.
func init() {
	register(
		Case{Name: "H8_TransientReleaseErrorsRetried", Rule: "H8", Run: h8TransientReleaseErrorsRetried},
		Case{Name: "H8_FailedReleaseThenReacquireWithinTTL", Rule: "H8", Run: h8FailedReleaseThenReacquire},
		Case{Name: "H8_NoRenewalAfterReleaseWithRenewPoolExhausted", Rule: "H8", Run: h8NoRenewalAfterRelease},
		Case{Name: "H8_ReleaseOfGoneLeaseMarksLost", Rule: "H8", Run: h8ReleaseOfGoneLeaseMarksLost},
	)
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
	le, err := l.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "acquire")
	release := lcRendered(e, "Release", e.Dialect.Statements().Release)
	// Only a retry can succeed: the first four attempts fail.
	remove := e.Faults.Add(faultdb.Rule{Match: release, Action: faultdb.Fail, Err: lcTransientError(e), Times: 4})
	err = le.Release(ctx)
	remove()
	e.Require(err == nil, "release with 4 transient failures = %v, want retried to success", err)
	if hs := holders(e, l, "k"); len(hs) != 0 {
		e.T.Errorf("rows left after a retried release: %v", hs)
	}
	e.Check(errors.Is(context.Cause(le.Context()), lock.ErrReleased), "lease context cause %v, want ErrReleased", context.Cause(le.Context()))
	again, err := l.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "re-acquire from the same locker after the release")
	if err := again.Release(ctx); err != nil {
		e.T.Errorf("release: %v", err)
	}
}

// h8FailedReleaseThenReacquire: every release attempt fails until the
// release deadline. Release returns the error, the Locker no longer counts
// the key as held, no renewal keeps the row alive, and the same Locker is
// granted the key within one TTL.
func h8FailedReleaseThenReacquire(e *Env) {
	ctx := e.Ctx()
	const ttl, releaseTimeout = 900 * time.Millisecond, 300 * time.Millisecond
	l := e.NewLocker(nil, lock.WithTTL(ttl), lock.WithReleaseTimeout(releaseTimeout))
	le, err := l.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "acquire")
	release := lcRendered(e, "Release", e.Dialect.Statements().Release)
	remove := e.Faults.Add(faultdb.Rule{Match: release, Action: faultdb.Fail, Err: lcTransientError(e)})
	start := time.Now()
	err = le.Release(ctx)
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
	if err := again.Release(ctx); err != nil {
		e.T.Errorf("release after re-acquire: %v", err)
	}
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
	le, err := l.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "acquire")
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
	if err := renewDB.PingContext(ctx); err != nil {
		e.T.Errorf("renew pool unusable afterwards: %v", err)
	}
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
	le, err := l.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "acquire")
	holders := e.Namespace.Object(e.Dialect, "holders")
	if _, err := e.DB.ExecContext(ctx, "DELETE FROM "+holders+" WHERE lease_id = "+e.Dialect.Placeholder(1), le.LeaseID()); err != nil {
		e.T.Fatalf("delete lease row: %v", err)
	}
	err = le.Release(ctx)
	e.Check(errors.Is(err, lock.ErrNotHeld), "release of a deleted lease = %v, want ErrNotHeld", err)
	wantLost(e, "lease.Err after release found the row gone", le.Err(), le)
	wantLost(e, "context cause", context.Cause(le.Context()), le)
	if err := le.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		e.T.Errorf("second release = %v, want ErrNotHeld again (idempotent)", err)
	}
	again, err := l.TryAcquire(ctx, "k", lock.Exclusive)
	e.Must(err, "re-acquire")
	_ = again.Release(ctx)
}
