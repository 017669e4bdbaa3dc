package conformance

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/internal/faultdb"
	"github.com/sqlease/sqlease/lock"
)

// The holder's view (docs/contract.md): deadlines hold (H9).
func init() {
	register(
		Case{Name: "H9_DeadlineHoldsWithHungStatement", Rule: "H9", Run: h9HungStatement},
		Case{Name: "H9_DeadlineHoldsWhileTakeoverIsBlocked", Rule: "H9", Run: h9TakeoverBlocked},
		Case{Name: "H9_GrantedWhileConnectionsAreCut", Rule: "H9", Run: h9ConnectionsCut},
		Case{Name: "H9_DeadlineHoldsWhileApplicationHoldsWriteLock", Rule: "H9", Run: h9WriteLockHeld},
	)
}

// h9WriteLockHeld (databases with one writer): the application holds the
// database write lock in its own transaction; Acquire of a free key with a
// 2 s deadline (context, then WaitTimeout) returns by the deadline (see
// h9AcquireBothWays for the bound) instead of sitting in the driver's busy
// handler, leaves nothing behind, and is granted once the application
// commits.
func h9WriteLockHeld(e *Env) {
	if dialect.CapabilitiesOf(e.Dialect).Has(dialect.CapConcurrentWriters) {
		e.T.Skipf("dialect %q has %s: one transaction's write does not block another's", e.Dialect.Name(), dialect.CapConcurrentWriters)
	}
	ctx := e.Ctx()
	const ttl = time.Second
	app := e.Table("app")
	if _, err := e.DB.ExecContext(ctx, "CREATE TABLE "+app+" (n BIGINT NOT NULL)"); err != nil {
		e.T.Fatalf("create table: %v", err)
	}
	l := e.NewLocker(nil, lock.WithTTL(ttl), lock.WithOwner("contender"))
	tx, err := e.OpenDB().BeginTx(ctx, nil)
	e.Must(err, "begin")
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "INSERT INTO "+app+" (n) VALUES (1)"); err != nil {
		e.T.Fatalf("application write: %v", err)
	}
	h9AcquireBothWays(e, l, "the application holds the write lock")
	e.Must(tx.Commit(), "application commit")
	h9NoRowsOf(e, l, l.Owner(), "after the application committed", false)
	got := e.MustAcquire(l, "k", lock.Exclusive, lock.WaitTimeout(2*time.Second))
	_ = got.Release(ctx)
}

// h9AcquireBothWays acquires "k" exclusively with l while the key is
// blocked as while says, once with a 2 s context deadline (want
// context.DeadlineExceeded) and once with WaitTimeout(2s) (want
// ErrLocked): each must be refused and return within 2 s + h9Slack +
// h9LoadAllowance. That bound still catches an acquire that waits in the
// driver's busy handler or lock wait (5 s in the DSNs sqlease uses and
// recommends) instead of giving up at its deadline.
func h9AcquireBothWays(e *Env, l *lock.Locker, while string) {
	e.T.Helper()
	ctx := e.Ctx()
	for _, c := range []struct {
		what string
		opts []lock.AcquireOption
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"Acquire with a 2s context deadline", nil, func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 2*time.Second) }, context.DeadlineExceeded},
		{"Acquire with WaitTimeout(2s)", []lock.AcquireOption{lock.WaitTimeout(2 * time.Second)}, func() (context.Context, context.CancelFunc) { return context.WithCancel(ctx) }, lock.ErrLocked},
	} {
		actx, cancel := c.ctx()
		start := time.Now()
		got, err := l.Acquire(actx, "k", lock.Exclusive, c.opts...)
		took := time.Since(start)
		cancel()
		if got != nil {
			e.T.Errorf("%s: granted while %s", c.what, while)
			_ = got.Release(ctx)
		}
		e.Check(errors.Is(err, c.want), "%s = %v, want an error matching %v", c.what, err, c.want)
		if took > 2*time.Second+h9Slack+h9LoadAllowance {
			e.T.Errorf("%s returned after %s, want within 2s + %s (+ %s for a loaded machine)", c.what, took, h9Slack, h9LoadAllowance)
		} else if took > 2*time.Second+h9Slack {
			e.T.Logf("%s returned after %s, over 2s + %s: a loaded machine?", c.what, took, h9Slack)
		}
	}
}

