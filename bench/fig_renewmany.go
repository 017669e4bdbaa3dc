package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"syscall"
	"time"
)

// figRenewMany is the batch-renewal figure (figBatchRenewal) with
// --renew-leases leases (default 100,000) held by one Locker with TTL
// --renew-ttl (default lock.DefaultTTL, 30 s): statements and CPU per
// renewal interval at scale. Its figures are named renewmany.* instead of
// batchrenew.*.
func figRenewMany(ctx context.Context, e *env) ([]Figure, error) {
	big := *e
	big.cfg.batchLeases, big.cfg.batchTTL = e.cfg.scale.renewLeases, e.cfg.scale.renewTTL
	figs, err := figBatchRenewal(ctx, &big)
	for i := range figs {
		figs[i].Name = "renewmany." + strings.TrimPrefix(figs[i].Name, "batchrenew.")
	}
	return figs, err
}

// processCPU returns the user and system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// startCPUProfile starts a pprof CPU profile into path and returns the
// function that stops it and closes the file.
func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}

// warnLog collects the warnings a Locker logs that its renewals cannot
// keep up with the leases it holds.
type warnLog struct {
	mu    sync.Mutex
	lines []string
}

// logger returns a logger that keeps those warnings and drops the rest.
func (w *warnLog) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func (w *warnLog) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("cannot keep up")) {
		w.mu.Lock()
		w.lines = append(w.lines, strings.TrimSpace(string(p)))
		w.mu.Unlock()
	}
	return len(p), nil
}

func (w *warnLog) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.lines)
}

func (w *warnLog) first() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.lines) == 0 {
		return "none"
	}
	return w.lines[0]
}
