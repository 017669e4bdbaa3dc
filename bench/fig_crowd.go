package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sqlease/sqlease/lock"
)

// The crowd figure: N exclusive waiters on one key, spread over
// --crowd-procs child processes (one Locker per waiter, one counting pool
// of crowdConns connections per process, as many Lockers of a replica
// share its pool). The parent holds the key while the waiters queue, then
// for the hold counts their statements; then it releases and every waiter,
// once granted, releases at once, until all have had the key. Child
// protocol (stdin/stdout):
//
//	child:  ready
//	parent: go <key> <waiters>
//	child:  queued <rss before, KiB> <rss after, KiB>   (every waiter made its first attempt)
//	parent: reset        child: reset                   (counters zeroed)
//	parent: count        child: count <statements>
//	child:  ev <unix ns>          (one per grant: granted, and Release called)
//	child:  done <grants> <errors>

// crowdConns bounds each crowd process's pool: the shared server has 100
// connections for every user of the machine.
const crowdConns = 6

// crowdChildMain is a crowd child process.
func crowdChildMain() int {
	ctx := context.Background()
	e, db, inj, err := childCountingDB()
	if err != nil {
		fmt.Fprintln(os.Stderr, "crowd child:", err)
		return 1
	}
	defer db.Close()
	db.SetMaxOpenConns(crowdConns)
	db.SetMaxIdleConns(crowdConns)
	if err := db.PingContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "crowd child:", err)
		return 1
	}
	var out sync.Mutex
	say := func(format string, args ...any) {
		out.Lock()
		defer out.Unlock()
		fmt.Printf(format+"\n", args...)
	}
	say("ready")
	sc := bufio.NewScanner(os.Stdin)
	var key string
	var n int
	if !sc.Scan() {
		return 1
	}
	if _, err := fmt.Sscanf(sc.Text(), "go %s %d", &key, &n); err != nil {
		fmt.Fprintln(os.Stderr, "crowd child: bad command:", sc.Text())
		return 1
	}
	rss0 := rssKiB()
	lockers := make([]*lock.Locker, n)
	for i := range lockers {
		if lockers[i], err = e.newLocker(ctx, db); err != nil {
			fmt.Fprintln(os.Stderr, "crowd child:", err)
			return 1
		}
		defer closeLocker(lockers[i])
	}
	t := acquireAll(ctx, "crowd child", lockers, key, 10*time.Minute, 0, func(at int64) { say("ev %d", at) })
	for mark := herdAttemptMark(e.d); inj.Count(mark) < n; {
		time.Sleep(10 * time.Millisecond)
	}
	say("queued %d %d", rss0, rssKiB())
	for sc.Scan() {
		switch sc.Text() {
		case "reset":
			inj.ResetCounts()
			say("reset")
		case "count":
			say("count %d", inj.Count(""))
		}
		if sc.Text() == "count" {
			break
		}
	}
	t.wg.Wait()
	say("done %d %d", t.grants, t.errs)
	return 0
}

// rssKiB returns this process's resident set size (VmRSS) in KiB, or 0.
func rssKiB() int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return n
		}
	}
	return 0
}

// figCrowd runs the crowd once per --crowd-waiters count.
func figCrowd(ctx context.Context, e *env) ([]Figure, error) {
	var out []Figure
	var xs, loads, p50s, mems []float64
	for _, n := range e.cfg.scale.crowdWaiters {
		r, err := runCrowd(ctx, e, n)
		if err != nil {
			return nil, fmt.Errorf("%d waiters: %w", n, err)
		}
		name := "crowd." + strconv.Itoa(n)
		note := fmt.Sprintf("%d waiters in %d processes; %d statements in %.1fs of hold; %d grants (%d errors) in %.1fs after the release",
			n, r.procs, r.stmts, r.hold.Seconds(), len(r.handoffs), r.errs, r.drain.Seconds())
		load := figure(name+".waiter_load", e.dialect, float64(r.stmts)/float64(n)/r.hold.Seconds(), "stmts/s/waiter", nil, onlyOn("postgres", e.dialect, atMost(1, "stmts/s/waiter")))
		h50 := figure(name+".handoff.p50", e.dialect, ms(percentile(r.handoffs, 50)), "ms", nil, info)
		h99 := figure(name+".handoff.p99", e.dialect, ms(percentile(r.handoffs, 99)), "ms", nil, info)
		mem := figure(name+".rss_per_waiter", e.dialect, r.rssPerWaiter, "bytes", nil, info)
		for _, f := range []*Figure{&load, &h50, &h99, &mem} {
			f.Note = note
		}
		h50.Note = "one waiter's Release call -> the next waiter granted, over every grant of the crowd; " + note
		mem.Note = "client RSS delta of the waiter processes (Lockers built, waiters queued) / waiters; " + note
		out = append(out, load, h50, h99, mem)
		addSamples("crowd.handoff", e.dialect, strconv.Itoa(n)+" waiters", r.handoffs)
		xs, loads, p50s, mems = append(xs, float64(n)), append(loads, load.Value), append(p50s, h50.Value), append(mems, r.rssPerWaiter/1024)
	}
	addCurve("crowd.waiter_load", e.dialect, "waiters", "stmts/s/waiter", true, series2("sqlease", xs, loads))
	addCurve("crowd.rss_per_waiter", e.dialect, "waiters", "KiB/waiter (client RSS)", true, series2("sqlease", xs, mems))
	addCurve("crowd.handoff_p50", e.dialect, "waiters", "handoff p50 ms", true, series2("sqlease", xs, p50s))
	return out, nil
}

