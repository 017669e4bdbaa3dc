package chaos

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Rules the history checker enforces, as they appear in Violation.Rule.
const (
	RuleS1        = "S1"          // two conflicting leases of a key live at once, in database time
	RuleS3        = "S3"          // a token reused, or not increasing in grant order, per key
	RuleFenced    = "F1"          // a fenced write committed with a superseded token
	RuleAcked     = "acked-write" // an acknowledged write is missing from the ledger
	RuleLoss      = "loss-signal" // no loss signal after a stop that outlived the TTL
	RuleLiveness  = "liveness"    // a key not acquired within TTL plus one backoff step after the faults
	RuleForget    = "H8"          // a Locker refused a key it had released (ErrReentrant)
	RuleDeadline  = "H9"          // a blocking acquire overran its WaitTimeout by more than 500 ms (plus a grace), or gave up early on a transient error
	RuleS7        = "S7"          // a token granted after a promotion does not exceed every token granted on its key before it
	RuleLostGrant = "lost-grant"  // a lease live at the kill of a synchronous primary is missing on the promoted standby
)

// deadlineGrace is added to H9's 500 ms for a loaded machine.
const deadlineGrace = time.Second

// Violation is one broken rule found in a run's history.
type Violation struct {
	Rule   string
	Key    string
	Detail string
}

// String formats the violation as "RULE key "KEY": DETAIL".
func (v Violation) String() string { return fmt.Sprintf("%s key %q: %s", v.Rule, v.Key, v.Detail) }

// stopFault is one SIGSTOP of a worker, in local wall time (Unix ns).
type stopFault struct {
	Worker     string
	Start, End int64
}

// history is everything a run recorded.
type history struct {
	events []event
	ledger []ledgerRow
	stops  []stopFault
	// probers are the workers that were asked for a liveness probe, with
	// whether they answered; keys and lockers say what each must probe.
	probers map[string]bool
	keys    []string
	lockers int
	// promotions are the failovers of the run (the promote fault).
	promotions []promotion
}

// epochOf is the number of promotions that switched the workers to a new
// primary before local or database time ns: a grant or a write of epoch 0
// was made by the first primary, of epoch 1 by the first promoted
// standby, and so on (database and local clocks are one machine's).
func (h *history) epochOf(ns int64) int {
	e := 0
	for _, p := range h.promotions {
		if ns >= p.SwitchNS {
			e++
		}
	}
	return e
}

// leaseInfo is what the history says about one grant.
type leaseInfo struct {
	id, key, worker, mode string
	inc                   int
	token                 int64
	ttl                   time.Duration
	grantT                int64 // local ns
	grantUS, expiryUS     int64 // database µs; expiry: latest seen
	grantExpiryUS         int64 // database µs: the expiry the grant returned
	lastWriteUS           int64 // latest ledger row of this lease (or lost acknowledged write)
	ended                 bool  // released, releasing or reported lost
	endT                  int64 // local ns of the first releasing or loss event
	epoch                 int   // promotions before the grant (history.epochOf)
	evs                   []event
}

// heldUntil is when, in database µs, the holder stopped trusting the
// lease at the latest: its first release or loss signal, but not past the
// latest expiry it saw (its trusted window ends before that), and not
// before its last committed fenced write.
func (l *leaseInfo) heldUntil() int64 {
	end := l.expiryUS
	if l.ended && l.endT/1000 < end {
		end = l.endT / 1000
	}
	return max(end, l.lastWriteUS, l.grantUS)
}

// standbyUntil is a lower bound, in database µs, on how long the primary
// promoted at p kept the lease's row live: the latest expiry that was
// acknowledged (granted or renewed) before p.SyncedNS, when every
// acknowledged commit had been replayed on the standby, or renewed by the
// new primary itself (a renewal's expiry is its database time plus the
// TTL, so one from after p.SwitchNS was made there); only its holder
// deletes a row before its expiry, so not past the holder's release. 0
// when nothing is known (granted after SyncedNS and never renewed by the
// new primary, or released on the old primary, which may or may not have
// reached the standby).
func (l *leaseInfo) standbyUntil(p promotion) int64 {
	var until, releasing int64
	synced := p.syncedNS()
	if synced != 0 && l.grantT < synced {
		until = l.grantExpiryUS
	}
	for _, e := range l.evs {
		if e.Ev == evRenewed && ((synced != 0 && e.T < synced) || (e.Expiry-l.ttl.Microseconds())*1000 >= p.SwitchNS) {
			until = max(until, e.Expiry)
		}
		if e.Ev == evReleasing && releasing == 0 {
			releasing = e.T
		}
	}
	switch {
	case releasing == 0:
	case releasing < p.SwitchNS:
		return 0
	default:
		until = min(until, releasing/1000)
	}
	return until
}

