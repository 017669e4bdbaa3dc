package gooselock_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlease/sqlease/gooselock"
	"github.com/sqlease/sqlease/lock"
)

// child is a migrator process started by startChild.
type child struct {
	cmd    *exec.Cmd
	lines  chan string   // its stdout, line by line; closed at its end
	stderr func() string // what it wrote to stderr so far
}

// startChild re-runs this test binary as a migrator on b (see runChild)
// whose migration 00002 sleeps pause, and which calls Provider.Up at start.
func startChild(t *testing.T, b backend, pause time.Duration, start time.Time) *child {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+b.name, childDSNEnv+"="+b.dsn, childSchemaEnv+"="+b.schema,
		childSleepEnv+"="+pause.String(), childStartEnv+"="+strconv.FormatInt(start.UnixNano(), 10))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, read := logFile(t, "stderr")
	c := &child{cmd: cmd, lines: make(chan string, 16), stderr: read}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(c.lines)
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			c.lines <- s.Text()
		}
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return c
}

// waitLine returns the rest of the child's first line starting with
// prefix, or fails t if the child ends or a minute passes first.
func (c *child) waitLine(t *testing.T, prefix string) string {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case line, ok := <-c.lines:
			if !ok {
				t.Fatalf("child ended before printing %q: %v\n%s", prefix, c.cmd.Wait(), c.stderr())
			}
			if rest, found := strings.CutPrefix(line, prefix); found {
				return rest
			}
		case <-timeout:
			t.Fatalf("child printed no %q within a minute\n%s", prefix, c.stderr())
		}
	}
}

var appliedRE = regexp.MustCompile(`^(\d+)$`)

// TestConcurrentUp runs goose's Provider.Up from two processes at the same
// moment through the Locker, on a database without the lock tables: both
// create them, one applies every migration while the other waits, and each
// migration is applied exactly once (SPEC D1, S1).
func TestConcurrentUp(t *testing.T) {
	backends(t, func(t *testing.T, b backend) {
		b.prepare(t)
		start := time.Now().Add(time.Second)
		children := []*child{startChild(t, b, 500*time.Millisecond, start), startChild(t, b, 500*time.Millisecond, start)}
		total := 0
		for i, c := range children {
			rest := c.waitLine(t, "gooselock child: applied ")
			m := appliedRE.FindStringSubmatch(rest)
			if m == nil {
				t.Fatalf("child %d printed applied %q", i, rest)
			}
			n, _ := strconv.Atoi(m[1])
			total += n
			if err := c.cmd.Wait(); err != nil {
				t.Fatalf("child %d: %v\n%s", i, err, c.stderr())
			}
		}
		if total != 3 {
			t.Errorf("the two migrators applied %d migrations in all, want 3", total)
		}
		b.checkOnce(t, b.open(t))
	})
}

// TestKilledMigratorIsTakenOver kills (SIGKILL) a migrator inside
// migration 00002 while it holds the lease; a migrator waiting meanwhile
// takes over once the lease expires, about one TTL later, and finishes:
// 00001 applied by the killed one, 00002 and 00003 by the other, each once
// (SPEC H1, S1).
func TestKilledMigratorIsTakenOver(t *testing.T) {
	backends(t, func(t *testing.T, b backend) {
		b.prepare(t)
		victim := startChild(t, b, time.Hour, time.Now())
		victim.waitLine(t, "gooselock child: migrating 2")

		db := b.open(t)
		locker, err := gooselock.New(b.d, gooselock.WithTTL(childTTL), gooselock.WithNamespace(b.ns()))
		if err != nil {
			t.Fatal(err)
		}
		p := b.provider(t, db, locker, b.migrations(sleep(0)))
		var killedAt atomic.Int64
		done := make(chan error, 1)
		go func() {
			res, err := p.Up(t.Context())
			if err == nil && len(res) != 2 {
				t.Errorf("the second migrator applied %d migrations, want 2 (00002, 00003)", len(res))
			}
			if killedAt.Load() == 0 {
				t.Errorf("the second migrator finished before the first one was killed")
			}
			done <- err
		}()
		time.Sleep(300 * time.Millisecond) // let it wait for the lease
		killedAt.Store(time.Now().UnixNano())
		if err := victim.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			took := time.Since(time.Unix(0, killedAt.Load()))
			if err != nil {
				t.Fatalf("Up after the kill: %v", err)
			}
			t.Logf("took over %s after the kill (TTL %s)", took.Round(time.Millisecond), childTTL)
			if took > childTTL+5*time.Second {
				t.Errorf("took over %s after the kill, want about one TTL (%s)", took, childTTL)
			}
		case <-time.After(childTTL + 30*time.Second):
			t.Fatal("the second migrator did not finish within TTL+30s of the kill")
		}
		by := b.checkOnce(t, db)
		if by[1] == os.Getpid() || by[2] != os.Getpid() || by[3] != os.Getpid() {
			t.Errorf("applied by pids %v; want 00001 by the killed child, 00002 and 00003 by this process (%d)", by, os.Getpid())
		}
		// The next run works and finds nothing to do.
		if res, err := p.Up(t.Context()); err != nil || len(res) != 0 {
			t.Errorf("Up again: %d applied, %v; want nothing", len(res), err)
		}
	})
}