// h9Slack is the documented bound on how long a blocking acquire may
// return after its deadline (SPEC H9).
const h9Slack = 500 * time.Millisecond

// h9LoadAllowance is added to h9Slack where an acquire gives up through
// several steps (a statement cut short by its lock-wait bound, then the
// undo of what it may have written), each of which a loaded machine
// delays: the case returned after 2.67 s at load 15-18 on 2 cores.
const h9LoadAllowance = time.Second

// h9NoRowsOf fails the case when the database still has a lease or marker
// of owner: any, expired ones included, or with live only the ones still
// live in database time. "Nothing outlives one TTL" (SPEC H9) is checked
// with live one TTL after the acquire gave up: a statement the client
// abandoned may still commit a grant on the server afterwards (MySQL runs
// a cancelled CALL to its end once its lock wait ends), and that grant
// expires within one TTL of the give-up.
func h9NoRowsOf(e *Env, l *lock.Locker, owner, what string, live bool) {
	e.T.Helper()
	hs, now, err := l.Holders(e.Ctx(), "")
	e.Must(err, "holders")
	for _, h := range hs {
		e.Check(h.Owner != owner || live && !h.Expiry.After(now), "%s: a %s row of the contender is still there (database time %s): %v", what, h.Mode, now.UTC().Format("15:04:05.000000"), h)
	}
}

// h9HungStatement: every acquire statement hangs in the database. Acquire
// with a 2 s context deadline, and with a 2 s WaitTimeout, returns within
// 2.5 s; a TryAcquire with a 1 s context deadline within 1.5 s.
func h9HungStatement(e *Env) {
	ctx := e.Ctx()
	const ttl = time.Second
	l := e.NewLocker(nil, lock.WithTTL(ttl))
	release := make(chan struct{})
	var hits atomic.Int64
	remove := e.Faults.Add(faultdb.Rule{Match: lcAcquireSQL(e), Action: faultdb.Hang, Release: release, Hits: &hits})
	check := func(what string, bound time.Duration, acquire func() (*lock.Lease, error), want error) {
		e.T.Helper()
		start := time.Now()
		le, err := acquire()
		took := time.Since(start)
		if le != nil {
			e.T.Errorf("%s: granted while every acquire statement hangs", what)
			_ = le.Release(ctx)
		}
		e.Check(errors.Is(err, want), "%s = %v, want an error matching %v", what, err, want)
		e.Check(took <= bound+h9Slack, "%s returned after %s, want within %s + %s", what, took, bound, h9Slack)
	}
	check("Acquire with a 2s context deadline", 2*time.Second, func() (*lock.Lease, error) {
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return l.Acquire(c, "k", lock.Exclusive)
	}, context.DeadlineExceeded)
	check("Acquire with WaitTimeout(2s)", 2*time.Second, func() (*lock.Lease, error) {
		return l.Acquire(ctx, "k", lock.Exclusive, lock.WaitTimeout(2*time.Second))
	}, lock.ErrLocked)
	check("TryAcquire with a 1s context deadline", time.Second, func() (*lock.Lease, error) {
		c, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		return l.TryAcquire(c, "k", lock.Shared)
	}, context.DeadlineExceeded)
	e.Check(hits.Load() != 0, "scenario not exercised: no acquire statement reached the hang")
	close(release)
	remove()
	// The database recovered: the same Locker is granted the key, and
	// nothing of the abandoned attempts outlives one TTL.
	time.Sleep(ttl)
	h9NoRowsOf(e, l, l.Owner(), "one TTL after the abandoned acquires", true)
	le := e.MustTryAcquire(l, "k", lock.Exclusive)
	_ = le.Release(ctx)
}