// liveUntil is a lower bound, in database µs, on when the lease's row
// stopped being live: a row lives until its expiry unless its holder
// deletes it, and every committed fenced write proves it live.
func (l *leaseInfo) liveUntil() int64 {
	if l.ended {
		return max(l.grantUS, l.lastWriteUS)
	}
	return max(l.expiryUS, l.lastWriteUS)
}

func isLossSignal(e event) bool {
	switch e.Ev {
	case evLost, evWriteLost, evWindowEnded:
		return true
	case evReleased:
		return e.Class == "not_held" || e.Class == "lost"
	}
	return false
}

// checkResult is the checker's verdict and figures.
type checkResult struct {
	Grants, Writes, Acked, StopsChecked, Probes int
	// Across promotions: grants the old primary made after the cut,
	// acknowledged writes lost with the promotion, tokens compared for S7,
	// fenced writes refused after the switch to holders of earlier leases,
	// overlaps of conflicting leases across the promotion (not S1) and the
	// longest; ClockTokens: every later token is at least the database
	// clock in µs at its grant.
	GrantsLost, AckedLost, TokensCompared, RefusedAcross, Overlaps int
	LongestOverlap                                                 time.Duration
	// S1Across counts the S1 violations across a promotion; LiveChecked
	// the leases live at a kill looked up on the promoted standby,
	// LiveLost those it did not have; PauseRefusals the acquires refused
	// for the failover pause.
	S1Across, LiveChecked, LiveLost, PauseRefusals int
	ClockTokens                                    bool
	Violations                                     []Violation
	ViolationsByRule                               map[string]int
	Stuck                                          []string
}

const maxDetails = 25

func (r *checkResult) add(v Violation) {
	if r.ViolationsByRule == nil {
		r.ViolationsByRule = map[string]int{}
	}
	r.ViolationsByRule[v.Rule]++
	if r.ViolationsByRule[v.Rule] <= maxDetails {
		r.Violations = append(r.Violations, v)
	}
}

// count is the total number of violations (details are capped per rule).
func (r *checkResult) count() int {
	n := 0
	for _, c := range r.ViolationsByRule {
		n += c
	}
	return n
}

func conflicts(a, b string) bool { return a == "x" || b == "x" }

