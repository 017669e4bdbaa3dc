package mysqldialect_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/mysqldialect"
	"github.com/sqlease/sqlease/internal/pgcluster"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// TestFailoverPauseSeesANewServer_MySQL checks the failover pause
// (migration 00003, lock.WithFailoverPause; SPEC S7) on the shared server,
// where a new primary is simulated by recording another server in the
// epoch row (as the row replicated from the old primary reads on a
// promoted replica). Turning the pause on does not pause the server it is
// turned on at; a server the row does not name grants nothing for the
// pause after it was first seen, shared and exclusive, Try and blocking
// alike, while a lease granted before renews; a refused grant writes
// nothing (an expired holder it took over is back) and leaves no named
// lock held; the pause applies to Lockers built without the option too;
// and grants resume when it ends.
func TestFailoverPauseSeesANewServer_MySQL(t *testing.T) {
	if conformance.IsChild() {
		t.Skip("child process")
	}
	ctx := t.Context()
	db, ns, _ := tokenSchema(t, "sqlease_pause_", 0)
	d := mysqldialect.New()
	const ttl = 2 * time.Second
	opts := []lock.Option{lock.WithSchema(ns.Schema), lock.WithTTL(ttl)}
	a, err := lock.New(ctx, db, d, append(opts, lock.WithFailoverPause(ttl))...)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(context.Background())
	plain, err := lock.New(ctx, db, d, opts...) // no option: the namespace's pause applies
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close(context.Background())

	held, err := a.TryAcquire(ctx, "held", lock.Exclusive)
	if err != nil {
		t.Fatalf("grant on the server the pause was turned on at: %v", err)
	}
	// An expired holder of "taken": a refused grant of the key takes it
	// over, then must roll that back.
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	acquire := "CALL " + ns.Object(d, "acquire") + "(?, 'x', ?, 'test', ?, 0, 0)"
	var row struct {
		granted               int
		id, mode, owner       string
		token, expires, nowUS int64
	}
	scan := func(r *sql.Row) error {
		return r.Scan(&row.granted, &row.id, &row.mode, &row.owner, &row.token, &row.expires, &row.nowUS)
	}
	if err := scan(conn.QueryRowContext(ctx, acquire, "taken", "L-expired", 1)); err != nil || row.granted != 1 {
		t.Fatalf("grant of an expiring lease: granted %d, %v", row.granted, err)
	}

	var server string
	if err := db.QueryRowContext(ctx, "SELECT server FROM "+ns.Object(d, "epoch")).Scan(&server); err != nil {
		t.Fatal(err)
	}
	t.Logf("the epoch row names %q", server)
	if _, err := db.ExecContext(ctx, "UPDATE "+ns.Object(d, "epoch")+" SET server = 'another'"); err != nil {
		t.Fatal(err)
	}
	seen := time.Now()

	// The procedure itself: SQLSTATE SL002, classified as the pause;
	// nothing written, no named lock left, the session's lock wait back.
	time.Sleep(time.Millisecond) // L-expired has expired
	var waitBefore, waitAfter int
	if err := conn.QueryRowContext(ctx, "SELECT @@SESSION.innodb_lock_wait_timeout").Scan(&waitBefore); err != nil {
		t.Fatal(err)
	}
	err = scan(conn.QueryRowContext(ctx, acquire, "taken", "L-new", 60_000_000))
	var me *mysql.MySQLError
	if !errors.As(err, &me) || string(me.SQLState[:]) != mysqldialect.SQLStateFailoverPause || d.Classify(err) != dialect.ErrorFailoverPause {
		t.Fatalf("CALL acquire on a server the epoch row does not name: %v (class %s), want SQLSTATE %s classified ErrorFailoverPause",
			err, d.Classify(err), mysqldialect.SQLStateFailoverPause)
	}
	t.Logf("refused: %v", err)
	var n int
	var keyLock sql.NullInt64
	holders := ns.Object(d, "holders")
	if err := conn.QueryRowContext(ctx, `SELECT (SELECT COUNT(*) FROM `+holders+` WHERE lock_key = 'taken' AND lease_id = 'L-expired'),
		IS_USED_LOCK(CONCAT('sqlease:', SHA1(CONCAT(?, ':', 'taken')))),
		@@SESSION.innodb_lock_wait_timeout`, holders).Scan(&n, &keyLock, &waitAfter); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("the refused grant's takeover of the expired holder was kept (%d rows left), want it rolled back", n)
	}
	if keyLock.Valid {
		t.Errorf("the per-key named lock is held after the refusal (%v); want it free", keyLock)
	}
	if waitAfter != waitBefore {
		t.Errorf("innodb_lock_wait_timeout %d after the refusal, was %d", waitAfter, waitBefore)
	}
	if err := conn.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+holders+" WHERE lease_id = 'L-new'").Scan(&n); err != nil || n != 0 {
		t.Errorf("the refused grant left %d rows, %v", n, err)
	}

	for _, l := range []*lock.Locker{a, plain} {
		for _, m := range []lock.Mode{lock.Exclusive, lock.Shared} {
			_, err := l.TryAcquire(ctx, "k", m)
			var le *lock.LockedError
			if !errors.Is(err, lock.ErrLocked) || !errors.As(err, &le) || len(le.Holders) != 1 || le.Holders[0].Mode != lock.FailoverPause {
				t.Fatalf("%s try on a new server: %v, want ErrLocked naming the failover pause", m, err)
			}
			if left := time.Until(le.Holders[0].Expiry); left <= 0 || left > ttl+time.Second {
				t.Errorf("the pause ends in %v, want within the pause %v", left, ttl)
			}
		}
	}
	if err := held.Renew(ctx); err != nil {
		t.Errorf("a lease granted before the change did not renew during the pause: %v", err)
	}
	le, err := plain.Acquire(ctx, "k", lock.Exclusive, lock.WaitTimeout(3*ttl))
	if err != nil {
		t.Fatalf("blocking acquire across the pause: %v", err)
	}
	waited := time.Since(seen)
	t.Logf("blocking acquire granted %v after the new server was first seen (pause %v)", waited.Round(time.Millisecond), ttl)
	if waited < ttl-100*time.Millisecond {
		t.Errorf("granted %v after the new server was first seen, inside the %v pause", waited, ttl)
	}
	if err := db.QueryRowContext(ctx, "SELECT server FROM "+ns.Object(d, "epoch")).Scan(&server); err != nil || server == "another" {
		t.Errorf("the epoch row names %q after the pause (%v), want this server", server, err)
	}
	_ = le.Release(ctx)
	_ = held.Release(ctx)

	// The option's own checks.
	if l, err := lock.New(ctx, db, d, lock.WithSchema(ns.Schema), lock.WithTTL(ttl), lock.WithFailoverPause(ttl/2)); !errors.Is(err, lock.ErrInvalidInput) {
		if l != nil {
			l.Close(ctx)
		}
		t.Errorf("a pause shorter than the TTL: %v, want ErrInvalidInput", err)
	}
}

