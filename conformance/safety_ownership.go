package conformance

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/lock"
)

// Safety (docs/contract.md): ownership checks (S4) and cross-key independence (S5).
func init() {
	register(
		Case{Name: "S4_StaleHandleAfterTakeover", Rule: "S4", Run: s4StaleHandleAfterTakeover},
		Case{Name: "S4_StaleHandleAfterRowDeleted", Rule: "S4", Run: s4StaleHandleAfterRowDeleted},
		Case{Name: "S4_SameLeaseIDOtherTokenCannotAct", Rule: "S4", Run: s4SameLeaseIDOtherToken},
		Case{Name: "S5_OtherKeyHeldNeverBlocks", Rule: "S5", Run: s5OtherKeyHeldNeverBlocks},
		Case{Name: "S5_OtherKeyTransactionDoesNotDelay", Rule: "S5", Needs: dialect.CapConcurrentWriters, Run: s5OtherKeyTransactionDoesNotDelay},
	)
}

// --- S4 -------------------------------------------------------------------

// keyHolders lists the holders of exactly key (not of the keys it prefixes).
func keyHolders(e *Env, l *lock.Locker, key string) []lock.Holder {
	e.T.Helper()
	var out []lock.Holder
	for _, h := range holders(e, l, key) {
		if h.Key == key {
			out = append(out, h)
		}
	}
	return out
}

// stgExec runs q on e.DB and returns the rows affected; "$n" markers in q
// become the dialect's Placeholder(n).
func stgExec(e *Env, q string, args ...any) int64 {
	e.T.Helper()
	for i := len(args); i >= 1; i-- {
		q = strings.ReplaceAll(q, "$"+strconv.Itoa(i), e.Dialect.Placeholder(i))
	}
	res, err := e.DB.ExecContext(e.Ctx(), q, args...)
	e.Must(err, "%s", q)
	n, err := res.RowsAffected()
	e.Must(err, "%s", q)
	return n
}

// stgFencedWrite runs a fenced transaction under le that inserts note into
// the case table "s4_writes", and returns its error.
func stgFencedWrite(e *Env, le *lock.Lease, note string) error {
	q := "INSERT INTO " + e.Table("s4_writes") + " (note) VALUES (" + e.Dialect.Placeholder(1) + ")"
	return le.RunInTx(e.Ctx(), e.DB, nil, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, q, note)
		return err
	})
}

// stgWrites returns the notes committed to the case table "s4_writes".
func stgWrites(e *Env) []string {
	e.T.Helper()
	rows, err := e.DB.QueryContext(e.Ctx(), "SELECT note FROM "+e.Table("s4_writes"))
	e.Must(err, "read writes")
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		e.Must(rows.Scan(&s), "read writes")
		out = append(out, s)
	}
	e.Must(rows.Err(), "read writes")
	return out
}

// stgCheckSuccessor checks that the successor lease is still in the
// database, untouched, and still works.
func stgCheckSuccessor(e *Env, l *lock.Locker, succ *lock.Lease, what string) {
	e.T.Helper()
	hs := keyHolders(e, l, succ.Key())
	e.Check(len(hs) == 1 && hs[0].LeaseID == succ.LeaseID() && hs[0].Token == succ.Token(), "%s: the successor lease (token %d) should be the only holder of %q, the database has %v", what, succ.Token(), succ.Key(), hs)
	e.CheckErr(succ.Err(), "%s: the successor lease ended", what)
	e.CheckErr(succ.Renew(e.Ctx()), "%s: the successor cannot renew", what)
}

// stgCreateWrites creates the case table "s4_writes".
func stgCreateWrites(e *Env) {
	e.T.Helper()
	if _, err := e.DB.ExecContext(e.Ctx(), "CREATE TABLE "+e.Table("s4_writes")+" (note TEXT NOT NULL)"); err != nil {
		e.T.Fatalf("create table: %v", err)
	}
}

