package sqlitedialect_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlease/sqlease/dialect/sqlitedialect"
)

// startWatch runs WatchChanges on db until the test ends and returns the
// change count; it skips the test where the watch is unsupported.
func startWatch(t *testing.T, db *sql.DB) (*atomic.Int64, func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var changes atomic.Int64
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- sqlitedialect.New().WatchChanges(ctx, db, func() { changes.Add(1) }, func() { close(ready) })
	}()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		if runtime.GOOS != "linux" && errors.Is(err, errors.ErrUnsupported) {
			t.Skipf("no file watch on %s: %v", runtime.GOOS, err)
		}
		t.Fatalf("WatchChanges ended before ready: %v", err)
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatal("WatchChanges not ready after 10 s")
	}
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		return <-done
	}
	t.Cleanup(func() { _ = stop() })
	return &changes, stop
}

// TestWatchChangesSeesOtherPoolsCommits: a commit through another pool of
// the same file (as another process would make it) is reported, quickly,
// in WAL and rollback-journal modes; reads are not; and an in-memory
// database is unsupported.
func TestWatchChangesSeesOtherPoolsCommits(t *testing.T) {
	for _, mode := range []string{"WAL", "DELETE"} {
		t.Run(mode, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "w.db")
			dsn := "file:" + path + "?_journal_mode=" + mode + "&_busy_timeout=5000"
			writer, err := sql.Open("sqlite", dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer writer.Close()
			if _, err := writer.Exec("CREATE TABLE t (v INTEGER)"); err != nil {
				t.Fatal(err)
			}
			watched, err := sql.Open("sqlite", dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer watched.Close()
			changes, stop := startWatch(t, watched)
			time.Sleep(600 * time.Millisecond) // follow-ups of the set-up's writes
			base := changes.Load()
			for i := 0; i < 20; i++ {
				var n int
				if err := writer.QueryRow("SELECT count(*) FROM t").Scan(&n); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(50 * time.Millisecond)
			if n := changes.Load() - base; n > 0 {
				t.Errorf("%d changes reported for reads only", n)
			}
			for i := 0; i < 5; i++ {
				before := changes.Load()
				if _, err := writer.Exec("INSERT INTO t VALUES (?)", i); err != nil {
					t.Fatal(err)
				}
				deadline := time.Now().Add(5 * time.Second)
				for changes.Load() == before && time.Now().Before(deadline) {
					time.Sleep(time.Millisecond)
				}
				if changes.Load() == before {
					t.Fatalf("commit %d not reported within 5 s", i)
				}
			}
			if err := stop(); !errors.Is(err, context.Canceled) {
				t.Errorf("WatchChanges after cancel: %v, want context.Canceled", err)
			}
			if _, err := watched.Exec("INSERT INTO t VALUES (99)"); err != nil {
				t.Errorf("the watched pool after watching: %v", err)
			}
		})
	}
	t.Run("memory", func(t *testing.T) {
		db, err := sql.Open("sqlite", ":memory:")
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		err = sqlitedialect.New().WatchChanges(context.Background(), db, func() {}, func() { t.Error("ready called") })
		if !errors.Is(err, errors.ErrUnsupported) {
			t.Errorf("in-memory database: %v, want errors.ErrUnsupported", err)
		}
	})
}

const lockProbeEnv = "SQLEASE_SQLITEDIALECT_LOCK_PROBE"

// TestWatchChangesKeepsProcessLocks: watching, and ending the watch, leaves
// this process's SQLite locks alone. POSIX locks belong to the process and
// inode, and closing any descriptor of a file drops them all, so a watcher
// that opened and closed the database's files would let another process
// write under this process's open read transaction (rollback journal) or
// truncate the WAL under its snapshot. Another process tries to take the
// write lock while this process holds a read transaction, before and after
// a watch.
func TestWatchChangesKeepsProcessLocks(t *testing.T) {
	if dsn := os.Getenv(lockProbeEnv); dsn != "" {
		// The other process: try to write at once.
		db, err := sql.Open("sqlite", dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		_, err = db.Exec("INSERT INTO t VALUES (1)")
		if err == nil {
			os.Stdout.WriteString("probe: wrote\n")
		} else {
			os.Stdout.WriteString("probe: refused: " + err.Error() + "\n")
		}
		return
	}
	path := filepath.Join(t.TempDir(), "locks.db")
	dsn := "file:" + path + "?_journal_mode=DELETE&_busy_timeout=5000"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("CREATE TABLE t (v INTEGER)"); err != nil {
		t.Fatal(err)
	}
	probe := func() string {
		cmd := exec.Command(os.Args[0], "-test.run=^TestWatchChangesKeepsProcessLocks$", "-test.count=1")
		cmd.Env = append(os.Environ(), lockProbeEnv+"=file:"+path+"?_journal_mode=DELETE&_busy_timeout=0")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("probe process: %v\n%s", err, out)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "probe: ") {
				return line
			}
		}
		t.Fatalf("probe process printed no result:\n%s", out)
		return ""
	}
	// Hold a read transaction (a SHARED lock on the database file).
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	var n int
	if err := tx.QueryRow("SELECT count(*) FROM t").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if got := probe(); !strings.Contains(got, "refused") {
		t.Fatalf("before any watch, another process could write under our read transaction: %s", got)
	}
	_, stop := startWatch(t, db)
	if _, err := tx.Exec("SELECT 1"); err != nil {
		t.Fatal(err)
	}
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Fatalf("stop: %v", err)
	}
	if got := probe(); !strings.Contains(got, "refused") {
		t.Fatalf("after a watch ended, another process wrote under our open read transaction (the process lost its lock): %s", got)
	}
}