// crowdResult is what one crowd run measured.
type crowdResult struct {
	procs, errs  int
	stmts        int
	hold, drain  time.Duration
	handoffs     []time.Duration
	rssPerWaiter float64 // bytes
}

// runCrowd runs n waiters spread over the configured processes.
func runCrowd(ctx context.Context, e *env, n int) (crowdResult, error) {
	key := "bench/crowd/" + strconv.Itoa(n)
	r := crowdResult{procs: min(e.cfg.scale.crowdProcs, n)}
	holder, err := e.newLocker(ctx, e.db)
	if err != nil {
		return r, err
	}
	defer closeLocker(holder)
	le, err := holder.TryAcquire(ctx, key, lock.Exclusive)
	if err != nil {
		return r, err
	}
	released := false
	defer func() {
		if !released {
			_ = le.Release(ctx)
		}
	}()
	var kids []*child
	defer func() {
		for _, c := range kids {
			c.stop()
		}
	}()
	rss := 0
	for p := 0; p < r.procs; p++ {
		c, err := startChildMode(ctx, e, "crowd")
		if err != nil {
			return r, err
		}
		kids = append(kids, c)
		if err := c.send(fmt.Sprintf("go %s %d", key, n/r.procs+btoi(p < n%r.procs))); err != nil {
			return r, err
		}
	}
	for _, c := range kids {
		line, err := c.recv(5 * time.Minute)
		var a, b int
		if _, serr := fmt.Sscanf(line, "queued %d %d", &a, &b); err != nil || serr != nil {
			return r, fmt.Errorf("crowd child not queued: %q %v", line, err)
		}
		rss += b - a
	}
	r.rssPerWaiter = float64(rss) * 1024 / float64(n)
	if err := crowdAll(kids, "reset", nil); err != nil {
		return r, err
	}
	start := time.Now()
	select {
	case <-time.After(e.cfg.waiterHold):
	case <-ctx.Done():
		return r, ctx.Err()
	}
	if err := crowdAll(kids, "count", func(line string) error {
		var s int
		_, err := fmt.Sscanf(line, "count %d", &s)
		r.stmts += s
		return err
	}); err != nil {
		return r, err
	}
	r.hold = time.Since(start)
	t0 := time.Now()
	released = true
	if err := le.Release(ctx); err != nil {
		return r, err
	}
	return r, crowdDrain(kids, t0, &r)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// crowdAll sends cmd to every child and hands each one's answer (its
// first line that starts with cmd) to check.
func crowdAll(kids []*child, cmd string, check func(string) error) error {
	for _, c := range kids {
		if err := c.send(cmd); err != nil {
			return err
		}
		line, err := c.recv(time.Minute)
		for err == nil && !strings.HasPrefix(line, cmd) {
			line, err = c.recv(time.Minute) // a grant's ev line cannot come before the release
		}
		if err != nil {
			return fmt.Errorf("%s: %w", cmd, err)
		}
		if check != nil {
			if err := check(line); err != nil {
				return fmt.Errorf("%s: %q: %w", cmd, line, err)
			}
		}
	}
	return nil
}

// crowdDrain reads every child's grant events until each is done and
// computes the handoffs: from the release call of the holder before (the
// parent's at t0 for the first grant) to each grant, in grant order.
func crowdDrain(kids []*child, t0 time.Time, r *crowdResult) error {
	var evs []int64 // grant times; each waiter calls Release right after
	for _, c := range kids {
		for {
			line, err := c.recv(10 * time.Minute)
			if err != nil {
				return err
			}
			var g, errs int64
			if _, err := fmt.Sscanf(line, "ev %d", &g); err == nil {
				evs = append(evs, g)
				continue
			}
			if _, err := fmt.Sscanf(line, "done %d %d", &g, &errs); err == nil {
				r.errs += int(errs)
				break
			}
		}
	}
	slices.Sort(evs)
	prev := t0.UnixNano()
	for _, g := range evs {
		r.handoffs = append(r.handoffs, time.Duration(g-prev))
		prev = g
	}
	if len(evs) > 0 {
		r.drain = time.Duration(evs[len(evs)-1] - t0.UnixNano())
	}
	if r.errs > 0 {
		return fmt.Errorf("%d waiters failed (see stderr)", r.errs)
	}
	return nil
}
