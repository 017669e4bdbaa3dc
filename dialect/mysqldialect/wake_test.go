package mysqldialect_test

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/mysqldialect"
	"github.com/sqlease/sqlease/lock"
)

// Push wake-ups (SPEC W2; migration 00009, listen.go). The waiter runs in
// a child process (this test binary again, running TestWakeChild_MySQL),
// so that only the doorbell can wake it: the in-process hub cannot. Its
// Locker polls at most every 20 s once its listener is up (notify poll
// interval 1 min, drawn from its upper half; pending-writer TTL 1 min,
// refreshed every 20 s), so a grant within wakeBound of the release was
// woken by the wake path.

const (
	wakeSchemaEnv = "SQLEASE_T_WAKE_SCHEMA"
	wakeTimingEnv = "SQLEASE_T_WAKE_TIMING" // "sleep,ttl": listening session timing
	wakeKey       = "wake/k"
	// wakeBound is generous (a loaded machine), and far below the 17 s or
	// more to the child's next poll.
	wakeBound = 8 * time.Second
)

// TestWakeChild_MySQL is the waiting process of the tests below; it is
// skipped unless started by them. It reads commands from stdin:
// "acquire" blocks on wakeKey (printing "waiting" before and "granted
// <unix ns>" after), "release" releases it ("released"); EOF ends it.
func TestWakeChild_MySQL(t *testing.T) {
	schema := os.Getenv(wakeSchemaEnv)
	if schema == "" {
		t.Skip("started only by the push wake-up tests")
	}
	if s, ttl, ok := strings.Cut(os.Getenv(wakeTimingEnv), ","); ok {
		sd, err1 := time.ParseDuration(s)
		td, err2 := time.ParseDuration(ttl)
		if err := errors.Join(err1, err2); err != nil {
			t.Fatal(err)
		}
		mysqldialect.SetListenTiming(t, sd, td)
	}
	ctx := context.Background()
	db := openShared(t, nil)
	l, err := lock.New(ctx, db, mysqldialect.New(), lock.WithSchema(schema), lock.WithOwner("child"),
		lock.WithTTL(2*time.Minute), lock.WithNotifyPollInterval(time.Minute), lock.WithPendingWriterTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	var le *lock.Lease
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch in.Text() {
		case "acquire":
			fmt.Println("waiting")
			if le, err = l.Acquire(ctx, wakeKey, lock.Exclusive); err != nil {
				t.Fatal(err)
			}
			fmt.Printf("granted %d\n", time.Now().UnixNano())
		case "release":
			if err := le.Release(ctx); err != nil {
				t.Fatal(err)
			}
			fmt.Println("released")
		}
	}
}

// wakeChild is a running TestWakeChild_MySQL.
type wakeChild struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	next  func(prefix string) string
}

// startWakeChild starts TestWakeChild_MySQL on schema; it is stopped (stdin
// closed, then waited for) when t ends.
func startWakeChild(t *testing.T, schema string, env ...string) *wakeChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestWakeChild_MySQL$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), wakeSchemaEnv+"="+schema), env...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Wait()
	})
	lines := bufio.NewScanner(stdout)
	next := func(prefix string) string {
		t.Helper()
		for lines.Scan() {
			if rest, ok := strings.CutPrefix(lines.Text(), prefix); ok {
				return rest
			}
		}
		t.Fatalf("wake child ended before %q: %v\n%s", prefix, lines.Err(), stderr.String())
		return ""
	}
	return &wakeChild{cmd: cmd, stdin: stdin, next: next}
}

