package conformance

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// Cases for SPEC S4 (ownership checks), S5 (cross-key independence), D1
// (migrations), D2 (bounded tables).

func init() {
	register(
		Case{Name: "S4_StaleHandleAfterTakeover", Rule: "S4", Run: s4StaleHandleAfterTakeover},
		Case{Name: "S4_StaleHandleAfterRowDeleted", Rule: "S4", Run: s4StaleHandleAfterRowDeleted},
		Case{Name: "S4_SameLeaseIDOtherTokenCannotAct", Rule: "S4", Run: s4SameLeaseIDOtherToken},
		Case{Name: "S5_OtherKeyHeldNeverBlocks", Rule: "S5", Run: s5OtherKeyHeldNeverBlocks},
		Case{Name: "S5_OtherKeyTransactionDoesNotDelay", Rule: "S5", Needs: dialect.CapConcurrentWriters, Run: s5OtherKeyTransactionDoesNotDelay},
		Case{Name: "D1_MigrateUpIsIdempotent", Rule: "D1", Run: d1MigrateUpIsIdempotent},
		Case{Name: "D1_UnmigratedLockerFailsAndWritesNothing", Rule: "D1", Run: d1UnmigratedLocker},
		Case{Name: "D1_ConcurrentMigrateOnEmptyNamespace", Rule: "D1", Run: d1ConcurrentMigrate},
		Case{Name: "D2_ChurnLeavesNoRows", Rule: "D2", Run: d2ChurnLeavesNoRows},
		Case{Name: "D2_ExpiredRowsSweptInBatches", Rule: "D2", Run: d2ExpiredRowsSweptInBatches},
		Case{Name: "D2_SweepSparesLiveLeasesAndMarkers", Rule: "D2", Run: d2SweepSparesLiveLeasesAndMarkers},
		Case{Name: "D2_SweepDuringStress", Rule: "D2", Run: d2SweepDuringStress},
	)
	childRoles[stgMigrateRole] = stgMigrateChild
}

// --- S4 -------------------------------------------------------------------

