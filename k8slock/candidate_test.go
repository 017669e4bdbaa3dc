package k8slock_test

// The candidate process of the election tests, and what it records.

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/tools/leaderelection"

	"github.com/sqlease/sqlease/k8slock"
	"github.com/sqlease/sqlease/lock"
)

// Durations of the multi-process election: client-go requires
// LeaseDuration > RenewDeadline > RetryPeriod * leaderelection.JitterFactor;
// the Lockers' TTL is the LeaseDuration.
const (
	leaseDuration = 2 * time.Second
	renewDeadline = 1500 * time.Millisecond
	retryPeriod   = 300 * time.Millisecond
	electionName  = "controllers/leader"
)

// candidateEnv carries a candidate process's spec (JSON): the test binary
// started with it runs runCandidate instead of the tests.
const candidateEnv = "K8SLOCK_CANDIDATE"

type candidateSpec struct {
	Backend  backend
	Identity string
	// Fenced: the candidate records its term with writes fenced by the
	// lease the Lock holds (Lock.Lease, Lease.RunInTx), and stops
	// recording at the first one refused.
	Fenced bool
}

// runCandidate is a candidate process: leaderelection.RunOrDie over a
// k8slock.Lock, until SIGTERM (then it releases, ReleaseOnCancel) or
// SIGKILL. While it leads it records its term in the terms table (start,
// and an end refreshed every 50ms, so a killed leader's term ends at its
// last heartbeat) with the token of its lease; OnNewLeader records each
// leader it is told of in the observed table. Times are the local wall
// clock, which the candidates share with the test.
func runCandidate() int {
	var spec candidateSpec
	if err := json.Unmarshal([]byte(os.Getenv(candidateEnv)), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "candidate: bad spec:", err)
		return 2
	}
	b, id := spec.Backend, spec.Identity
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	db, err := b.open(ctx, false)
	if err != nil {
		fmt.Fprintln(os.Stderr, "candidate:", err)
		return 1
	}
	defer db.Close()
	locker, err := b.locker(ctx, db, id, leaseDuration)
	if err != nil {
		fmt.Fprintln(os.Stderr, "candidate:", err)
		return 1
	}
	defer locker.Close(context.Background())
	rl, err := k8slock.New(locker, electionName, id)
	if err != nil {
		fmt.Fprintln(os.Stderr, "candidate:", err)
		return 1
	}
	var terms sync.WaitGroup
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock: rl, Name: electionName, ReleaseOnCancel: true,
		LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				terms.Add(1)
				defer terms.Done()
				if err := recordTerm(ctx, b, db, rl, spec.Fenced); err != nil {
					fmt.Fprintln(os.Stderr, "candidate: term:", err)
				}
			},
			OnStoppedLeading: func() {},
			OnNewLeader: func(leader string) {
				_, err := db.ExecContext(context.Background(), b.q("INSERT INTO "+b.table("observed")+" (observer, leader, at_us) VALUES ($1, $2, $3)"),
					id, leader, time.Now().UnixMicro())
				if err != nil {
					fmt.Fprintln(os.Stderr, "candidate: observed:", err)
				}
			},
		},
	})
	terms.Wait()
	return 0
}

// recordTerm records this candidate's term while ctx lasts, with unfenced
// writes: its start, then its end every 50ms and when ctx ends.
//
// Fenced, it writes through the lease the Lock holds (Lock.Lease,
// Lease.RunInTx) and only twice: the start, and the end when ctx ends; a
// refused end is recorded (unfenced) in the refused table. No write while
// leading: a candidate stopped inside a SQLite transaction would hold the
// database's write lock, and its successor's acquire would wait for it.
func recordTerm(ctx context.Context, b backend, db *sql.DB, rl *k8slock.Lock, fenced bool) error {
	write := func(ctx context.Context, query string, args ...any) error {
		if !fenced {
			_, err := db.ExecContext(ctx, b.q(query), args...)
			return err
		}
		lease, ok := rl.Lease()
		if !ok {
			return lock.ErrLeaseLost
		}
		return lease.RunInTx(ctx, db, nil, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, b.q(query), args...)
			return err
		})
	}
	lease, ok := rl.Lease()
	if !ok {
		return fmt.Errorf("leading without a lease")
	}
	start := time.Now().UnixMicro()
	if err := write(ctx, "INSERT INTO "+b.table("terms")+" (identity, token, start_us, end_us) VALUES ($1, $2, $3, $4)",
		rl.Identity(), lease.Token(), start, start); err != nil {
		return err
	}
	end := func(ctx context.Context) error {
		return write(ctx, "UPDATE "+b.table("terms")+" SET end_us = $1 WHERE identity = $2 AND start_us = $3",
			time.Now().UnixMicro(), rl.Identity(), start)
	}
	if fenced {
		<-ctx.Done()
		err := end(context.Background())
		if errors.Is(err, lock.ErrLeaseLost) {
			_, err = db.ExecContext(context.Background(), b.q("INSERT INTO "+b.table("refused")+" (identity, at_us) VALUES ($1, $2)"),
				rl.Identity(), time.Now().UnixMicro())
		}
		return err
	}
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return end(context.Background())
		case <-t.C:
			if err := end(ctx); err != nil && ctx.Err() == nil {
				return err
			}
		}
	}
}

type term struct {
	identity   string
	token      int64
	start, end time.Time
}

// readTerms returns the terms recorded so far, in start order.
func readTerms(t *testing.T, b backend, db *sql.DB) []term {
	t.Helper()
	rows, err := db.QueryContext(t.Context(), "SELECT identity, token, start_us, end_us FROM "+b.table("terms")+" ORDER BY start_us")
	if err != nil {
		t.Fatalf("read terms: %v", err)
	}
	defer rows.Close()
	var out []term
	for rows.Next() {
		var tm term
		var s, e int64
		if err := rows.Scan(&tm.identity, &tm.token, &s, &e); err != nil {
			t.Fatal(err)
		}
		tm.start, tm.end = time.UnixMicro(s), time.UnixMicro(e)
		out = append(out, tm)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// observedBy returns the leaders observer's OnNewLeader reported, in order.
func observedBy(t *testing.T, b backend, db *sql.DB, observer string) []string {
	t.Helper()
	rows, err := db.QueryContext(t.Context(), b.q("SELECT leader FROM "+b.table("observed")+" WHERE observer = $1 ORDER BY at_us"), observer)
	if err != nil {
		t.Fatalf("read observed: %v", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// candidate is a running candidate process.
type candidate struct {
	cmd  *exec.Cmd
	out  bytes.Buffer
	done chan struct{} // closed when the process has exited
	err  error         // its exit status, once done
}

func startCandidate(t *testing.T, b backend, identity string, fenced bool) *candidate {
	t.Helper()
	spec, _ := json.Marshal(candidateSpec{Backend: b, Identity: identity, Fenced: fenced})
	c := &candidate{cmd: exec.Command(os.Args[0], "-test.run=^$"), done: make(chan struct{})}
	c.cmd.Env = append(os.Environ(), candidateEnv+"="+string(spec))
	c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.out
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.err = c.cmd.Wait(); close(c.done) }()
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		<-c.done
		if t.Failed() {
			t.Logf("candidate %s output:\n%s", identity, c.out.String())
		}
	})
	return c
}