// h9TakeoverBlocked: the holder's lease expires while its fenced
// transaction stays open, so the contender's takeover cannot commit (on
// PostgreSQL it waits for the row lock, on SQLite for the write lock).
// Acquire with a 2 s deadline (context, then WaitTimeout) returns within
// 2.5 s and leaves no row or marker beyond one TTL.
func h9TakeoverBlocked(e *Env) {
	ctx := e.Ctx()
	// The holder's TTL bounds its fenced transaction's idle time
	// (CapFenceIdleTimeout): 1 s leaves keepBusy's pings room on a loaded
	// machine.
	const ttl, holderTTL = 300 * time.Millisecond, time.Second
	holder := e.NewLocker(e.OpenDB(), lock.WithTTL(holderTTL))
	contender := e.NewLocker(nil, lock.WithTTL(ttl), lock.WithOwner("contender"))
	le := e.MustTryAcquire(holder, "k", lock.Exclusive)
	tx, err := holder.DB().BeginTx(ctx, nil)
	e.Must(err, "begin")
	defer tx.Rollback()
	e.Must(le.Fence(ctx, tx), "fence")
	// Busy, as a live holder's: an idle one would be ended by the
	// database (CapFenceIdleTimeout, F1_StoppedHolder...).
	stopBusy := keepBusy(ctx, tx)
	defer stopBusy()
	le.Orphan() // it expires while the fenced transaction stays open
	time.Sleep(holderTTL)
	h9AcquireBothWays(e, contender, "the fenced transaction holds the expired lease")
	stopBusy()
	_ = tx.Rollback()
	time.Sleep(ttl + ttl/2)
	h9NoRowsOf(e, contender, contender.Owner(), "one TTL after the contender gave up", true)
	got := e.MustAcquire(contender, "k", lock.Exclusive, lock.WaitTimeout(2*time.Second))
	_ = got.Release(ctx)
}

// h9ConnectionsCut: every 150 ms the next statement on the contender's
// pool runs but loses its reply and its connection (unexpected EOF). A
// blocking Acquire with a 6 s WaitTimeout keeps waiting through the cuts
// and is granted after the holder releases, well before its deadline.
func h9ConnectionsCut(e *Env) {
	ctx := e.Ctx()
	const ttl = 2 * time.Second
	holder := e.NewLocker(e.OpenDB(), lock.WithTTL(ttl))
	// Frequent polls, so that many of the contender's statements are cut.
	contender := e.NewLocker(nil, lock.WithTTL(ttl), lock.WithMaxBackoff(50*time.Millisecond))
	le := e.MustTryAcquire(holder, "k", lock.Exclusive)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var cuts atomic.Int64 // statements that lost their reply and connection
	e.Go(&wg, func() {
		// At most one cut is pending at a time: the next statement after
		// each tick loses its reply and its connection.
		t := time.NewTicker(150 * time.Millisecond)
		defer t.Stop()
		remove := func() {}
		defer func() { remove() }()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			remove()
			remove = e.Faults.Add(faultdb.Rule{Action: faultdb.DropReply, Err: io.ErrUnexpectedEOF, Times: 1, Hits: &cuts})
		}
	})
	releasedAt := make(chan time.Time, 1)
	e.Go(&wg, func() {
		time.Sleep(time.Second)
		e.CheckErr(le.Release(ctx), "holder release")
		releasedAt <- time.Now()
	})
	start := time.Now()
	got, err := contender.Acquire(ctx, "k", lock.Exclusive, lock.WaitTimeout(6*time.Second))
	took := time.Since(start)
	close(stop)
	wg.Wait()
	e.Faults.Reset()
	e.Require(err == nil, "acquire while connections are cut = %v after %s, want granted", err, took)
	e.Check(took <= 5*time.Second, "granted only after %s; the holder released after about 1s", took)
	e.T.Logf("granted after %s, %d connections cut; holder released at +%s", took, cuts.Load(), (<-releasedAt).Sub(start).Round(time.Millisecond))
	e.Check(cuts.Load() >= 2, "scenario not exercised: only %d cuts", cuts.Load())
	// After the faults: the lease works, and nothing else is left.
	e.CheckErr(got.Renew(ctx), "renew after the cuts")
	e.CheckErr(got.Release(ctx), "release after the cuts")
	var rows []lock.Holder
	e.Check(Eventually(ttl+lcSlack, func() bool {
		hs, _, err := contender.Holders(ctx, "")
		rows = hs
		return err == nil && len(hs) == 0
	}), "rows left one TTL after the release: %v", rows)
	e.CheckErr(e.DB.PingContext(ctx), "pool unusable after the cuts")
}
