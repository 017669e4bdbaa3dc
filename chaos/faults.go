package chaos

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/sqlease/sqlease/dialect"
)

// faultWeights is how often each kind is picked, relative to the others.
var faultWeights = map[string]int{FaultKill: 2, FaultStop: 3, FaultTerminate: 2, FaultLatency: 2, FaultCut: 2, FaultRestart: 1}

// restartEvery is the least time between two restarts of the cluster.
const restartEvery = 12 * time.Second

// faults injects faults until the fault phase is over.
func (d *driver) faults(ctx context.Context) {
	var kinds []string
	total := 0
	for _, f := range d.cfg.Faults {
		if _, skip := d.report.Skipped[f]; !skip {
			kinds = append(kinds, f)
			total += faultWeights[f]
		}
	}
	end := time.Now().Add(d.cfg.Duration)
	lastRestart := time.Now().Add(-restartEvery / 2)
	// The promotion is not drawn by weight: it happens once, at 20-40% of
	// the fault phase, so the run goes on for a while on the new primary.
	var promoteAt time.Time
	for i, k := range kinds {
		if k == FaultPromote {
			kinds = append(kinds[:i:i], kinds[i+1:]...)
			promoteAt = time.Now().Add(d.cfg.Duration * time.Duration(20+d.intN(21)) / 100)
			break
		}
	}
	for ctx.Err() == nil && time.Now().Before(end) {
		sleepCtx(ctx, time.Duration(250+d.intN(650))*time.Millisecond)
		if !promoteAt.IsZero() && !time.Now().Before(promoteAt) && d.restart.TryLock() {
			promoteAt = time.Time{}
			d.bg.Add(1)
			go func() {
				defer d.bg.Done()
				defer d.restart.Unlock()
				d.promote()
			}()
		}
		if len(kinds) == 0 || !time.Now().Before(end) {
			continue
		}
		pick := d.intN(total)
		kind := kinds[0]
		for _, k := range kinds {
			if pick < faultWeights[k] {
				kind = k
				break
			}
			pick -= faultWeights[k]
		}
		switch kind {
		case FaultKill:
			d.killOne()
		case FaultStop:
			d.stopOne()
		case FaultTerminate:
			d.terminate(ctx)
		case FaultLatency:
			d.spike()
		case FaultCut:
			if n := d.px.Cut(); n >= 0 {
				d.count(FaultCut)
			}
		case FaultRestart:
			if time.Since(lastRestart) >= restartEvery && d.restart.TryLock() {
				lastRestart = time.Now()
				immediate := d.intN(2) == 0
				d.bg.Add(1)
				go func() {
					defer d.bg.Done()
					defer d.restart.Unlock()
					d.count(FaultRestart)
					rctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
					defer cancel()
					if err := d.cluster.Restart(rctx, immediate); err != nil {
						d.problem("restart: %v (server log: %s)", err, d.cluster.LogPath())
					}
				}()
			}
		}
	}
}

// pickProc returns a random live worker that ok accepts, or nil.
func (d *driver) pickProc(ok func(*proc) bool) *proc {
	d.mu.Lock()
	defer d.mu.Unlock()
	var cands []*proc
	for i := 0; i < d.cfg.Workers; i++ {
		p := d.procs[workerName(i)]
		select {
		case <-p.exited:
			continue
		default:
		}
		if !p.killed && ok(p) {
			cands = append(cands, p)
		}
	}
	if len(cands) == 0 {
		return nil
	}
	return cands[d.intN(len(cands))]
}

// killOne SIGKILLs a worker and restarts it after 100-500 ms.
func (d *driver) killOne() {
	p := d.pickProc(func(*proc) bool { return true })
	if p == nil {
		return
	}
	d.mu.Lock()
	p.killed = true
	d.mu.Unlock()
	if err := p.cmd.Process.Kill(); err != nil {
		d.problem("kill %s: %v", p.name, err)
		return
	}
	d.record(FaultKill, p.name, 0)
	delay := time.Duration(100+d.intN(400)) * time.Millisecond
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		<-p.exited
		select {
		case <-d.faultCh:
			return // run restarts it after the fault phase
		case <-time.After(delay):
		}
		np, err := d.spawn(p.name, p.inc+1)
		if err != nil {
			d.problem("restart %s: %v", p.name, err)
			return
		}
		d.mu.Lock()
		d.procs[p.name] = np
		d.mu.Unlock()
	}()
}

