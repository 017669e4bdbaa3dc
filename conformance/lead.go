package conformance

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/lock"
)

// Cases of the leader-election helper (lock.Locker.Lead), across
// processes. They are named after the rules Lead inherits from the lease
// it runs on.
func init() {
	register(
		Case{Name: "S1_LeaderOneAtATimeAcrossProcesses", Rule: "S1", Run: s1LeaderOneAtATime},
		Case{Name: "W2_KilledLeaderReplacedWithinTTLPlusBackoff", Rule: "W2", Run: w2KilledLeaderReplaced},
		Case{Name: "H3_StoppedLeaderFnEndsByTrustedWindow", Rule: "H3", Run: h3StoppedLeaderFnEnds},
	)
	childRoles["leader"] = leaderChild
}

const leaderKey = "leader/scheduler"

// createLeaderLog creates the table leader children report to.
func createLeaderLog(e *Env) string {
	table := e.Table("leader")
	if _, err := e.DB.ExecContext(e.Ctx(), `CREATE TABLE `+table+` (worker TEXT NOT NULL, event TEXT NOT NULL, token BIGINT NOT NULL, detail TEXT NOT NULL)`); err != nil {
		e.T.Fatalf("create leader log: %v", err)
	}
	return table
}

type leaderEvent struct {
	Worker, Event string
	Token         int64
	Detail        string
}

func readLeaderLog(e *Env, table string) []leaderEvent {
	rows, err := e.DB.QueryContext(e.Ctx(), `SELECT worker, event, token, detail FROM `+table)
	e.Must(err, "read leader log")
	defer rows.Close()
	var out []leaderEvent
	for rows.Next() {
		var ev leaderEvent
		e.Must(rows.Scan(&ev.Worker, &ev.Event, &ev.Token, &ev.Detail), "read leader log")
		out = append(out, ev)
	}
	e.Must(rows.Err(), "read leader log")
	return out
}

// leaderChild runs Lead on leaderKey. Extra["mode"]:
//   - "rotate": lead, hold for up to spec.Hold, log the term to
//     spec.LogTable (a grant log, see CreateLogTable) and step down; again
//     until spec.Duration ends.
//   - "hold": lead until killed (or spec.Duration ends); log "start".
//   - "report": as hold, but when fn's context ends log "end" with its
//     cause, and count ticks at which the trusted window had ended while
//     the context was still live, for longer than a scheduling slack.
func leaderChild(ctx context.Context, db *sql.DB, d dialect.Dialect, spec StressSpec) error {
	ctx, cancel := context.WithTimeout(ctx, spec.Duration)
	defer cancel()
	l, err := lock.New(ctx, db, d, lock.WithSchema(spec.Namespace.Schema), lock.WithTablePrefix(spec.Namespace.Prefix),
		lock.WithoutSchemaCheck(), lock.WithTTL(spec.TTL), lock.WithOwner(spec.Worker),
		lock.WithMaxBackoff(50*time.Millisecond), lock.WithLogger(discard))
	if err != nil {
		return err
	}
	defer l.Close(context.Background())
	ph := d.Placeholder
	event := fmt.Sprintf(`INSERT INTO %s (worker, event, token, detail) VALUES (%s, %s, %s, %s)`, spec.LogTable, ph(1), ph(2), ph(3), ph(4))
	grant := grantInsert(d, spec.LogTable)
	switch mode := spec.Extra["mode"]; mode {
	case "rotate":
		for ctx.Err() == nil {
			err := l.Lead(ctx, leaderKey, func(fctx context.Context, lease *lock.Lease) error {
				acquired := lease.GrantedAt().UnixMicro()
				t := time.NewTimer(time.Duration(rand.Int64N(int64(spec.Hold) + 1)))
				defer t.Stop()
				select {
				case <-fctx.Done():
				case <-t.C:
				}
				// The term ends no later than now (database time) and the
				// lease's expiry; fn returns before the release.
				released, err := endOfHold(context.WithoutCancel(fctx), l, lease)
				if err != nil {
					return err
				}
				if _, err := db.ExecContext(context.WithoutCancel(fctx), grant, leaderKey, lease.Token(), "exclusive", acquired, released, spec.Worker); err != nil {
					return err
				}
				return nil
			})
			if err != nil && ctx.Err() == nil && !errors.Is(err, lock.ErrLeaseLost) {
				return err
			}
		}
		return nil
	case "hold", "report":
		err := l.Lead(ctx, leaderKey, func(fctx context.Context, lease *lock.Lease) error {
			if _, err := db.ExecContext(fctx, event, spec.Worker, "start", lease.Token(), ""); err != nil {
				return err
			}
			const slack = 500 * time.Millisecond
			windowEnd := time.Now().Add(lease.Remaining())
			late := 0
			var lateSince time.Time // first tick past the window with the context live
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-fctx.Done():
					cause := context.Cause(fctx)
					detail := fmt.Sprintf("lost=%v late_ticks=%d cause=%v", errors.Is(cause, lock.ErrLeaseLost), late, cause)
					if mode == "report" {
						if _, err := db.ExecContext(context.WithoutCancel(fctx), event, spec.Worker, "end", lease.Token(), detail); err != nil {
							return err
						}
					}
					return cause
				case <-tick.C:
					// Right after a resume this tick may run before the
					// lease's own timer; the context must end within a
					// scheduling slack after that.
					if now := time.Now(); now.After(windowEnd.Add(slack)) && fctx.Err() == nil {
						if lateSince.IsZero() {
							lateSince = now
						} else if now.Sub(lateSince) > slack {
							late++
						}
					}
					if r := lease.Remaining(); r > 0 {
						windowEnd = time.Now().Add(r)
					}
				}
			}
		})
		if mode == "report" && errors.Is(err, context.DeadlineExceeded) {
			return nil
		}
		return err
	default:
		return fmt.Errorf("leader child: unknown mode %q", mode)
	}
}

