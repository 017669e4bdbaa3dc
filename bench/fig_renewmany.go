package main

import (
	"context"
	"os"
	"runtime/pprof"
	"strings"
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
