package chaos

import (
	"strings"
	"testing"
	"time"
)

// hb builds synthetic histories for the checker's tests. Database and
// local times are both in milliseconds from an arbitrary origin.
type hb struct {
	h    history
	keys map[string]string // lease → key
}

const origin = int64(1_700_000_000_000) // ms

func us(ms int64) int64 { return (origin + ms) * 1000 }
func ns(ms int64) int64 { return (origin + ms) * 1_000_000 }

func (b *hb) ev(e event, atMS int64) {
	e.T = ns(atMS)
	if e.Worker == "" {
		e.Worker = "w0"
	}
	b.h.events = append(b.h.events, e)
}

// grant logs a grant of lease id at ms (local and database time alike)
// with the given TTL.
func (b *hb) grant(worker, id, key, mode string, token, atMS, ttlMS int64) {
	if b.keys == nil {
		b.keys = map[string]string{}
	}
	b.keys[id] = key
	b.ev(event{Ev: evGrant, Worker: worker, Lease: id, Key: key, Mode: mode, Token: token, TTLMS: ttlMS,
		Granted: us(atMS), Expiry: us(atMS + ttlMS)}, atMS)
}

func (b *hb) release(worker, id string, atMS int64, class string) {
	b.ev(event{Ev: evReleasing, Worker: worker, Lease: id, Key: b.keys[id]}, atMS)
	b.ev(event{Ev: evReleased, Worker: worker, Lease: id, Key: b.keys[id], Class: class}, atMS+1)
}

func (b *hb) write(worker, id, key, mode string, token, n, atMS int64, acked bool) {
	wid := id + "/" + time.Duration(n).String()
	b.h.ledger = append(b.h.ledger, ledgerRow{WriteID: wid, Key: key, Token: token, Lease: id, Worker: worker, Mode: mode, N: n, AtUS: us(atMS)})
	if acked {
		b.ev(event{Ev: evAck, Worker: worker, Lease: id, Key: key, Token: token, WriteID: wid, N: n, At: us(atMS)}, atMS+1)
	}
}

func rules(r checkResult) string {
	var s []string
	for _, v := range r.Violations {
		s = append(s, v.String())
	}
	return strings.Join(s, "\n")
}

// clean is a legal history: exclusive, then two overlapping shared leases,
// then an exclusive takeover after the holder's expiry.
func clean() *hb {
	b := &hb{}
	b.grant("w0", "a", "k", "x", 1, 0, 1000)
	b.write("w0", "a", "k", "x", 1, 1, 100, true)
	b.release("w0", "a", 200, "ok")
	b.grant("w1", "b", "k", "s", 2, 300, 1000)
	b.grant("w2", "c", "k", "s", 3, 310, 1000)
	b.write("w1", "b", "k", "s", 2, 2, 400, true)
	b.write("w2", "c", "k", "s", 3, 3, 410, true)
	b.release("w1", "b", 500, "ok")
	// c's worker dies holding it: d is granted after c's expiry.
	b.grant("w3", "d", "k", "x", 4, 1400, 1000)
	b.write("w3", "d", "k", "x", 4, 4, 1500, true)
	b.release("w3", "d", 1600, "ok")
	return b
}

func TestCheckCleanHistory(t *testing.T) {
	r := check(clean().h)
	if r.count() != 0 {
		t.Fatalf("clean history: %d violations:\n%s", r.count(), rules(r))
	}
	if r.Grants != 4 || r.Writes != 4 || r.Acked != 4 {
		t.Errorf("figures: grants %d writes %d acked %d, want 4 4 4", r.Grants, r.Writes, r.Acked)
	}
}