// TestFailoverPauseNoOverlap_MySQL: with lock.WithFailoverPause, the
// promotion of an asynchronous GTID replica that lost a grant leaves no
// two holders of a key at once (SPEC S7): the promoted replica grants
// nothing until one maximum TTL after it was first seen, by which time the
// holder of the lost grant has stopped trusting it; a lease whose row
// reached the replica renews meanwhile; tokens still never go back.
func TestFailoverPauseNoOverlap_MySQL(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const ttl = 3 * time.Second
	primary, replica := startPair(t)
	d := mysqldialect.New()
	if _, err := migrate.Up(ctx, primary.DB, d); err != nil {
		t.Fatal(err)
	}
	// Every Locker reaches the database through a proxy, re-pointed at the
	// promoted replica after the failover.
	px, err := pgcluster.StartProxy(fmt.Sprintf("127.0.0.1:%d", primary.port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Close)
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr, cfg.DBName, cfg.ParseTime = "root", "tcp", px.Addr(), "test", true
	cfg.Timeout = 2 * time.Second
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	newLocker := func(owner string) *lock.Locker {
		l, err := lock.New(ctx, db, d, lock.WithTTL(ttl), lock.WithOwner(owner), lock.WithFailoverPause(ttl))
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
	catchUp(t, primary, replica) // the epoch row and the survivor's row
	replica.Exec("STOP SLAVE")
	lost, err := a.TryAcquire(ctx, "h", lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	// By the local clock: the lost lease is trusted until lostTrustEnd.
	lostTrustEnd := time.Now().Add(lost.Remaining())

	primary.Kill()
	replica.Exec("STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL read_only = 0")
	px.SetUpstream(fmt.Sprintf("127.0.0.1:%d", replica.port))
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
		t.Errorf("the promoted replica granted %q %v before the holder of the lost grant stopped trusting it: two holders", "h", lostTrustEnd.Sub(granted))
	}
	var server string
	var sinceUS, pauseUS int64
	if err := replica.DB.QueryRowContext(ctx, "SELECT server, since_us, pause_us FROM sqlease_epoch").Scan(&server, &sinceUS, &pauseUS); err != nil {
		t.Fatal(err)
	}
	t.Logf("epoch row on the promoted replica: server %q, since %d µs, pause %d µs", server, sinceUS, pauseUS)
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
		t.Errorf("renewing the surviving lease on the promoted replica: %v", err)
	}
	if !errors.Is(lost.Err(), lock.ErrLeaseLost) {
		t.Errorf("the lease whose grant was lost: Err %v, want ErrLeaseLost", lost.Err())
	}
	_ = nh.Release(ctx)
	_ = survivor.Release(ctx)
}

// TestFailoverPauseMigration3DownUp_MySQL: Down from 00003 removes the
// epoch table and {primary_seen} and restores 00002's acquire procedure
// (which grants on a namespace whose pause was on); Up again installs the
// pause, off until a Locker turns it on.
func TestFailoverPauseMigration3DownUp_MySQL(t *testing.T) {
	if conformance.IsChild() {
		t.Skip("child process")
	}
	ctx := t.Context()
	db, ns, p := tokenSchema(t, "sqlease_pause_m3_", 0)
	d := mysqldialect.New()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	seePrimary := "CALL " + ns.Object(d, "primary_seen") + "(?)"
	var until, now int64
	if err := conn.QueryRowContext(ctx, seePrimary, 5_000_000).Scan(&until, &now); err != nil {
		t.Fatal(err)
	}
	if until != 5_000_000 {
		t.Errorf("first primary_seen(5 s): until %d, want 5000000 (since 0: the first server is not paused)", until)
	}
	tok := callAcquire(t, conn, ns, "m")
	if _, err := conn.ExecContext(ctx, "UPDATE "+ns.Object(d, "epoch")+" SET server = 'another'"); err != nil {
		t.Fatal(err)
	}
	if _, err := p.DownTo(ctx, 2); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRowContext(ctx, `SELECT (SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = ? AND table_name = 'sqlease_epoch')
		+ (SELECT COUNT(*) FROM information_schema.routines WHERE routine_schema = ? AND routine_name = 'sqlease_primary_seen')`, ns.Schema, ns.Schema).Scan(&n); err != nil || n != 0 {
		t.Errorf("after Down to 00002: %d epoch tables and primary_seen procedures left, %v", n, err)
	}
	again := callAcquire(t, conn, ns, "m") // 00002's procedure: no pause
	if again <= tok {
		t.Errorf("after Down to 00002: token %d, want > %d", again, tok)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if tok = callAcquire(t, conn, ns, "m"); tok <= again {
		t.Errorf("after Up again: token %d, want > %d", tok, again)
	}
	// A second call with a larger pause raises it; a smaller one leaves it;
	// the same server keeps since_us.
	for _, c := range []struct{ pause, want int64 }{{2_000_000, 2_000_000}, {4_000_000, 4_000_000}, {1_000_000, 4_000_000}} {
		if err := conn.QueryRowContext(ctx, seePrimary, c.pause).Scan(&until, &now); err != nil {
			t.Fatal(err)
		}
		if until != c.want {
			t.Errorf("primary_seen(%d): until %d, want %d", c.pause, until, c.want)
		}
	}
	// Another server recorded: the next call records this one, from now.
	if _, err := conn.ExecContext(ctx, "UPDATE "+ns.Object(d, "epoch")+" SET server = 'another'"); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRowContext(ctx, seePrimary, 0).Scan(&until, &now); err != nil {
		t.Fatal(err)
	}
	if until != now+4_000_000 {
		t.Errorf("primary_seen(0) on a server the row does not name: until %d, want now %d + 4 s", until, now)
	}
}
