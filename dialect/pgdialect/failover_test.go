package pgdialect_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/sqlease/sqlease/cli"
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/pgdialect"
	"github.com/sqlease/sqlease/internal/pgcluster"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// The tests of this file run private PostgreSQL clusters of their own
// (package internal/pgcluster: a primary, a hot standby streaming from it,
// a cluster restored from a base backup); they need the server binaries
// and an OS user postgres, not SQLEASE_POSTGRES_DSN. Without them they
// skip, or fail under SQLEASE_REQUIRE_POSTGRES=1.

// foNeed skips t when private clusters with replication cannot run here.
func foNeed(t *testing.T) {
	t.Helper()
	if why := pgcluster.ReplicationUnavailable(); why != "" {
		if os.Getenv("SQLEASE_REQUIRE_POSTGRES") == "1" {
			t.Fatalf("SQLEASE_REQUIRE_POSTGRES=1 but no private PostgreSQL cluster can run: %s", why)
		}
		t.Skipf("no private PostgreSQL cluster: %s", why)
	}
}

func foPrimary(t *testing.T, ctx context.Context) *pgcluster.Cluster {
	t.Helper()
	c, err := pgcluster.New(ctx, pgcluster.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Remove)
	return c
}

// foSyncPrimary starts a primary whose commits wait (synchronous_commit
// on) for the standby named "standby1" (foStandby's).
func foSyncPrimary(t *testing.T, ctx context.Context) *pgcluster.Cluster {
	t.Helper()
	c, err := pgcluster.New(ctx, pgcluster.Config{SynchronousStandby: "standby1", SynchronousCommit: "on"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Remove)
	return c
}

func foStandby(t *testing.T, ctx context.Context, primary *pgcluster.Cluster) *pgcluster.Cluster {
	t.Helper()
	s, err := pgcluster.StartStandby(ctx, primary, "standby1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Remove)
	return s
}

func foOpen(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func foLocker(t *testing.T, ctx context.Context, db *sql.DB) *lock.Locker {
	t.Helper()
	l, err := lock.New(ctx, db, pgdialect.New(), lock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = l.Close(cctx)
	})
	return l
}

// tokens records the greatest token granted per key.
type tokens map[string]int64

func (m tokens) add(key string, tok int64) {
	if tok > m[key] {
		m[key] = tok
	}
}

// foGrants makes n exclusive grants of key (each released at once) and n
// rounds of two concurrent shared grants of shared; it records every token
// in seen and returns the least of them in least (when non-nil).
func foGrants(t *testing.T, ctx context.Context, l *lock.Locker, key, shared string, n int, seen, least tokens) {
	t.Helper()
	note := func(key string, tok int64) {
		seen.add(key, tok)
		if least != nil {
			if v, ok := least[key]; !ok || tok < v {
				least[key] = tok
			}
		}
	}
	for i := 0; i < n; i++ {
		le, err := l.TryAcquire(ctx, key, lock.Exclusive)
		if err != nil {
			t.Fatalf("grant %d of %q: %v", i, key, err)
		}
		note(key, le.Token())
		if err := le.Release(ctx); err != nil {
			t.Fatal(err)
		}
		var held []*lock.Lease
		for j := 0; j < 2; j++ {
			le, err := l.TryAcquire(ctx, shared, lock.Shared)
			if err != nil {
				t.Fatalf("shared grant %d of %q: %v", i, shared, err)
			}
			note(shared, le.Token())
			held = append(held, le)
		}
		for _, le := range held {
			if err := le.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// foCheckAfter fails t for every key whose least token granted after an
// event does not exceed the greatest granted before it.
func foCheckAfter(t *testing.T, event string, before, after tokens) {
	t.Helper()
	for key, first := range after {
		if first <= before[key] {
			t.Errorf("key %q: token %d granted after %s does not exceed token %d granted before it: fencing tokens went back, "+
				"so a write fenced by the old grant would be accepted after the new one (SPEC S7)", key, first, event, before[key])
		}
	}
}

// TestFailoverAsyncTokensNeverGoBack: a primary with an asynchronous hot
// standby; replication is cut, the primary goes on granting (those grants
// never reach the standby), then it dies and the standby is promoted.
// Every token the new primary grants, on every key, must exceed every
// token the old one granted, including the grants the new primary never
// saw (SPEC S2 across a failover). And the holder of a lease granted after
// the cut, whose connections are re-pointed at the new primary, learns of
// the loss at its next renewal (the new primary has no such lease): its
// lease context ends with ErrLeaseLost and its fenced transaction does not
// commit there.
//
// On token generation from a sequence alone this fails: the standby's
// sequence is only as far as the WAL it received (plus the up-to-32
// values a logged sequence runs ahead), far behind the old primary.
func TestFailoverAsyncTokensNeverGoBack(t *testing.T) {
	foNeed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	p := foPrimary(t, ctx)
	s := foStandby(t, ctx, p)
	pdb := foOpen(t, p.DSN())
	if _, err := migrate.Up(ctx, pdb, pgdialect.New()); err != nil {
		t.Fatal(err)
	}
	if _, err := pdb.ExecContext(ctx, "CREATE TABLE fenced_writes (n int)"); err != nil {
		t.Fatal(err)
	}
	before := tokens{}
	l := foLocker(t, ctx, pdb)
	foGrants(t, ctx, l, "k", "s", 5, before, nil)
	if err := s.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	replicated := fmt.Sprint(before)
	if err := s.CutReplication(); err != nil {
		t.Fatal(err)
	}
	foGrants(t, ctx, l, "k", "s", 100, before, nil)

	// The holder reaches the database through a proxy, re-pointed at the
	// new primary after the failover (as a DNS name or a virtual IP would
	// be).
	px, err := pgcluster.StartProxy(p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Close)
	hdb := foOpen(t, fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable&connect_timeout=5", px.Addr()))
	hl := foLocker(t, ctx, hdb)
	h, err := hl.TryAcquire(ctx, "h", lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	before.add("h", h.Token())
	t.Logf("greatest tokens granted by the old primary: %v (%v when the standby caught up, before the cut)", before, replicated)

	// The primary dies; the standby is promoted; the holder's connections
	// now lead to the new primary.
	p.Kill()
	failedAt := time.Now()
	if err := s.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	px.SetUpstream(s.Addr())
	px.Cut()
	t.Logf("primary killed, standby promoted in %v", time.Since(failedAt).Round(time.Millisecond))

	sdb := foOpen(t, s.DSN())
	nl := foLocker(t, ctx, sdb)
	after := tokens{}
	least := tokens{}
	foGrants(t, ctx, nl, "k", "s", 3, after, least)
	for i := 0; i < 3; i++ {
		le, err := nl.TryAcquire(ctx, "h", lock.Exclusive)
		if err != nil {
			t.Fatalf("grant %d of %q on the new primary: %v", i, "h", err)
		}
		after.add("h", le.Token())
		if v, ok := least["h"]; !ok || le.Token() < v {
			least["h"] = le.Token()
		}
		if err := le.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("least tokens granted by the new primary: %v (greatest %v)", least, after)
	foCheckAfter(t, "the failover", before, least)

	// The holder of "h" learns of the loss at its next renewal (every
	// TTL/3), which the new primary answers without the lease.
	select {
	case <-h.Done():
	case <-time.After(15 * time.Second):
		t.Fatalf("the lease of %q granted after the cut is still held 15s after the failover", "h")
	}
	cause := context.Cause(h.Context())
	var lost *lock.LeaseLostError
	switch {
	case !errors.Is(cause, lock.ErrLeaseLost) || !errors.As(cause, &lost):
		t.Errorf("lease context of %q ended with %v, want a *LeaseLostError (ErrLeaseLost)", "h", cause)
	case lost.Reason != lock.LossNotOurs:
		t.Errorf("lease of %q lost with reason %q, want %q: the new primary's answer to a renewal", "h", lost.Reason, lock.LossNotOurs)
	}
	if err := h.Err(); !errors.Is(err, lock.ErrLeaseLost) {
		t.Errorf("Err of the lost lease: %v, want ErrLeaseLost", err)
	}
	err = h.RunInTx(ctx, hdb, nil, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO fenced_writes VALUES (1)")
		return err
	})
	if !errors.Is(err, lock.ErrLeaseLost) {
		t.Errorf("fenced transaction of the lost lease on the new primary: %v, want ErrLeaseLost", err)
	}
	var n int
	if err := sdb.QueryRowContext(ctx, "SELECT count(*) FROM fenced_writes").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("the lost lease's fenced transaction committed %d rows on the new primary", n)
	}
	t.Logf("total %v", time.Since(start).Round(time.Millisecond))
}

// TestRestoreBaseBackupTokensNeverGoBack: a cluster restored from a base
// backup replays the backup only, not what its source did after it; every
// token it grants must still exceed every token the source issued (SPEC
// S2 across a restore). On token generation from a sequence alone this
// fails.
func TestRestoreBaseBackupTokensNeverGoBack(t *testing.T) {
	foNeed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := foPrimary(t, ctx)
	pdb := foOpen(t, p.DSN())
	if _, err := migrate.Up(ctx, pdb, pgdialect.New()); err != nil {
		t.Fatal(err)
	}
	before := tokens{}
	l := foLocker(t, ctx, pdb)
	foGrants(t, ctx, l, "k", "s", 5, before, nil)
	b, err := p.BaseBackup(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Remove)
	backedUp := fmt.Sprint(before)
	foGrants(t, ctx, l, "k", "s", 100, before, nil)
	t.Logf("greatest tokens granted by the source: %v (%v at the backup)", before, backedUp)
	p.Stop(false)

	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	rl := foLocker(t, ctx, foOpen(t, b.DSN()))
	after, least := tokens{}, tokens{}
	foGrants(t, ctx, rl, "k", "s", 3, after, least)
	t.Logf("least tokens granted by the restored cluster: %v (greatest %v)", least, after)
	foCheckAfter(t, "the restore", before, least)
}

// TestStandbyRefusesLocker: a hot standby is read-only; lock.New,
// migrate.Up and the CLI refuse it at once with ErrReadOnly, naming the
// server (SPEC S7).
func TestStandbyRefusesLocker(t *testing.T) {
	foNeed(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := foPrimary(t, ctx)
	s := foStandby(t, ctx, p)
	if _, err := migrate.Up(ctx, foOpen(t, p.DSN()), pgdialect.New()); err != nil {
		t.Fatal(err)
	}
	if err := s.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	sdb := foOpen(t, s.DSN())
	port := fmt.Sprint(s.Port())
	l, err := lock.New(ctx, sdb, pgdialect.New(), lock.WithTTL(2*time.Second))
	var se *dialect.ServerError
	if !errors.Is(err, lock.ErrReadOnly) || !errors.As(err, &se) || !strings.Contains(err.Error(), "hot standby at 127.0.0.1:"+port) {
		if l != nil {
			l.Close(ctx)
		}
		t.Fatalf("lock.New on a hot standby: want ErrReadOnly naming 127.0.0.1:%s, got %v", port, err)
	}
	if _, err := migrate.Up(ctx, sdb, pgdialect.New()); !errors.Is(err, lock.ErrReadOnly) {
		t.Fatalf("migrate.Up on a hot standby: want ErrReadOnly, got %v", err)
	}
	var out, stderr strings.Builder
	if code := cli.Main([]string{"status", "--dsn", s.DSN()}, &out, &stderr); code == 0 || !strings.Contains(stderr.String(), "read-only") || !strings.Contains(stderr.String(), port) {
		t.Fatalf("sqlease status on a hot standby: exit %d, stderr %q; want a failure saying read-only and naming the DSN", code, stderr.String())
	}
	t.Logf("lock.New: %v; sqlease status: %s", err, stderr.String())
	// A renewal pool on the standby is refused too.
	pdb := foOpen(t, p.DSN())
	if l, err := lock.New(ctx, pdb, pgdialect.New(), lock.WithRenewDB(sdb)); !errors.Is(err, lock.ErrReadOnly) || !strings.Contains(err.Error(), "renewal pool") {
		if l != nil {
			l.Close(ctx)
		}
		t.Fatalf("lock.New with a renewal pool on a hot standby: want ErrReadOnly naming the renewal pool, got %v", err)
	}
	// The primary is unaffected.
	pl := foLocker(t, ctx, pdb)
	le, err := pl.TryAcquire(ctx, "k", lock.Exclusive)
	if err != nil {
		t.Fatalf("primary after the standby was refused: %v", err)
	}
	_ = le.Release(ctx)
}

// TestSyncStandbyStallLosesNothingAcknowledged: with a synchronous standby
// (synchronous_commit on) whose acknowledgements stall past the acquire's
// deadline and the renew timeout, PostgreSQL answers the driver's cancel of
// a commit waiting for the standby with success and a warning. The library
// must not count such a grant or renewal (SPEC S7, H1): after the primary
// dies and the standby is promoted, no acquire the library returned is
// missing, the holder's trusted window ends no later than its row's expiry
// on the new primary, and no token is reissued.
//
// Two ways a driver cancels are tried: pgx's default (it closes the
// connection at the deadline, so the outcome reads as an error) and a
// cancel request whose answer the driver waits for (as lib/pq does, and
// pgx with pgconn.CancelRequestContextWatcherHandler): that answer is the
// success with a warning.
func TestSyncStandbyStallLosesNothingAcknowledged(t *testing.T) {
	foNeed(t)
	t.Run("DeadlineCloses", func(t *testing.T) { foSyncStall(t, foOpen) })
	t.Run("CancelRequest", func(t *testing.T) { foSyncStall(t, foOpenCancelRequest) })
}

// foOpenCancelRequest opens dsn with pgx set to cancel a statement by a
// cancel request and to wait for the server's answer.
func foOpenCancelRequest(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: 10 * time.Second}
	}
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { db.Close() })
	return db
}

func foSyncStall(t *testing.T, open func(*testing.T, string) *sql.DB) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := foSyncPrimary(t, ctx)
	s := foStandby(t, ctx, p)
	pdb := open(t, p.DSN())
	if _, err := migrate.Up(ctx, pdb, pgdialect.New()); err != nil {
		t.Fatal(err)
	}
	const ttl = 3 * time.Second
	l, err := lock.New(ctx, pdb, pgdialect.New(), lock.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = l.Close(cctx)
	})
	held, err := l.TryAcquire(ctx, "held", lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	before := tokens{}
	before.add("held", held.Token())

	// The standby stops acknowledging: every commit now waits.
	if err := s.CutReplication(); err != nil {
		t.Fatal(err)
	}
	// An acquire whose commit outlives its deadline is not acknowledged.
	actx, acancel := context.WithTimeout(ctx, time.Second)
	le, err := l.TryAcquire(actx, "new", lock.Exclusive)
	acancel()
	if err == nil {
		t.Errorf("an acquire whose commit never reached the synchronous standby returned a lease (token %d)", le.Token())
		before.add("new", le.Token())
	}
	t.Logf("acquire while the standby stalls: %v", err)
	// Let the held lease's renewal (at TTL/3, about when the acquire gave
	// up) stall past its timeout (TTL/5), within the lease's window.
	time.Sleep(time.Second)

	p.Kill()
	if err := s.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	sdb := foOpen(t, s.DSN())
	var leftUS int64
	err = sdb.QueryRowContext(ctx, `SELECT (extract(epoch FROM expires_at - clock_timestamp()) * 1e6)::bigint FROM sqlease_holders WHERE lease_id = $1`, held.LeaseID()).Scan(&leftUS)
	if err != nil {
		t.Fatalf("the acknowledged lease %q is missing on the promoted standby: %v", held.Key(), err)
	}
	rowLeft := time.Duration(leftUS) * time.Microsecond
	if trusted := held.Remaining(); trusted > 0 && trusted > rowLeft+20*time.Millisecond {
		t.Errorf("the holder trusts its lease for %v more, but its row on the new primary expires in %v: a renewal the standby never got was counted", trusted, rowLeft)
	}
	t.Logf("after the promotion: the holder trusts %v more, its row lives %v more (lease err: %v)", held.Remaining(), rowLeft, held.Err())

	nl := foLocker(t, ctx, sdb)
	after := tokens{}
	for _, key := range []string{"held", "new"} {
		le, err := nl.Acquire(ctx, key, lock.Exclusive, lock.WaitTimeout(2*ttl))
		if err != nil {
			t.Fatalf("acquire %q on the new primary: %v", key, err)
		}
		after.add(key, le.Token())
		_ = le.Release(ctx)
	}
	foCheckAfter(t, "the synchronous failover", before, after)
}

// TestMultiHostDSNFollowsPromotion: a Locker on a pgx multi-host DSN
// (host=a,b with target_session_attrs=read-write) over a synchronous
// standby keeps its lease across a failover shorter than the lease's
// trusted window: after the primary dies and the standby is promoted, the
// lease renews on the new primary, is never reported lost, and a fenced
// transaction commits there (SPEC S7, H2).
func TestMultiHostDSNFollowsPromotion(t *testing.T) {
	foNeed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := foSyncPrimary(t, ctx)
	s := foStandby(t, ctx, p)
	dsn := fmt.Sprintf("postgres://postgres@%s,%s/postgres?sslmode=disable&target_session_attrs=read-write&connect_timeout=2", p.Addr(), s.Addr())
	db := foOpen(t, dsn)
	if _, err := migrate.Up(ctx, db, pgdialect.New()); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE fenced_writes (token bigint)"); err != nil {
		t.Fatal(err)
	}
	l := foLocker(t, ctx, db) // TTL 10 s: renewed every 3.3 s
	le, err := l.TryAcquire(ctx, "k", lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	grantedExpiry := le.Expiry()

	p.Kill()
	failedAt := time.Now()
	if err := s.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("primary killed, standby promoted in %v", time.Since(failedAt).Round(time.Millisecond))

	// The next renewal reaches the new primary through the DSN's second
	// host and moves the expiry on.
	deadline := time.Now().Add(8 * time.Second)
	for !le.Expiry().After(grantedExpiry) {
		if err := le.Err(); err != nil {
			t.Fatalf("the lease was lost across a %v failover: %v", time.Since(failedAt).Round(time.Millisecond), err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no renewal reached the new primary within 8 s of the failover (trusted for %v more)", le.Remaining())
		}
		time.Sleep(50 * time.Millisecond)
	}
	err = le.RunInTx(ctx, db, nil, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO fenced_writes VALUES ($1)", le.Token())
		return err
	})
	if err != nil {
		t.Fatalf("fenced transaction on the new primary: %v", err)
	}
	var n int
	if err := foOpen(t, s.DSN()).QueryRowContext(ctx, "SELECT count(*) FROM fenced_writes").Scan(&n); err != nil || n != 1 {
		t.Fatalf("fenced writes on the new primary: %d, %v; want 1", n, err)
	}
	if err := le.Release(ctx); err != nil {
		t.Fatalf("release on the new primary: %v", err)
	}
}

// TestFailoverPauseNoOverlap: with lock.WithFailoverPause, an asynchronous
// promotion that lost a grant leaves no two holders of a key at once
// (SPEC S7): the new primary grants nothing until one maximum TTL after it
// was first seen, by which time the holder of the lost grant has stopped
// trusting it; a lease whose row survived renews meanwhile; tokens still
// never go back.
func TestFailoverPauseNoOverlap(t *testing.T) {
	foNeed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ttl = 3 * time.Second
	p := foPrimary(t, ctx)
	s := foStandby(t, ctx, p)
	if _, err := migrate.Up(ctx, foOpen(t, p.DSN()), pgdialect.New()); err != nil {
		t.Fatal(err)
	}
	// Every Locker reaches the database through a proxy, re-pointed at the
	// new primary after the failover.
	px, err := pgcluster.StartProxy(p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Close)
	db := foOpen(t, fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable&connect_timeout=5", px.Addr()))
	newLocker := func(owner string) *lock.Locker {
		l, err := lock.New(ctx, db, pgdialect.New(), lock.WithTTL(ttl), lock.WithOwner(owner), lock.WithFailoverPause(ttl))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_ = l.Close(cctx)
		})
		return l
	}
	a, b := newLocker("a"), newLocker("b")
	survivor, err := a.TryAcquire(ctx, "survivor", lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.CutReplication(); err != nil {
		t.Fatal(err)
	}
	lost, err := a.TryAcquire(ctx, "h", lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	// By the local clock: the lost lease is trusted until lostTrustEnd.
	lostTrustEnd := time.Now().Add(lost.Remaining())

	p.Kill()
	if err := s.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	px.SetUpstream(s.Addr())
	px.Cut()
	promoted := time.Now()

	// A try during the pause is refused, naming the pause.
	_, err = b.TryAcquire(ctx, "h", lock.Exclusive)
	var le *lock.LockedError
	if !errors.As(err, &le) || len(le.Holders) != 1 || le.Holders[0].Mode != lock.FailoverPause {
		t.Fatalf("TryAcquire right after the promotion: %v, want ErrLocked naming the failover pause", err)
	}
	t.Logf("refused during the pause: %v", err)
	// A blocking acquire is granted once the pause ends.
	nh, err := b.Acquire(ctx, "h", lock.Exclusive, lock.WaitTimeout(4*ttl))
	if err != nil {
		t.Fatalf("acquire after the pause: %v", err)
	}
	granted := time.Now()
	t.Logf("after the promotion: the lost grant was trusted for %v more, the first new grant came %v later",
		lostTrustEnd.Sub(promoted).Round(time.Millisecond), granted.Sub(promoted).Round(time.Millisecond))
	if granted.Before(lostTrustEnd) {
		t.Errorf("the new primary granted %q %v before the holder of the lost grant stopped trusting it: two holders", "h", lostTrustEnd.Sub(granted))
	}
	var sinceUS, pauseUS int64
	sdb := foOpen(t, s.DSN())
	if err := sdb.QueryRowContext(ctx, "SELECT since_us, pause_us FROM sqlease_epoch").Scan(&sinceUS, &pauseUS); err != nil {
		t.Fatal(err)
	}
	if g := nh.GrantedAt().UnixMicro(); g < sinceUS+pauseUS {
		t.Errorf("first grant at %d µs, before the pause ended (first seen %d + %d µs)", g, sinceUS, pauseUS)
	}
	if nh.Token() <= lost.Token() {
		t.Errorf("token after the promotion %d does not exceed the lost grant's %d", nh.Token(), lost.Token())
	}
	// The surviving lease renewed through the pause; the lost one is lost.
	if err := survivor.Err(); err != nil {
		t.Errorf("the lease whose row survived was lost during the pause: %v", err)
	}
	if err := survivor.Renew(ctx); err != nil {
		t.Errorf("renewing the surviving lease on the new primary: %v", err)
	}
	if !errors.Is(lost.Err(), lock.ErrLeaseLost) {
		t.Errorf("the lease whose grant was lost: Err %v, want ErrLeaseLost", lost.Err())
	}
	_ = nh.Release(ctx)
}