// stgHolders lists the holders of exactly key.
func stgHolders(e *Env, l *lock.Locker, key string) []lock.Holder {
	e.T.Helper()
	hs, _, err := l.Holders(e.Ctx(), key)
	if err != nil {
		e.T.Fatalf("holders %q: %v", key, err)
	}
	var out []lock.Holder
	for _, h := range hs {
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
	if err != nil {
		e.T.Fatalf("%s: %v", q, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		e.T.Fatalf("%s: %v", q, err)
	}
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
	if err != nil {
		e.T.Fatalf("read writes: %v", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			e.T.Fatalf("read writes: %v", err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		e.T.Fatalf("read writes: %v", err)
	}
	return out
}

// stgCheckSuccessor checks that the successor lease is still in the
// database, untouched, and still works.
func stgCheckSuccessor(e *Env, l *lock.Locker, succ *lock.Lease, what string) {
	e.T.Helper()
	hs := stgHolders(e, l, succ.Key())
	if len(hs) != 1 || hs[0].LeaseID != succ.LeaseID() || hs[0].Token != succ.Token() {
		e.T.Errorf("%s: the successor lease (token %d) should be the only holder of %q, the database has %v", what, succ.Token(), succ.Key(), hs)
	}
	if err := succ.Err(); err != nil {
		e.T.Errorf("%s: the successor lease ended: %v", what, err)
	}
	if err := succ.Renew(e.Ctx()); err != nil {
		e.T.Errorf("%s: the successor cannot renew: %v", what, err)
	}
}

// stgLost checks that err is a *LeaseLostError for le.
func stgLost(e *Env, what string, le *lock.Lease, err error) {
	e.T.Helper()
	var lle *lock.LeaseLostError
	if !errors.Is(err, lock.ErrLeaseLost) || !errors.As(err, &lle) {
		e.T.Errorf("%s: want a *LeaseLostError matching ErrLeaseLost, got %v", what, err)
		return
	}
	if lle.LeaseID != le.LeaseID() || lle.Token != le.Token() || lle.Key != le.Key() {
		e.T.Errorf("%s: the error names lease %q token %d key %q, want %q token %d key %q", what, lle.LeaseID, lle.Token, lle.Key, le.LeaseID(), le.Token(), le.Key())
	}
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
		stale, err := a.TryAcquire(ctx, key, mode)
		if err != nil {
			e.T.Fatalf("acquire: %v", err)
		}
		stale.Orphan()
		succ, err := b.Acquire(ctx, key, lock.Exclusive, lock.WaitTimeout(10*time.Second))
		if err != nil {
			e.T.Fatalf("takeover: %v", err)
		}
		if succ.Token() <= stale.Token() {
			e.T.Errorf("successor token %d not greater than %d", succ.Token(), stale.Token())
		}
		stgLost(e, "renew of the stale handle", stale, stale.Renew(ctx))
		stgLost(e, "fenced write of the stale handle", stale, stgFencedWrite(e, stale, "stale "+mode.String()))
		err = stale.Release(ctx)
		if !errors.Is(err, lock.ErrNotHeld) {
			e.T.Errorf("release of the stale handle: want ErrNotHeld, got %v", err)
		}
		stgCheckSuccessor(e, b, succ, "after the stale handle acted")
		if err := stgFencedWrite(e, succ, "successor "+mode.String()); err != nil {
			e.T.Errorf("fenced write of the successor: %v", err)
		}
		if err := succ.Release(ctx); err != nil {
			e.T.Errorf("release of the successor: %v", err)
		}
	}
	w := stgWrites(e)
	slices.Sort(w)
	if !slices.Equal(w, []string{"successor exclusive", "successor shared"}) {
		e.T.Errorf("only the successors' writes should have committed, the table holds %q", w)
	}
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
			stale, err := a.TryAcquire(ctx, key, mode)
			if err != nil {
				e.T.Fatalf("acquire: %v", err)
			}
			if n := stgExec(e, "DELETE FROM "+holders+" WHERE lease_id = $1", stale.LeaseID()); n != 1 {
				e.T.Fatalf("delete the stale lease's row: %d rows", n)
			}
			succ, err := b.TryAcquire(ctx, key, mode)
			if err != nil {
				e.T.Fatalf("successor: %v", err)
			}
			if stale.Err() != nil || stale.Remaining() <= 0 {
				e.T.Fatalf("the stale handle should still trust its lease locally: %v", stale.Err())
			}
			what := fmt.Sprintf("%s of a stale %s handle", op, mode)
			switch op {
			case "renew":
				stgLost(e, what, stale, stale.Renew(ctx))
				if !errors.Is(stale.Err(), lock.ErrLeaseLost) {
					e.T.Errorf("%s: the handle's context should end with ErrLeaseLost, got %v", what, stale.Err())
				}
			case "fence":
				stgLost(e, what, stale, stgFencedWrite(e, stale, what))
			case "release":
				if err := stale.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
					e.T.Errorf("%s: want ErrNotHeld, got %v", what, err)
				}
			}
			stgCheckSuccessor(e, b, succ, what)
			if err := succ.Release(ctx); err != nil {
				e.T.Errorf("%s: release of the successor: %v", what, err)
			}
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
		le, err := l.TryAcquire(ctx, key, lock.Exclusive)
		if err != nil {
			e.T.Fatalf("acquire: %v", err)
		}
		other := le.Token() + 1_000_000
		if n := stgExec(e, "UPDATE "+holders+" SET token = $1 WHERE lease_id = $2", other, le.LeaseID()); n != 1 {
			e.T.Fatalf("update token: %d rows", n)
		}
		what := op + " of a handle whose row has another token"
		switch op {
		case "renew":
			stgLost(e, what, le, le.Renew(ctx))
		case "fence":
			stgLost(e, what, le, stgFencedWrite(e, le, what))
		case "release":
			if err := le.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
				e.T.Errorf("%s: want ErrNotHeld, got %v", what, err)
			}
		}
		hs := stgHolders(e, l, key)
		if len(hs) != 1 || hs[0].LeaseID != le.LeaseID() || hs[0].Token != other || !hs[0].Expiry.Equal(le.Expiry()) {
			e.T.Errorf("%s: the row (lease %s, token %d, expiry %s) should be untouched, the database has %v", what, le.LeaseID(), other, le.Expiry(), hs)
		}
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
	x, err := holder.TryAcquire(ctx, "s5/b", lock.Exclusive)
	if err != nil {
		e.T.Fatalf("%v", err)
	}
	defer x.Release(ctx)
	s, err := reader.TryAcquire(ctx, "s5/c", lock.Shared)
	if err != nil {
		e.T.Fatalf("%v", err)
	}
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
	if !Eventually(5*time.Second, func() bool {
		for _, h := range stgHolders(e, other, "s5/c") {
			if h.Mode == lock.PendingWriter {
				return true
			}
		}
		return false
	}) {
		e.T.Fatalf("the waiting writer left no marker on s5/c")
	}
	for _, key := range []string{"s5/a", "s5/b2", "s5/c2", "s5/", "s5", "s5/B", "s5/c/"} {
		for _, mode := range []lock.Mode{lock.Exclusive, lock.Shared} {
			le, err := other.TryAcquire(ctx, key, mode)
			if err != nil {
				e.T.Errorf("%s %q while other keys are held or awaited: %v", mode, key, err)
				continue
			}
			if err := le.Release(ctx); err != nil {
				e.T.Errorf("release %q: %v", key, err)
			}
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
	lb, err := a.TryAcquire(ctx, "s5/B", lock.Exclusive)
	if err != nil {
		e.T.Fatalf("%v", err)
	}
	tx, err := e.OpenDB().BeginTx(ctx, nil)
	if err != nil {
		e.T.Fatalf("begin: %v", err)
	}
	defer tx.Rollback()
	if err := lb.Fence(ctx, tx); err != nil {
		e.T.Fatalf("fence B: %v", err)
	}
	stopBusy := keepBusy(ctx, tx) // open longer than the TTL: busy, as a live holder's
	defer stopBusy()
	lb.Orphan()
	if !Eventually(5*time.Second, func() bool {
		hs, now, err := b.Holders(ctx, "s5/B")
		return err == nil && len(hs) == 1 && !hs[0].Expiry.After(now)
	}) {
		e.T.Fatalf("B's orphaned lease did not expire")
	}
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
		if err != nil {
			e.T.Errorf("%s: %v", what, err)
		}
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
	if err := tx.Rollback(); err != nil {
		e.T.Fatalf("rollback: %v", err)
	}
	if err := <-takeover; err != nil {
		e.T.Errorf("takeover of B after its fenced transaction ended: %v", err)
	}
	if !stillWaiting {
		e.T.Errorf("the takeover of B did not wait for the fenced transaction on B (SPEC F1); the case could not hold B's per-key lock")
	}
	e.T.Logf("%d rounds of operations on A while B's transactions stayed open", rounds)
	for _, s := range slow {
		e.T.Errorf("operation on key A was delayed while only transactions on other keys ran (SPEC S5): %s (bound %s)", s, bound)
	}
}

// --- D1 -------------------------------------------------------------------

const stgMigrateRole = "d1-migrate"

// stgMigrateChild runs migrate.Up at the moment given in Extra["at"] (Unix
// nanoseconds) on spec.Namespace.
func stgMigrateChild(ctx context.Context, db *sql.DB, d dialect.Dialect, spec StressSpec) error {
	at, err := strconv.ParseInt(spec.Extra["at"], 10, 64)
	if err != nil {
		return fmt.Errorf("bad start time: %w", err)
	}
	if err := db.PingContext(ctx); err != nil {
		return err
	}
	late := time.Since(time.Unix(0, at))
	time.Sleep(time.Until(time.Unix(0, at)))
	applied, err := migrate.Up(ctx, db, d, migrate.WithNamespace(spec.Namespace))
	if err != nil {
		return fmt.Errorf("migrate.Up (started %s late): %w", max(late, 0), err)
	}
	fmt.Printf("applied %q\n", applied)
	return nil
}

// stgTableExists reports whether the table called ns.Object(d, name)
// exists, by selecting from it.
func stgTableExists(e *Env, ns dialect.Namespace, name string) bool {
	e.T.Helper()
	rows, err := e.DB.QueryContext(e.Ctx(), "SELECT 1 FROM "+ns.Object(e.Dialect, name)+" WHERE 1 = 0")
	if err == nil {
		rows.Close()
		return true
	}
	if e.Dialect.Classify(err) == dialect.ErrorUndefinedTable {
		return false
	}
	e.T.Fatalf("probe %s: %v", ns.Object(e.Dialect, name), err)
	return false
}

// stgCheckMigrated checks that ns is migrated to the latest version and
// Status reports every migration applied.
func stgCheckMigrated(e *Env, ns dialect.Namespace) {
	e.T.Helper()
	ctx := e.Ctx()
	cur, want, err := migrate.Version(ctx, e.DB, e.Dialect, migrate.WithNamespace(ns))
	if err != nil || want < 1 || cur != want {
		e.T.Errorf("version of %+v: current %d want %d, %v", ns, cur, want, err)
	}
	st, err := migrate.Status(ctx, e.DB, e.Dialect, migrate.WithNamespace(ns))
	if err != nil {
		e.T.Fatalf("status: %v", err)
	}
	if len(st) == 0 {
		e.T.Errorf("status lists no migration")
	}
	for _, s := range st {
		if !s.Applied || s.Version < 1 || !strings.HasSuffix(s.Name, ".sql") {
			e.T.Errorf("status: %+v, want an applied .sql migration", s)
		}
	}
	if !stgTableExists(e, ns, "db_version") {
		e.T.Errorf("version table %s does not exist", ns.Object(e.Dialect, "db_version"))
	}
	// Each migration is recorded once in the version table (goose's
	// version_id column), however many callers raced to apply it.
	for _, s := range st {
		var n int
		q := "SELECT count(*) FROM " + ns.Object(e.Dialect, "db_version") + " WHERE version_id = " + e.Dialect.Placeholder(1)
		if err := e.DB.QueryRowContext(ctx, q, s.Version).Scan(&n); err != nil || n != 1 {
			e.T.Errorf("version %d is recorded %d times in %s (%v), want once", s.Version, n, ns.Object(e.Dialect, "db_version"), err)
		}
	}
	// Migrations never touch the application's goose table (unless it was
	// there before the case migrated: a schema the application shares).
	goose := dialect.Namespace{Schema: ns.Schema, Prefix: "goose_"}
	if !e.gooseBefore && stgTableExists(e, goose, "db_version") {
		e.T.Errorf("%s exists: migrations must use their own version table", goose.Object(e.Dialect, "db_version"))
	}
}

// d1MigrateUpIsIdempotent: the case's namespace is migrated; running Up
// again applies nothing and changes nothing.
func d1MigrateUpIsIdempotent(e *Env) {
	ctx := e.Ctx()
	l := e.NewLocker(nil)
	le, err := l.TryAcquire(ctx, "d1/k", lock.Exclusive)
	if err != nil {
		e.T.Fatalf("%v", err)
	}
	for i := 0; i < 3; i++ {
		applied, err := migrate.Up(ctx, e.DB, e.Dialect, migrate.WithNamespace(e.Namespace))
		if err != nil || len(applied) != 0 {
			e.T.Errorf("migrate.Up #%d on a migrated namespace: applied %q, %v; want nothing, nil", i+2, applied, err)
		}
	}
	stgCheckMigrated(e, e.Namespace)
	if hs := stgHolders(e, l, "d1/k"); len(hs) != 1 || hs[0].Token != le.Token() {
		e.T.Errorf("the lease should survive migrate.Up, the database has %v", hs)
	}
	if err := le.Renew(ctx); err != nil {
		e.T.Errorf("renew after migrate.Up: %v", err)
	}
	if err := le.Release(ctx); err != nil {
		e.T.Errorf("release: %v", err)
	}
}

// stgNewLockerIn builds a Locker in ns with the Config's constructor.
func stgNewLockerIn(e *Env, ns dialect.Namespace, opts ...lock.Option) (*lock.Locker, error) {
	newLocker := e.Config.NewLocker
	if newLocker == nil {
		newLocker = lock.New
	}
	opts = append([]lock.Option{lock.WithSchema(ns.Schema), lock.WithTablePrefix(ns.Prefix), lock.WithLogger(e.Logger)}, opts...)
	l, err := newLocker(e.Ctx(), e.DB, e.Dialect, opts...)
	if err == nil {
		e.T.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = l.Close(ctx)
		})
	}
	return l, err
}

// d1UnmigratedLocker: on a namespace never migrated, a Locker refuses to
// start (ErrSchemaNotMigrated, saying how to migrate) and writes nothing;
// reading the version or the status writes nothing either.
func d1UnmigratedLocker(e *Env) {
	ctx := e.Ctx()
	ns := e.SubNamespace("d1_")
	_, err := stgNewLockerIn(e, ns)
	var se *lock.SchemaError
	if !errors.Is(err, lock.ErrSchemaNotMigrated) || !errors.As(err, &se) {
		e.T.Fatalf("lock.New on an unmigrated namespace: want *SchemaError matching ErrSchemaNotMigrated, got %v", err)
	}
	if se.Current != 0 || se.Want < 1 || se.Table != ns.VersionTable() || !strings.HasSuffix(se.Table, "d1_db_version") {
		e.T.Errorf("schema error: %+v; want current 0, want >= 1, table %q", se, ns.VersionTable())
	}
	for _, s := range []string{"migrate.Up", "sqlease migrate", ns.VersionTable()} {
		if !strings.Contains(err.Error(), s) {
			e.T.Errorf("schema error %q should mention %q", err, s)
		}
	}
	for _, name := range []string{"db_version", "holders"} {
		if stgTableExists(e, ns, name) {
			e.T.Errorf("lock.New on an unmigrated namespace created %s; it must write nothing", ns.Object(e.Dialect, name))
		}
	}
	// Reading the version and the status writes nothing either (checked on
	// another namespace, untouched by lock.New).
	ns = e.SubNamespace("d1v_")
	if cur, _, err := migrate.Version(ctx, e.DB, e.Dialect, migrate.WithNamespace(ns)); err != nil || cur != 0 {
		e.T.Errorf("version of the unmigrated namespace: %d, %v", cur, err)
	}
	if st, err := migrate.Status(ctx, e.DB, e.Dialect, migrate.WithNamespace(ns)); err != nil || len(st) == 0 || st[0].Applied {
		e.T.Errorf("status of the unmigrated namespace: %+v, %v", st, err)
	}
	for _, name := range []string{"db_version", "holders"} {
		if stgTableExists(e, ns, name) {
			e.T.Errorf("migrate.Version or migrate.Status on an unmigrated namespace created %s; they must write nothing", ns.Object(e.Dialect, name))
		}
	}
}

// d1ConcurrentMigrate: several goroutines and two processes run migrate.Up
// at the same moment on a namespace nothing has touched, and all succeed;
// each migration is recorded once; the namespace then works.
func d1ConcurrentMigrate(e *Env) {
	ctx := e.Ctx()
	// Everyone migrates at once, on a namespace nothing has touched yet.
	ns := e.SubNamespace("d1race_")
	if stgTableExists(e, ns, "db_version") {
		e.T.Fatalf("the namespace should be empty")
	}
	at := time.Now().Add(1500 * time.Millisecond)
	wait := SpawnChildren(e, 2, StressSpec{
		Role: stgMigrateRole, Extra: map[string]string{"at": strconv.FormatInt(at.UnixNano(), 10)},
		Dialect: e.Dialect.Name(), Driver: e.Config.DriverName, DSN: e.DSN, Namespace: ns,
	})
	const goroutines = 6
	var wg sync.WaitGroup
	var mu sync.Mutex
	var applied []string
	for i := 0; i < goroutines; i++ {
		db := e.OpenDB()
		e.Go(&wg, func() {
			time.Sleep(time.Until(at))
			names, err := migrate.Up(ctx, db, e.Dialect, migrate.WithNamespace(ns))
			if err != nil {
				e.T.Errorf("concurrent migrate.Up #%d: %v", i, err)
			}
			mu.Lock()
			applied = append(applied, names...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if err := wait(); err != nil {
		e.T.Errorf("migrate.Up in a child process: %v", err)
	}
	seen := map[string]int{}
	for _, n := range applied {
		seen[n]++
		if seen[n] > 1 {
			e.T.Errorf("migration %s applied %d times", n, seen[n])
		}
	}
	e.T.Logf("in-process callers applied %q", applied)
	stgCheckMigrated(e, ns)
	if again, err := migrate.Up(ctx, e.DB, e.Dialect, migrate.WithNamespace(ns)); err != nil || len(again) != 0 {
		e.T.Errorf("migrate.Up after the race: applied %q, %v", again, err)
	}

	// The new namespace works, independently of the case's namespace.
	l, err := stgNewLockerIn(e, ns)
	if err != nil {
		e.T.Fatalf("lock.New after migrating: %v", err)
	}
	le, err := l.TryAcquire(ctx, "d1/k", lock.Exclusive)
	if err != nil {
		e.T.Fatalf("acquire in the new namespace: %v", err)
	}
	if _, err := e.NewLocker(nil).TryAcquire(ctx, "d1/k", lock.Exclusive); err != nil {
		e.T.Errorf("the same key in another namespace should be independent: %v", err)
	}
	if err := le.Release(ctx); err != nil {
		e.T.Errorf("release: %v", err)
	}
}

// --- D2 -------------------------------------------------------------------

// stgRowCount returns l.RowCount or fails the case.
func stgRowCount(e *Env, l *lock.Locker) int64 {
	e.T.Helper()
	n, err := l.RowCount(e.Ctx())
	if err != nil {
		e.T.Fatalf("row count: %v", err)
	}
	return n
}

// stgChurnBudget bounds the churn of D2_ChurnLeavesNoRows, so that a slow
// database or engine does not run the test binary into its timeout; the
// case logs a warning with the measured rate when it stops early.
const stgChurnBudget = 3 * time.Minute

// stgWriters is how many goroutines write at once in bulk cases: 8, or 2
// where the database serializes writers (more only queue on its lock).
func stgWriters(e *Env) int {
	if dialect.CapabilitiesOf(e.Dialect).Has(dialect.CapConcurrentWriters) {
		return 8
	}
	return 2
}

// d2ChurnLeavesNoRows: many distinct keys acquired and released leave no
// row behind, and a key whose rows are all gone still gets a larger token.
func d2ChurnLeavesNoRows(e *Env) {
	ctx := e.Ctx()
	n, workers := 100_000, stgWriters(e)
	if e.Config.Short {
		n = 5_000
	}
	var next, done atomic.Int64
	var inAcquire, inRelease atomic.Int64 // nanoseconds, summed over workers
	tokens := make([]int64, n)
	var wg sync.WaitGroup
	start := time.Now()
	budget := start.Add(stgChurnBudget)
	for w := 0; w < workers; w++ {
		l := e.NewLocker(nil, lock.WithLogger(discard))
		e.Go(&wg, func() {
			for time.Now().Before(budget) {
				i := int(next.Add(1)) - 1
				if i >= n || e.T.Failed() {
					return
				}
				t0 := time.Now()
				mode := lock.Exclusive
				if i%3 == 0 {
					mode = lock.Shared
				}
				le, err := l.TryAcquire(ctx, fmt.Sprintf("d2/churn/%d", i), mode)
				if err != nil {
					e.T.Errorf("acquire %d: %v", i, err)
					return
				}
				tokens[i] = le.Token()
				t1 := time.Now()
				if err := le.Release(ctx); err != nil {
					e.T.Errorf("release %d: %v", i, err)
					return
				}
				inAcquire.Add(int64(t1.Sub(t0)))
				inRelease.Add(int64(time.Since(t1)))
				done.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	churned := int(done.Load())
	rate := float64(churned) / elapsed.Seconds()
	e.T.Logf("churn: %d distinct keys acquired and released by %d Lockers in %s: %.0f keys/s; mean acquire %s, mean release %s",
		churned, workers, elapsed.Round(time.Millisecond), rate,
		time.Duration(inAcquire.Load()/max(int64(churned), 1)).Round(time.Microsecond), time.Duration(inRelease.Load()/max(int64(churned), 1)).Round(time.Microsecond))
	if e.T.Failed() {
		return
	}
	if churned < n {
		// Throughput is no SPEC rule, so this is not a failure; but the
		// case proves less than it should, and says so.
		e.T.Logf("WARNING: churned only %d of %d keys within the %s budget (%.0f keys/s; all %d would take %s); checking the tables with what was done",
			churned, n, stgChurnBudget, rate, n, time.Duration(float64(n)/rate*float64(time.Second)).Round(time.Second))
		n = churned
	}
	l := e.NewLocker(nil)
	if rc := stgRowCount(e, l); rc != 0 {
		hs, _, _ := l.Holders(ctx, "")
		e.T.Errorf("after %d keys acquired and released, the lock tables hold %d rows, want 0 (first rows: %v)", n, rc, hs[:min(len(hs), 5)])
	}
	for _, i := range []int{0, n / 2, n - 1} {
		if i < 0 || tokens[i] == 0 {
			continue
		}
		le, err := l.TryAcquire(ctx, fmt.Sprintf("d2/churn/%d", i), lock.Exclusive)
		if err != nil {
			e.T.Fatalf("re-acquire: %v", err)
		}
		if le.Token() <= tokens[i] {
			e.T.Errorf("key d2/churn/%d re-acquired after its rows were deleted got token %d, not greater than %d", i, le.Token(), tokens[i])
		}
		_ = le.Release(ctx)
	}
}

// d2ExpiredRowsSweptInBatches: many leases left to expire are removed by
// Sweep in batches of at most the limit, until nothing is left.
func d2ExpiredRowsSweptInBatches(e *Env) {
	ctx := e.Ctx()
	n, workers, limit := 10_000, stgWriters(e), 500
	if e.Config.Short {
		n = 1_000
	}
	var next atomic.Int64
	tokens := make([]int64, n)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		l := e.NewLocker(nil, lock.WithTTL(lock.MinTTL), lock.WithLogger(discard))
		e.Go(&wg, func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || e.T.Failed() {
					return
				}
				le, err := l.TryAcquire(ctx, fmt.Sprintf("d2/exp/%d", i), lock.Exclusive)
				if err != nil {
					e.T.Errorf("acquire %d: %v", i, err)
					return
				}
				le.Orphan()
				tokens[i] = le.Token()
			}
		})
	}
	wg.Wait()
	if e.T.Failed() {
		return
	}
	l := e.NewLocker(nil)
	// A live lease and a live marker the sweeps must leave alone.
	live, err := l.TryAcquire(ctx, "d2/live", lock.Shared)
	if err != nil {
		e.T.Fatalf("%v", err)
	}
	wctx, stopWaiter := context.WithCancel(ctx)
	var wwg sync.WaitGroup
	waiter := e.NewLocker(nil, lock.WithPendingWriterTTL(2*time.Second), lock.WithMaxBackoff(200*time.Millisecond))
	e.Go(&wwg, func() {
		if le, err := waiter.Acquire(wctx, "d2/live", lock.Exclusive); err == nil {
			e.T.Errorf("writer granted while the reader held the key")
			_ = le.Release(ctx)
		}
	})
	defer wwg.Wait()
	defer stopWaiter()
	if !Eventually(5*time.Second, func() bool { return len(stgHolders(e, l, "d2/live")) == 2 }) {
		e.T.Fatalf("no marker: %v", stgHolders(e, l, "d2/live"))
	}

	// Wait until every orphaned lease expired in database time.
	var hs []lock.Holder
	if !Eventually(10*time.Second, func() bool {
		var now time.Time
		hs, now, err = l.Holders(ctx, "d2/exp/")
		if err != nil {
			e.T.Fatalf("holders: %v", err)
		}
		for _, h := range hs {
			if h.Expiry.After(now) {
				return false
			}
		}
		return true
	}) {
		e.T.Fatalf("orphaned leases did not expire")
	}
	if len(hs) != n {
		e.T.Fatalf("%d expired leases listed, want %d", len(hs), n)
	}
	rows := stgRowCount(e, l)
	var total int64
	calls := 0
	start := time.Now()
	for {
		removed, err := l.Sweep(ctx, limit)
		if err != nil {
			e.T.Fatalf("sweep: %v", err)
		}
		calls++
		if removed > int64(limit) {
			e.T.Errorf("sweep #%d removed %d holder rows, more than its limit %d", calls, removed, limit)
		}
		left := len(stgHoldersPrefix(e, l, "d2/exp/"))
		if int64(n)-total-removed != int64(left) {
			e.T.Errorf("sweep #%d reported %d rows removed, but the listing went from %d to %d", calls, removed, int64(n)-total, left)
		}
		total += removed
		if removed == 0 {
			break
		}
		if calls > 2*n/limit+10 {
			e.T.Fatalf("sweep does not converge: %d calls, %d removed", calls, total)
		}
	}
	e.T.Logf("%d expired leases (%d rows) swept in %d calls of limit %d in %s", n, rows, calls, limit, time.Since(start).Round(time.Millisecond))
	if total != int64(n) {
		e.T.Errorf("sweeps removed %d holder rows, want %d", total, n)
	}
	if calls < n/limit {
		e.T.Errorf("%d rows swept in %d calls of limit %d", total, calls, limit)
	}
	got := stgHolders(e, l, "d2/live")
	if len(got) != 2 || live.Err() != nil {
		e.T.Errorf("the live lease and the live marker must survive the sweeps; the database has %v, lease %v", got, live.Err())
	}
	stopWaiter()
	wwg.Wait()
	if err := live.Release(ctx); err != nil {
		e.T.Errorf("release of the live lease: %v", err)
	}
	// Nothing is live now. A dialect may keep short-lived bookkeeping of a
	// waiter that just gave up (a marker, a watch) until it expires: sweep
	// until the tables are empty, for a bounded time.
	rc := stgRowCount(e, l)
	t0 := time.Now()
	if !Eventually(20*time.Second, func() bool {
		if _, err := l.Sweep(ctx, limit); err != nil {
			e.T.Fatalf("sweep: %v", err)
		}
		return stgRowCount(e, l) == 0
	}) {
		hs, _, _ := l.Holders(ctx, "")
		e.T.Errorf("nothing is live, yet sweeping for 20 s leaves %d rows: %v", stgRowCount(e, l), hs[:min(len(hs), 5)])
	} else if rc != 0 {
		e.T.Logf("%d rows were left right after the last lease was released; sweeps emptied the tables in %s", rc, time.Since(t0).Round(time.Millisecond))
	}
	for _, i := range []int{0, n - 1} {
		le, err := l.TryAcquire(ctx, fmt.Sprintf("d2/exp/%d", i), lock.Exclusive)
		if err != nil {
			e.T.Fatalf("re-acquire: %v", err)
		}
		if le.Token() <= tokens[i] {
			e.T.Errorf("key d2/exp/%d re-acquired after its rows were swept got token %d, not greater than %d", i, le.Token(), tokens[i])
		}
		_ = le.Release(ctx)
	}
}

func stgHoldersPrefix(e *Env, l *lock.Locker, prefix string) []lock.Holder {
	e.T.Helper()
	hs, _, err := l.Holders(e.Ctx(), prefix)
	if err != nil {
		e.T.Fatalf("holders: %v", err)
	}
	return hs
}

// stgSweeper runs Sweep with limit in a loop until stop is closed, pausing
// pause between calls, and returns the number of rows removed.
func stgSweeper(e *Env, wg *sync.WaitGroup, limit int, pause time.Duration) (stop func() int64) {
	l := e.NewLocker(nil, lock.WithLogger(discard))
	done := make(chan struct{})
	var total atomic.Int64
	e.Go(wg, func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			n, err := l.Sweep(e.Ctx(), limit)
			if err != nil && e.Dialect.Classify(err) != dialect.ErrorRetryable {
				e.T.Errorf("sweep: %v", err)
				return
			}
			total.Add(n)
			time.Sleep(pause)
		}
	})
	var once sync.Once
	return func() int64 {
		once.Do(func() { close(done) })
		return total.Load()
	}
}

// d2SweepSparesLiveLeasesAndMarkers: while sweepers run non-stop and expired
// rows keep appearing, a writer waiting behind a reader keeps its marker
// (no new reader is let in), and the renewing reader keeps its lease.
func d2SweepSparesLiveLeasesAndMarkers(e *Env) {
	ctx := e.Ctx()
	// TTLs and the marker's TTL leave seconds of slack: a lapse under a
	// loaded machine must not pass for a sweep.
	// The renew timeout is the longest allowed (TTL/3): two renewals that
	// each took more than TTL/5 on a loaded CI machine once lost the
	// writer's lease through PgBouncer.
	reader := e.NewLocker(nil, lock.WithTTL(3*time.Second), lock.WithRenewTimeout(time.Second))
	writer := e.NewLocker(nil, lock.WithTTL(3*time.Second), lock.WithRenewTimeout(time.Second), lock.WithMaxBackoff(50*time.Millisecond), lock.WithPendingWriterTTL(3*time.Second))
	probe := e.NewLocker(nil)
	junk := e.NewLocker(nil, lock.WithTTL(lock.MinTTL), lock.WithLogger(discard))

	r, err := reader.TryAcquire(ctx, "d2/m", lock.Shared)
	if err != nil {
		e.T.Fatalf("%v", err)
	}
	var wg sync.WaitGroup
	stopJunk := make(chan struct{})
	e.Go(&wg, func() {
		// Keep producing expired rows for the sweepers.
		for i := 0; ; i++ {
			select {
			case <-stopJunk:
				return
			default:
			}
			le, err := junk.TryAcquire(ctx, fmt.Sprintf("d2/junk/%d", i), lock.Exclusive)
			if err != nil {
				e.T.Errorf("junk: %v", err)
				return
			}
			le.Orphan()
			time.Sleep(5 * time.Millisecond)
		}
	})
	stop1 := stgSweeper(e, &wg, 7, 5*time.Millisecond)
	stop2 := stgSweeper(e, &wg, 100, 20*time.Millisecond)
	granted := make(chan *lock.Lease, 1)
	e.Go(&wg, func() {
		le, err := writer.Acquire(ctx, "d2/m", lock.Exclusive, lock.WaitTimeout(20*time.Second))
		if err != nil {
			e.T.Errorf("writer: %v", err)
		}
		granted <- le
	})
	if !Eventually(5*time.Second, func() bool { return len(stgHolders(e, probe, "d2/m")) == 2 }) {
		e.T.Fatalf("no marker: %v", stgHolders(e, probe, "d2/m"))
	}
	probes := 0
	for t0 := time.Now(); time.Since(t0) < 1500*time.Millisecond; probes++ {
		le, err := probe.TryAcquire(ctx, "d2/m", lock.Shared)
		if err == nil {
			e.T.Errorf("a new reader was granted while a writer waited: its marker was swept or lapsed (%v)", stgHolders(e, probe, "d2/m"))
			_ = le.Release(ctx)
			break
		}
		var le2 *lock.LockedError
		if !errors.As(err, &le2) || len(le2.Holders) != 1 || le2.Holders[0].Mode != lock.PendingWriter {
			e.T.Errorf("new reader: want a *LockedError naming the pending writer, got %v", err)
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := r.Err(); err != nil {
		e.T.Errorf("the renewing reader lost its lease while sweepers ran: %v", err)
	}
	if err := r.Release(ctx); err != nil {
		e.T.Errorf("release of the reader (its row must not have been swept): %v", err)
	}
	var w *lock.Lease
	select {
	case w = <-granted:
	case <-time.After(10 * time.Second):
		e.T.Fatalf("the writer was not granted after the reader left")
	}
	time.Sleep(3500 * time.Millisecond) // the writer renews past its TTL under the sweepers
	close(stopJunk)
	swept := stop1() + stop2()
	wg.Wait()
	if w != nil {
		if err := w.Err(); err != nil {
			e.T.Errorf("the writer lost its lease while sweepers ran: %v", err)
		}
		if err := w.Release(ctx); err != nil {
			e.T.Errorf("release of the writer (its row must not have been swept): %v", err)
		}
	}
	e.T.Logf("%d probes refused; sweepers removed %d expired rows meanwhile", probes, swept)
	if swept == 0 {
		e.T.Errorf("the sweepers removed nothing; the case did not exercise them")
	}
}

// d2SweepDuringStress: workers contend for a few keys, holding leases long
// enough to renew them, while crashed holders leave expired rows and two
// sweepers run non-stop. No live lease is ever swept (no loss, no failed
// release), and the grant log shows mutual exclusion and increasing tokens.
func d2SweepDuringStress(e *Env) {
	ctx := e.Ctx()
	table := e.Table("grants")
	if err := CreateLogTable(ctx, e.DB, table); err != nil {
		e.T.Fatalf("create log: %v", err)
	}
	insert := fmt.Sprintf(`INSERT INTO %s (lock_key, token, mode, acquired_us, released_us, worker) VALUES (%s, %s, %s, %s, %s, %s)`,
		table, e.Dialect.Placeholder(1), e.Dialect.Placeholder(2), e.Dialect.Placeholder(3), e.Dialect.Placeholder(4), e.Dialect.Placeholder(5), e.Dialect.Placeholder(6))
	dur := 4 * time.Second
	if e.Config.Short {
		dur = 1500 * time.Millisecond
	}
	const (
		ttl      = 2 * time.Second
		crashTTL = lock.MinTTL
		keys     = 6
		workers  = 8
	)
	deadline := time.Now().Add(dur)
	var wg, sweepers sync.WaitGroup
	var grants, crashes, strict atomic.Int64
	// The case runs for dur, and on (up to a minute more) until it has
	// done enough to prove something: on a loaded machine dur alone can
	// give only a handful of grants.
	const minGrants = 10
	hard := deadline.Add(time.Minute)
	running := func() bool {
		if e.T.Failed() {
			return false
		}
		now := time.Now()
		return now.Before(deadline) || (now.Before(hard) && (grants.Load() < minGrants || crashes.Load() == 0))
	}
	logGrant := func(le *lock.Lease, acquired, released int64, worker string) {
		if _, err := e.DB.ExecContext(ctx, insert, le.Key(), le.Token(), le.Mode().String(), acquired, released, worker); err != nil {
			e.T.Errorf("log: %v", err)
		}
	}
	stopSweep1 := stgSweeper(e, &sweepers, 3, 5*time.Millisecond)
	stopSweep2 := stgSweeper(e, &sweepers, 50, 20*time.Millisecond)
	randKey := func() (string, lock.Mode) {
		mode := lock.Exclusive
		if rand.IntN(100) < 30 {
			mode = lock.Shared
		}
		return fmt.Sprintf("d2/stress/%d", rand.IntN(keys)), mode
	}
	// A holder that keeps crashing: each of its leases is orphaned, expires,
	// and is taken over or swept.
	crasher := e.NewLocker(nil, lock.WithTTL(crashTTL), lock.WithMaxBackoff(20*time.Millisecond), lock.WithLogger(discard))
	e.Go(&wg, func() {
		for running() {
			key, mode := randKey()
			if n := crashes.Load(); n%2 == 0 {
				// A key no worker touches: only a sweep removes its row.
				key = fmt.Sprintf("d2/crash/%d", n)
			}
			le, err := crasher.Acquire(ctx, key, mode, lock.WaitTimeout(time.Second))
			if errors.Is(err, lock.ErrLocked) {
				continue
			}
			if err != nil {
				e.T.Errorf("crasher acquire: %v", err)
				return
			}
			le.Orphan()
			crashes.Add(1)
			acquired := le.GrantedAt().UnixMicro()
			// Wait out the window so that Expiry is final (a renewal
			// answered later only makes the logged interval shorter than
			// the real one).
			<-le.Done()
			logGrant(le, acquired, le.Expiry().UnixMicro(), "crasher")
			time.Sleep(20 * time.Millisecond)
		}
	})
	for w := 0; w < workers; w++ {
		l := e.NewLocker(nil, lock.WithTTL(ttl), lock.WithMaxBackoff(20*time.Millisecond), lock.WithLogger(discard))
		name := fmt.Sprintf("w%d", w)
		e.Go(&wg, func() {
			for running() {
				key, mode := randKey()
				le, err := l.Acquire(ctx, key, mode, lock.WaitTimeout(2*time.Second))
				if errors.Is(err, lock.ErrLocked) {
					continue
				}
				if err != nil {
					e.T.Errorf("acquire: %v", err)
					return
				}
				grants.Add(1)
				acquired := le.GrantedAt().UnixMicro()
				// Hold long enough to renew once in a while.
				if rand.IntN(8) == 0 {
					time.Sleep(ttl/3 + time.Duration(rand.Int64N(int64(ttl/3))))
				} else {
					time.Sleep(time.Duration(rand.Int64N(int64(10 * time.Millisecond))))
				}
				var lle *lock.LeaseLostError
				if err := le.Err(); errors.As(err, &lle) && lle.Reason == lock.LossNotOurs {
					e.T.Errorf("%s: a renewing lease was reported gone from the database: %v", name, err)
				}
				_, now, err := l.Holders(ctx, key)
				if err != nil {
					e.T.Errorf("holders: %v", err)
					return
				}
				released := min(now.UnixMicro(), le.Expiry().UnixMicro())
				// A release that completes within the trusted window
				// (SPEC H1) deletes a row that was live all along: it
				// must find it.
				trusted, t0 := le.Remaining(), time.Now()
				err = le.Release(ctx)
				if took := time.Since(t0); took < trusted {
					strict.Add(1)
					if err != nil {
						e.T.Errorf("%s: release of %q token %d within its trusted window (%s left, took %s): %v (swept while live?)", name, key, le.Token(), trusted, took, err)
					}
				} else if err != nil && !errors.Is(err, lock.ErrNotHeld) {
					e.T.Errorf("release: %v", err)
				}
				logGrant(le, acquired, released, name)
			}
		})
	}
	wg.Wait()
	swept := stopSweep1() + stopSweep2()
	sweepers.Wait()
	log, err := ReadLog(ctx, e.DB, table)
	if err != nil {
		e.T.Fatalf("read log: %v", err)
	}
	took := time.Since(deadline.Add(-dur)).Round(time.Millisecond)
	e.T.Logf("%d grants (%d checked strictly), %d crashed holders, %d rows swept, %d log entries in %s", grants.Load(), strict.Load(), crashes.Load(), swept, len(log), took)
	if grants.Load() < minGrants || crashes.Load() == 0 {
		e.T.Errorf("the stress did not stress: %d grants, %d crashes in %s (want >= %d grants and a crash)", grants.Load(), crashes.Load(), took, minGrants)
	}
	if swept == 0 {
		e.T.Errorf("the sweepers removed nothing")
	}
	for _, line := range CheckLog(log) {
		e.T.Errorf("%s", line)
	}
}