// check verifies a run's history: S1, S3, fenced writes, acknowledged
// writes, loss signals after long stops and liveness after the faults.
func check(h history) checkResult {
	var r checkResult
	leases := map[string]*leaseInfo{}
	var order []*leaseInfo
	for _, e := range h.events {
		if (e.Ev == evGrant || (e.Ev == evProbe && e.Lease != "")) && leases[e.Lease] == nil {
			l := &leaseInfo{id: e.Lease, key: e.Key, worker: e.Worker, inc: e.Inc, mode: e.Mode, token: e.Token,
				ttl: time.Duration(e.TTLMS) * time.Millisecond, grantT: e.T, grantUS: e.Granted, expiryUS: e.Expiry, grantExpiryUS: e.Expiry,
				epoch: h.epochOf(e.Granted * 1000)}
			leases[e.Lease] = l
			order = append(order, l)
			continue
		}
		l := leases[e.Lease]
		if e.Lease == "" || l == nil {
			continue
		}
		l.evs = append(l.evs, e)
		switch e.Ev {
		case evRenewed:
			l.expiryUS = max(l.expiryUS, e.Expiry)
		case evReleasing, evReleased, evLost, evWriteLost, evWindowEnded:
			if !l.ended {
				l.ended, l.endT = true, e.T
			}
		}
	}
	r.Grants = len(order)
	r.Writes = len(h.ledger)

	// Acknowledged writes are in the ledger, except, after a promotion,
	// those the old primary acknowledged after the standby was last known
	// to have caught up (asynchronous replication loses them).
	//
	// The fenced-write checks below run over the ledger the last primary
	// has (what survived) plus those lost acknowledged writes: a worker
	// saw them accepted, so a later write with a smaller token is as much
	// a fencing failure as one that survived. Their commit order is the
	// old primary's counter, which the new primary's counter does not
	// continue (it goes back to the last value it replayed): writes are
	// ordered by epoch, then counter. Lost writes nobody saw acknowledged
	// (a worker killed before the answer) are not in the history at all.
	written := map[string]bool{}
	for _, w := range h.ledger {
		written[w.WriteID] = true
	}
	ledger := h.ledger
	for _, e := range h.events {
		if e.Ev != evAck {
			continue
		}
		r.Acked++
		if written[e.WriteID] {
			continue
		}
		if ep := h.epochOf(e.At * 1000); ep < len(h.promotions) {
			if p := h.promotions[ep]; p.Mode == PromoteSync {
				// The commit waited for the standby's flush before it was
				// acknowledged: it may not be lost.
				r.AckedLost++
				ledger = append(ledger, ledgerRow{WriteID: e.WriteID, Key: e.Key, Token: e.Token, Lease: e.Lease, Worker: e.Worker, Mode: e.Mode, N: e.N, AtUS: e.At})
				r.add(Violation{RuleAcked, e.Key, fmt.Sprintf("write %s (token %d, %s) committed at %s was acknowledged by the synchronous primary but is not on the promoted standby",
					e.WriteID, e.Token, e.Worker, fmtUS(e.At))})
				continue
			} else if p.SyncedNS == 0 || e.T >= p.SyncedNS {
				r.AckedLost++
				ledger = append(ledger, ledgerRow{WriteID: e.WriteID, Key: e.Key, Token: e.Token, Lease: e.Lease, Worker: e.Worker, Mode: e.Mode, N: e.N, AtUS: e.At})
				continue
			}
		}
		r.add(Violation{RuleAcked, e.Key, fmt.Sprintf("write %s (token %d, %s) was acknowledged but is not in the ledger", e.WriteID, e.Token, e.Worker)})
	}
	for _, w := range ledger {
		if l := leases[w.Lease]; l != nil {
			l.lastWriteUS = max(l.lastWriteUS, w.AtUS)
		}
	}

	byKey := map[string][]*leaseInfo{}
	for _, l := range order {
		byKey[l.key] = append(byKey[l.key], l)
	}
	for _, ls := range byKey {
		sort.SliceStable(ls, func(i, j int) bool { return ls[i].token < ls[j].token })
	}
	if len(h.promotions) > 0 {
		// Hybrid-clock tokens: at least the database clock in µs at the
		// grant (1 s of slack for the clock reading's place in the
		// statement).
		later := 0
		r.ClockTokens = true
		for _, l := range order {
			if l.epoch > 0 {
				later++
				r.ClockTokens = r.ClockTokens && l.token >= l.grantUS-1_000_000
			}
		}
		r.ClockTokens = r.ClockTokens && later > 0
		for _, e := range h.events {
			if l := leases[e.Lease]; e.Ev == evWriteLost && l != nil && l.epoch < h.epochOf(e.T) {
				r.RefusedAcross++
			}
			if e.Ev == evAcquireErr && e.Pause {
				r.PauseRefusals++
			}
		}
		r.checkLive(h, order)
	}
	for key, all := range byKey {
		// S1 and S3 hold among the grants of one primary; across a
		// promotion, S7 and the overlaps are checked below.
		epochs := map[int][]*leaseInfo{}
		for _, l := range all {
			epochs[l.epoch] = append(epochs[l.epoch], l)
		}
		for _, ls := range epochs {
			r.checkEpoch(key, ls)
		}
		if len(h.promotions) > 0 {
			r.checkPromotions(h, key, all)
		}
	}

	// Fenced writes: no conflicting lease with a greater token may have
	// been granted before a write's database time, and in commit order a
	// write never follows a conflicting write with a greater token.
	ledgerByKey := map[string][]ledgerRow{}
	for _, w := range ledger {
		ledgerByKey[w.Key] = append(ledgerByKey[w.Key], w)
	}
	across := func(a, b int64) string {
		if h.epochOf(a*1000) != h.epochOf(b*1000) {
			return " (across the promotion)"
		}
		return ""
	}
	for key, ws := range ledgerByKey {
		ls := byKey[key] // sorted by token
		sufAll := make([]*leaseInfo, len(ls)+1)
		sufX := make([]*leaseInfo, len(ls)+1)
		for i := len(ls) - 1; i >= 0; i-- {
			sufAll[i], sufX[i] = sufAll[i+1], sufX[i+1]
			if sufAll[i] == nil || ls[i].grantUS < sufAll[i].grantUS {
				sufAll[i] = ls[i]
			}
			if ls[i].mode == "x" && (sufX[i] == nil || ls[i].grantUS < sufX[i].grantUS) {
				sufX[i] = ls[i]
			}
		}
		for _, w := range ws {
			i := sort.Search(len(ls), func(i int) bool { return ls[i].token > w.Token })
			succ := sufX[i]
			if w.Mode == "x" {
				succ = sufAll[i]
			}
			if succ != nil && succ.grantUS < w.AtUS {
				r.add(Violation{RuleFenced, key, fmt.Sprintf("write %s (token %d, %s) committed at %s, after %s lease %s (token %d, %s) was granted at %s%s",
					w.WriteID, w.Token, w.Worker, fmtUS(w.AtUS), succ.mode, succ.id, succ.token, succ.worker, fmtUS(succ.grantUS), across(succ.grantUS, w.AtUS))})
			}
		}
		sort.Slice(ws, func(i, j int) bool {
			if ei, ej := h.epochOf(ws[i].AtUS*1000), h.epochOf(ws[j].AtUS*1000); ei != ej {
				return ei < ej
			}
			return ws[i].N < ws[j].N
		})
		var topAll, topX *ledgerRow
		for i := range ws {
			w := &ws[i]
			prev := topX
			if w.Mode == "x" {
				prev = topAll
			}
			if prev != nil && prev.Token > w.Token {
				r.add(Violation{RuleFenced, key, fmt.Sprintf("write %s (token %d, %s) committed after write %s with token %d (%s)%s",
					w.WriteID, w.Token, w.Worker, prev.WriteID, prev.Token, prev.Worker, across(prev.AtUS, w.AtUS))})
			}
			if topAll == nil || w.Token > topAll.Token {
				topAll = w
			}
			if w.Mode == "x" && (topX == nil || w.Token > topX.Token) {
				topX = w
			}
		}
	}

	// A worker acquires a key only after releasing its previous lease of
	// it, so ErrReentrant right after a release means the Locker did not
	// forget the released key. (After an abandoned acquire the engine may
	// still be undoing it; the liveness probe bounds that.)
	last := map[string]string{} // worker.inc/locker/key → last grant, release or acquire error
	for _, e := range h.events {
		if e.Key == "" || (e.Ev != evGrant && e.Ev != evReleased && e.Ev != evAcquireErr) || e.Phantom {
			continue
		}
		id := fmt.Sprintf("%s.%d/%d/%s", e.Worker, e.Inc, e.Locker, e.Key)
		prev := last[id]
		if e.Ev == evAcquireErr && e.Class == "reentrant" {
			if prev == evReleased || prev == "reentrant" {
				r.add(Violation{RuleForget, e.Key, fmt.Sprintf("%s.%d locker %d: %s acquire refused after a release: %s", e.Worker, e.Inc, e.Locker, e.Mode, e.Err)})
				last[id] = "reentrant"
			}
			continue
		}
		last[id] = e.Ev
	}

	// H9: a blocking acquire returns within its WaitTimeout plus 500 ms,
	// unless its worker was stopped meanwhile.
	stopsOf := map[string][]stopFault{}
	for _, st := range h.stops {
		stopsOf[st.Worker] = append(stopsOf[st.Worker], st)
	}
	// Every database error the faults cause is transient, so a blocking
	// acquire that returns one before its WaitTimeout gave up instead of
	// retrying (H9: connection failures are retryable while waiting).
	bound := acquireWait + 500*time.Millisecond + deadlineGrace
	for _, e := range h.events {
		wait := time.Duration(e.WaitMS) * time.Millisecond
		if e.Ev == evAcquireErr && e.Class == "error" && wait < acquireWait-200*time.Millisecond {
			r.add(Violation{RuleDeadline, e.Key, fmt.Sprintf("%s.%d locker %d: %s acquire with WaitTimeout %v gave up after %dms on a transient error: %s",
				e.Worker, e.Inc, e.Locker, e.Mode, acquireWait, e.WaitMS, e.Err)})
			continue
		}
		if (e.Ev != evAcquireErr && e.Ev != evGrant) || e.Phantom || wait <= bound {
			continue
		}
		from := e.T - e.WaitMS*int64(time.Millisecond)
		stopped := false
		for _, st := range stopsOf[e.Worker] {
			stopped = stopped || (st.Start <= e.T && st.End >= from)
		}
		if !stopped {
			what := "granted"
			if e.Ev == evAcquireErr {
				what = "returned " + e.Class
			}
			r.add(Violation{RuleDeadline, e.Key, fmt.Sprintf("%s.%d locker %d: %s acquire with WaitTimeout %v %s after %dms: %s",
				e.Worker, e.Inc, e.Locker, e.Mode, acquireWait, what, e.WaitMS, e.Err)})
		}
	}

	// A stop that outlived a held lease's TTL is followed by a loss signal
	// for that lease: once resumed, the first time its worker asks (an
	// answer stamped after the stop ended, which the driver stamps before
	// SIGCONT), the answer is a loss signal. A worker that never asked
	// after resuming (killed, during the stop or after it, or stopped
	// between its last answer and the release) has nothing to check.
	for _, s := range h.stops {
		for _, l := range order {
			if l.worker != s.Worker || l.grantT >= s.Start || time.Duration(s.End-s.Start) <= l.ttl {
				continue
			}
			open := true
			var post []event
			for _, e := range l.evs {
				if e.T < s.Start {
					if e.Ev == evReleasing || isLossSignal(e) {
						open = false
					}
					continue
				}
				post = append(post, e)
			}
			if !open {
				continue // ended before the stop
			}
			for _, e := range post {
				if isLossSignal(e) {
					r.StopsChecked++
					break
				}
				if e.Ev == evHeld && e.T > s.End {
					r.StopsChecked++
					r.add(Violation{RuleLoss, l.key, fmt.Sprintf("%s was stopped for %v holding lease %s (token %d, TTL %v); asked %v after resuming, the lease was reported held (%s)",
						s.Worker, time.Duration(s.End-s.Start).Round(time.Millisecond), l.id, l.token, l.ttl, time.Duration(e.T-s.End).Round(time.Millisecond), describe(post, s.End))})
					break
				}
			}
		}
	}

	// Liveness: every prober acquired every key with every Locker.
	probed := map[string]event{}
	for _, e := range h.events {
		if e.Ev == evProbe {
			probed[fmt.Sprintf("%s/%d/%s", e.Worker, e.Locker, e.Key)] = e
			r.Probes++
		}
	}
	var workers []string
	for w := range h.probers {
		workers = append(workers, w)
	}
	sort.Strings(workers)
	for _, w := range workers {
		if !h.probers[w] {
			r.Stuck = append(r.Stuck, fmt.Sprintf("%s: did not finish its liveness probe", w))
			r.add(Violation{RuleLiveness, "", fmt.Sprintf("%s did not finish its liveness probe", w)})
			continue
		}
		for li := 0; li < h.lockers; li++ {
			for _, k := range h.keys {
				e, ok := probed[fmt.Sprintf("%s/%d/%s", w, li, k)]
				var why string
				switch {
				case !ok:
					why = "no probe recorded"
				case !e.OK && e.Class == "ok":
					why = fmt.Sprintf("granted after %dms, beyond the longest TTL plus one backoff step", e.WaitMS)
				case !e.OK:
					why = fmt.Sprintf("%s after %dms: %s", e.Class, e.WaitMS, e.Err)
				default:
					continue
				}
				r.Stuck = append(r.Stuck, fmt.Sprintf("%s locker %d key %q: %s", w, li, k, why))
				r.add(Violation{RuleLiveness, k, fmt.Sprintf("%s locker %d: %s", w, li, why)})
			}
		}
	}
	return r
}