// S1 for Lead: three processes campaign for one key, each stepping down
// after a short term; the terms logged in database time never overlap and
// their tokens increase.
func s1LeaderOneAtATime(e *Env) {
	dur := 6 * time.Second
	if e.Config.Short {
		dur = 3 * time.Second
	}
	child := e.stressSpec()
	child.Role, child.Extra = "leader", map[string]string{"mode": "rotate"}
	child.Duration, child.TTL, child.Hold = dur, 2*time.Second, 60*time.Millisecond
	// The children log their terms; runStress checks no two overlap
	// (CheckLog) and tokens increase.
	terms := runStress(e, 3, child, func(string) error { return nil })
	workers := map[string]int{}
	for _, g := range terms {
		workers[g.Worker]++
	}
	e.T.Logf("%d terms across %d processes: %v", len(terms), len(workers), workers)
	e.Check(len(terms) >= 5 && len(workers) >= 2, "%d terms by %d processes: want leadership to change hands (at least 5 terms, 2 processes)", len(terms), len(workers))
}

// leaderOf returns the owner and expiry of key's live exclusive lease, as
// the database reports it.
func leaderOf(e *Env, l *lock.Locker) (owner string, expiry time.Time) {
	hs, now, err := l.Holders(e.Ctx(), leaderKey)
	e.Must(err, "holders")
	for _, h := range hs {
		if h.Mode == lock.Exclusive && h.Expiry.After(now) {
			return h.Owner, h.Expiry
		}
	}
	return "", time.Time{}
}