// TestLostLeaseFailsUnlock deletes the lease's row while goose runs
// migration 00002: the loss is logged when it happens and Provider.Up (its
// Unlock) returns an error matching lock.ErrLeaseLost (SPEC H3). The same
// Locker then works again.
func TestLostLeaseFailsUnlock(t *testing.T) {
	backends(t, func(t *testing.T, b backend) {
		b.prepare(t)
		db := b.open(t)
		logs, readLogs := logFile(t, "log")
		var onLost atomic.Pointer[error]
		locker, err := gooselock.New(b.d, gooselock.WithTTL(childTTL), gooselock.WithNamespace(b.ns()),
			gooselock.WithLogger(slog.New(slog.NewTextHandler(logs, nil))),
			gooselock.WithOnLost(func(err error) { onLost.Store(&err) }))
		if err != nil {
			t.Fatal(err)
		}
		lose := func(ctx context.Context, _ *sql.Tx) error {
			loseLease(t, b, locker.Lease())
			return nil
		}
		p := b.provider(t, db, locker, b.migrations(lose))
		_, err = p.Up(t.Context())
		if !errors.Is(err, lock.ErrLeaseLost) {
			t.Fatalf("Up after the lease row was deleted: %v, want an error matching lock.ErrLeaseLost", err)
		}
		var lost *lock.LeaseLostError
		if !errors.As(err, &lost) || lost.Key != gooselock.DefaultKey {
			t.Errorf("Up: %v, want a *lock.LeaseLostError of key %q", err, gooselock.DefaultKey)
		}
		if !strings.Contains(readLogs(), "gooselock: lease lost while goose migrates") {
			t.Errorf("no loss logged; logs:\n%s", readLogs())
		}
		deadline := time.Now().Add(5 * time.Second)
		for onLost.Load() == nil && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if p := onLost.Load(); p == nil || !errors.Is(*p, lock.ErrLeaseLost) {
			t.Errorf("WithOnLost function not called with the loss")
		}
		if locker.Lease() != nil {
			t.Error("Lease() after Unlock is not nil")
		}
		// Each migration still ran once (nobody else migrated), and the
		// same Locker takes the lease again.
		b.checkOnce(t, db)
		if res, err := p.Up(t.Context()); err != nil || len(res) != 0 {
			t.Errorf("Up again with the same Locker: %d applied, %v; want nothing", len(res), err)
		}
	})
}

// loseLease deletes lease's row behind its back, on a pool of its own, and
// waits until the lease notices (at its next renewal).
func loseLease(t *testing.T, b backend, lease *lock.Lease) {
	t.Helper()
	if lease == nil {
		t.Error("Lease() is nil inside a migration")
		return
	}
	q := "DELETE FROM " + b.ns().Object(b.d, "holders") + " WHERE lease_id = " + b.d.Placeholder(1)
	if res, err := b.open(t).ExecContext(t.Context(), q, lease.LeaseID()); err != nil {
		t.Errorf("delete the lease row: %v", err)
	} else if n, _ := res.RowsAffected(); n != 1 {
		t.Errorf("deleted %d lease rows, want 1", n)
	}
	select {
	case <-lease.Done():
	case <-time.After(childTTL + 10*time.Second):
		t.Error("the lease was not lost within TTL+10s of deleting its row")
	}
}

// TestGoMigrationFences: a Go migration that fences its transaction with
// the Locker's lease (Lease().Fence) commits nothing once the lease is
// lost (SPEC F1): goose stops at it, and a later run applies it.
func TestGoMigrationFences(t *testing.T) {
	backends(t, func(t *testing.T, b backend) {
		b.prepare(t)
		db := b.open(t)
		locker, err := gooselock.New(b.d, gooselock.WithTTL(childTTL), gooselock.WithNamespace(b.ns()),
			gooselock.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			t.Fatal(err)
		}
		var lost atomic.Bool
		fenced := func(ctx context.Context, tx *sql.Tx) error {
			lease := locker.Lease()
			if !lost.Swap(true) {
				loseLease(t, b, lease)
			}
			return lease.Fence(ctx, tx)
		}
		p := b.provider(t, db, locker, b.migrations(fenced))
		res, err := p.Up(t.Context())
		if !errors.Is(err, lock.ErrLeaseLost) {
			t.Fatalf("Up with a fenced migration after the loss: %v, want lock.ErrLeaseLost", err)
		}
		if v, err := p.GetDBVersion(t.Context()); err != nil || v != 1 {
			t.Fatalf("version after the fenced migration failed: %d, %v; want 1 (00002 not committed)", v, err)
		}
		// The next run, with the lease held, applies 00002 and 00003.
		res, err = p.Up(t.Context())
		if err != nil || len(res) != 2 {
			t.Fatalf("Up again: %d applied, %v; want 2", len(res), err)
		}
		b.checkOnce(t, db)
	})
}
