package mysqldialect_test

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"

	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/mysqldialect"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// clockUS is the database clock in microseconds since the Unix epoch, as
// the procedures read it.
const clockUS = `SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))`

// tokenSchema opens the shared server with parseTime, creates a fresh
// namespace migrated up to version v (0: all migrations), dropped at the
// end of t, and returns the pool, the namespace and a goose provider on it.
func tokenSchema(t *testing.T, prefix string, v int64) (*sql.DB, dialect.Namespace, *goose.Provider) {
	t.Helper()
	ctx := t.Context()
	db := openShared(t, nil)
	d := mysqldialect.New()
	var rnd [5]byte
	_, _ = crand.Read(rnd[:])
	ns := dialect.Namespace{Schema: prefix + hex.EncodeToString(rnd[:])}
	t.Cleanup(func() { db.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+d.QuoteIdent(ns.Schema)) })
	if _, err := db.ExecContext(ctx, "CREATE DATABASE "+d.QuoteIdent(ns.Schema)); err != nil {
		t.Fatal(err)
	}
	fsys, err := migrate.FS(d, migrate.WithNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	store, err := database.NewStore(database.DialectMySQL, ns.VersionTable())
	if err != nil {
		t.Fatal(err)
	}
	p, err := goose.NewProvider("", db, fsys, goose.WithStore(store), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		t.Fatal(err)
	}
	if v > 0 {
		_, err = p.UpTo(ctx, v)
	} else {
		_, err = migrate.Up(ctx, db, d, migrate.WithNamespace(ns))
	}
	if err != nil {
		t.Fatal(err)
	}
	return db, ns, p
}

// callAcquire grants key exclusively through the acquire procedure on
// conn, with no Locker, and returns the token.
func callAcquire(t *testing.T, conn *sql.Conn, ns dialect.Namespace, key string) int64 {
	t.Helper()
	var granted int
	var leaseID, mode, owner string
	var token, expires, now int64
	id := fmt.Sprintf("L-%s-%d", key, time.Now().UnixNano())
	err := conn.QueryRowContext(t.Context(), "CALL "+ns.Object(mysqldialect.New(), "acquire")+"(?, 'x', ?, 'test', 60000000, 0, 0)", key, id).
		Scan(&granted, &leaseID, &mode, &owner, &token, &expires, &now)
	if err != nil || granted != 1 {
		t.Fatalf("CALL acquire(%s): granted %d, %v", key, granted, err)
	}
	if _, err := conn.ExecContext(t.Context(), "CALL "+ns.Object(mysqldialect.New(), "release")+"(?, 0)", id); err != nil {
		t.Fatal(err)
	}
	return token
}

