package lock

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// LeadOption configures one Lead call.
type LeadOption func(*leadConfig)

type leadConfig struct {
	started   func(lease *Lease)
	stopped   func(err error)
	newLeader func(leader Holder)
	observe   time.Duration
	acquire   []AcquireOption
	zero      error
}

// LeadAcquireOptions passes opts to every acquire Lead campaigns with, after
// its own: HoldAtMost(d) makes a leader step down (lost, LossMaxLife) at
// most d after each grant and campaign again; HoldAtLeast(d) keeps the key
// taken until d after the grant when fn returns earlier (SPEC H10); FIFO
// queues campaigners in arrival order (SPEC W6). Lead returns an invalid
// option's *InputError (ErrInvalidInput) at its first campaign.
func LeadAcquireOptions(opts ...AcquireOption) LeadOption {
	return func(c *leadConfig) { c.acquire = append(c.acquire, opts...) }
}

// OnStartedLeading calls f with the leader's lease each time this Lead call
// becomes leader, just before fn runs.
// A nil f is rejected by Lead (an *InputError matching ErrInvalidInput).
func OnStartedLeading(f func(lease *Lease)) LeadOption {
	return func(c *leadConfig) {
		if f == nil && c.zero == nil {
			c.zero = inputErr("OnStartedLeading", "nil", "a function; leave the option out instead of passing nil")
		}
		c.started = f
	}
}

// OnStoppedLeading calls f each time this Lead call stops being leader,
// after fn has returned and the lease was released: err is nil when fn
// returned nil, an error matching ErrLeaseLost when leadership was lost
// (SPEC H3), the context's error when Lead's context ended, or fn's error.
// A nil f is rejected by Lead (an *InputError matching ErrInvalidInput).
func OnStoppedLeading(f func(err error)) LeadOption {
	return func(c *leadConfig) {
		if f == nil && c.zero == nil {
			c.zero = inputErr("OnStoppedLeading", "nil", "a function; leave the option out instead of passing nil")
		}
		c.stopped = f
	}
}

// OnNewLeader calls f each time Lead observes that a different lease leads
// the key: another process's (seen while campaigning, at most one observe
// interval late) or this call's own. The Holder is the leader's lease as the
// database holds it (Owner names the replica, see WithOwner).
// A nil f is rejected by Lead (an *InputError matching ErrInvalidInput).
func OnNewLeader(f func(leader Holder)) LeadOption {
	return func(c *leadConfig) {
		if f == nil && c.zero == nil {
			c.zero = inputErr("OnNewLeader", "nil", "a function; leave the option out instead of passing nil")
		}
		c.newLeader = f
	}
}

// ObserveInterval sets how often a campaigning Lead reads who leads, for
// OnNewLeader (default TTL/3; positive, at least 10ms). Only used with
// OnNewLeader; campaigning itself waits with the Locker's backoff (SPEC W2)
// whatever this interval is.
func ObserveInterval(d time.Duration) LeadOption {
	return func(c *leadConfig) {
		if d < 10*time.Millisecond && c.zero == nil {
			c.zero = inputErr("observe interval", d.String(), "at least 10ms (leave ObserveInterval out for the default TTL/3)")
		}
		c.observe = d
	}
}

func (l *Locker) leadSlot(key string) chan struct{} {
	id := l.d.Name() + "\x00" + l.channel + "\x00" + key
	v, _ := process.leading.LoadOrStore(id, make(chan struct{}, 1))
	return v.(chan struct{})
}

// Lead runs fn whenever this process leads key: leader election on an
// exclusive lease. It campaigns (a blocking exclusive Acquire, so a crashed
// leader is replaced within one TTL plus one backoff step, SPEC W2), runs
// fn under the lease, and after a loss campaigns again, until ctx ends.
//
// fn's context ends when ctx ends or leadership is lost; on loss its cause
// matches ErrLeaseLost (SPEC H3), at the latest when the lease's trusted
// window ends (SPEC H1), also for a process that was stopped and resumed.
// fn must return promptly once its context ends, and should guard writes
// with lease.RunInTx or lease.Token() (SPEC F1, F2): until fn returns, no
// other fn of this key starts in this process. Within one process, fn calls
// of every Lead on the same key and namespace never overlap, even through
// different Lockers; across processes the lease keeps one leader at a time
// (SPEC S1).
//
// Lead returns nil when fn returns nil while still leader (the work is
// done; the lease is released), fn's error when fn fails while still
// leader, and an error matching ctx's error (context.Cause) when ctx ends.
// Database errors while campaigning are logged and retried with backoff.
// Errors that retrying cannot fix are returned at once: ErrInvalidInput
// (bad key, nil fn, bad option; SPEC I1), ErrReentrant (this Locker holds
// key outside Lead), ErrClosed, ErrSchemaNotMigrated.
func (l *Locker) Lead(ctx context.Context, key string, fn func(ctx context.Context, lease *Lease) error, opts ...LeadOption) error {
	c, err := l.leadConfig(ctx, key, fn, opts)
	if err != nil {
		return err
	}
	cp := &campaign{l: l, key: key, fn: fn, c: c, slot: l.leadSlot(key)}
	failures := 0
	for {
		if ctx.Err() != nil {
			return fmt.Errorf("lock: lead %q: %w", key, context.Cause(ctx))
		}
		ran, err := cp.term(ctx)
		if ran {
			failures = 0
			if c.stopped != nil {
				c.stopped(err)
			}
			switch {
			case errors.Is(err, ErrLeaseLost):
				l.cfg.logger.Info("sqlease: leadership lost; campaigning again", "key", key, "err", err)
				continue
			case ctx.Err() != nil:
				return fmt.Errorf("lock: lead %q: %w", key, context.Cause(ctx))
			}
			return err
		}
		var locked *LockedError
		switch {
		case errors.As(err, &locked):
			cp.observeAll(locked.Holders)
			continue
		case ctx.Err() != nil:
			return fmt.Errorf("lock: lead %q: %w", key, context.Cause(ctx))
		case errors.Is(err, ErrLeaseLost): // lost before fn could start
			continue
		case errors.Is(err, ErrInvalidInput), errors.Is(err, ErrReentrant), errors.Is(err, ErrClosed), errors.Is(err, ErrSchemaNotMigrated), errors.Is(err, errors.ErrUnsupported):
			return err
		}
		// A database error while campaigning: back off and retry.
		failures++
		if err := cp.backOff(ctx, failures, err); err != nil {
			return err
		}
	}
}

