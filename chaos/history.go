package chaos

import (
	"context"
	"fmt"
	"path/filepath"
	"time"
)

// check reads the run's history (worker logs, ledger, stops) and fills the
// report.
func (d *driver) check(ctx context.Context) error {
	q, err := newLedgerSQL(d.cfg.Dialect, d.spec.Schema)
	if err != nil {
		return err
	}
	var rows []ledgerRow
	// The server may still be coming back from a restart.
	for attempt := 0; ; attempt++ {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		rows, err = q.readLedger(rctx, d.adminDB())
		cancel()
		if err == nil || attempt == 10 {
			break
		}
		time.Sleep(time.Second)
	}
	if err != nil {
		return fmt.Errorf("chaos: read ledger: %w", err)
	}
	d.mu.Lock()
	h := history{ledger: rows, stops: d.stops, probers: d.probers, keys: d.spec.Keys, lockers: d.cfg.Lockers, promotions: d.promotions}
	d.mu.Unlock()
	for i := 0; i < d.cfg.Workers; i++ {
		evs, bad, err := readEvents(filepath.Join(d.dir, workerName(i)+".jsonl"))
		if err != nil {
			return err
		}
		if bad > 0 {
			d.problem("%s: %d unreadable log lines", workerName(i), bad)
		}
		h.events = append(h.events, evs...)
	}
	for _, e := range h.events {
		switch {
		case e.Ev == evAcquireErr:
			d.report.AcquireErrors[e.Class]++
		case e.Ev == evReleased && e.Class != "ok":
			d.report.ReleaseErrors[e.Class]++
		}
	}
	res := check(h)
	r := d.report
	r.Grants, r.Writes, r.Acked, r.StopsChecked, r.Probes = res.Grants, res.Writes, res.Acked, res.StopsChecked, res.Probes
	r.Violations, r.ViolationsByRule, r.Stuck = res.Violations, res.ViolationsByRule, res.Stuck
	if r.ViolationsByRule == nil {
		r.ViolationsByRule = map[string]int{}
	}
	if len(h.promotions) > 0 {
		p := h.promotions[0]
		at := func(ns int64) time.Time {
			if ns == 0 {
				return time.Time{}
			}
			return time.Unix(0, ns)
		}
		r.Promotion = &PromotionReport{Mode: p.Mode, S1: res.S1Across, LiveChecked: res.LiveChecked, LiveLost: res.LiveLost, PauseRefusals: res.PauseRefusals,
			Synced: at(p.SyncedNS), Cut: at(p.CutNS), Killed: at(p.KillNS), Switched: at(p.SwitchNS),
			GrantsLost: res.GrantsLost, AckedLost: res.AckedLost, TokensCompared: res.TokensCompared, S7: r.ViolationsByRule[RuleS7],
			Refused: res.RefusedAcross, Overlaps: res.Overlaps, LongestOverlap: res.LongestOverlap, ClockTokens: res.ClockTokens}
	}
	return nil
}
