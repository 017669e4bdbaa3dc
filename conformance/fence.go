package conformance

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/lock"
)

// Cases of fenced writes (SPEC F1, F2).
func init() {
	register(
		Case{Name: "F1_FencedTxOnLiveLeaseCommits", Rule: "F1", Run: f1LiveLeaseCommits},
		Case{Name: "F2_LossDuringFencedTxRollsBack", Rule: "F2", Run: f2LossDuringTx},
		Case{Name: "F2_StaleTokenRejectedByGuardedTable", Rule: "F2", Run: f2StaleTokenRejected},
		Case{Name: "F2_FencedCounterAcrossProcesses", Rule: "F2", Run: f2FencedCounter},
	)
	for _, c := range f1FenceCases {
		register(Case{Name: c.name, Rule: "F1", Needs: c.needs, Run: c.run})
	}
	for _, c := range f2StaleCases {
		register(Case{Name: c.name, Rule: "F2", Run: c.run})
	}
}

// errStaleToken: a guarded write found a larger token already stored.
var errStaleToken = errors.New("guarded write rejected: a larger token is stored")

// queryRower is a *sql.DB, *sql.Tx or *sql.Conn.
type queryRower interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// execQueryRower is a *sql.DB, *sql.Tx or *sql.Conn.
type execQueryRower interface {
	queryRower
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// guardedTable is a resource protected by fencing tokens: one row (id 1)
// with a counter n and the last token that wrote it.
type guardedTable struct {
	table string
	d     dialect.Dialect
}

// createGuarded creates the guarded table (table is a quoted name) with its
// row at n = 0, last_token = 0.
func createGuarded(ctx context.Context, db *sql.DB, d dialect.Dialect, table string) (guardedTable, error) {
	if _, err := db.ExecContext(ctx, `CREATE TABLE `+table+` (id INTEGER NOT NULL PRIMARY KEY, n BIGINT NOT NULL, last_token BIGINT NOT NULL)`); err != nil {
		return guardedTable{}, err
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO `+table+` (id, n, last_token) VALUES (1, 0, 0)`); err != nil {
		return guardedTable{}, err
	}
	return guardedTable{table: table, d: d}, nil
}

// newGuarded creates the case-owned guarded table "guarded".
func newGuarded(e *Env) guardedTable {
	e.T.Helper()
	g, err := createGuarded(e.Ctx(), e.DB, e.Dialect, e.Table("guarded"))
	e.Must(err, "create guarded table")
	return g
}

// inc increments the counter if no larger token wrote it before (the
// token pattern: WHERE stored token <= our token), and returns the new n.
// It returns errStaleToken when the row refused the token.
func (g guardedTable) inc(ctx context.Context, q execQueryRower, token int64) (int64, error) {
	// Portable SQL only: no RETURNING, each placeholder bound once.
	res, err := q.ExecContext(ctx, `UPDATE `+g.table+` SET n = n + 1, last_token = `+g.d.Placeholder(1)+
		` WHERE id = 1 AND last_token <= `+g.d.Placeholder(2), token, token)
	if err != nil {
		return 0, err
	}
	if n, err := res.RowsAffected(); err != nil {
		return 0, err
	} else if n == 0 {
		return 0, errStaleToken
	}
	var n int64
	err = q.QueryRowContext(ctx, `SELECT n FROM `+g.table+` WHERE id = 1`).Scan(&n)
	return n, err
}

// read returns the counter and the last token.
func (g guardedTable) read(ctx context.Context, q queryRower) (n, last int64, err error) {
	err = q.QueryRowContext(ctx, `SELECT n, last_token FROM `+g.table+` WHERE id = 1`).Scan(&n, &last)
	return n, last, err
}

// expect fails the case unless the guarded row holds n and last.
func (g guardedTable) expect(e *Env, what string, n, last int64) {
	e.T.Helper()
	gn, gl, err := g.read(e.Ctx(), e.DB)
	e.Must(err, "%s: read guarded row", what)
	e.Check(gn == n && gl == last, "%s: guarded row n=%d last_token=%d, want n=%d last_token=%d", what, gn, gl, n, last)
}

// incIn returns a RunInTx function that increments the guarded row with
// lease's token.
func (g guardedTable) incIn(lease *lock.Lease, called *bool) func(context.Context, *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		if called != nil {
			*called = true
		}
		_, err := g.inc(ctx, tx, lease.Token())
		return err
	}
}

// wantLost fails the case unless err reports the loss of le (nil: of any
// lease): a *LeaseLostError matching ErrLeaseLost, not a plain
// cancellation, naming le's lease ID, token and key. It returns the error,
// or nil when err is no such error.
func wantLost(e *Env, what string, err error, le *lock.Lease) *lock.LeaseLostError {
	e.T.Helper()
	var lost *lock.LeaseLostError
	switch {
	case err == nil:
		e.T.Errorf("%s: no loss reported", what)
		return nil
	case err == context.Canceled || err == context.DeadlineExceeded || errors.Is(err, context.Canceled):
		// (A loss may wrap the last renewal's statement timeout.)
		e.T.Errorf("%s: loss reported as a plain cancellation: %v", what, err)
	case !errors.Is(err, lock.ErrLeaseLost):
		e.T.Errorf("%s: want an error matching ErrLeaseLost, got %v", what, err)
	}
	if !errors.As(err, &lost) {
		e.T.Errorf("%s: want a *LeaseLostError, got %T: %v", what, err, err)
		return nil
	}
	if le != nil && (lost.LeaseID != le.LeaseID() || lost.Token != le.Token() || lost.Key != le.Key()) {
		e.T.Errorf("%s: loss names lease %q token %d key %q, want %q token %d key %q", what, lost.LeaseID, lost.Token, lost.Key, le.LeaseID(), le.Token(), le.Key())
	}
	return lost
}

// fenceManually begins a transaction, fences it with lease and returns the
// fence's error after rolling the transaction back.
func fenceManually(e *Env, lease *lock.Lease) error {
	e.T.Helper()
	tx, err := e.DB.BeginTx(e.Ctx(), nil)
	e.Must(err, "begin")
	defer tx.Rollback()
	return lease.Fence(e.Ctx(), tx)
}

// f1LiveLeaseCommits: a fence on a live lease succeeds, RunInTx commits the
// function's writes (exclusive and shared leases), a function error rolls
// back, and the lease stays held.
func f1LiveLeaseCommits(e *Env) {
	ctx := e.Ctx()
	g := newGuarded(e)
	l := e.NewLocker(nil)
	x, err := l.TryAcquire(ctx, "f1/live", lock.Exclusive)
	e.Must(err, "acquire")
	e.Must(x.RunInTx(ctx, e.DB, nil, g.incIn(x, nil)), "RunInTx on a live lease")
	g.expect(e, "after RunInTx", 1, x.Token())
	// Fence in the caller's own transaction.
	tx, err := e.DB.BeginTx(ctx, nil)
	e.Must(err, "begin")
	if err := x.Fence(ctx, tx); err != nil {
		_ = tx.Rollback()
		e.T.Fatalf("Fence on a live lease: %v", err)
	}
	if _, err := g.inc(ctx, tx, x.Token()); err != nil {
		_ = tx.Rollback()
		e.T.Fatalf("write after fence: %v", err)
	}
	e.Must(tx.Commit(), "commit")
	g.expect(e, "after Fence+commit", 2, x.Token())
	// The function's error rolls back and is returned as is.
	boom := errors.New("boom")
	err = x.RunInTx(ctx, e.DB, nil, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := g.inc(ctx, tx, x.Token()); err != nil {
			return err
		}
		return boom
	})
	e.Check(errors.Is(err, boom) && !errors.Is(err, lock.ErrLeaseLost), "RunInTx with a failing function: want its error, got %v", err)
	g.expect(e, "after a failed function", 2, x.Token())
	e.CheckErr(x.Err(), "lease ended by fenced transactions")
	e.Must(x.Release(ctx), "release")
	// Shared leases fence too.
	var shared []*lock.Lease
	for i := range 2 {
		s, err := e.NewLocker(nil).TryAcquire(ctx, "f1/live", lock.Shared)
		e.Must(err, "shared %d", i)
		defer s.Release(ctx)
		shared = append(shared, s)
	}
	for i, s := range shared {
		e.CheckErr(s.RunInTx(ctx, e.DB, nil, g.incIn(s, nil)), "RunInTx on shared lease %d", i)
	}
	g.expect(e, "after shared writes", 4, shared[1].Token())
}

// f2Stale is the shape of the F2 cases whose lease goes stale underneath
// its handle: neither RunInTx (its function is not even run) nor Fence of
// the stale handle writes anything, the handle learns of the loss, the
// successor writes, and once released the successor cannot write either
// (ErrNotHeld, the caller's mistake, never ErrLeaseLost).
type f2Stale struct {
	name, key string
	// stale acquires a lease on key, makes it stale and returns it with
	// its successor and the guarded row (n, last) they left.
	stale func(e *Env, g guardedTable, key string) (x, y *lock.Lease, n, last int64)
	// reason is the loss reason RunInTx must report ("": any).
	reason lock.LossReason
}

var f2StaleCases = []f2Stale{
	// A lease whose row was deleted underneath (as a takeover or sweep
	// does) cannot fence, though its handle still trusts it.
	{name: "F2_FenceAfterLeaseDeletedCommitsNothing", key: "f2/deleted", reason: lock.LossFenceFailed,
		stale: func(e *Env, g guardedTable, key string) (x, y *lock.Lease, n, last int64) {
			x, err := e.NewLocker(nil).TryAcquire(e.Ctx(), key, lock.Exclusive)
			e.Must(err, "acquire")
			holders := e.Namespace.Object(e.Dialect, "holders")
			_, err = e.OpenDB().ExecContext(e.Ctx(), `DELETE FROM `+holders+` WHERE lease_id = `+e.Dialect.Placeholder(1), x.LeaseID())
			e.Must(err, "delete lease row")
			// A successor takes the key while the stale handle still trusts it.
			y, err = e.NewLocker(nil).TryAcquire(e.Ctx(), key, lock.Exclusive)
			e.Must(err, "successor after the row was deleted")
			e.Require(x.Err() == nil && x.Remaining() > 0, "stale handle already knows (err %v, remaining %s); the case needs it unaware", x.Err(), x.Remaining())
			return x, y, 0, 0
		}},
	// An orphaned lease that wrote, expired and was taken over.
	{name: "F2_TakenOverLeaseCannotWrite", key: "f2/taken-over",
		stale: func(e *Env, g guardedTable, key string) (x, y *lock.Lease, n, last int64) {
			x, err := e.NewLocker(nil, lock.WithTTL(500*time.Millisecond)).TryAcquire(e.Ctx(), key, lock.Exclusive)
			e.Must(err, "acquire")
			e.Must(x.RunInTx(e.Ctx(), e.DB, nil, g.incIn(x, nil)), "write while live")
			x.Orphan()
			y, err = e.NewLocker(nil, lock.WithMaxBackoff(20*time.Millisecond)).Acquire(e.Ctx(), key, lock.Exclusive, lock.WaitTimeout(5*time.Second))
			e.Must(err, "takeover")
			e.Check(y.Token() > x.Token(), "successor token %d not above %d", y.Token(), x.Token())
			return x, y, 1, x.Token()
		}},
}

func (c f2Stale) run(e *Env) {
	ctx := e.Ctx()
	g := newGuarded(e)
	x, y, n, last := c.stale(e, g, c.key)
	defer y.Release(ctx)
	called := false
	if lle := wantLost(e, "RunInTx of the stale lease", x.RunInTx(ctx, e.DB, nil, g.incIn(x, &called)), x); lle != nil && c.reason != "" {
		e.Check(lle.Reason == c.reason, "loss reason %q, want %q", lle.Reason, c.reason)
	}
	e.Check(!called, "RunInTx ran the function although the fence failed")
	e.Check(errors.Is(x.Err(), lock.ErrLeaseLost), "handle after a failed fence: Err() = %v, want ErrLeaseLost (SPEC H3)", x.Err())
	select {
	case <-x.Done():
	default:
		e.T.Errorf("handle's context not ended after a failed fence")
	}
	wantLost(e, "Fence of the stale lease", fenceManually(e, x), x)
	g.expect(e, "after the stale lease tried to write", n, last)
	e.Must(y.RunInTx(ctx, e.DB, nil, g.incIn(y, nil)), "successor's fenced write")
	g.expect(e, "after the successor's write", n+1, y.Token())
	e.Must(y.Release(ctx), "release")
	called = false
	for what, err := range map[string]error{
		"RunInTx after Release": y.RunInTx(ctx, e.DB, nil, g.incIn(y, &called)),
		"Fence after Release":   fenceManually(e, y),
	} {
		e.Check(errors.Is(err, lock.ErrNotHeld) && !errors.Is(err, lock.ErrLeaseLost), "%s: %v, want ErrNotHeld and not ErrLeaseLost", what, err)
	}
	e.Check(!called, "RunInTx ran the function of a released lease")
	g.expect(e, "after writes of a released lease", n+1, y.Token())
}

// f2LossDuringTx: the lease is lost while the fenced function runs (its
// trusted window ends); RunInTx reports the loss and commits nothing.
func f2LossDuringTx(e *Env) {
	ctx := e.Ctx()
	g := newGuarded(e)
	l := e.NewLocker(nil, lock.WithTTL(time.Second))
	x, err := l.TryAcquire(ctx, "f2/loss-in-tx", lock.Exclusive)
	e.Must(err, "acquire")
	x.Orphan()
	wrote := false
	err = x.RunInTx(ctx, e.DB, nil, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := g.inc(ctx, tx, x.Token()); err != nil {
			return err
		}
		wrote = true
		select {
		case <-x.Done():
		case <-time.After(5 * time.Second):
			return errors.New("lease not lost 5 s after Orphan with a 1 s TTL")
		}
		return nil
	})
	e.Require(wrote, "fenced function did not write (fence on a live lease failed?): %v", err)
	wantLost(e, "RunInTx whose lease was lost before commit", err, x)
	g.expect(e, "after the lost transaction", 0, 0)
}

// f2StaleTokenRejectedByGuardedTable: for a resource outside the lock
// tables (no fence), the token pattern — write only WHERE stored token <=
// our token — rejects a stale holder's write after a successor wrote.
func f2StaleTokenRejected(e *Env) {
	ctx := e.Ctx()
	g := newGuarded(e)
	const key = "f2/token"
	l1 := e.NewLocker(nil, lock.WithTTL(300*time.Millisecond))
	l2 := e.NewLocker(nil, lock.WithMaxBackoff(20*time.Millisecond))
	x := e.MustTryAcquire(l1, key, lock.Exclusive)
	ext := e.OpenDB() // the "other" resource: written without a fence
	if _, err := g.inc(ctx, ext, x.Token()); err != nil {
		e.T.Fatalf("first holder's write: %v", err)
	}
	x.Orphan() // the first holder pauses and loses the lease
	y := e.MustAcquire(l2, key, lock.Exclusive, lock.WaitTimeout(5*time.Second))
	defer y.Release(ctx)
	e.Require(y.Token() > x.Token(), "successor token %d not above %d", y.Token(), x.Token())
	if _, err := g.inc(ctx, ext, y.Token()); err != nil {
		e.T.Fatalf("successor's write: %v", err)
	}
	// The stale holder wakes up and writes with its old token.
	if _, err := g.inc(ctx, ext, x.Token()); !errors.Is(err, errStaleToken) {
		e.T.Errorf("stale holder's write with token %d after token %d: want rejected, got %v", x.Token(), y.Token(), err)
	}
	g.expect(e, "after the stale write", 2, y.Token())
	// The current holder may write again with the same token.
	if _, err := g.inc(ctx, ext, y.Token()); err != nil {
		e.T.Errorf("current holder's second write: %v", err)
	}
	g.expect(e, "after the current holder's second write", 3, y.Token())
}

// LockInspector is an optional interface of the Dialect under test: it lets
// the fence cases also watch the server's lock table, to report which
// session a takeover waits for. Without it the cases prove the same
// behaviour from outcomes and timing alone (a takeover is not granted
// while the fenced transaction is open), so implementing it is never
// required. The built-in PostgreSQL dialect implements it (MariaDB's
// information_schema does not list every InnoDB lock wait, so the MySQL
// dialect does not).
type LockInspector interface {
	// SessionID returns the server's ID of the session (connection) that
	// runs tx (PostgreSQL: pg_backend_pid(); MySQL: CONNECTION_ID()).
	SessionID(ctx context.Context, tx *sql.Tx) (int64, error)
	// BlockedBy returns the ID of one session waiting for a lock that
	// session holds, and false when none waits.
	BlockedBy(ctx context.Context, db *sql.DB, session int64) (waiter int64, ok bool, err error)
}

// waitBlocked waits until a session is blocked by session, and returns it.
func waitBlocked(ctx context.Context, in LockInspector, mon *sql.DB, session int64, until time.Time) (int64, bool) {
	var waiter int64
	ok := Eventually(time.Until(until), func() bool {
		w, ok, err := in.BlockedBy(ctx, mon, session)
		waiter = w
		return err == nil && ok
	})
	return waiter, ok
}

// grantResult is the outcome of an Acquire run in a goroutine, with the
// time it returned.
type grantResult struct {
	lease *lock.Lease
	err   error
	at    time.Time
}

// f1Fence is the shape of the F1 cases whose fence keeps a takeover out:
// the holder fences a transaction and writes in it, then its lease expires
// underneath the open transaction (Orphan); a takeover is not granted
// while the transaction stays open (hold) and is granted once it commits,
// with a greater token; the fenced write committed, the old lease cannot
// write and the successor can.
type f1Fence struct {
	name, key string
	needs     dialect.Capabilities
	// hold is how long the fenced transaction stays open after the fence.
	hold time.Duration
	// fenced and takeover configure the two Lockers.
	fenced, takeover []lock.Option
	// inspect: watch the dialect's LockInspector (if any) for the
	// takeover's session waiting for the fenced one.
	inspect bool
	// whileOpen runs in the open fenced transaction before the lease is
	// orphaned; the stop it returns runs before the commit.
	whileOpen func(e *Env, x *lock.Lease, tx *sql.Tx) (stop func())
}

var f1FenceCases = []f1Fence{
	// CapRowLockFence: the fence holds a lock on the lease's row that a
	// takeover needs and a renewal does not (PostgreSQL FOR KEY SHARE;
	// MySQL a shared lock on a row that renewals do not update). TTL 1 s:
	// its renew timeout (TTL/3) leaves a few tries of 333 ms within the
	// trusted window through PgBouncer under the race detector (at 500 ms,
	// three tries of 166 ms timed out once in CI); the fenced transaction
	// stays open well past the TTL. The takeover's grant statement waits
	// for the fence; its trusted window counts from when it was sent (SPEC
	// H1), so its TTL must outlast that wait.
	{name: "F1_RowLockFenceBlocksTakeoverNotRenewal", key: "f1/row-lock", needs: dialect.CapRowLockFence, hold: 3 * time.Second, inspect: true,
		fenced:    []lock.Option{lock.WithTTL(time.Second), lock.WithRenewTimeout(time.Second / 3), lock.WithOwner("f1-fenced")},
		takeover:  []lock.Option{lock.WithTTL(10 * time.Second), lock.WithOwner("f1-takeover"), lock.WithMaxBackoff(20 * time.Millisecond)},
		whileOpen: f1RenewWhileFenced},
	// CapWriteLockFence (SQLite): the fence takes the database write lock,
	// so a takeover cannot commit while the fenced transaction is open
	// (hold: five TTLs, long expired).
	{name: "F1_WriteLockFenceBlocksTakeover", key: "f1/write-lock", needs: dialect.CapWriteLockFence, hold: 1500 * time.Millisecond,
		fenced:   []lock.Option{lock.WithTTL(300 * time.Millisecond), lock.WithOwner("f1-fenced")},
		takeover: []lock.Option{lock.WithOwner("f1-takeover"), lock.WithMaxBackoff(20 * time.Millisecond)}},
}

// f1RenewWhileFenced keeps the fenced transaction busy as a live holder's
// (an idle one is ended by CapFenceIdleTimeout; see F1_StoppedHolder...)
// and checks that renewal is not blocked by the fence: a renewal statement
// is bounded by the renew timeout (TTL/3), so a blocked one would fail
// every try.
func f1RenewWhileFenced(e *Env, x *lock.Lease, tx *sql.Tx) (stop func()) {
	stopBusy := keepBusy(e.Ctx(), tx)
	before := x.Expiry()
	var renewErrs []error
	for try := 0; ; try++ {
		start := time.Now()
		err := x.Renew(e.Ctx())
		took := time.Since(start)
		if err == nil {
			e.Check(took < 500*time.Millisecond, "renewal took %s during the fenced transaction, want < 500ms (not blocked)", took)
			e.T.Logf("renewal during the fenced transaction took %s (%d failed tries before: %v)", took.Round(time.Millisecond), try, renewErrs)
			break
		}
		renewErrs = append(renewErrs, err)
		if try == 4 || errors.Is(err, lock.ErrLeaseLost) {
			stopBusy()
			e.T.Fatalf("renewal during the fenced transaction never succeeded: %v", renewErrs)
		}
	}
	e.Check(x.Expiry().After(before), "renewal did not move the expiry: %v then %v", before, x.Expiry())
	return stopBusy
}

func (c f1Fence) run(e *Env) {
	ctx := e.Ctx()
	g := newGuarded(e)
	l1, l2 := e.NewLocker(nil, c.fenced...), e.NewLocker(nil, c.takeover...)
	x := e.MustTryAcquire(l1, c.key, lock.Exclusive)
	tx, err := e.DB.BeginTx(ctx, nil)
	e.Must(err, "begin")
	defer tx.Rollback()
	var inspector LockInspector
	var session int64
	if c.inspect {
		if inspector, _ = e.Dialect.(LockInspector); inspector != nil {
			session, err = inspector.SessionID(ctx, tx)
			e.Must(err, "session ID")
		}
	}
	fencedAt := time.Now()
	e.Must(x.Fence(ctx, tx), "Fence")
	_, err = g.inc(ctx, tx, x.Token())
	e.Must(err, "fenced write")
	stop := func() {}
	if c.whileOpen != nil {
		stop = c.whileOpen(e, x, tx)
		defer stop()
	}
	x.Orphan()
	done := make(chan grantResult, 1)
	go func() {
		le, err := l2.Acquire(ctx, c.key, lock.Exclusive, lock.WaitTimeout(10*time.Second))
		done <- grantResult{le, err, time.Now()}
	}()
	if inspector != nil {
		waiter, ok := waitBlocked(ctx, inspector, e.OpenDB(), session, fencedAt.Add(c.hold-100*time.Millisecond))
		if !ok {
			e.T.Errorf("no session blocked by the fenced transaction within %s: the takeover did not wait for the fence", c.hold)
		} else {
			e.T.Logf("takeover session %d blocked by fenced session %d after %s", waiter, session, time.Since(fencedAt).Round(time.Millisecond))
		}
	}
	time.Sleep(time.Until(fencedAt.Add(c.hold)))
	select {
	case r := <-done:
		e.T.Fatalf("takeover ended while the fenced transaction was open (%s after the fence): %v", r.at.Sub(fencedAt), r.err)
	default:
	}
	stop()
	commitStart := time.Now()
	e.Must(tx.Commit(), "commit of the fenced transaction")
	var r grantResult
	select {
	case r = <-done:
	case <-time.After(5 * time.Second):
		e.T.Fatalf("takeover not granted 5 s after the fenced transaction committed")
	}
	e.Must(r.err, "takeover")
	defer r.lease.Release(ctx)
	e.Check(!r.at.Before(commitStart), "takeover granted %s before the fenced transaction committed", commitStart.Sub(r.at))
	e.T.Logf("takeover granted %s after the fenced commit", r.at.Sub(commitStart).Round(time.Millisecond))
	e.Check(r.lease.Token() > x.Token(), "takeover token %d not above %d", r.lease.Token(), x.Token())
	g.expect(e, "fenced write committed", 1, x.Token())
	called := false
	wantLost(e, "RunInTx after takeover", x.RunInTx(ctx, e.DB, nil, g.incIn(x, &called)), x)
	e.Check(!called, "RunInTx ran the function of a taken-over lease")
	g.expect(e, "after the old lease tried to write", 1, x.Token())
	e.Must(r.lease.RunInTx(ctx, e.DB, nil, g.incIn(r.lease, nil)), "successor's fenced write")
	g.expect(e, "after the successor's write", 2, r.lease.Token())
}

// f2FencedCounter: holders in this process and two children increment a
// guarded counter only through fenced transactions while leases expire
// underneath them (short TTL, orphaned leases that keep writing, pauses
// inside the fenced transaction). Every increment RunInTx reported is in
// the log and in the counter, nothing else is, tokens never go back in
// commit order, and the token guard never had to refuse a fenced write.
func f2FencedCounter(e *Env) {
	ctx := e.Ctx()
	g := newGuarded(e)
	logTable, report := e.Table("fenced_log"), e.Table("fenced_report")
	e.Must(createFencedCounterTables(ctx, e.DB, logTable, report), "create tables")
	dur := 4 * time.Second
	if e.Config.Short {
		dur = 2 * time.Second
	}
	base := StressSpec{
		Role: "f2-counter", Dialect: e.Dialect.Name(), Driver: e.Config.DriverName, DSN: e.DSN, Namespace: e.Namespace,
		LogTable: logTable, Duration: dur, TTL: 300 * time.Millisecond, WaitTimeout: 3 * time.Second,
		Extra: map[string]string{"guarded": g.table, "report": report},
	}
	childSpec := base
	childSpec.Workers = 2
	wait := SpawnChildren(e, 2, childSpec)
	spec := base
	spec.Worker, spec.Workers = "inproc", 3
	err := runFencedCounterWorkers(ctx, e.OpenDB(), e.Dialect, spec, e.Config.NewLocker)
	if cerr := wait(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	e.Must(err, "fenced counter workers")
	// What the workers say they did.
	type tally struct{ ok, lost, stale, grants, orphans int64 }
	rows, err := e.DB.QueryContext(ctx, `SELECT worker, ok, lost, stale, grants, orphans FROM `+report)
	e.Must(err, "read report")
	perWorker := map[string]tally{}
	var total tally
	for rows.Next() {
		var w string
		var t tally
		e.Must(rows.Scan(&w, &t.ok, &t.lost, &t.stale, &t.grants, &t.orphans), "read report")
		perWorker[w] = t
		total.ok += t.ok
		total.lost += t.lost
		total.stale += t.stale
		total.grants += t.grants
		total.orphans += t.orphans
	}
	_ = rows.Close()
	e.Check(len(perWorker) == 3+2*2, "%d workers reported, want %d: %v", len(perWorker), 3+2*2, perWorker)
	e.T.Logf("%d grants, %d orphaned; %d fenced increments committed, %d refused as lost, %d refused by the token guard; per worker %v",
		total.grants, total.orphans, total.ok, total.lost, total.stale, perWorker)
	// What the database holds.
	rows, err = e.DB.QueryContext(ctx, `SELECT n, token, worker FROM `+logTable+` ORDER BY n`)
	e.Must(err, "read log")
	logged := map[string]int64{}
	var count, prevToken int64
	var bad []string
	for rows.Next() {
		var n, token int64
		var w string
		e.Must(rows.Scan(&n, &token, &w), "read log")
		count++
		logged[w]++
		if n != count {
			bad = append(bad, fmt.Sprintf("increment #%d logged as n=%d", count, n))
		}
		if token < prevToken {
			bad = append(bad, fmt.Sprintf("n=%d committed with token %d after token %d", n, token, prevToken))
		}
		prevToken = token
	}
	_ = rows.Close()
	for i, b := range bad {
		if i == 20 {
			break
		}
		e.T.Errorf("%s", b)
	}
	n, last, err := g.read(ctx, e.DB)
	e.Must(err, "read counter")
	e.Check(n == count && n == total.ok, "counter %d, log rows %d, increments reported committed %d: want all equal", n, count, total.ok)
	e.Check(count <= 0 || last == prevToken, "counter's last token %d, last logged token %d", last, prevToken)
	for w, t := range perWorker {
		if logged[w] != t.ok {
			e.T.Errorf("worker %s: RunInTx succeeded %d times, %d of its increments committed", w, t.ok, logged[w])
		}
	}
	e.Check(total.stale == 0, "the token guard refused %d fenced writes: a fence let a stale lease reach the resource", total.stale)
	e.Check(total.ok >= 10 && total.orphans != 0 && total.lost != 0, "the case did not exercise enough: %d increments, %d orphaned leases, %d lost writes", total.ok, total.orphans, total.lost)
}
