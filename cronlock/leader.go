package cronlock

import (
	"context"
	"errors"

	"github.com/robfig/cron/v3"

	"github.com/sqlease/sqlease/internal/schedjob"
	"github.com/sqlease/sqlease/lock"
)

// Leader campaigns for leadership of a key (lock.Locker.Lead) in the
// background; its Wrap runs cron jobs only while this process leads.
type Leader struct {
	key      string
	cfg      config
	campaign *schedjob.Campaign
}

// LeaderOnly starts campaigning for key through l and returns the Leader;
// pass its Wrap to cron.WithChain (or cron.NewChain) and call Stop when the
// Cron stops. A crashed leader is replaced within about one TTL (SPEC W2).
//
// While another replica leads, wrapped jobs are skipped (logged at DEBUG).
// A Job runs with a context that carries the leader lease (lock.LeaseFrom)
// and ends with cause lock.ErrLeaseLost when leadership is lost (SPEC H3).
// Errors that end the campaign (bad key or acquire option, ErrClosed,
// schema not migrated) are logged at ERROR, and every later run is
// skipped. WithAcquireOptions applies to each campaign's acquire
// (lock.LeadAcquireOptions): lock.HoldAtMost(d) makes the leader step
// down at most d after it was elected, ending a running job's context
// with lock.ErrLeaseLost, and campaign again (SPEC H10).
func LeaderOnly(l *lock.Locker, key string, opts ...Option) *Leader {
	c := newConfig(opts)
	return &Leader{key: key, cfg: c, campaign: schedjob.StartCampaign(l, key, c.logger, c.acquire...)}
}

// Leading reports whether this process leads now.
func (ld *Leader) Leading() bool { return ld.campaign.Lease() != nil }

// Wrap is a cron.JobWrapper: the job it returns runs j when this process
// leads and skips it otherwise.
func (ld *Leader) Wrap(j cron.Job) cron.Job {
	return cron.FuncJob(func() {
		lease := ld.campaign.Lease()
		if lease == nil {
			ld.cfg.logger.Debug("cronlock: job skipped: this process does not lead", "key", ld.key)
			return
		}
		err := run(lease.Context(), lease, j)
		if cause := context.Cause(lease.Context()); err == nil && errors.Is(cause, lock.ErrLeaseLost) {
			err = cause
		}
		logResult(ld.cfg.logger, ld.key, err)
	})
}

// Stop ends the campaign and releases leadership if held. Call it after
// the Cron's Stop has let running jobs finish.
func (ld *Leader) Stop() { ld.campaign.Stop() }