// s4StaleHandleAfterTakeover: a holder "crashes" (stops renewing), its lease
// expires and another Locker takes the key over. The stale handle can then
// neither renew, nor fence a write, nor release the successor's lease.
func s4StaleHandleAfterTakeover(e *Env) {
	ctx := e.Ctx()
	stgCreateWrites(e)
	a := e.NewLocker(nil, lock.WithTTL(200*time.Millisecond))
	b := e.NewLocker(nil, lock.WithTTL(10*time.Second))
	for _, mode := range []lock.Mode{lock.Exclusive, lock.Shared} {
		key := "s4/takeover/" + mode.String()
		stale := e.MustTryAcquire(a, key, mode)
		stale.Orphan()
		succ := e.MustAcquire(b, key, lock.Exclusive, lock.WaitTimeout(10*time.Second))
		e.Check(succ.Token() > stale.Token(), "successor token %d not greater than %d", succ.Token(), stale.Token())
		wantLost(e, "renew of the stale handle", stale.Renew(ctx), stale)
		wantLost(e, "fenced write of the stale handle", stgFencedWrite(e, stale, "stale "+mode.String()), stale)
		err := stale.Release(ctx)
		e.Check(errors.Is(err, lock.ErrNotHeld), "release of the stale handle: want ErrNotHeld, got %v", err)
		stgCheckSuccessor(e, b, succ, "after the stale handle acted")
		e.CheckErr(stgFencedWrite(e, succ, "successor "+mode.String()), "fenced write of the successor")
		e.CheckErr(succ.Release(ctx), "release of the successor")
	}
	w := stgWrites(e)
	slices.Sort(w)
	e.Check(slices.Equal(w, []string{"successor exclusive", "successor shared"}), "only the successors' writes should have committed, the table holds %q", w)
}

// s4StaleHandleAfterRowDeleted: a handle whose trusted window is still open
// but whose row is gone (deleted by an operator, say) and whose key is now
// held by another Locker. Each operation of the stale handle must reach the
// database and be refused there. The row is deleted with SQL on the
// dialect's {holders} table by its lease_id column (the column contract,
// see the package documentation).
func s4StaleHandleAfterRowDeleted(e *Env) {
	ctx := e.Ctx()
	stgCreateWrites(e)
	a := e.NewLocker(nil, lock.WithTTL(30*time.Second))
	b := e.NewLocker(nil, lock.WithTTL(30*time.Second))
	holders := e.Namespace.Object(e.Dialect, "holders")
	// One key per operation: the first refusal ends the handle, after which
	// it answers from its own state.
	for _, op := range []string{"renew", "fence", "release"} {
		for _, mode := range []lock.Mode{lock.Exclusive, lock.Shared} {
			key := "s4/deleted/" + op + "/" + mode.String()
			stale := e.MustTryAcquire(a, key, mode)
			if n := stgExec(e, "DELETE FROM "+holders+" WHERE lease_id = $1", stale.LeaseID()); n != 1 {
				e.T.Fatalf("delete the stale lease's row: %d rows", n)
			}
			succ := e.MustTryAcquire(b, key, mode)
			if stale.Err() != nil || stale.Remaining() <= 0 {
				e.T.Fatalf("the stale handle should still trust its lease locally: %v", stale.Err())
			}
			what := fmt.Sprintf("%s of a stale %s handle", op, mode)
			switch op {
			case "renew":
				wantLost(e, what, stale.Renew(ctx), stale)
				e.Check(errors.Is(stale.Err(), lock.ErrLeaseLost), "%s: the handle's context should end with ErrLeaseLost, got %v", what, stale.Err())
			case "fence":
				wantLost(e, what, stgFencedWrite(e, stale, what), stale)
			case "release":
				if err := stale.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
					e.T.Errorf("%s: want ErrNotHeld, got %v", what, err)
				}
			}
			stgCheckSuccessor(e, b, succ, what)
			e.CheckErr(succ.Release(ctx), "%s: release of the successor", what)
		}
	}
	if w := stgWrites(e); len(w) != 0 {
		e.T.Errorf("no fenced write of a stale handle may commit, the table holds %q", w)
	}
}

