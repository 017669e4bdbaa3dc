package pgdialect_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sqlease/sqlease/conformance/conftest"
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/lock"
)

// TestReleaseCommitsWithoutWaitingForFlush: the Release statement turns
// synchronous_commit off for its own transaction only (a release lost in a
// crash leaves the lease to expire, SPEC H5; the next grant's synchronous
// commit flushes it). Inside a transaction it shows "off" until the end;
// in autocommit, as the engine runs it, the connection's setting is the
// same after the release as before, whether the release deleted a row or
// not, and the released key can be acquired again at once.
func TestReleaseCommitsWithoutWaitingForFlush(t *testing.T) {
	ctx := context.Background()
	db, d, ns, _ := schemaAt(t, "sqlease_rel_", 0)
	// One connection, so the SHOWs below read the connection the Locker's
	// statements ran on.
	db.SetMaxOpenConns(1)
	show := func(q interface {
		QueryRowContext(context.Context, string, ...any) *sql.Row
	}) string {
		t.Helper()
		var v string
		if err := q.QueryRowContext(ctx, "SHOW synchronous_commit").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	if got := show(db); got != "on" {
		t.Skipf("the server's synchronous_commit is %q; the test needs the default, on", got)
	}
	l, err := lock.New(ctx, db, d, lock.WithSchema(ns.Schema))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)

	le, err := l.TryAcquire(ctx, "rel", lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	release := compileRelease(t, d, ns)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var key string
	var setting, woke sql.NullString
	args := release.Args(map[string]any{"lease_id": le.LeaseID(), "token": le.Token(), "channel": "sqlease_rel_test"})
	if err := tx.QueryRowContext(ctx, release.SQL, args...).Scan(&key, &setting, &woke); err != nil || key != "rel" {
		t.Fatalf("Release in a transaction: key %q, %v; want the row of %q", key, err, "rel")
	}
	if got := show(tx); got != "off" {
		t.Errorf("synchronous_commit after the Release statement, same transaction: %q, want off", got)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := show(db); got != "on" {
		t.Errorf("synchronous_commit after the transaction that released: %q, want on (transaction-local)", got)
	}

	// As the engine runs it: autocommit, deleting no row (the lease was
	// released by hand above: the release reports it), then deleting one.
	if err := le.Release(ctx); err != nil {
		t.Logf("release of a lease released by hand: %v", err)
	}
	if got := show(db); got != "on" {
		t.Errorf("synchronous_commit after a release that deleted nothing: %q, want on", got)
	}
	le2, err := l.TryAcquire(ctx, "rel", lock.Exclusive)
	if err != nil {
		t.Fatalf("TryAcquire after the release: %v", err)
	}
	if err := le2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := show(db); got != "on" {
		t.Errorf("synchronous_commit after Lease.Release: %q, want on", got)
	}
	le3, err := l.TryAcquire(ctx, "rel", lock.Exclusive)
	if err != nil {
		t.Fatalf("TryAcquire after two releases: %v", err)
	}
	if le3.Token() <= le2.Token() {
		t.Errorf("token %d after %d: want it greater (SPEC S3)", le3.Token(), le2.Token())
	}
	if err := le3.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestReleaseWakesOnlyWatchedKeys runs the Release statement on one key's
// rows set up by hand, one case at a time, and checks what it notifies and
// what it leaves in the watches table (SPEC W1, W2; migration 00008 moved
// this part into the {wake} function, called only for a watched key):
//   - an unwatched key, or one whose watch expired: no notification, and
//     the rows other than the released lease are untouched;
//   - a watched key whose lease was the last live one: the key is
//     notified and the watch consumed;
//   - the same with a live marker: the payload names the marked waiter
//     (chr(30) framing) and the watch stays for the others; an expired
//     marker counts as none;
//   - a watched key another live shared lease still holds: no
//     notification, and the watch stays;
//   - a wrong token: nothing is deleted, nothing notified.
//
// After every case the key is acquired and released through a Locker, to
// show the rows left behind do not jam it.
func TestReleaseWakesOnlyWatchedKeys(t *testing.T) {
	ctx := context.Background()
	db, d, ns, _ := schemaAt(t, "sqlease_wake_", 0)
	release := compileRelease(t, d, ns)
	const channel = "sqlease_wake_test"
	listener := listen(t, channel)
	l, err := lock.New(ctx, db, d, lock.WithSchema(ns.Schema))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)

	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	holders, watches, markers := ns.Object(d, "holders"), ns.Object(d, "watches"), ns.Object(d, "markers")
	// rows: holder lease IDs ("mode:lease:live"), the watch ("" none,
	// "live", "expired") and the marker ("" none, "live", "expired").
	type state struct {
		holders       []string
		watch, marker string
	}
	setup := func(key string, st state) {
		t.Helper()
		for _, h := range st.holders {
			f := strings.Split(h, ":")
			iv := "1 hour"
			if f[2] == "expired" {
				iv = "-1 second"
			}
			exec("INSERT INTO "+holders+" (lease_id, lock_key, mode, owner, token, acquired_at, expires_at) VALUES ($1, $2, $3, 'test', 1, now(), clock_timestamp() + $4::interval)", f[1], key, f[0], iv)
		}
		switch st.watch {
		case "live":
			exec("INSERT INTO "+watches+" (lock_key, expires_at) VALUES ($1, clock_timestamp() + interval '1 hour')", key)
		case "expired":
			exec("INSERT INTO "+watches+" (lock_key, expires_at) VALUES ($1, clock_timestamp() - interval '1 second')", key)
		}
		switch st.marker {
		case "live":
			exec("INSERT INTO "+markers+" (lock_key, waiter_id, owner, expires_at) VALUES ($1, 'W1', 'test', clock_timestamp() + interval '1 hour')", key)
		case "expired":
			exec("INSERT INTO "+markers+" (lock_key, waiter_id, owner, expires_at) VALUES ($1, 'W1', 'test', clock_timestamp() - interval '1 second')", key)
		}
	}
	count := func(table, key string) int {
		t.Helper()
		var n int
		if err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+table+" WHERE lock_key = $1", key).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// notification returns the payload sent on channel, or "" when none
	// arrives within wait.
	notification := func(wait time.Duration) string {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		n, err := listener.WaitForNotification(wctx)
		if err != nil {
			if wctx.Err() != nil {
				return ""
			}
			t.Fatal(err)
		}
		return n.Payload
	}

	cases := []struct {
		name      string
		st        state
		lease     string
		token     int64
		wantRows  int
		wake      *dialect.Wake // the notification, without its key; nil: none
		wantWatch int
	}{
		{"unwatched", state{holders: []string{"x:L:live"}}, "L", 1, 1, nil, 0},
		{"watch expired", state{holders: []string{"x:L:live"}, watch: "expired"}, "L", 1, 1, nil, 1},
		{"watched, last lease", state{holders: []string{"x:L:live"}, watch: "live"}, "L", 1, 1, &dialect.Wake{}, 0},
		{"watched, expired lease released", state{holders: []string{"x:L:expired"}, watch: "live"}, "L", 0, 1, &dialect.Wake{}, 0},
		{"watched, other lease expired", state{holders: []string{"s:L:live", "s:O:expired"}, watch: "live"}, "L", 1, 1, &dialect.Wake{}, 0},
		{"watched, marked", state{holders: []string{"x:L:live"}, watch: "live", marker: "live"}, "L", 1, 1, &dialect.Wake{WaiterID: "W1"}, 1},
		{"watched, marker expired", state{holders: []string{"x:L:live"}, watch: "live", marker: "expired"}, "L", 1, 1, &dialect.Wake{}, 0},
		{"watched, another shared lease live", state{holders: []string{"s:L:live", "s:O:live"}, watch: "live"}, "L", 1, 1, nil, 1},
		{"wrong token", state{holders: []string{"x:L:live"}, watch: "live"}, "L", 2, 0, nil, 1},
		{"unknown lease", state{watch: "live"}, "nobody", 0, 0, nil, 1},
	}
	for i, c := range cases {
		key := fmt.Sprintf("wake%d", i)
		setup(key, c.st)
		n, err := runRelease(ctx, db, release, c.lease, c.token, channel)
		if err != nil {
			t.Fatalf("%s: release: %v", c.name, err)
		}
		if n != c.wantRows {
			t.Errorf("%s: release returned %d rows, want %d", c.name, n, c.wantRows)
		}
		want := ""
		if c.wake != nil {
			want = dialect.Wake{Key: key, WaiterID: c.wake.WaiterID}.Payload()
		}
		wait := 3 * time.Second
		if want == "" {
			wait = 300 * time.Millisecond
		}
		if got := notification(wait); got != want {
			t.Errorf("%s: notification %q, want %q", c.name, got, want)
		}
		if got := count(watches, key); got != c.wantWatch {
			t.Errorf("%s: %d watch rows left, want %d", c.name, got, c.wantWatch)
		}
		if got, want := count(holders, key), len(c.st.holders)-c.wantRows; got != want {
			t.Errorf("%s: %d holder rows left, want %d", c.name, got, want)
		}

		// Clear the case's rows; the key is then free for a Locker.
		for _, tb := range []string{holders, watches, markers} {
			exec("DELETE FROM "+tb+" WHERE lock_key = $1", key)
		}
		le, err := l.TryAcquire(ctx, key, lock.Exclusive)
		if err != nil {
			t.Fatalf("%s: TryAcquire after the case: %v", c.name, err)
		}
		if err := le.Release(ctx); err != nil {
			t.Fatalf("%s: Release after the case: %v", c.name, err)
		}
	}
}

// TestReleaseWakesAfterConcurrentSharedReleases: two shared leases of a
// watched key are released in overlapping transactions, the second
// before the first commits. Each alone sees the other's row live; the
// {wake} function makes the second wait for the first's commit, so it sees
// the key free and notifies (SPEC W1, W2: the waiters are woken, not left
// to their polls). Without that wait neither release notifies.
func TestReleaseWakesAfterConcurrentSharedReleases(t *testing.T) {
	ctx := context.Background()
	db, d, ns, _ := schemaAt(t, "sqlease_wake2_", 0)
	release := compileRelease(t, d, ns)
	const channel = "sqlease_wake2_test"
	listener := listen(t, channel)
	holders, watches := ns.Object(d, "holders"), ns.Object(d, "watches")
	for _, q := range []string{
		"INSERT INTO " + holders + " (lease_id, lock_key, mode, owner, token, acquired_at, expires_at) VALUES ('A', 'k', 's', 'test', 1, now(), now() + interval '1 hour'), ('B', 'k', 's', 'test', 2, now(), now() + interval '1 hour')",
		"INSERT INTO " + watches + " (lock_key, expires_at) VALUES ('k', now() + interval '1 hour')",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	releaseIn := func(tx *sql.Tx, lease string) error {
		_, err := runRelease(ctx, tx, release, lease, 0, channel)
		return err
	}
	first, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback()
	if err := releaseIn(first, "A"); err != nil {
		t.Fatal(err)
	}
	second, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Rollback()
	done := make(chan error, 1)
	go func() { done <- releaseIn(second, "B") }()
	select {
	case err := <-done:
		t.Fatalf("the second release returned (%v) before the first committed; want it to wait", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := first.Commit(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the second release did not return within 10 s of the first's commit")
	}
	if err := second.Commit(); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	n, err := listener.WaitForNotification(wctx)
	if err != nil || n.Payload != "k" {
		t.Fatalf("notification after both releases: %+v, %v; want the key", n, err)
	}
	var left int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+watches).Scan(&left); err != nil || left != 0 {
		t.Fatalf("watch rows after the wake-up: %d, %v; want the watch consumed", left, err)
	}
}

// TestConnectionLimitIsRetried: a connection the server refuses for too
// many connections (SQLSTATE 53300; here the role's CONNECTION LIMIT 1,
// taken by another session) is retried like a failed connect, so a
// blocking Acquire with a deadline is granted once the other session ends
// instead of failing at once (SPEC H9).
func TestConnectionLimitIsRetried(t *testing.T) {
	ctx := context.Background()
	db, d, ns, _ := schemaAt(t, "sqlease_connlim_", 0)
	role := ns.Schema + "_svc"
	q := d.QuoteIdent
	t.Cleanup(func() {
		db.ExecContext(context.Background(), "DROP OWNED BY "+q(role))
		db.ExecContext(context.Background(), "DROP ROLE IF EXISTS "+q(role))
	})
	for _, s := range []string{
		"CREATE ROLE " + q(role) + " LOGIN CONNECTION LIMIT 1",
		"GRANT USAGE ON SCHEMA " + q(ns.Schema) + " TO " + q(role),
		"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA " + q(ns.Schema) + " TO " + q(role),
		"GRANT USAGE ON ALL SEQUENCES IN SCHEMA " + q(ns.Schema) + " TO " + q(role),
	} {
		if _, err := db.ExecContext(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	u, err := url.Parse(conftest.PostgresDSN(t))
	if err != nil {
		t.Skipf("SQLEASE_POSTGRES_DSN is not a URL (%v): this test sets the user in it", err)
	}
	u.User = url.User(role)
	rdb, err := sql.Open("pgx", u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	l, err := lock.New(ctx, rdb, d, lock.WithSchema(ns.Schema))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	rdb.SetMaxIdleConns(0) // the Locker's next statement needs a new connection

	// The role's one connection. The backend of the connection the pool
	// just closed (SetMaxIdleConns(0) above) leaves a moment after the
	// client hangs up, and counts until then, so the first tries may be
	// refused too.
	var hog *pgx.Conn
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		hog, err = pgx.Connect(ctx, u.String())
		var pe *pgconn.PgError
		if err == nil || !errors.As(err, &pe) || pe.Code != "53300" || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgx.Connect(ctx, u.String()); err == nil {
		t.Fatal("a second connection of the role was accepted; want it refused by CONNECTION LIMIT 1")
	} else if pe := (*pgconn.PgError)(nil); !errors.As(err, &pe) || pe.Code != "53300" {
		t.Fatalf("second connection of the role: %v; want SQLSTATE 53300", err)
	}
	time.AfterFunc(time.Second, func() { hog.Close(context.Background()) })
	actx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	start := time.Now()
	le, err := l.Acquire(actx, "connlim", lock.Exclusive)
	if err != nil {
		t.Fatalf("Acquire while the role's connection was taken (freed after 1 s): %v after %v; want it granted", err, time.Since(start))
	}
	if took := time.Since(start); took < 500*time.Millisecond {
		t.Errorf("Acquire granted after %v, before the role's connection was freed (1 s)", took)
	}
	if err := le.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// A refusal that never ends (CONNECTION LIMIT 0): the acquire waits out
	// its wait timeout and returns ErrLocked, whose LockedError names the
	// refusal (no attempt reached the database, so no holder is named).
	if _, err := db.ExecContext(ctx, "ALTER ROLE "+q(role)+" CONNECTION LIMIT 0"); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	_, err = l.Acquire(ctx, "connlim", lock.Exclusive, lock.WaitTimeout(time.Second))
	var lerr *lock.LockedError
	if !errors.As(err, &lerr) || !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("Acquire with every connection refused: %v; want a *lock.LockedError", err)
	}
	if pe := (*pgconn.PgError)(nil); !errors.As(lerr.Err, &pe) || pe.Code != "53300" || len(lerr.Holders) != 0 ||
		!strings.Contains(err.Error(), "the last attempt failed") || !strings.Contains(err.Error(), "53300") {
		t.Errorf("LockedError after refused connections: Err %v, holders %v, message %q; want the 53300 refusal named and no holder", lerr.Err, lerr.Holders, err)
	}
	if took := time.Since(start); took < 900*time.Millisecond || took > 3*time.Second {
		t.Errorf("Acquire with a 1 s wait timeout returned after %v", took)
	}
}

// compileRelease renders this build's Release statement for ns.
func compileRelease(t *testing.T, d dialect.Dialect, ns dialect.Namespace) dialect.Stmt {
	t.Helper()
	release, err := dialect.Compile(d, ns, d.Statements().Release, []string{"lease_id", "token", "channel"})
	if err != nil {
		t.Fatal(err)
	}
	return release
}

// runRelease runs the Release statement on q (a pool or a transaction) and
// returns the number of rows it returned: the holder rows it deleted.
func runRelease(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, release dialect.Stmt, leaseID string, token int64, channel string) (int, error) {
	rows, err := q.QueryContext(ctx, release.SQL, release.Args(map[string]any{"lease_id": leaseID, "token": token, "channel": channel})...)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		n++
	}
	return n, rows.Err()
}