// stopOne SIGSTOPs a worker for a short time (below its shortest TTL) or
// a long one (past its longest TTL, up to twice that), then SIGCONTs it.
func (d *driver) stopOne() {
	p := d.pickProc(func(p *proc) bool { return !p.stopped })
	if p == nil {
		return
	}
	d.mu.Lock()
	ttls := d.ttls[p.name]
	var dur time.Duration
	if d.intN(2) == 0 {
		dur = time.Duration(50+d.int64N(int64(ttls[0]/time.Millisecond)-50)) * time.Millisecond
	} else {
		longest := ttls[len(ttls)-1]
		dur = longest + 200*time.Millisecond + time.Duration(d.int64N(int64(longest)))
	}
	p.stopped = true
	p.stopStart = time.Now().UnixNano()
	d.mu.Unlock()
	if err := stopProcess(p.cmd.Process); err != nil {
		d.problem("stop %s: %v", p.name, err)
		return
	}
	d.record(FaultStop, p.name, dur)
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		t := time.NewTimer(dur)
		defer t.Stop()
		select {
		case <-t.C:
		case <-d.faultCh:
		case <-p.exited:
		}
		// End is stamped before SIGCONT, as Start is before SIGSTOP: an
		// event the worker stamps after End was logged after it resumed.
		end := time.Now().UnixNano()
		_ = contProcess(p.cmd.Process)
		d.mu.Lock()
		st := stopFault{Worker: p.name, Start: p.stopStart, End: end}
		d.stops = append(d.stops, st)
		p.stopped = false
		d.mu.Unlock()
		d.logFault("stop ended", p.name, time.Duration(st.End-st.Start))
	}()
}

