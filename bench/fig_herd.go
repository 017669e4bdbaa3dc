package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/mysqldialect"
	"github.com/sqlease/sqlease/dialect/pgdialect"
	"github.com/sqlease/sqlease/lock"
)

// The herd figure: herdProcs child processes with herdPerProc waiters each
// (one Locker per waiter, one counting pool per process) queue on one key
// the parent holds. The parent resets the children's statement counters
// and releases; each waiter, once granted, holds for herdHold and
// releases, until all have had the key. Every statement the children send
// after the reset (acquire attempts, marker and watch refreshes, fallback
// polls, their own releases) is counted and divided by the number of
// releases (the parent's and every waiter's). Target: < 5 statements per
// release on PostgreSQL, where releases notify the other processes (a
// herd would be about 50). Child protocol (stdin/stdout):
//
//	child:  ready                     (Lockers built)
//	parent: go <key>                  (waiters start acquiring)
//	child:  queued                    (every waiter made its first attempt)
//	parent: reset                     (zero the counters)
//	child:  done <stmts> <attempts> <grants> <errors>

const (
	herdProcs   = 5
	herdPerProc = 10
	herdHold    = 5 * time.Millisecond
)

// herdChildMain is a herd child process.
func herdChildMain() int {
	ctx := context.Background()
	e, db, inj, err := childCountingDB()
	if err != nil {
		fmt.Fprintln(os.Stderr, "herd child:", err)
		return 1
	}
	defer db.Close()
	db.SetMaxIdleConns(herdPerProc + 2)
	lockers := make([]*lock.Locker, herdPerProc)
	for i := range lockers {
		if lockers[i], err = e.newLocker(ctx, db); err != nil {
			fmt.Fprintln(os.Stderr, "herd child:", err)
			return 1
		}
		defer closeLocker(lockers[i])
	}
	attemptMark := herdAttemptMark(e.d)
	fmt.Println("ready")
	sc := bufio.NewScanner(os.Stdin)
	if !sc.Scan() {
		return 1
	}
	cmd, key, _ := strings.Cut(sc.Text(), " ")
	if cmd != "go" {
		return 1
	}
	t := acquireAll(ctx, "herd child", lockers, key, 2*time.Minute, herdHold, nil)
	// Every waiter has made its first attempt once this many acquire
	// attempts were counted.
	for inj.Count(attemptMark) < herdPerProc {
		time.Sleep(5 * time.Millisecond)
	}
	fmt.Println("queued")
	if !sc.Scan() || sc.Text() != "reset" {
		return 1
	}
	inj.ResetCounts()
	t.wg.Wait()
	fmt.Printf("done %d %d %d %d\n", inj.Count(""), inj.Count(attemptMark), t.grants, t.errs)
	return 0
}

// figHerd runs the herd and reports statements per release.
func figHerd(ctx context.Context, e *env) ([]Figure, error) {
	const key = "bench/herd"
	holder, err := e.newLocker(ctx, e.db)
	if err != nil {
		return nil, err
	}
	defer closeLocker(holder)
	held, err := holder.TryAcquire(ctx, key, lock.Exclusive)
	if err != nil {
		return nil, err
	}
	defer held.Release(ctx)
	var children []*child
	defer func() {
		for _, c := range children {
			c.stop()
		}
	}()
	for i := 0; i < herdProcs; i++ {
		c, err := startChildMode(ctx, e, "herd")
		if err != nil {
			return nil, err
		}
		children = append(children, c)
	}
	for _, c := range children {
		if err := c.send("go " + key); err != nil {
			return nil, err
		}
	}
	for _, c := range children {
		if line, err := c.recv(60 * time.Second); err != nil || line != "queued" {
			return nil, fmt.Errorf("herd child: %q %v", line, err)
		}
	}
	time.Sleep(300 * time.Millisecond) // let the waiters' backoff settle
	for _, c := range children {
		if err := c.send("reset"); err != nil {
			return nil, err
		}
	}
	start := time.Now()
	if err := held.Release(ctx); err != nil {
		return nil, err
	}
	var stmts, attempts, grants, errs int
	for _, c := range children {
		line, err := c.recv(3 * time.Minute)
		if err != nil {
			return nil, err
		}
		f := strings.Fields(line)
		if len(f) != 5 || f[0] != "done" {
			return nil, fmt.Errorf("herd child: %q", line)
		}
		n := make([]int, 4)
		for i := range n {
			if n[i], err = strconv.Atoi(f[i+1]); err != nil {
				return nil, fmt.Errorf("herd child: %q", line)
			}
		}
		stmts, attempts, grants, errs = stmts+n[0], attempts+n[1], grants+n[2], errs+n[3]
	}
	took := time.Since(start)
	if errs > 0 {
		return nil, fmt.Errorf("herd: %d waiters failed", errs)
	}
	releases := float64(grants + 1)
	t := info
	if e.isPG() {
		t = below(5, "stmts/release")
	}
	f := figure("herd.stmts_per_release", e.dialect, float64(stmts)/releases, "stmts/release", nil, t)
	f.Note = fmt.Sprintf("%d waiters in %d processes, each holding %s: %d statements from the waiters' processes (attempts, refreshes, polls, their releases) for %d releases in %s",
		herdProcs*herdPerProc, herdProcs, herdHold, stmts, grants+1, took.Round(time.Millisecond))
	a := figure("herd.attempts_per_release", e.dialect, float64(attempts)/releases, "attempts/release", nil, info)
	a.Note = "acquire attempts per release (PostgreSQL: function calls; SQLite: Probe reads); 1 is a perfect handoff"
	return []Figure{f, a}, nil
}

// herdAttemptMark is text that only an acquire attempt's statement sent to
// d contains, so the children can count their waiters' attempts: the
// acquire function's or procedure's name on PostgreSQL and MySQL; on SQLite the start of the Probe
// read, which every attempt but an uncontended first one (the Grant
// statement alone) starts with. TestHerdAttemptMark checks it against the
// dialects' statements.
func herdAttemptMark(d dialect.Dialect) string {
	if d.Name() == pgdialect.Name || d.Name() == mysqldialect.Name {
		return "sqlease_acquire"
	}
	return "SELECT 0 AS granted"
}
