package cli

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sqlease/sqlease/conformance/conftest"
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/lock"
)

// releaseTTL is the holder's TTL in the release tests: a renewal every
// 800ms, long enough that a loaded machine does not lose the lease before
// the release.
const releaseTTL = 2400 * time.Millisecond

// releaseEnv is a database with migrated lock tables: the connection
// flags of the CLI, a pool and dialect for Lockers, the Locker options
// placing them, and an application table fenced writes go to.
type releaseEnv struct {
	args  []string // --dsn ... [--schema ...]
	db    *sql.DB
	d     dialect.Dialect
	opts  []lock.Option
	table string
}

func (e releaseEnv) locker(t *testing.T, opts ...lock.Option) *lock.Locker {
	t.Helper()
	l, err := lock.New(t.Context(), e.db, e.d, append(append([]lock.Option{}, e.opts...), opts...)...)
	if err != nil {
		t.Fatalf("lock.New: %v", err)
	}
	t.Cleanup(func() { l.Close(context.Background()) })
	return l
}

func (e releaseEnv) release(t *testing.T, args ...string) result {
	t.Helper()
	return cli(t, append(append([]string{"release"}, args...), e.args...)...)
}

// rows counts the rows of the application table.
func (e releaseEnv) rows(t *testing.T) int {
	t.Helper()
	var n int
	if err := e.db.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM `+e.table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// testRelease: `sqlease release` against a live lease of a Locker in
// another "process" (its own Locker). Without --yes it refuses and changes
// nothing; an unheld key exits 1; with --yes --json it prints the lease
// it removed. The holder's fenced transaction commits nothing, its
// context ends with ErrLeaseLost (reason LossNotOurs) within about a
// renewal interval, the next grant has a greater token, and the holder's
// Locker acquires again.
func testRelease(t *testing.T, e releaseEnv) {
	const key = "jobs/nightly"
	if _, err := e.db.ExecContext(t.Context(), `CREATE TABLE `+e.table+` (id INTEGER NOT NULL PRIMARY KEY, token BIGINT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	holder := e.locker(t, lock.WithTTL(releaseTTL), lock.WithOwner("holder-1"))
	leases := make(chan *lock.Lease, 1)
	type outcome struct {
		err, cause, fenced error
		at                 time.Time
	}
	done := make(chan outcome, 1)
	go func() {
		var o outcome
		o.err = holder.Do(t.Context(), key, lock.Exclusive, func(ctx context.Context, le *lock.Lease) error {
			leases <- le
			<-ctx.Done()
			o.cause, o.at = context.Cause(ctx), time.Now()
			// A holder that writes on regardless: its fenced write.
			o.fenced = le.RunInTx(context.WithoutCancel(ctx), e.db, nil, func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO `+e.table+` (id, token) VALUES (1, `+fmt.Sprint(le.Token())+`)`)
				return err
			})
			return nil
		})
		done <- o
	}()
	var lease *lock.Lease
	select {
	case lease = <-leases:
	case o := <-done:
		t.Fatalf("holder: %v", o.err)
	}

	r := e.release(t, key)
	if r.code != 2 || !strings.Contains(r.stderr, "holder-1") || !strings.Contains(r.stderr, fmt.Sprint(lease.Token())) ||
		!strings.Contains(r.stderr, "pass --yes") || r.stdout != "" {
		t.Fatalf("release without --yes: want exit 2 listing the lease and asking for --yes, got %v", r)
	}
	if err := lease.Renew(t.Context()); err != nil {
		t.Fatalf("lease after a refused release: %v", err)
	}
	if r := e.release(t, "jobs/other", "--yes"); r.code != 1 || !strings.Contains(r.stderr, `nothing held under key "jobs/other"`) {
		t.Fatalf("release of an unheld key: want exit 1 saying nothing is held, got %v", r)
	}

	r = e.release(t, key, "--yes", "--json")
	released := time.Now()
	var raw map[string]any
	var rj releaseJSON
	if err := json.Unmarshal([]byte(r.stdout), &raw); r.code != 0 || err != nil || json.Unmarshal([]byte(r.stdout), &rj) != nil {
		t.Fatalf("release --yes --json: want exit 0 and one JSON object, got %v", r)
	}
	hasFields(t, "release --json", raw, "key", "released")
	if rj.Key != key || len(rj.Released) != 1 {
		t.Fatalf("release --json: want one lease of %q, got %+v", key, rj)
	}
	if h := rj.Released[0]; h.LeaseID != lease.LeaseID() || h.Token != lease.Token() || h.Mode != "exclusive" || h.Owner != "holder-1" || h.Key != key {
		t.Errorf("release --json: released %+v, want lease %s token %d", h, lease.LeaseID(), lease.Token())
	}

	select {
	case o := <-done:
		var lle *lock.LeaseLostError
		if !errors.Is(o.err, lock.ErrLeaseLost) || !errors.As(o.cause, &lle) {
			t.Errorf("holder's Do = %v, context cause %v; want ErrLeaseLost", o.err, o.cause)
		} else if lle.Reason != lock.LossNotOurs {
			t.Errorf("loss reason %q, want %q", lle.Reason, lock.LossNotOurs)
		}
		if !errors.Is(o.fenced, lock.ErrLeaseLost) {
			t.Errorf("holder's RunInTx after the release = %v, want ErrLeaseLost", o.fenced)
		}
		t.Logf("holder told %s after the release", o.at.Sub(released).Round(time.Millisecond))
	case <-time.After(releaseTTL/3 + 2*time.Second):
		t.Fatalf("holder's context not ended %s after the release", releaseTTL/3+2*time.Second)
	}
	if n := e.rows(t); n != 0 {
		t.Errorf("the force-released holder's fenced transaction committed: %d rows", n)
	}

	next, err := e.locker(t).TryAcquire(t.Context(), key, lock.Exclusive)
	if err != nil {
		t.Fatalf("acquire after the release: %v", err)
	}
	if next.Token() <= lease.Token() {
		t.Errorf("next grant's token %d, want greater than the released %d", next.Token(), lease.Token())
	}
	if err := next.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
	again, err := holder.TryAcquire(t.Context(), key, lock.Exclusive)
	if err != nil {
		t.Fatalf("the holder's Locker after the release: %v", err)
	}
	if err := again.Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func TestReleaseSQLite(t *testing.T) {
	path := migrated(t)
	db, err := sql.Open("sqlite", conftest.SQLiteDSN(path))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	testRelease(t, releaseEnv{args: []string{"--dsn", path}, db: db, d: mustDialect(t, "sqlite"), table: "app_report"})
}

func TestReleasePostgres(t *testing.T) {
	dsn := conftest.PostgresDSN(t)
	db, schema := migratedSchema(t, "pgx", dsn, "DROP SCHEMA IF EXISTS %s CASCADE")
	testRelease(t, releaseEnv{args: []string{"--dsn", dsn, "--schema", schema}, db: db, d: mustDialect(t, "postgres"),
		opts: []lock.Option{lock.WithSchema(schema)}, table: schema + ".app_report"})
}

func TestReleaseMySQL(t *testing.T) {
	dsn := conftest.MySQLDSN(t)
	db, schema := migratedSchema(t, "mysql", dsn, "DROP DATABASE IF EXISTS %s")
	testRelease(t, releaseEnv{args: []string{"--dsn", dsn, "--schema", schema}, db: db, d: mustDialect(t, "mysql"),
		opts: []lock.Option{lock.WithSchema(schema)}, table: schema + ".app_report"})
}

// migratedSchema migrates the lock tables into a new schema (MySQL: a
// database) of the server at dsn with `sqlease migrate`, and returns a pool
// on driver and the schema, which drop (a format for the schema's name)
// removes at cleanup.
func migratedSchema(t *testing.T, driver, dsn, drop string) (*sql.DB, string) {
	t.Helper()
	schema := fmt.Sprintf("sqlease_cli_rel_%d", time.Now().UnixNano()%1e9)
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		db.ExecContext(context.Background(), fmt.Sprintf(drop, schema))
		db.Close()
	})
	if r := cli(t, "migrate", "--dsn", dsn, "--schema", schema); r.code != 0 {
		t.Fatalf("migrate: %v", r)
	}
	return db, schema
}

func mustDialect(t *testing.T, name string) dialect.Dialect {
	t.Helper()
	d, err := dialect.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestReleaseTextAndUsage: the text output names every lease released
// and the waiters left alone; bad usage exits 2 and changes nothing.
func TestReleaseTextAndUsage(t *testing.T) {
	path := migrated(t)
	a := locker(t, path, lock.WithOwner("reader-a"), lock.WithTTL(time.Minute))
	b := locker(t, path, lock.WithOwner("reader-b"), lock.WithTTL(time.Minute))
	w := locker(t, path, lock.WithOwner("writer"), lock.WithTTL(time.Minute), lock.WithMaxBackoff(50*time.Millisecond))
	ra, err := a.TryAcquire(t.Context(), "k", lock.Shared)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := b.TryAcquire(t.Context(), "k", lock.Shared)
	if err != nil {
		t.Fatal(err)
	}
	kept, err := a.TryAcquire(t.Context(), "k2", lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"release", "--dsn", path, "--yes"}, "missing KEY"},
		{[]string{"release", "k", "k2", "--dsn", path, "--yes"}, `unexpected argument "k2"`},
		{[]string{"release", "", "--dsn", path, "--yes"}, "invalid key"},
		{[]string{"release", "k\x00", "--dsn", path, "--yes"}, "contains NUL"},
	} {
		if r := cli(t, tc.args...); r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%q: want exit 2 saying %q, got %v", tc.args, tc.want, r)
		}
	}
	if len(statusJSON(t, "--dsn", path)) != 3 {
		t.Fatalf("bad usage changed the leases")
	}
	// On a terminal it asks; anything but "yes" changes nothing.
	func() {
		defer func() { stdin = os.Stdin; stdinIsTerminal = func() bool { return false } }()
		stdinIsTerminal = func() bool { return true }
		stdin = strings.NewReader("no\n")
		r := cli(t, "release", "k2", "--dsn", path)
		if r.code != 1 || !strings.Contains(r.stderr, `This will release 1 lease of key "k2"`) || !strings.Contains(r.stderr, "not confirmed") {
			t.Errorf("release answered no: want exit 1, not confirmed, got %v", r)
		}
	}()
	if err := kept.Renew(t.Context()); err != nil {
		t.Fatalf("the lease of key k2 after a declined release: %v", err)
	}
	waiting := make(chan error, 1)
	go func() {
		le, err := w.Acquire(t.Context(), "k", lock.Exclusive, lock.WaitTimeout(20*time.Second))
		if err == nil {
			err = le.Release(context.Background())
		}
		waiting <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(cli(t, "status", "--dsn", path).stdout, "pending-writer") {
		if time.Now().After(deadline) {
			t.Fatal("the writer's marker never appeared")
		}
		time.Sleep(20 * time.Millisecond)
	}
	r := cli(t, "release", "k", "--dsn", path, "--yes")
	if r.code != 0 || !strings.Contains(r.stdout, "reader-a") || !strings.Contains(r.stdout, "reader-b") ||
		!strings.Contains(r.stdout, `released 2 leases of key "k"`) || !strings.Contains(r.stdout, "1 waiter left waiting") || strings.Contains(r.stdout, "k2") {
		t.Fatalf("release of two readers: %v", r)
	}
	if err := <-waiting; err != nil {
		t.Errorf("the waiting writer after the release: %v", err)
	}
	// Reader a fences before any renewal tells it: the database refuses.
	db, err := sql.Open("sqlite", conftest.SQLiteDSN(path))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(t.Context(), `CREATE TABLE app_report (id INTEGER PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	err = ra.RunInTx(t.Context(), db, nil, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO app_report (id) VALUES (1)`)
		return err
	})
	var lle *lock.LeaseLostError
	if !errors.As(err, &lle) || lle.Reason != lock.LossFenceFailed {
		t.Errorf("reader's RunInTx after the release = %v, want ErrLeaseLost: the fence finds no row", err)
	}
	var n int
	if err := db.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM app_report`).Scan(&n); err != nil || n != 0 {
		t.Errorf("the released reader's fenced transaction committed: %d rows (%v)", n, err)
	}
	if err := rb.Renew(t.Context()); !errors.Is(err, lock.ErrLeaseLost) {
		t.Errorf("reader's renewal after the release = %v, want ErrLeaseLost", err)
	}
	if err := kept.Renew(t.Context()); err != nil {
		t.Errorf("the lease of key k2 after releasing k: %v", err)
	}
}