// leaderTakeover starts a leader child in mode, waits until it leads, does
// stop to it, and checks that a Lead in this process takes over within one
// TTL plus one backoff step. It returns the child, the takeover lease's
// token, and a function ending this process's leadership.
//
// resume, when not nil, undoes stop. On a dialect without concurrent
// writers (SQLite) a child stopped inside one of its write transactions (a
// renewal, a log row) keeps the database's write lock while stopped, and
// nothing can take over until it runs again (no server-side bound; see
// docs/contract.md, "Where a dialect differs"): then the child is resumed
// and stopped again, up to three times, and the takeover is timed from the
// last stop.
func leaderTakeover(e *Env, mode string, stop, resume func(*childProc) error) (*childProc, string, func()) {
	ctx := e.Ctx()
	const ttl, maxBackoff = time.Second, 100 * time.Millisecond
	table := createLeaderLog(e)
	spec := e.stressSpec()
	spec.Role, spec.Extra, spec.Worker = "leader", map[string]string{"mode": mode}, "leader-child"
	spec.LogTable, spec.Duration, spec.TTL = table, time.Minute, ttl
	c := startChild(e, spec)
	b := e.NewLocker(nil, lock.WithTTL(ttl), lock.WithMaxBackoff(maxBackoff), lock.WithOwner("leader-parent"))
	if !Eventually(20*time.Second, func() bool { owner, _ := leaderOf(e, b); return owner == "leader-child" }) {
		e.T.Fatalf("child never became leader: %s", c.kill())
	}
	// Campaign from this process, then stop the child leader.
	lctx, cancel := context.WithCancel(ctx)
	type term struct {
		at    time.Time
		token int64
	}
	led := make(chan term, 1)
	var wg sync.WaitGroup
	e.Go(&wg, func() {
		_ = b.Lead(lctx, leaderKey, func(fctx context.Context, lease *lock.Lease) error {
			led <- term{time.Now(), lease.Token()}
			<-fctx.Done()
			return nil
		})
	})
	end := func() { cancel(); wg.Wait() }
	time.Sleep(3 * maxBackoff) // the campaign is under way
	retries := 0
	if resume != nil && !dialect.CapabilitiesOf(e.Dialect).Has(dialect.CapConcurrentWriters) {
		retries = 3
	}
	for attempt := 0; ; attempt++ {
		_, expiry := leaderOf(e, b)
		stopped := time.Now()
		if err := stop(c); err != nil {
			end()
			e.T.Fatalf("stop the child leader: %v", err)
		}
		select {
		case t := <-led:
			if d := t.at.Sub(stopped); d > ttl+maxBackoff+lcSlack {
				e.T.Errorf("leader replaced %s after it stopped, want within TTL %s + one backoff step %s", d, ttl, maxBackoff)
			}
			owner, _ := leaderOf(e, b)
			e.Check(owner == "leader-parent", "after takeover the database names %q the leader, want leader-parent", owner)
			e.T.Logf("replaced after %s (the child's lease expired at %s database time); new token %d",
				t.at.Sub(stopped).Round(time.Millisecond), expiry.Format(time.RFC3339Nano), t.token)
			return c, table, end
		case <-time.After(5 * ttl):
			if attempt < retries {
				// Stopped inside a write transaction: it holds the
				// write lock. Let it finish, and stop it again.
				e.T.Logf("no new leader %s after the stop: the child holds the write lock while stopped; resuming and stopping it again", 5*ttl)
				if err := resume(c); err != nil {
					end()
					e.T.Fatalf("continue the child: %v", err)
				}
				time.Sleep(3 * maxBackoff)
				continue
			}
			end()
			e.T.Fatalf("no new leader %s after the old one stopped", 5*ttl)
		}
	}
}

// W2 for Lead: a killed leader process is replaced within one TTL plus one
// backoff step.
func w2KilledLeaderReplaced(e *Env) {
	_, _, end := leaderTakeover(e, "hold", func(c *childProc) error { c.kill(); return nil }, nil)
	end()
}

// H3 (and H1) for Lead: a leader process that is stopped (SIGSTOP) loses
// leadership to another process; when it runs again, its fn's context has
// ended with cause ErrLeaseLost by the end of its trusted window (never
// later than a scheduling slack), and it does not lead again while the new
// leader holds the key.
func h3StoppedLeaderFnEnds(e *Env) {
	if err := stopProcess(nil); errors.Is(err, errors.ErrUnsupported) {
		e.T.Skipf("stopping a process is not supported on this system: %v", err)
	}
	c, table, end := leaderTakeover(e, "report", func(c *childProc) error { return stopProcess(c.cmd.Process) },
		func(c *childProc) error { return continueProcess(c.cmd.Process) })
	defer end()
	resumed := time.Now()
	e.Must(continueProcess(c.cmd.Process), "continue the child")
	var got leaderEvent
	if !Eventually(10*time.Second, func() bool {
		for _, ev := range readLeaderLog(e, table) {
			if ev.Event == "end" {
				got = ev
				return true
			}
		}
		return false
	}) {
		e.T.Fatalf("the stopped leader's fn did not end within 10s of resuming: %s", c.kill())
	}
	e.T.Logf("stopped leader's fn ended %s after resuming: %s", time.Since(resumed).Round(time.Millisecond), got.Detail)
	var lost bool
	var late int
	if _, err := fmt.Sscanf(got.Detail, "lost=%t late_ticks=%d", &lost, &late); err != nil {
		e.T.Fatalf("bad end report %q: %v", got.Detail, err)
	}
	e.Check(lost, "stopped leader's fn context ended with %q, want cause ErrLeaseLost", got.Detail)
	e.Check(late <= 0, "stopped leader's fn saw its context live %d times after its trusted window ended", late)
	// The resumed process campaigns again but cannot lead while this
	// process does.
	time.Sleep(300 * time.Millisecond)
	starts := 0
	for _, ev := range readLeaderLog(e, table) {
		if ev.Event == "start" {
			starts++
		}
	}
	e.Check(starts == 1, "the resumed leader started fn %d times, want once (the key is led from this process)", starts)
}
