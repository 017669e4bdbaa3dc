package gocronlock

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-co-op/gocron/v2"

	"github.com/sqlease/sqlease/internal/schedjob"
	"github.com/sqlease/sqlease/lock"
)

// ErrNotLeader is IsLeader's error while another replica leads.
var ErrNotLeader = errors.New("gocronlock: this process does not lead")

// Elector is a gocron.Elector: give it to gocron.WithDistributedElector,
// and only the replica that leads its key runs the scheduler's jobs.
type Elector struct {
	key      string
	campaign *schedjob.Campaign
}

var _ gocron.Elector = (*Elector)(nil)

// NewElector starts campaigning for key through l (lock.Locker.Lead) in
// the background and returns the Elector; call Close when the scheduler
// has shut down. A leader that crashes is replaced within about one TTL
// plus one backoff step (SPEC W2). WithAcquireOptions applies to each
// campaign's acquire (lock.LeadAcquireOptions): lock.HoldAtMost(d) makes
// the leader step down at most d after it was elected and campaign again
// (SPEC H10); a bad acquire option ends the campaign (IsLeader returns
// its error). Errors: an error matching lock.ErrInvalidInput for a nil
// l, a bad key, a nil option (also among WithAcquireOptions),
// WithLogger(nil) or a non-empty WithKeyPrefix, which is NewLocker's
// (SPEC I1).
func NewElector(l *lock.Locker, key string, opts ...Option) (*Elector, error) {
	if l == nil {
		return nil, fmt.Errorf("gocronlock: NewElector: nil *lock.Locker: %w", lock.ErrInvalidInput)
	}
	if err := lock.CheckKey(key); err != nil {
		return nil, fmt.Errorf("gocronlock: NewElector: %w", err)
	}
	c, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if c.prefix != "" {
		return nil, fmt.Errorf("gocronlock: NewElector: WithKeyPrefix(%q) applies to NewLocker only; put it in the key instead (%q): %w", clipPrefix(c.prefix), clipPrefix(c.prefix)+key, lock.ErrInvalidInput)
	}
	return &Elector{key: key, campaign: schedjob.StartCampaign(l, key, c.logger, c.acquire...)}, nil
}

// IsLeader returns nil while this process leads (its leader lease is held
// and within its trusted window, SPEC H1), else an error and gocron skips
// the run: ErrNotLeader while campaigning, or the error that ended the
// campaign (lock.ErrClosed, lock.ErrSchemaNotMigrated).
func (e *Elector) IsLeader(context.Context) error {
	if e.campaign.Lease() != nil {
		return nil
	}
	if err := e.campaign.Err(); err != nil {
		return fmt.Errorf("gocronlock: campaign for %q ended: %w", e.key, err)
	}
	return ErrNotLeader
}

// Job returns a gocron task function (for gocron.NewTask) that runs fn
// with the leader lease: fn's context carries it (lock.LeaseFrom) and ends
// when leadership is lost (cause lock.ErrLeaseLost, SPEC H3) or gocron
// ends the job. When this process does not lead, fn does not run and the
// task returns an error matching ErrNoLease and ErrNotLeader.
func (e *Elector) Job(fn func(ctx context.Context, lease *lock.Lease) error) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		lease := e.campaign.Lease()
		if lease == nil {
			return fmt.Errorf("%w: %w", ErrNoLease, ErrNotLeader)
		}
		return runUnder(ctx, lease, fn)
	}
}

// Close ends the campaign and releases leadership if held.
func (e *Elector) Close() { e.campaign.Stop() }
