package k8slock_test

import (
	"database/sql"
	"syscall"
	"testing"
	"time"
)

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