// checkPromotions checks key's leases across the run's promotions (all:
// every lease of key, sorted by token).
//
// S7: every token granted after a promotion exceeds every token granted
// on the key before it, lost grants included.
//
// S1 does not survive an asynchronous promotion: a lease the promoted
// standby never saw (granted, or renewed, after the last commit it
// replayed) still has a holder who trusts it until its next renewal or
// its expiry, and the new primary may grant a conflicting lease
// meanwhile. Such an overlap of a lease from before a promotion with one
// from after it is counted (Overlaps, LongestOverlap: from the later
// grant to when the earlier holder stopped trusting its lease, see
// heldUntil), not reported as S1. It is an S1 violation only when the
// standby is known to have had the earlier lease's row live (standbyUntil:
// granted or renewed before it had caught up, not released) when the
// later lease was granted.
func (r *checkResult) checkPromotions(h history, key string, all []*leaseInfo) {
	n := len(h.promotions)
	for _, l := range all {
		if l.epoch < n {
			if p := h.promotions[l.epoch]; l.grantUS*1000 >= p.CutNS {
				r.GrantsLost++
			}
		}
	}
	var earlier []*leaseInfo // leases of earlier epochs still trusted after a switch
	for e := 1; e <= n; e++ {
		var top *leaseInfo // greatest token before epoch e
		for _, l := range all {
			if l.epoch < e && (top == nil || l.token > top.token) {
				top = l
			}
		}
		for _, b := range all {
			if b.epoch != e || top == nil {
				continue
			}
			r.TokensCompared++
			if b.token <= top.token {
				r.add(Violation{RuleS7, key, fmt.Sprintf("token %d (%s lease %s, %s) granted at %s, after the promotion at %s, does not exceed token %d (%s lease %s, %s) granted before it at %s: tokens went back",
					b.token, b.mode, b.id, b.worker, fmtUS(b.grantUS), fmtUS(h.promotions[e-1].SwitchNS/1000), top.token, top.mode, top.id, top.worker, fmtUS(top.grantUS))})
			}
		}
	}
	for _, l := range all {
		if l.epoch < n {
			sw := h.promotions[l.epoch].SwitchNS / 1000
			if l.heldUntil() > sw || l.standbyUntil(h.promotions[l.epoch]) > sw {
				earlier = append(earlier, l)
			}
		}
	}
	for _, b := range all {
		for _, a := range earlier {
			if a.epoch >= b.epoch || !conflicts(a.mode, b.mode) {
				continue
			}
			if b.epoch == a.epoch+1 {
				if until := a.standbyUntil(h.promotions[a.epoch]); b.grantUS < until {
					r.S1Across++
					r.add(Violation{RuleS1, key, fmt.Sprintf("%s lease %s (token %d, %s) granted at %s by the promoted standby, which had %s lease %s (token %d, %s) live until at least %s",
						b.mode, b.id, b.token, b.worker, fmtUS(b.grantUS), a.mode, a.id, a.token, a.worker, fmtUS(until))})
					continue
				}
			}
			if end := a.heldUntil(); b.grantUS < end {
				r.Overlaps++
				r.LongestOverlap = max(r.LongestOverlap, time.Duration(end-b.grantUS)*time.Microsecond)
				// The pause and sync modes close these overlaps: each
				// one is an S1 violation there.
				if p := h.promotions[b.epoch-1]; p.strict() {
					r.S1Across++
					r.add(Violation{RuleS1, key, fmt.Sprintf("%s lease %s (token %d, %s) granted at %s by the promoted standby (promote mode %s, switched at %s), while %s lease %s (token %d, %s, TTL %v) granted at %s before the promotion was trusted by its holder until %s (%s)",
						b.mode, b.id, b.token, b.worker, fmtUS(b.grantUS), p.Mode, fmtUS(p.SwitchNS/1000), a.mode, a.id, a.token, a.worker, a.ttl, fmtUS(a.grantUS), fmtUS(end), describeUS(a.evs))})
				}
			}
		}
	}
}