// terminate ends the backends of one worker, or of all (one time in
// three), with pg_terminate_backend.
func (d *driver) terminate(ctx context.Context) {
	pattern := "chaosw-%"
	if d.intN(3) != 0 {
		pattern = fmt.Sprintf("chaosw-w%d", d.intN(d.cfg.Workers))
	}
	tctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var n int
	err := d.adminDB().QueryRowContext(tctx, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE $1 AND pid <> pg_backend_pid()) t`, pattern).Scan(&n)
	if err != nil {
		return // the server may be restarting
	}
	d.count(FaultTerminate)
}

// spike makes the proxy delay every chunk by 50-400 ms for 0.5-2.5 s.
func (d *driver) spike() {
	if !d.latency.TryLock() {
		return
	}
	delay := time.Duration(50+d.intN(350)) * time.Millisecond
	length := time.Duration(500+d.intN(2000)) * time.Millisecond
	d.px.SetDelay(delay)
	d.count(FaultLatency)
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		defer d.latency.Unlock()
		select {
		case <-time.After(length):
		case <-d.faultCh:
		}
		d.px.SetDelay(0)
	}()
}

// promotion is one failover to the standby (the promote fault), in local
// wall time (Unix ns; the database's clock too, on this machine): the
// standby had replayed every commit acknowledged before SyncedNS (0 when
// that could not be made sure), replication was cut at CutNS, the primary
// killed at KillNS, and the proxy re-pointed at the promoted standby at
// SwitchNS. Every grant the old primary made has a database time before
// SwitchNS, every grant of the new one after it.
//
// Mode is the promote fault's mode (Config.PromoteMode): in the sync mode
// replication is not cut (CutNS is KillNS) and every commit acknowledged
// before the kill is on the standby. Survivors are the lease IDs the
// promoted standby had before any worker reached it (Snapshot: it could
// be read).
type promotion struct {
	SyncedNS, CutNS, KillNS, SwitchNS int64
	Mode                              string
	Snapshot                          bool
	Survivors                         map[string]bool
}

// strict reports whether overlaps across the promotion are S1 violations
// (the pause and sync modes close them).
func (p promotion) strict() bool { return p.Mode == PromotePause || p.Mode == PromoteSync }

// syncedNS is the instant before which every acknowledged commit is known
// to be on the standby (0: none): in the sync mode the kill (a commit
// waits for the standby's flush before it is acknowledged), else SyncedNS.
func (p promotion) syncedNS() int64 {
	if p.Mode == PromoteSync {
		return p.KillNS
	}
	return p.SyncedNS
}

// promoteGrants is how many grants the old primary makes after the cut
// before it is killed (at least), and promoteWait bounds the wait for
// them.
const (
	promoteGrants = 101
	promoteWait   = 20 * time.Second
)

// promote fails the cluster over to its standby: wait until the standby
// has caught up (so every commit acknowledged before is on it), cut
// replication, let the primary grant more than 100 leases the standby
// never sees (counted in the workers' logs, for at most promoteWait),
// kill the primary, promote the standby, and point the workers' proxy at
// it, cutting their open connections. The caller holds d.restart.
//
// In the sync mode (PromoteSync) replication is not cut: every commit
// waits for the standby, so the primary could not grant anything the
// standby does not have. Once the standby has caught up, the workers go on
// for a moment and the primary is killed while the standby is connected.
func (d *driver) promote() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := promotion{Mode: d.cfg.PromoteMode}
	d.logf("promote: waiting for the standby to catch up")
	synced := time.Now().UnixNano()
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	err := d.standby.WaitCaughtUp(wctx)
	wcancel()
	if err != nil {
		// Then no acknowledged commit is known to be on the standby: the
		// checker counts every missing acknowledged write from before the
		// switch as lost with the promotion.
		d.problem("promote: the standby did not catch up before the cut: %v", err)
	} else {
		p.SyncedNS = synced
	}
	var tail grantTail
	if p.Mode == PromoteSync {
		// Grants go on, each acknowledged only once the standby has it.
		tail = grantTail{dir: d.dir, workers: d.cfg.Workers, since: time.Now().UnixNano(), off: map[string]int64{}}
		time.Sleep(time.Duration(500+d.intN(1000)) * time.Millisecond)
		tail.count()
		d.logf("promote: %d grants logged since the standby caught up; killing the primary while the synchronous standby is connected", tail.n)
		p.KillNS = time.Now().UnixNano()
		p.CutNS = p.KillNS
	} else {
		p.CutNS = time.Now().UnixNano()
		if err := d.standby.CutReplication(); err != nil {
			d.problem("promote: %v", err)
			return
		}
		d.logFault("promote: replication cut", "", 0)
		tail = grantTail{dir: d.dir, workers: d.cfg.Workers, since: p.CutNS, off: map[string]int64{}}
		deadline := time.Now().Add(promoteWait)
		for tail.count() < promoteGrants && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		d.logf("promote: %d grants logged since the cut; killing the primary", tail.n)
		p.KillNS = time.Now().UnixNano()
	}
	d.cluster.Kill()
	d.logFault("promote: primary killed", "", 0)
	if err := d.standby.Promote(ctx); err != nil {
		d.problem("promote: %v (server log: %s)", err, d.standby.LogPath())
		return
	}
	db, err := sql.Open("pgx", d.standby.DSN())
	if err != nil {
		d.problem("promote: %v", err)
		return
	}
	// The leases the new primary has before any worker reaches it: the
	// checker looks up there every lease live at the kill.
	if ids, err := d.leaseIDs(ctx, db); err != nil {
		d.problem("promote: read the promoted standby's leases: %v", err)
	} else {
		p.Snapshot, p.Survivors = true, ids
	}
	// Stamped before the proxy moves: no worker reaches the new primary
	// before SwitchNS, and the old one was dead already.
	p.SwitchNS = time.Now().UnixNano()
	d.px.SetUpstream(d.standby.Addr())
	d.px.Cut()
	d.cluster = d.standby // under d.restart: a later restart restarts the new primary
	d.adminMu.Lock()
	old := d.admin
	d.admin = db
	d.adminMu.Unlock()
	old.Close()
	d.mu.Lock()
	d.promotions = append(d.promotions, p)
	d.mu.Unlock()
	d.record(FaultPromote, "", time.Duration(p.SwitchNS-p.CutNS))
	d.logf("promote: the standby is the primary (%d grants logged since the cut, %v after the kill)", tail.n, time.Duration(p.SwitchNS-p.KillNS).Round(time.Millisecond))
}

// leaseIDs returns the IDs of the lease rows db has in the run's
// namespace.
func (d *driver) leaseIDs(ctx context.Context, db *sql.DB) (map[string]bool, error) {
	dl, _, err := dialectOf(d.cfg.Dialect)
	if err != nil {
		return nil, err
	}
	table := dialect.Namespace{Schema: d.spec.Schema}.Object(dl, "holders")
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rows, err := db.QueryContext(qctx, `SELECT lease_id FROM `+table)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	ids := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids[id] = true
	}
	return ids, rows.Err()
}

// grantTail counts the grants the workers logged that were made at or
// after since (database time), reading only what their logs gained since
// the last count.
type grantTail struct {
	dir     string
	workers int
	since   int64
	off     map[string]int64
	n       int
}

func (g *grantTail) count() int {
	for i := 0; i < g.workers; i++ {
		path := filepath.Join(g.dir, workerName(i)+".jsonl")
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		if _, err := f.Seek(g.off[path], io.SeekStart); err != nil {
			f.Close()
			continue
		}
		r := bufio.NewReader(f)
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				break // a torn last line is read again next time
			}
			g.off[path] += int64(len(line))
			if !bytes.Contains(line, []byte(`"ev":"grant"`)) {
				continue
			}
			var e event
			// By database time, as the checker counts lost grants.
			if json.Unmarshal(line, &e) == nil && e.Granted*1000 >= g.since {
				g.n++
			}
		}
		f.Close()
	}
	return g.n
}