// TestS7_TokensFollowDatabaseClock_MySQL (SPEC S7, S3): a token is at
// least the database clock in microseconds read just before the grant;
// grants of many keys at once succeed, each key's tokens increasing (keys
// may share a token: migration 00008 dropped the token lock); after
// the AUTO_INCREMENT counter is forced back (the rows deleted and the
// counter set to 1, as a restore of an old dump does) the next token of a
// key still exceeds every earlier one; and with the session's clock set an
// hour back (SET timestamp), tokens still increase (the counter is the
// high-water).
func TestS7_TokensFollowDatabaseClock_MySQL(t *testing.T) {
	if conformance.IsChild() {
		t.Skip("child process")
	}
	ctx := t.Context()
	db, ns, _ := tokenSchema(t, "sqlease_t_s7_", 0)
	d := mysqldialect.New()
	l, err := lock.New(ctx, db, d, lock.WithSchema(ns.Schema), lock.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())

	var maxToken int64
	last := map[string]int64{}
	grant := func(key string, mode lock.Mode) {
		t.Helper()
		var clock int64
		if err := db.QueryRowContext(ctx, clockUS).Scan(&clock); err != nil {
			t.Fatal(err)
		}
		le, err := l.TryAcquire(ctx, key, mode)
		if err != nil {
			t.Fatalf("TryAcquire(%s): %v", key, err)
		}
		tok := le.Token()
		if tok < clock {
			t.Errorf("%s: token %d < database clock %d µs read before the grant", key, tok, clock)
		}
		if tok <= last[key] {
			t.Errorf("%s: token %d not greater than the key's previous %d", key, tok, last[key])
		}
		last[key], maxToken = tok, max(maxToken, tok)
		if err := le.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for range 5 {
		grant("a", lock.Exclusive)
		grant("b", lock.Shared)
	}

	// Many keys at once: no grant fails (no token lock, no UNIQUE index
	// to collide on since migration 00008), and each key's tokens
	// increase; two keys may get the same token in the same microsecond.
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				key := fmt.Sprintf("k%d", g)
				le, err := l.TryAcquire(ctx, key, lock.Exclusive)
				if err != nil {
					errs <- fmt.Errorf("TryAcquire(%s) #%d: %w", key, i, err)
					return
				}
				mu.Lock()
				if le.Token() <= last[key] {
					errs <- fmt.Errorf("%s: token %d not greater than the key's previous %d", key, le.Token(), last[key])
				}
				last[key] = le.Token()
				maxToken = max(maxToken, le.Token())
				mu.Unlock()
				if err := le.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	// A restore of an old dump: the rows are gone and the counter is back
	// to 1.
	holders := ns.Object(d, "holders")
	if _, err := db.ExecContext(ctx, "DELETE FROM "+holders); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "ALTER TABLE "+holders+" AUTO_INCREMENT = 1"); err != nil {
		t.Fatal(err)
	}
	var counter sql.NullInt64
	if err := db.QueryRowContext(ctx, "SELECT AUTO_INCREMENT FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME LIKE '%holders'",
		ns.Schema).Scan(&counter); err != nil {
		t.Fatal(err)
	}
	if counter.Valid && counter.Int64 > 1 {
		t.Fatalf("the counter is %d after ALTER TABLE ... AUTO_INCREMENT = 1; the test no longer forces it back", counter.Int64)
	}
	before := maxToken
	grant("a", lock.Exclusive)
	if last["a"] <= before {
		t.Errorf("after the counter was forced back: token %d, want > %d (every earlier token)", last["a"], before)
	}

	// The clock an hour back (this session's timestamp): the counter still
	// makes each token greater than the one before.
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SET timestamp = UNIX_TIMESTAMP(NOW(6)) - 3600"); err != nil {
		t.Fatal(err)
	}
	prev := last["a"]
	for range 3 {
		tok := callAcquire(t, conn, ns, "a")
		if tok <= prev {
			t.Errorf("clock an hour back: token %d, want > %d", tok, prev)
		}
		prev = tok
	}
	if _, err := conn.ExecContext(ctx, "SET timestamp = DEFAULT"); err != nil {
		t.Fatal(err)
	}
}

// TestTokensIncreaseThroughMigration2: tokens granted by migration 00001
// (counter values) are below those granted after 00002 (clock values) for
// the same key, and those granted after a Down to 00001 (the counter, which
// the clock values raised) are above them.
func TestTokensIncreaseThroughMigration2(t *testing.T) {
	if conformance.IsChild() {
		t.Skip("child process")
	}
	ctx := t.Context()
	db, ns, p := tokenSchema(t, "sqlease_t_m2_", 1)
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var old int64
	for range 3 {
		tok := callAcquire(t, conn, ns, "m")
		if tok <= old {
			t.Fatalf("version 1: token %d after %d", tok, old)
		}
		old = tok
	}
	if old > 1000 {
		t.Fatalf("version 1 issued token %d; want a small counter value", old)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	var clock int64
	if err := conn.QueryRowContext(ctx, clockUS).Scan(&clock); err != nil {
		t.Fatal(err)
	}
	tok := callAcquire(t, conn, ns, "m")
	if tok <= old || tok < clock {
		t.Errorf("after 00002: token %d, want > %d and >= the clock %d", tok, old, clock)
	}
	// Down to 1: the old procedure draws from the counter, which the clock
	// tokens raised, so tokens still increase.
	if _, err := p.DownTo(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if again := callAcquire(t, conn, ns, "m"); again <= tok {
		t.Errorf("after Down to 00001: token %d, want > %d", again, tok)
	}
}
