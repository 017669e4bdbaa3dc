package main

import (
	"context"
	"strings"
	"syscall"
	"time"
)

// figRenewMany is the batch-renewal figure (figBatchRenewal) with
// --renew-leases leases (default 100,000) held by one Locker: statements
// and CPU per renewal interval at scale. Its figures are named
// renewmany.* instead of batchrenew.*.
func figRenewMany(ctx context.Context, e *env) ([]Figure, error) {
	big := *e
	big.cfg.batchLeases = e.cfg.scale.renewLeases
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