// TestCheckCatches builds one broken history per rule and checks that the
// checker reports that rule (and no other, unless the break implies it).
func TestCheckCatches(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rule  string
		also  string // a rule the same break may also break
		build func(b *hb)
	}{
		{"exclusive granted while another is live", RuleS1, "", func(b *hb) {
			b.grant("w0", "a", "k", "x", 1, 0, 1000) // its worker dies: live until 1000
			b.grant("w1", "b", "k", "x", 2, 500, 1000)
		}},
		{"shared granted under a live exclusive", RuleS1, "", func(b *hb) {
			b.grant("w0", "a", "k", "x", 1, 0, 1000)
			b.grant("w1", "b", "k", "s", 2, 999, 1000)
		}},
		{"exclusive granted while a fenced write proves a shared lease live", RuleS1, RuleFenced, func(b *hb) {
			b.grant("w0", "a", "k", "s", 1, 0, 1000)
			b.write("w0", "a", "k", "s", 1, 1, 700, false)
			b.release("w0", "a", 800, "ok")
			b.grant("w1", "b", "k", "x", 2, 600, 1000)
		}},
		{"token granted twice", RuleS3, "", func(b *hb) {
			b.grant("w0", "a", "k", "x", 1, 0, 1000)
			b.release("w0", "a", 100, "ok")
			b.grant("w1", "b", "k", "x", 1, 200, 1000)
		}},
		{"token out of grant order", RuleS3, RuleS1, func(b *hb) {
			b.grant("w0", "a", "k", "x", 1, 500, 1000)
			b.release("w0", "a", 600, "ok")
			b.grant("w1", "b", "k", "x", 2, 100, 1000)
			b.release("w1", "b", 200, "ok")
		}},
		{"write committed after a conflicting successor's write", RuleFenced, "", func(b *hb) {
			b.grant("w0", "a", "k", "x", 1, 0, 1000)
			b.write("w0", "a", "k", "x", 1, 2, 100, true)
			b.release("w0", "a", 200, "ok")
			b.grant("w1", "b", "k", "x", 2, 400, 1000)
			b.write("w1", "b", "k", "x", 2, 1, 500, true)
			b.release("w1", "b", 600, "ok")
		}},
		{"write committed after a successor was granted", RuleFenced, RuleS1, func(b *hb) {
			b.grant("w0", "a", "k", "x", 1, 0, 300)
			b.grant("w1", "b", "k", "x", 2, 400, 1000)
			b.write("w0", "a", "k", "x", 1, 1, 450, true)
		}},
		{"acknowledged write missing", RuleAcked, "", func(b *hb) {
			b.grant("w0", "a", "k", "x", 1, 0, 1000)
			b.ev(event{Ev: evAck, Worker: "w0", Lease: "a", Key: "k", Token: 1, WriteID: "gone"}, 450)
		}},
		{"lease reported held after a long stop", RuleLoss, "", func(b *hb) {
			b.grant("w5", "f", "k2", "x", 1, 0, 500)
			b.h.stops = append(b.h.stops, stopFault{Worker: "w5", Start: ns(100), End: ns(900)})
			b.ev(event{Ev: evHeld, Worker: "w5", Lease: "f", Key: "k2"}, 940)
			b.release("w5", "f", 950, "ok")
		}},
		{"released key refused as reentrant", RuleForget, "", func(b *hb) {
			b.grant("w0", "a", "k", "x", 1, 0, 1000)
			b.release("w0", "a", 100, "error")
			b.ev(event{Ev: evAcquireErr, Worker: "w0", Key: "k", Mode: "x", Class: "reentrant", Err: "lock: key already held by this locker"}, 200)
			b.ev(event{Ev: evAcquireErr, Worker: "w0", Key: "k", Mode: "x", Class: "reentrant", Err: "lock: key already held by this locker"}, 300)
		}},
		{"acquire overran its wait timeout", RuleDeadline, "", func(b *hb) {
			b.ev(event{Ev: evAcquireErr, Worker: "w0", Key: "k", Mode: "x", Class: "locked", WaitMS: 20000}, 30000)
		}},
		{"acquire gave up early on a transient error", RuleDeadline, "", func(b *hb) {
			b.ev(event{Ev: evAcquireErr, Worker: "w0", Key: "k", Mode: "x", Class: "error", WaitMS: 8, Err: "unexpected EOF"}, 30000)
		}},
		{"stuck key", RuleLiveness, "", func(b *hb) {
			b.h.probers = map[string]bool{"w0": true}
			b.h.keys, b.h.lockers = []string{"k"}, 1
			b.ev(event{Ev: evProbe, Worker: "w0", Key: "k", Class: "reentrant", Err: "lock: key already held by this locker"}, 3000)
		}},
		{"probe too slow", RuleLiveness, "", func(b *hb) {
			b.h.probers = map[string]bool{"w0": true}
			b.h.keys, b.h.lockers = []string{"k"}, 1
			b.ev(event{Ev: evProbe, Worker: "w0", Key: "k", Class: "ok", WaitMS: 5000, TTLMS: 1000, Lease: "p", Token: 9, Mode: "x", Granted: us(3000), Expiry: us(4000)}, 3000)
			b.release("w0", "p", 3010, "ok")
		}},
		{"worker never finished its probe", RuleLiveness, "", func(b *hb) {
			b.h.probers = map[string]bool{"w0": false}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &hb{}
			tc.build(b)
			r := check(b.h)
			if r.ViolationsByRule[tc.rule] == 0 {
				t.Fatalf("want a %s violation, got:\n%s", tc.rule, rules(r))
			}
			for rule := range r.ViolationsByRule {
				if rule != tc.rule && rule != tc.also {
					t.Errorf("unexpected %s violation:\n%s", rule, rules(r))
				}
			}
		})
	}
}