// s4SameLeaseIDOtherToken: the row of a lease still carries its lease ID but
// another token (as if replaced by a later grant reusing the ID; set with SQL
// on the {holders} table's token column, per the column contract). The
// handle acts on (lease ID, token) and must be refused; the row stays
// untouched.
func s4SameLeaseIDOtherToken(e *Env) {
	ctx := e.Ctx()
	stgCreateWrites(e)
	l := e.NewLocker(nil, lock.WithTTL(30*time.Second))
	holders := e.Namespace.Object(e.Dialect, "holders")
	for _, op := range []string{"renew", "fence", "release"} {
		key := "s4/token/" + op
		le := e.MustTryAcquire(l, key, lock.Exclusive)
		other := le.Token() + 1_000_000
		if n := stgExec(e, "UPDATE "+holders+" SET token = $1 WHERE lease_id = $2", other, le.LeaseID()); n != 1 {
			e.T.Fatalf("update token: %d rows", n)
		}
		what := op + " of a handle whose row has another token"
		switch op {
		case "renew":
			wantLost(e, what, le.Renew(ctx), le)
		case "fence":
			wantLost(e, what, stgFencedWrite(e, le, what), le)
		case "release":
			if err := le.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
				e.T.Errorf("%s: want ErrNotHeld, got %v", what, err)
			}
		}
		hs := keyHolders(e, l, key)
		e.Check(len(hs) == 1 && hs[0].LeaseID == le.LeaseID() && hs[0].Token == other && hs[0].Expiry.Equal(le.Expiry()), "%s: the row (lease %s, token %d, expiry %s) should be untouched, the database has %v", what, le.LeaseID(), other, le.Expiry(), hs)
	}
	if w := stgWrites(e); len(w) != 0 {
		e.T.Errorf("no fenced write may commit, the table holds %q", w)
	}
}

// --- S5 -------------------------------------------------------------------

// s5OtherKeyHeldNeverBlocks: whatever holds or waits for key B (exclusive,
// shared, a waiting writer's marker), key A is granted at once in either
// mode, including keys that share a prefix with B.
func s5OtherKeyHeldNeverBlocks(e *Env) {
	ctx := e.Ctx()
	holder := e.NewLocker(nil)
	reader := e.NewLocker(nil)
	waiter := e.NewLocker(nil, lock.WithMaxBackoff(20*time.Millisecond))
	other := e.NewLocker(nil)
	x := e.MustTryAcquire(holder, "s5/b", lock.Exclusive)
	defer x.Release(ctx)
	s := e.MustTryAcquire(reader, "s5/c", lock.Shared)
	defer s.Release(ctx)
	// A writer waits for s5/c, keeping a pending-writer marker on it.
	var wg sync.WaitGroup
	wctx, stop := context.WithCancel(ctx)
	defer wg.Wait()
	defer stop()
	e.Go(&wg, func() {
		le, err := waiter.Acquire(wctx, "s5/c", lock.Exclusive)
		if err == nil {
			e.T.Errorf("the waiting writer was granted s5/c while a reader held it")
			_ = le.Release(ctx)
		}
	})
	e.Require(Eventually(5*time.Second, func() bool {
		for _, h := range keyHolders(e, other, "s5/c") {
			if h.Mode == lock.PendingWriter {
				return true
			}
		}
		return false
	}), "the waiting writer left no marker on s5/c")
	for _, key := range []string{"s5/a", "s5/b2", "s5/c2", "s5/", "s5", "s5/B", "s5/c/"} {
		for _, mode := range []lock.Mode{lock.Exclusive, lock.Shared} {
			le, err := other.TryAcquire(ctx, key, mode)
			if err != nil {
				e.T.Errorf("%s %q while other keys are held or awaited: %v", mode, key, err)
				continue
			}
			e.CheckErr(le.Release(ctx), "release %q", key)
		}
	}
}

