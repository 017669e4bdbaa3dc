package lock_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "modernc.org/sqlite" // registers "sqlite"

	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/internal/faultdb"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

const sqliteHolderEnv = "SQLEASE_LOCK_SQLITE_HOLDER"

// TestSQLiteWaiterWokenByOtherProcessRelease: on SQLite a waiter learns of
// a release in another process by watching the database file
// (dialect.ChangeWatcher), not by polling. The waiter is set up so that,
// once it watches, its polls are at least 10 s apart (pending-writer TTL 30 s,
// notify poll interval 20 s), while without a watch it would poll at least
// every 100 ms (maximum backoff); the other process releases 4 s after the
// waiter's marker appeared (in the last 3 s of that the waiter may send
// at most 2 statements), and the grant must follow within 3 s. A later
// release through the same file wakes it again (the watcher keeps
// working), and the Locker's Close stops the watcher (the package's leak
// check).
func TestSQLiteWaiterWokenByOtherProcessRelease(t *testing.T) {
	if p := os.Getenv(sqliteHolderEnv); p != "" {
		sqliteHolderChild(t, p)
		return
	}
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "watch.db")
	dsn := "file:" + path + "?_journal_mode=WAL&_busy_timeout=5000"
	raw, err := sql.Open("sqlite", dsn)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := faultdb.DSNConnector(raw.Driver(), dsn)
	_ = raw.Close()
	if err != nil {
		t.Fatal(err)
	}
	inj := faultdb.New()
	db := sql.OpenDB(inj.Connector(conn))
	defer db.Close()
	if _, err := migrate.Up(ctx, db, sqlitedialect.New()); err != nil {
		t.Fatal(err)
	}
	l, err := lock.New(ctx, db, sqlitedialect.New(), lock.WithTTL(30*time.Second),
		lock.WithPendingWriterTTL(30*time.Second), lock.WithNotifyPollInterval(20*time.Second), lock.WithMaxBackoff(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())

	stdin, next := startChild(ctx, t, "TestSQLiteWaiterWokenByOtherProcessRelease", sqliteHolderEnv+"="+dsn)

	for round, key := range []string{"k1", "k2"} {
		if _, err := io.WriteString(stdin, "hold "+key+"\n"); err != nil {
			t.Fatal(err)
		}
		next("holder: held")
		type result struct {
			at  time.Time
			err error
		}
		got := make(chan result, 1)
		go func() {
			lease, err := l.Acquire(ctx, key, lock.Exclusive, lock.WaitTimeout(time.Minute))
			at := time.Now()
			if err == nil {
				err = lease.Release(context.Background())
			}
			got <- result{at, err}
		}()
		// Wait for the waiter's marker, then give it time to settle into
		// its long poll.
		for deadline := time.Now().Add(30 * time.Second); ; {
			hs, _, err := l.Holders(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			marked := false
			for _, h := range hs {
				marked = marked || h.Mode == lock.PendingWriter
			}
			if marked {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the waiter set no marker within 30 s")
			}
			time.Sleep(10 * time.Millisecond)
		}
		// Once it watches, the waiter sends nothing until a change. Let
		// the wake-ups for its own marker's commit pass (the watcher's
		// follow-ups end within 250 ms), then count: a waiter that
		// polled would send several statements in 3 s.
		time.Sleep(time.Second)
		inj.ResetCounts()
		time.Sleep(3 * time.Second)
		if n := inj.Count(""); n > 2 {
			t.Errorf("round %d: the waiter sent %d statements in 3 s while nothing changed, want at most 2 (it should wait for a change, not poll)", round, n)
		}
		select {
		case r := <-got:
			t.Fatalf("round %d: acquired while the other process held the key: %v", round, r.err)
		default:
		}
		if _, err := io.WriteString(stdin, "release\n"); err != nil {
			t.Fatal(err)
		}
		ns, err := strconv.ParseInt(next("holder: released "), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-got:
			if r.err != nil {
				t.Fatalf("round %d: waiter: %v", round, r.err)
			}
			lat := r.at.Sub(time.Unix(0, ns))
			t.Logf("round %d: granted %s after the other process's release", round, lat)
			if lat > 3*time.Second {
				t.Errorf("round %d: granted %s after the release, want well under the 10 s poll (a wake-up from the file watch)", round, lat)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: not granted within 30 s of the release", round)
		}
	}
}

// sqliteHolderChild holds the key named on each "hold" line of stdin until
// the next line, then releases it and prints when the release returned.
func sqliteHolderChild(t *testing.T, dsn string) {
	ctx := t.Context()
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	l, err := lock.New(ctx, db, sqlitedialect.New(), lock.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	in := bufio.NewReader(os.Stdin)
	for {
		line, err := in.ReadString('\n')
		if err != nil {
			return
		}
		key, ok := strings.CutPrefix(strings.TrimSpace(line), "hold ")
		if !ok {
			continue
		}
		lease, err := l.TryAcquire(ctx, key, lock.Exclusive)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Println("holder: held")
		if _, err := in.ReadString('\n'); err != nil {
			return
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		fmt.Printf("holder: released %d\n", time.Now().UnixNano())
	}
}