// TestCheckLossSignal: after a stop that outlived the TTL, the first
// answer given after the stop ended must be a loss signal. Short stops,
// workers that never asked again (killed, or stopped between their last
// answer and the release) and answers stamped before the stop ended are
// not violations.
func TestCheckLossSignal(t *testing.T) {
	b := clean()
	// Asked after resuming: told the lease is lost.
	b.grant("w5", "f", "k2", "x", 1, 0, 500)
	b.h.stops = append(b.h.stops, stopFault{Worker: "w5", Start: ns(100), End: ns(900)})
	b.ev(event{Ev: evWriteLost, Worker: "w5", Lease: "f"}, 950)
	b.release("w5", "f", 960, "not_held")
	// A stop shorter than the TTL.
	b.grant("w6", "g", "k3", "x", 1, 0, 500)
	b.h.stops = append(b.h.stops, stopFault{Worker: "w6", Start: ns(100), End: ns(300)})
	b.ev(event{Ev: evHeld, Worker: "w6", Lease: "g", Key: "k3"}, 320)
	b.release("w6", "g", 350, "ok")
	// Nothing logged after the stop (killed during it).
	b.grant("w7", "h", "k4", "x", 1, 0, 500)
	b.h.stops = append(b.h.stops, stopFault{Worker: "w7", Start: ns(100), End: ns(900)})
	// Killed after resuming, having logged only a renewal sent before the
	// stop: it never asked.
	b.grant("w8", "i", "k5", "x", 1, 0, 500)
	b.h.stops = append(b.h.stops, stopFault{Worker: "w8", Start: ns(100), End: ns(900)})
	b.ev(event{Ev: evRenewed, Worker: "w8", Lease: "i", Key: "k5"}, 905)
	// Answered "held" just before the stop took effect (stamped after the
	// driver stamped the stop's start), then released after resuming
	// without asking again.
	b.grant("w9", "j", "k6", "x", 1, 0, 500)
	b.h.stops = append(b.h.stops, stopFault{Worker: "w9", Start: ns(100), End: ns(900)})
	b.ev(event{Ev: evHeld, Worker: "w9", Lease: "j", Key: "k6"}, 101)
	b.release("w9", "j", 901, "ok")
	// A write whose fence ran before the stop committed after it, then
	// the worker asked.
	b.grant("w10", "m", "k7", "x", 1, 0, 500)
	b.h.stops = append(b.h.stops, stopFault{Worker: "w10", Start: ns(100), End: ns(900)})
	b.write("w10", "m", "k7", "x", 1, 1, 100, true)
	b.ev(event{Ev: evWindowEnded, Worker: "w10", Lease: "m", Key: "k7"}, 930)
	b.release("w10", "m", 940, "ok")
	r := check(b.h)
	if r.count() != 0 {
		t.Fatalf("violations:\n%s", rules(r))
	}
	if r.StopsChecked != 2 {
		t.Errorf("stops checked %d, want 2 (w5, w10)", r.StopsChecked)
	}
	// Asked after resuming and told the lease is held: a violation, even
	// when a loss signal follows.
	b.ev(event{Ev: evHeld, Worker: "w8", Lease: "i", Key: "k5"}, 1100)
	b.ev(event{Ev: evLost, Worker: "w8", Lease: "i", Key: "k5"}, 1200)
	if r := check(b.h); r.ViolationsByRule[RuleLoss] != 1 || r.count() != 1 {
		t.Errorf("a worker told its lease was held after a stop that outlived it: want 1 loss-signal violation, got:\n%s", rules(r))
	}
}