// liveMargin is how long before its expiry a lease row may already be
// gone at a kill stamped a moment before the primary actually died (a
// grant of another holder deletes an expired row).
const liveMargin = 200 * time.Millisecond

// checkLive looks up on each promoted standby (its lease rows before any
// worker reached it) every lease live at the kill of the primary before
// it: granted before the kill, neither released nor reported lost before
// it, and whose last expiry acknowledged before the kill is more than
// liveMargin past it (so no other grant could have deleted its row). In
// the sync mode every such lease must be there (RuleLostGrant).
func (r *checkResult) checkLive(h history, order []*leaseInfo) {
	for _, l := range order {
		if l.epoch >= len(h.promotions) {
			continue
		}
		p := h.promotions[l.epoch]
		if !p.Snapshot || l.grantT >= p.KillNS {
			continue
		}
		expiry, ended := l.grantExpiryUS, false
		for _, e := range l.evs {
			if e.T >= p.KillNS {
				break
			}
			switch {
			case e.Ev == evRenewed:
				expiry = max(expiry, e.Expiry)
			case e.Ev == evReleasing || isLossSignal(e):
				ended = true
			}
		}
		if ended || expiry <= (p.KillNS+int64(liveMargin))/1000 {
			continue
		}
		r.LiveChecked++
		if p.Survivors[l.id] {
			continue
		}
		r.LiveLost++
		if p.Mode == PromoteSync {
			r.add(Violation{RuleLostGrant, l.key, fmt.Sprintf("%s lease %s (token %d, %s) granted at %s, live until %s, was not on the standby promoted after the kill of the synchronous primary at %s",
				l.mode, l.id, l.token, l.worker, fmtUS(l.grantUS), fmtUS(expiry), fmtUS(p.KillNS/1000))})
		}
	}
}