// lockedBuffer is a bytes.Buffer safe for concurrent use.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *lockedBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *lockedBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// listenerIDs returns the registered listening sessions of ns that are
// alive (hold their named lock): those a release rings.
func listenerIDs(t *testing.T, db *sql.DB, ns dialect.Namespace) []int64 {
	t.Helper()
	d := mysqldialect.New()
	rows, err := db.QueryContext(t.Context(), `SELECT conn_id FROM `+ns.Object(d, "listeners")+`
WHERE IS_USED_LOCK(CONCAT('sqlease:listener:', tag)) = conn_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// waitFor polls cond every 50 ms until it holds, failing t after 30 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// countRows returns the number of rows of ns's table name matching where.
func countRows(t *testing.T, db *sql.DB, ns dialect.Namespace, name, where string) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM `+ns.Object(mysqldialect.New(), name)+` WHERE `+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// handoff takes wakeKey in holder, has the child block on it until its
// listener listens and its polls have slowed down, runs fault, releases
// and returns how long the child took to be granted (failing t past
// wakeBound), then has the child release.
func handoff(t *testing.T, db *sql.DB, ns dialect.Namespace, holder *lock.Locker, c *wakeChild, fault func()) time.Duration {
	t.Helper()
	ctx := t.Context()
	le, err := holder.TryAcquire(ctx, wakeKey, lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(c.stdin, "acquire")
	c.next("waiting")
	waitFor(t, "the child's watch and listener", func() bool {
		return countRows(t, db, ns, "watches", "TRUE") > 0 && len(listenerIDs(t, db, ns)) > 0
	})
	// The child's first polls follow the backoff until its listener is
	// ready; the attempt after that schedules the slow poll.
	time.Sleep(3 * time.Second)
	if fault != nil {
		fault()
	}
	t0 := time.Now()
	if err := le.Release(ctx); err != nil {
		t.Fatal(err)
	}
	ns64, err := strconv.ParseInt(c.next("granted "), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Unix(0, ns64).Sub(t0)
	if took > wakeBound {
		t.Fatalf("the child was granted %s after the release: not woken (polls are 17 s or more apart; bound %s)", took, wakeBound)
	}
	fmt.Fprintln(c.stdin, "release")
	c.next("released")
	return took
}

// TestPushWakeAcrossProcesses_MySQL: a release wakes a waiter in another
// process through its listening session (SPEC W2), and does so again
// after that session was killed (KILL CONNECTION from another session):
// the engine reconnects and the session registers again.
func TestPushWakeAcrossProcesses_MySQL(t *testing.T) {
	if os.Getenv(wakeSchemaEnv) != "" {
		t.Skip("child process")
	}
	db, ns, _ := tokenSchema(t, "sqlease_t_wake_", 0)
	ctx := t.Context()
	holder, err := lock.New(ctx, db, mysqldialect.New(), lock.WithSchema(ns.Schema), lock.WithOwner("holder"), lock.WithTTL(2*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(context.Background())
	c := startWakeChild(t, ns.Schema)
	took := handoff(t, db, ns, holder, c, nil)
	t.Logf("handoff to the other process: %s", took)

	took = handoff(t, db, ns, holder, c, func() {
		ids := listenerIDs(t, db, ns)
		for _, id := range ids {
			if _, err := db.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id)); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, "a new listening session", func() bool {
			now := listenerIDs(t, db, ns)
			return len(now) > 0 && now[0] != ids[0]
		})
	})
	t.Logf("handoff after the listening session was killed: %s", took)
}

// TestPushWakeCleanup_MySQL: a waiting process that dies leaves no
// registration that a release rings (its session and named lock are gone):
// the next ring deletes it. Its watch expires; a release of a key whose
// watch expired writes no wake row, and the next listening session deletes
// the expired watch.
func TestPushWakeCleanup_MySQL(t *testing.T) {
	if os.Getenv(wakeSchemaEnv) != "" {
		t.Skip("child process")
	}
	mysqldialect.SetListenTiming(t, time.Second, 3*time.Second)
	db, ns, _ := tokenSchema(t, "sqlease_t_wake_", 0)
	ctx := t.Context()
	d := mysqldialect.New()
	newLocker := func(owner string) *lock.Locker {
		l, err := lock.New(ctx, db, d, lock.WithSchema(ns.Schema), lock.WithOwner(owner), lock.WithTTL(2*time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close(context.Background()) })
		return l
	}
	holder := newLocker("holder")
	le, err := holder.TryAcquire(ctx, wakeKey, lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	c := startWakeChild(t, ns.Schema, wakeTimingEnv+"=1s,3s")
	fmt.Fprintln(c.stdin, "acquire")
	c.next("waiting")
	waitFor(t, "the child's watch and listener", func() bool {
		return countRows(t, db, ns, "watches", "TRUE") > 0 && len(listenerIDs(t, db, ns)) > 0
	})
	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = c.cmd.Wait()
	waitFor(t, "the dead child's session to end", func() bool { return len(listenerIDs(t, db, ns)) == 0 })
	if n := countRows(t, db, ns, "listeners", "TRUE"); n != 1 {
		t.Fatalf("%d registrations, want the dead child's one", n)
	}
	wakes := countRows(t, db, ns, "wakes", "TRUE")
	if err := le.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, db, ns, "wakes", "TRUE"); n != wakes+1 {
		t.Fatalf("wake rows %d -> %d after a release of a watched key, want one more", wakes, n)
	}
	if n := countRows(t, db, ns, "listeners", "TRUE"); n != 0 {
		t.Fatalf("%d registrations left after a ring, want the dead child's deleted", n)
	}
	// A waiter of this process on another key leaves; its watch lasts 10 s
	// after its last attempt: wait it out.
	other, err := holder.TryAcquire(ctx, "other", lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := newLocker("waiter").Acquire(wctx, "other", lock.Exclusive); err == nil {
		t.Fatal("granted a held key")
	}
	waitFor(t, "the watches to expire", func() bool {
		return countRows(t, db, ns, "watches", "expires_us > "+nowUS) == 0
	})
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, db, ns, "wakes", "TRUE"); n != wakes+1 {
		t.Fatalf("a release of a key whose watch expired wrote a wake row (%d -> %d)", wakes+1, n)
	}
	// Listening sessions delete expired watches (at their start and every
	// third of their registration TTL): a new waiter starts one.
	third, err := holder.TryAcquire(ctx, "third", lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	waiter2 := newLocker("waiter 2")
	wctx2, cancel2 := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = waiter2.Acquire(wctx2, "third", lock.Exclusive)
	}()
	waitFor(t, "the expired watches deleted", func() bool {
		return countRows(t, db, ns, "watches", "expires_us <= "+nowUS) == 0
	})
	cancel2()
	<-done
	if err := third.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// nowUS is the database clock in microseconds.
const nowUS = `TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))`

// TestListenerFailingForGoodIsWarned_MySQL: a listener that can never
// start (here its procedure is missing, as with a role without EXECUTE on
// it) is logged once at WARN after a few attempts, not only at DEBUG every
// second, and waiters still get the key by polling.
func TestListenerFailingForGoodIsWarned_MySQL(t *testing.T) {
	if os.Getenv(wakeSchemaEnv) != "" {
		t.Skip("child process")
	}
	db, ns, _ := tokenSchema(t, "sqlease_t_wake_", 0)
	ctx := t.Context()
	if _, err := db.ExecContext(ctx, "DROP PROCEDURE "+ns.Object(mysqldialect.New(), "listen_start")); err != nil {
		t.Fatal(err)
	}
	// The waiter's Locker starts the listener and logs for it.
	var logs lockedBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	l, err := lock.New(ctx, db, mysqldialect.New(), lock.WithSchema(ns.Schema), lock.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	held, err := l.TryAcquire(ctx, "warned", lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	granted := make(chan error, 1)
	go func() {
		other, err := lock.New(ctx, db, mysqldialect.New(), lock.WithSchema(ns.Schema), lock.WithTTL(time.Minute), lock.WithLogger(logger))
		if err == nil {
			defer other.Close(context.Background())
			var le *lock.Lease
			if le, err = other.Acquire(ctx, "warned", lock.Exclusive, lock.WaitTimeout(30*time.Second)); err == nil {
				err = le.Release(ctx)
			}
		}
		granted <- err
	}()
	const warning = "notification listener keeps failing before it listens"
	waitFor(t, "the listener's warning", func() bool { return strings.Contains(logs.String(), warning) })
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-granted; err != nil {
		t.Fatalf("the waiter, polling: %v", err)
	}
	if n := strings.Count(logs.String(), warning); n != 1 || !strings.Contains(logs.String(), "listen_start") {
		t.Errorf("want one warning naming the missing procedure, got %d:\n%s", n, logs.String())
	}
}