// TestCheckKilledHolder: a killed holder's lease is live until its last
// known expiry, also after a renewal was seen.
// TestCheckReentrantAfterAbandonedAcquire: ErrReentrant right after an
// acquire that gave up is not an H8 violation (the engine may still be
// undoing it); after a release it is.
func TestCheckReentrantAfterAbandonedAcquire(t *testing.T) {
	b := &hb{}
	b.grant("w0", "a", "k", "x", 1, 0, 1000)
	b.release("w0", "a", 100, "ok")
	b.ev(event{Ev: evAcquireErr, Worker: "w0", Key: "k", Mode: "x", Class: "context"}, 200)
	b.ev(event{Ev: evAcquireErr, Worker: "w0", Key: "k", Mode: "x", Class: "reentrant"}, 300)
	if r := check(b.h); r.count() != 0 {
		t.Fatalf("violations:\n%s", rules(r))
	}
}

// TestCheckDeadlineStopped: an acquire that overran while its worker was
// stopped is not an H9 violation.
func TestCheckDeadlineStopped(t *testing.T) {
	b := &hb{}
	b.ev(event{Ev: evAcquireErr, Worker: "w0", Key: "k", Mode: "x", Class: "locked", WaitMS: 6000}, 10000)
	b.h.stops = append(b.h.stops, stopFault{Worker: "w0", Start: ns(5000), End: ns(8000)})
	if r := check(b.h); r.count() != 0 {
		t.Fatalf("violations:\n%s", rules(r))
	}
}

