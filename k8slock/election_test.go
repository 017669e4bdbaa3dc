package k8slock_test

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

// waitFor polls cond every 50ms until it is true or d has passed.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// election is two candidate processes, "a" and "b", and what they record.
type election struct {
	b                backend
	db               *sql.DB
	cands            map[string]*candidate
	first            term // the first leader's term
	leader, follower string
}

// startElection starts candidates a and b and waits until one leads and
// both have been told so.
func startElection(t *testing.T, b backend, fenced bool) *election {
	t.Helper()
	e := &election{b: b, db: b.openT(t, true)}
	for _, ddl := range []string{
		"CREATE TABLE " + b.table("terms") + " (identity TEXT NOT NULL, token BIGINT NOT NULL, start_us BIGINT NOT NULL, end_us BIGINT NOT NULL)",
		"CREATE TABLE " + b.table("observed") + " (observer TEXT NOT NULL, leader TEXT NOT NULL, at_us BIGINT NOT NULL)",
		"CREATE TABLE " + b.table("refused") + " (identity TEXT NOT NULL, at_us BIGINT NOT NULL)",
	} {
		if _, err := e.db.ExecContext(t.Context(), ddl); err != nil {
			t.Fatal(err)
		}
	}
	e.cands = map[string]*candidate{"a": startCandidate(t, b, "a", fenced), "b": startCandidate(t, b, "b", fenced)}
	e.first = e.waitTerm(t, 0, 20*time.Second, "a first leader")
	e.leader, e.follower = e.first.identity, map[string]string{"a": "b", "b": "a"}[e.first.identity]
	waitFor(t, 10*time.Second, "both candidates told of the leader", func() bool {
		return len(observedBy(t, b, e.db, e.leader)) > 0 && len(observedBy(t, b, e.db, e.follower)) > 0
	})
	return e
}

// waitTerm waits at most d for term i (0 the first) and returns it.
func (e *election) waitTerm(t *testing.T, i int, d time.Duration, what string) term {
	t.Helper()
	tm, ok := e.termWithin(t, i, d)
	if !ok {
		t.Fatalf("%s: not within %s", what, d)
	}
	return tm
}

// termWithin waits at most d for term i and returns it, or false.
func (e *election) termWithin(t *testing.T, i int, d time.Duration) (term, bool) {
	t.Helper()
	for deadline := time.Now().Add(d); ; time.Sleep(50 * time.Millisecond) {
		if ts := readTerms(t, e.b, e.db); len(ts) > i {
			return ts[i], true
		}
		if time.Now().After(deadline) {
			return term{}, false
		}
	}
}

// exited waits at most d for candidate who to exit, and fails t unless it
// exited with status 0.
func (e *election) exited(t *testing.T, who string, d time.Duration, after string) {
	t.Helper()
	c := e.cands[who]
	select {
	case <-c.done:
		if c.err != nil {
			t.Fatalf("%s after %s: %v", who, after, c.err)
		}
	case <-time.After(d):
		t.Fatalf("%s did not exit within %s of %s", who, d, after)
	}
}

// checkTerms fails t unless exactly n terms were recorded, none
// overlapping another.
func (e *election) checkTerms(t *testing.T, n int) {
	t.Helper()
	ts := readTerms(t, e.b, e.db)
	for i := 1; i < len(ts); i++ {
		if !ts[i].start.After(ts[i-1].end) {
			t.Fatalf("terms overlap: %+v and %+v", ts[i-1], ts[i])
		}
	}
	if len(ts) != n {
		t.Fatalf("terms %+v, want %d", ts, n)
	}
}