// s5OtherKeyTransactionDoesNotDelay: transactions that touch only key B stay
// open ~1.5 s: a fenced transaction on B's lease, and a takeover of B that
// waits behind it (SPEC F1) while holding whatever serializes B's grants.
// Meanwhile every operation on key A completes promptly. B's transactions
// end only after the last operation on A returned, so an operation that
// waited for them would take until its own timeout (seconds): the bound
// only has to sit well below that, and above a loaded machine's latency.
func s5OtherKeyTransactionDoesNotDelay(e *Env) {
	ctx := e.Ctx()
	const (
		hold  = 1500 * time.Millisecond
		bound = 500 * time.Millisecond
	)
	// a's TTL bounds the fenced transaction's idle time
	// (CapFenceIdleTimeout): 1 s leaves keepBusy's pings room on a loaded
	// machine.
	a := e.NewLocker(nil, lock.WithTTL(time.Second))
	b := e.NewLocker(nil, lock.WithTTL(5*time.Second))
	la := e.NewLocker(nil, lock.WithTTL(5*time.Second))
	lb := e.MustTryAcquire(a, "s5/B", lock.Exclusive)
	tx, err := e.OpenDB().BeginTx(ctx, nil)
	e.Must(err, "begin")
	defer tx.Rollback()
	e.Must(lb.Fence(ctx, tx), "fence B")
	stopBusy := keepBusy(ctx, tx) // open longer than the TTL: busy, as a live holder's
	defer stopBusy()
	lb.Orphan()
	e.Require(Eventually(5*time.Second, func() bool {
		hs, now, err := b.Holders(ctx, "s5/B")
		return err == nil && len(hs) == 1 && !hs[0].Expiry.After(now)
	}), "B's orphaned lease did not expire")
	// Once B's lease expired, a takeover of B waits for the fenced
	// transaction while holding whatever serializes B's grants.
	var wg sync.WaitGroup
	var takeoverDone atomic.Bool
	takeover := make(chan error, 1)
	e.Go(&wg, func() {
		le, err := b.TryAcquire(context.WithoutCancel(ctx), "s5/B", lock.Exclusive)
		takeoverDone.Store(true)
		if err == nil {
			defer le.Release(ctx)
		}
		takeover <- err
	})
	defer wg.Wait()
	opened := time.Now()
	time.Sleep(100 * time.Millisecond)
	var slow []string
	timed := func(what string, f func() error) {
		t0 := time.Now()
		err := f()
		if d := time.Since(t0); d > bound {
			slow = append(slow, fmt.Sprintf("%s took %s", what, d.Round(time.Millisecond)))
		}
		e.Check(err == nil, "%s: %v", what, err)
	}
	rounds := 0
	for time.Since(opened) < hold-300*time.Millisecond {
		rounds++
		for _, mode := range []lock.Mode{lock.Exclusive, lock.Shared} {
			var le *lock.Lease
			timed("TryAcquire "+mode.String()+" A", func() (err error) { le, err = la.TryAcquire(ctx, "s5/A", mode); return err })
			if le == nil {
				continue
			}
			timed("Renew A", func() error { return le.Renew(ctx) })
			timed("Release A", func() error { return le.Release(ctx) })
		}
		var le *lock.Lease
		timed("Acquire A", func() (err error) {
			le, err = la.Acquire(ctx, "s5/A", lock.Exclusive, lock.WaitTimeout(time.Second))
			return err
		})
		if le != nil {
			timed("Release A", func() error { return le.Release(ctx) })
		}
	}
	stillWaiting := !takeoverDone.Load()
	if time.Since(opened) >= hold {
		e.T.Logf("the operations on A outlasted the transaction on B; the case is weaker than intended")
	}
	time.Sleep(time.Until(opened.Add(hold)))
	stopBusy()
	e.Must(tx.Rollback(), "rollback")
	e.CheckErr(<-takeover, "takeover of B after its fenced transaction ended")
	e.Check(stillWaiting, "the takeover of B did not wait for the fenced transaction on B (SPEC F1); the case could not hold B's per-key lock")
	e.T.Logf("%d rounds of operations on A while B's transactions stayed open", rounds)
	for _, s := range slow {
		e.T.Errorf("operation on key A was delayed while only transactions on other keys ran (SPEC S5): %s (bound %s)", s, bound)
	}
}