func TestCheckKilledHolder(t *testing.T) {
	b := &hb{}
	b.grant("w0", "a", "k", "x", 1, 0, 1000)
	b.ev(event{Ev: evRenewed, Worker: "w0", Lease: "a", Expiry: us(1600)}, 600)
	b.grant("w1", "b", "k", "x", 2, 1300, 1000)
	r := check(b.h)
	if r.ViolationsByRule[RuleS1] != 1 {
		t.Fatalf("want one S1 violation (granted at 1300 under an expiry renewed to 1600), got:\n%s", rules(r))
	}
	b = &hb{}
	b.grant("w0", "a", "k", "x", 1, 0, 1000)
	b.ev(event{Ev: evRenewed, Worker: "w0", Lease: "a", Expiry: us(1600)}, 600)
	b.grant("w1", "b", "k", "x", 2, 1600, 1000)
	if r := check(b.h); r.count() != 0 {
		t.Fatalf("granted at the expiry: violations:\n%s", rules(r))
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []Config{
		{Dialect: "oracle"},
		{Dialect: "sqlite", Duration: time.Second},
		{Dialect: "sqlite", Workers: 1},
		{Dialect: "sqlite", Faults: []string{"flood"}},
		{Dialect: "sqlite", Broken: "sometimes"},
		{Dialect: "postgres", PromoteMode: "semisync"},
	} {
		err := c.fill()
		if err == nil || !strings.Contains(err.Error(), "allowed") {
			t.Errorf("%+v: want an invalid-config error naming what is allowed, got %v", c, err)
		}
	}
}

func TestHostPort(t *testing.T) {
	for dsn, want := range map[string]string{
		"postgres://root@127.0.0.1:5432/test?sslmode=disable": "127.0.0.1:5432",
		"postgresql://u:p@localhost/db":                       "localhost:5432",
	} {
		if got, err := hostPort(dsn); err != nil || got != want {
			t.Errorf("hostPort(%q) = %q, %v; want %q", dsn, got, err, want)
		}
	}
	for _, dsn := range []string{"postgres://root@db.example.com:5432/test", "host=127.0.0.1 user=root"} {
		if _, err := hostPort(dsn); err == nil {
			t.Errorf("hostPort(%q): want an error (only 127.0.0.1 URLs)", dsn)
		}
	}
}

// promoted is a history with one promotion of an asynchronous standby:
// caught up at 1000 ms, replication cut at 1100, primary killed at 1500,
// the proxy switched to the promoted standby at 1600. On key k, lease c
// is granted by the old primary after the cut (lost), writes once
// (acknowledged, lost) and its holder trusts it until 1800; lease d is
// granted by the new primary at 1700 with token dToken and writes at
// 1750 (the new primary's counter goes back to 3).
func promoted(dToken int64) *hb {
	b := &hb{}
	b.h.promotions = []promotion{{SyncedNS: ns(1000), CutNS: ns(1100), KillNS: ns(1500), SwitchNS: ns(1600)}}
	b.grant("w0", "a", "k", "x", 10, 0, 1000)
	b.write("w0", "a", "k", "x", 10, 1, 100, true)
	b.release("w0", "a", 200, "ok")
	b.grant("w1", "b", "k", "x", 11, 300, 2000)
	b.write("w1", "b", "k", "x", 11, 2, 400, true)
	b.release("w1", "b", 900, "ok")
	b.grant("w2", "c", "k", "x", 12, 1200, 2000)
	b.write("w2", "c", "k", "x", 12, 3, 1250, true)
	b.h.ledger = b.h.ledger[:len(b.h.ledger)-1] // lost with the promotion
	b.ev(event{Ev: evLost, Worker: "w2", Lease: "c", Key: "k"}, 1800)
	b.grant("w3", "d", "k", "x", dToken, 1700, 1000)
	b.write("w3", "d", "k", "x", dToken, 3, 1750, true)
	b.release("w3", "d", 1900, "ok")
	return b
}

// TestCheckPromotion: across a promotion, a lost grant overlapping a new
// one is counted, not S1; a lost acknowledged write is counted, not an
// acked-write violation; with tokens above every earlier one nothing is
// reported.
func TestCheckPromotion(t *testing.T) {
	r := check(promoted(13).h)
	if r.count() != 0 {
		t.Fatalf("violations in a legal promotion:\n%s", rules(r))
	}
	if r.GrantsLost != 1 || r.AckedLost != 1 || r.TokensCompared != 1 || r.Overlaps != 1 || r.LongestOverlap != 100*time.Millisecond {
		t.Errorf("grants lost %d (want 1), acked lost %d (want 1), tokens compared %d (want 1), overlaps %d (want 1), longest %v (want 100ms)",
			r.GrantsLost, r.AckedLost, r.TokensCompared, r.Overlaps, r.LongestOverlap)
	}
	if r.ClockTokens {
		t.Errorf("token 13 granted at %d µs taken for a clock token", us(1700))
	}
	if r := check(promoted(us(1700)).h); r.count() != 0 || !r.ClockTokens {
		t.Errorf("clock token after the promotion: ClockTokens %v, violations:\n%s", r.ClockTokens, rules(r))
	}
}

// TestCheckPromotionCatches: tokens that go back across a promotion are
// S7 (not S3), and writes fenced by them after the lost writes with
// greater tokens are F1; a conflicting grant while the promoted standby
// had a lease's row live is S1; an acknowledged write from before the
// standby caught up must survive.
func TestCheckPromotionCatches(t *testing.T) {
	b := promoted(11)
	r := check(b.h)
	if r.ViolationsByRule[RuleS7] != 1 || r.ViolationsByRule[RuleFenced] != 2 || r.count() != 3 {
		t.Errorf("token 11 after the promotion, 12 lost before it: want 1 S7 and 2 F1, got:\n%s", rules(r))
	}
	b = promoted(13)
	// e: granted before the standby caught up, its holder killed: the new
	// primary must not grant f before e's expiry (2500).
	b.grant("w4", "e", "k2", "x", 20, 500, 2000)
	b.grant("w5", "f", "k2", "s", 21, 1700, 1000)
	// g: acknowledged at 801, before the standby caught up, and missing.
	b.grant("w4", "g", "k3", "x", 30, 700, 1000)
	b.write("w4", "g", "k3", "x", 30, 1, 800, true)
	b.h.ledger = b.h.ledger[:len(b.h.ledger)-1]
	b.release("w4", "g", 900, "ok")
	r = check(b.h)
	if r.ViolationsByRule[RuleS1] != 1 || r.ViolationsByRule[RuleAcked] != 1 || r.count() != 2 {
		t.Errorf("want 1 S1 (f while the standby had e) and 1 acked-write (g), got:\n%s", rules(r))
	}
}

// TestCheckPromotionModes: in the pause and sync modes of the promote
// fault an overlap across the promotion is an S1 violation; in the sync
// mode so are a lost acknowledged write and a lease live at the kill that
// the promoted standby does not have (RuleLostGrant), which the async mode
// only counts.
func TestCheckPromotionModes(t *testing.T) {
	withMode := func(mode string) *hb {
		b := promoted(13)
		b.h.promotions[0].Mode = mode
		b.h.promotions[0].Snapshot, b.h.promotions[0].Survivors = true, map[string]bool{}
		return b
	}
	r := check(withMode(PromoteAsync).h)
	if r.count() != 0 || r.Overlaps != 1 || r.S1Across != 0 || r.LiveChecked != 1 || r.LiveLost != 1 {
		t.Errorf("async: want 1 overlap and 1 live lease lost (c), no violation; got overlaps %d, S1 across %d, live lost %d of %d, violations:\n%s",
			r.Overlaps, r.S1Across, r.LiveLost, r.LiveChecked, rules(r))
	}
	r = check(withMode(PromotePause).h)
	if r.ViolationsByRule[RuleS1] != 1 || r.count() != 1 || r.S1Across != 1 || r.Overlaps != 1 {
		t.Errorf("pause: want the overlap of c and d as 1 S1 violation; got overlaps %d, S1 across %d, violations:\n%s", r.Overlaps, r.S1Across, rules(r))
	}
	// With d granted after c's holder stopped trusting it (1800), nothing.
	b := withMode(PromotePause)
	for i := range b.h.events {
		if e := &b.h.events[i]; e.Lease == "d" && e.Ev == evGrant {
			e.Granted, e.Expiry = us(1850), us(2850)
		}
	}
	for i := range b.h.ledger {
		if w := &b.h.ledger[i]; w.Lease == "d" {
			w.AtUS = us(1860)
		}
	}
	if r := check(b.h); r.count() != 0 || r.Overlaps != 0 {
		t.Errorf("pause, d granted after c ended: want nothing; got overlaps %d, violations:\n%s", r.Overlaps, rules(r))
	}
	r = check(withMode(PromoteSync).h)
	if r.ViolationsByRule[RuleS1] != 1 || r.ViolationsByRule[RuleAcked] != 1 || r.ViolationsByRule[RuleLostGrant] != 1 || r.count() != 3 || r.AckedLost != 1 {
		t.Errorf("sync: want 1 S1 (d while the standby had c), 1 acked-write (c's write), 1 lost-grant (c); got acked lost %d, violations:\n%s", r.AckedLost, rules(r))
	}
	b = withMode(PromoteSync)
	b.h.promotions[0].Survivors["c"] = true
	if r := check(b.h); r.ViolationsByRule[RuleLostGrant] != 0 || r.LiveChecked != 1 || r.LiveLost != 0 {
		t.Errorf("sync, c on the promoted standby: want no lost-grant; got live lost %d of %d, violations:\n%s", r.LiveLost, r.LiveChecked, rules(r))
	}
}
