// Package schedjob holds what the scheduler adapters (cronlock, gocronlock)
// share: a leadership campaign that runs in the background and says who
// leads, and the context a job runs with under a lease.
package schedjob

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/sqlease/sqlease/lock"
)

// Campaign runs lock.Locker.Lead on one key in the background and tells,
// at any moment, whether this process leads and under which lease.
type Campaign struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	lease *lock.Lease
	err   error // Lead's error once it stopped by itself
}

// StartCampaign campaigns for key through l until Stop, each campaign's
// acquire with acquire (lock.LeadAcquireOptions). Lead's own errors (bad
// key or option, ErrClosed, schema not migrated) end the campaign: they
// are logged at error level and returned by Err, as is a nil l.
func StartCampaign(l *lock.Locker, key string, logger *slog.Logger, acquire ...lock.AcquireOption) *Campaign {
	ctx, cancel := context.WithCancel(context.Background())
	c := &Campaign{cancel: cancel, done: make(chan struct{})}
	if l == nil {
		c.err = fmt.Errorf("nil *lock.Locker: %w", lock.ErrInvalidInput)
		logger.Error("sqlease: leader campaign not started", "key", key, "err", c.err)
		close(c.done)
		return c
	}
	go func() {
		defer close(c.done)
		err := l.Lead(ctx, key, func(ctx context.Context, lease *lock.Lease) error {
			c.set(lease)
			defer c.set(nil)
			<-ctx.Done()
			return context.Cause(ctx)
		}, lock.LeadAcquireOptions(acquire...))
		if ctx.Err() == nil {
			logger.Error("sqlease: leader campaign stopped", "key", key, "err", err)
			c.mu.Lock()
			c.err = err
			c.mu.Unlock()
		}
	}()
	return c
}

func (c *Campaign) set(lease *lock.Lease) {
	c.mu.Lock()
	c.lease = lease
	c.mu.Unlock()
}

// Lease returns the leader lease while this process leads and the lease
// is neither lost nor past its trusted window (SPEC H1), else nil.
func (c *Campaign) Lease() *lock.Lease {
	c.mu.Lock()
	lease := c.lease
	c.mu.Unlock()
	if lease == nil || lease.Err() != nil {
		return nil
	}
	return lease
}

// Err returns the error that ended the campaign by itself, or nil while it
// runs or after Stop.
func (c *Campaign) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Stop ends the campaign and waits until leadership, if held, is released.
// It is idempotent.
func (c *Campaign) Stop() {
	c.cancel()
	<-c.done
}

// LeaseContext returns a context for a job running under lease: it carries
// the lease (lock.LeaseFrom), ends with cause lock.ErrLeaseLost when the
// lease is lost or with lock.ErrReleased when it is released, and also
// ends, with parent's cause, when parent ends. Call cancel when the job
// returns.
func LeaseContext(parent context.Context, lease *lock.Lease) (ctx context.Context, cancel func()) {
	ctx, cancelCause := context.WithCancelCause(lease.Context())
	stop := context.AfterFunc(parent, func() { cancelCause(context.Cause(parent)) })
	return ctx, func() {
		stop()
		cancelCause(nil)
	}
}
