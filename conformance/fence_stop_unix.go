//go:build unix

package conformance

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/lock"
)

func init() {
	register(Case{Name: "F1_StoppedHolderInFencedTxEndedByDatabase", Rule: "F1", Needs: dialect.CapFenceIdleTimeout, Run: f1StoppedHolder})
	childRoles["f1-stop"] = f1StopChild
}

// f1StopChild acquires Extra["key"], fences a transaction, reports its
// process ID in Extra["ready"], then sleeps spec.Hold inside the
// transaction (the parent stops it meanwhile) and tries to write
// Extra["writes"] and commit. It prints the outcome; exit status 0 means
// the commit failed, as it must once the database ended the transaction.
func f1StopChild(ctx context.Context, db *sql.DB, d dialect.Dialect, spec StressSpec) error {
	l, err := lock.New(ctx, db, d, lock.WithSchema(spec.Namespace.Schema), lock.WithTablePrefix(spec.Namespace.Prefix),
		lock.WithTTL(spec.TTL), lock.WithoutSchemaCheck(), lock.WithOwner("f1-stopped"), lock.WithLogger(discard))
	if err != nil {
		return err
	}
	le, err := l.TryAcquire(ctx, spec.Extra["key"], lock.Exclusive)
	if err != nil {
		return fmt.Errorf("acquire: %w", err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := le.Fence(ctx, tx); err != nil {
		return fmt.Errorf("fence: %w", err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO "+spec.Extra["ready"]+" (pid) VALUES ("+d.Placeholder(1)+")", os.Getpid()); err != nil {
		return fmt.Errorf("report ready: %w", err)
	}
	time.Sleep(spec.Hold) // stopped here
	_, werr := tx.ExecContext(ctx, "INSERT INTO "+spec.Extra["writes"]+" (n) VALUES (1)")
	cerr := tx.Commit()
	if werr == nil && cerr == nil {
		return errors.New("the fenced transaction committed after the stop")
	}
	fmt.Printf("fenced transaction refused after the stop: write: %v; commit: %v\n", werr, cerr)
	return nil
}

// f1StoppedHolder: a holder process is stopped (SIGSTOP) inside a fenced
// transaction. The database ends that transaction after it sat idle for
// about one TTL, so a contender is granted within about TTL + the acquire's
// lock timeout (2 s) + one backoff step, and after SIGCONT the stopped
// holder's write and commit fail.
func f1StoppedHolder(e *Env) {
	ctx := e.Ctx()
	const ttl = time.Second
	ready, writes := e.Table("f1_ready"), e.Table("f1_writes")
	for _, q := range []string{"CREATE TABLE " + ready + " (pid BIGINT NOT NULL)", "CREATE TABLE " + writes + " (n BIGINT NOT NULL)"} {
		if _, err := e.DB.ExecContext(ctx, q); err != nil {
			e.T.Fatalf("create table: %v", err)
		}
	}
	spec := StressSpec{
		Role: "f1-stop", Dialect: e.Dialect.Name(), Driver: e.Config.DriverName, DSN: e.DSN, Namespace: e.Namespace,
		TTL: ttl, Hold: 3 * time.Second, Extra: map[string]string{"key": "f1/stopped", "ready": ready, "writes": writes},
	}
	b, _ := json.Marshal(spec)
	exe, err := os.Executable()
	e.Must(err, "executable")
	var args []string
	if testing.Testing() {
		top, _, _ := strings.Cut(e.T.Name(), "/")
		args = []string{"-test.run=^" + top + "$", "-test.count=1"}
	} else {
		args = os.Args[1:]
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), childEnv+"="+string(b))
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	e.Must(cmd.Start(), "start child")
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	continued := false
	defer func() {
		if !continued {
			_ = cmd.Process.Signal(syscall.SIGCONT)
		}
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	e.Require(Eventually(15*time.Second, func() bool {
		var n int
		return e.DB.QueryRowContext(ctx, "SELECT count(*) FROM "+ready).Scan(&n) == nil && n > 0
	}), "the child never fenced its transaction: %s", out.String())
	e.Must(cmd.Process.Signal(syscall.SIGSTOP), "SIGSTOP")
	stopped := time.Now()
	contender := e.NewLocker(nil, lock.WithTTL(ttl), lock.WithOwner("f1-contender"))
	le, err := contender.Acquire(ctx, "f1/stopped", lock.Exclusive, lock.WaitTimeout(15*time.Second))
	took := time.Since(stopped)
	e.Require(err == nil, "contender while the holder is stopped inside its fenced transaction: %v after %s", err, took)
	// TTL + lock timeout (2 s) + one backoff step (at most the TTL), plus
	// slack for a loaded machine.
	if bound := ttl + 2*time.Second + ttl + time.Second; took > bound {
		e.T.Errorf("contender granted %s after the holder stopped, want within %s", took, bound)
	}
	e.T.Logf("contender granted %s after the holder stopped", took.Round(time.Millisecond))
	continued = true
	e.Must(cmd.Process.Signal(syscall.SIGCONT), "SIGCONT")
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			e.T.Errorf("stopped holder: %v: %s", err, out.String())
		} else {
			e.T.Logf("stopped holder: %s", strings.TrimSpace(out.String()))
		}
	case <-time.After(10 * time.Second):
		e.T.Errorf("stopped holder did not finish 10 s after SIGCONT")
	}
	var n int
	if err := e.DB.QueryRowContext(ctx, "SELECT count(*) FROM "+writes).Scan(&n); err != nil || n != 0 {
		e.T.Errorf("the stopped holder's write committed (%d rows, %v)", n, err)
	}
	// The successor works normally.
	e.CheckErr(le.RunInTx(ctx, e.DB, nil, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO "+writes+" (n) VALUES (2)")
		return err
	}), "successor's fenced write")
	e.CheckErr(le.Release(ctx), "release")
}