// describeUS lists up to eight events of a lease with their database or
// local times, for a violation's detail.
func describeUS(evs []event) string {
	var parts []string
	for i, e := range evs {
		if i == 8 {
			parts = append(parts, fmt.Sprintf("and %d more", len(evs)-i))
			break
		}
		p := e.Ev + " " + fmtUS(e.T/1000)
		if e.Ev == evRenewed {
			p += " expiry " + fmtUS(e.Expiry)
		}
		if e.Class != "" {
			p += " " + e.Class
		}
		parts = append(parts, p)
	}
	return "events: " + strings.Join(parts, ", ")
}

// checkEpoch checks S1 and S3 over the leases of key that one primary
// granted, sorted by token.
func (r *checkResult) checkEpoch(key string, ls []*leaseInfo) {
	// S3: one lease per token.
	for i := 1; i < len(ls); i++ {
		if ls[i].token == ls[i-1].token {
			r.add(Violation{RuleS3, key, fmt.Sprintf("token %d granted twice: lease %s (%s) and lease %s (%s)",
				ls[i].token, ls[i-1].id, ls[i-1].worker, ls[i].id, ls[i].worker)})
		}
	}
	// S1 and S3 order: walking in token order, a lease must be granted
	// after every earlier conflicting lease stopped being live, and
	// not before an earlier conflicting lease was granted.
	var maxAll, maxX *leaseInfo // by liveUntil
	var grantAll, grantX *leaseInfo
	for _, b := range ls {
		prev, prevGrant := maxX, grantX
		if b.mode == "x" {
			prev, prevGrant = maxAll, grantAll
		}
		// (A lease granted before prev is a token-order problem,
		// reported below as S3.)
		if prev != nil && prev.token < b.token && prev.grantUS <= b.grantUS && b.grantUS < prev.liveUntil() {
			r.add(Violation{RuleS1, key, fmt.Sprintf("%s lease %s (token %d, %s) granted at %s while %s lease %s (token %d, %s) was live until at least %s",
				b.mode, b.id, b.token, b.worker, fmtUS(b.grantUS), prev.mode, prev.id, prev.token, prev.worker, fmtUS(prev.liveUntil()))})
		}
		if prevGrant != nil && prevGrant.token < b.token && b.grantUS < prevGrant.grantUS {
			r.add(Violation{RuleS3, key, fmt.Sprintf("token %d (lease %s) granted at %s, before token %d (lease %s) at %s",
				b.token, b.id, fmtUS(b.grantUS), prevGrant.token, prevGrant.id, fmtUS(prevGrant.grantUS))})
		}
		if maxAll == nil || b.liveUntil() > maxAll.liveUntil() {
			maxAll = b
		}
		if grantAll == nil || b.grantUS > grantAll.grantUS {
			grantAll = b
		}
		if b.mode == "x" {
			if maxX == nil || b.liveUntil() > maxX.liveUntil() {
				maxX = b
			}
			if grantX == nil || b.grantUS > grantX.grantUS {
				grantX = b
			}
		}
	}
}

func fmtUS(us int64) string {
	return time.UnixMicro(us).UTC().Format("15:04:05.000000")
}

// describe lists up to six events of a lease with their times relative to
// ref (the end of a stop), for a violation's detail.
func describe(evs []event, ref int64) string {
	var parts []string
	for i, e := range evs {
		if i == 6 {
			parts = append(parts, fmt.Sprintf("and %d more", len(evs)-i))
			break
		}
		p := fmt.Sprintf("%s %+v", e.Ev, time.Duration(e.T-ref).Round(time.Millisecond))
		if e.Class != "" {
			p += " " + e.Class
		}
		parts = append(parts, p)
	}
	return "events after the stop began, relative to its end: " + strings.Join(parts, ", ")
}