// leadConfig checks Lead's input and applies its options (SPEC I1).
func (l *Locker) leadConfig(ctx context.Context, key string, fn func(ctx context.Context, lease *Lease) error, opts []LeadOption) (leadConfig, error) {
	var c leadConfig
	if ctx == nil {
		return c, inputErr("context", "nil", "pass a non-nil context")
	}
	if fn == nil {
		return c, inputErr("function", "nil", "Lead needs a function to run while leader")
	}
	if err := CheckKey(key); err != nil {
		return c, err
	}
	for i, o := range opts {
		if o == nil {
			return c, inputErr("lead option", fmt.Sprintf("nil (option %d of %d)", i+1, len(opts)), "a lock.LeadOption such as OnNewLeader(f); leave it out instead of passing nil")
		}
		o(&c)
	}
	if c.zero != nil {
		return c, c.zero
	}
	if c.observe == 0 {
		c.observe = max(l.cfg.ttl/3, 10*time.Millisecond)
	}
	return c, nil
}

// campaign is one Lead call's state across its terms.
type campaign struct {
	l          *Locker
	key        string
	fn         func(ctx context.Context, lease *Lease) error
	c          leadConfig
	slot       chan struct{} // one fn at a time per key in this process
	lastLeader string        // lease ID of the last leader reported
}

// term campaigns once and, when granted, runs fn as leader; ran says
// whether fn ran.
func (cp *campaign) term(ctx context.Context) (ran bool, err error) {
	var acOpts []AcquireOption
	if cp.c.newLeader != nil {
		acOpts = append(acOpts, WaitTimeout(cp.c.observe))
	}
	acOpts = append(acOpts, cp.c.acquire...)
	err = cp.l.Do(ctx, cp.key, Exclusive, func(fctx context.Context, lease *Lease) error {
		// Wait, holding the lease, for a previous fn (of a lease lost
		// meanwhile) to return.
		select {
		case cp.slot <- struct{}{}:
		case <-fctx.Done():
			return context.Cause(fctx)
		}
		defer func() { <-cp.slot }()
		ran = true
		cp.observe(Holder{Key: cp.key, Mode: Exclusive, LeaseID: lease.LeaseID(), Owner: lease.Owner(), Token: lease.Token(), Expiry: lease.Expiry()})
		if cp.c.started != nil {
			cp.c.started(lease)
		}
		return cp.fn(fctx, lease)
	}, acOpts...)
	return ran, err
}

// observe reports a leader to OnNewLeader once per lease.
func (cp *campaign) observe(h Holder) {
	if cp.c.newLeader != nil && h.LeaseID != cp.lastLeader {
		cp.lastLeader = h.LeaseID
		cp.c.newLeader(h)
	}
}

// observeAll reports the exclusive holder among a refusal's holders.
func (cp *campaign) observeAll(holders []Holder) {
	for _, h := range holders {
		if h.Mode == Exclusive {
			cp.observe(h)
		}
	}
}

// backOff logs a failed campaign and waits before the next one, or
// returns Lead's error when ctx ends first.
func (cp *campaign) backOff(ctx context.Context, failures int, err error) error {
	l := cp.l
	wait := Backoff(failures, max(l.cfg.maxBackoff, min(l.cfg.ttl, 5*time.Second)))
	l.cfg.logger.Warn("sqlease: leader campaign failed; retrying", "key", cp.key, "err", err, "retry_in", wait)
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("lock: lead %q: %w", cp.key, context.Cause(ctx))
	case <-t.C:
		return nil
	}
}