// TestRunOrDieTwoProcesses: two candidate processes run client-go's
// leaderelection.RunOrDie over k8slock: one leads at a time, both are told
// who leads, and after SIGKILL of the leader the other leads within the
// TTL plus a RetryPeriod (with slack for a loaded machine); a leader
// stopped with SIGTERM releases (ReleaseOnCancel). SPEC S1, S3, W2.
func TestRunOrDieTwoProcesses(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		e := startElection(t, b, false)
		db, cands, first, leader, follower := e.db, e.cands, e.first, e.leader, e.follower
		time.Sleep(leaseDuration) // the leader renews; the follower must not take over
		e.checkTerms(t, 1)

		if err := cands[leader].cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		<-cands[leader].done
		killed := time.Now()
		bound := leaseDuration + retryPeriod + 3*time.Second // TTL + RetryPeriod, with slack for a loaded machine
		second := e.waitTerm(t, 1, bound, "the follower leading after SIGKILL of the leader")
		takeover := second.start.Sub(killed)
		t.Logf("%s led from the start; %s led %s after SIGKILL of %s (TTL %s, RetryPeriod %s)", leader, follower, takeover.Round(time.Millisecond), leader, leaseDuration, retryPeriod)
		if second.identity != follower || takeover < 0 || second.token <= first.token {
			t.Fatalf("second term %+v (takeover %s), want %s after the kill, with a token greater than %d (SPEC S3)", second, takeover, follower, first.token)
		}
		waitFor(t, 5*time.Second, "the follower told it leads", func() bool {
			obs := observedBy(t, b, db, follower)
			return len(obs) > 0 && obs[len(obs)-1] == follower
		})
		if obs := observedBy(t, b, db, leader); len(obs) != 1 || obs[0] != leader {
			t.Fatalf("%s was told of leaders %v, want [%s]", leader, obs, leader)
		}
		if obs := observedBy(t, b, db, follower); len(obs) != 2 || obs[0] != leader {
			t.Fatalf("%s was told of leaders %v, want [%s %s]", follower, obs, leader, follower)
		}

		// SIGTERM: RunOrDie returns and releases the lease.
		if err := cands[follower].cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		e.exited(t, follower, 10*time.Second, "SIGTERM")
		wantNotFound(t, b.newLock(t, db, electionName, "observer", leaseDuration))

		e.checkTerms(t, 2)
	})
}

// TestStoppedLeaderIsFenced: a leader stopped (SIGSTOP) for longer than the
// TTL is replaced; resumed, client-go stops it leading on its own
// (RunOrDie returns) and its fenced write is refused, so its term never
// overlaps its successor's (SPEC S1, H1, F2).
func TestStoppedLeaderIsFenced(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend) {
		e := startElection(t, b, true)
		old := e.cands[e.leader]
		if err := old.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		stopped := time.Now()
		bound := leaseDuration + retryPeriod + 3*time.Second
		second, ok := e.termWithin(t, 1, bound)
		if err := old.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		if !ok && b.Driver == "sqlite" {
			// Stopped inside a write transaction (a renewal), the leader
			// holds SQLite's write lock, and nothing can take over until
			// it runs again (docs/contract.md, "Where a dialect differs").
			t.Logf("no new leader %s after SIGSTOP: %s holds the SQLite write lock while stopped; resumed it", bound, e.leader)
			second = e.waitTerm(t, 1, bound, "the follower leading after the leader resumed")
		} else if !ok {
			t.Fatalf("no new leader %s after SIGSTOP of %s", bound, e.leader)
		}
		t.Logf("%s led %s after SIGSTOP of %s", second.identity, second.start.Sub(stopped).Round(time.Millisecond), e.leader)
		if second.identity != e.follower || second.token <= e.first.token {
			t.Fatalf("second term %+v, want %s's, with a token greater than %d (SPEC S3)", second, e.follower, e.first.token)
		}
		e.exited(t, e.leader, renewDeadline+5*time.Second, "SIGCONT")
		var refused int
		if err := e.db.QueryRowContext(t.Context(), b.q("SELECT count(*) FROM "+b.table("refused")+" WHERE identity = $1"), e.leader).Scan(&refused); err != nil {
			t.Fatal(err)
		}
		if refused != 1 {
			t.Fatalf("%s's fenced write after it was replaced: %d refusals recorded, want 1", e.leader, refused)
		}
		e.checkTerms(t, 2)
	})
}
