package lock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sqlease/sqlease/dialect"
)

// WithFailoverPause turns on the failover pause for the Locker's namespace
// (SPEC S7): a primary the namespace has not seen before (a promoted
// standby, a dump restored into another cluster) grants nothing until
// maxTTL after the engine first sees it, while the leases whose rows survived renew as usual. So a
// holder whose grant an asynchronous standby never received has seen its
// trusted window end before anyone else can be granted its key. maxTTL
// must be at least the TTL of every Locker of the namespace; the longest
// any Locker asked for is kept in the database and applies to all of them,
// also to those built without this option. Its cost: after a failover, no
// key can be granted for maxTTL; grants cost a one-row read more.
//
// Errors at New: maxTTL below the Locker's TTL or above MaxTTL
// (ErrInvalidInput); a dialect without a failover pause
// (dialect.Statements.SeePrimary; errors.ErrUnsupported).
func WithFailoverPause(maxTTL time.Duration) Option {
	return durationOption("failover pause", fmt.Sprintf("at least the TTL and at most %s", MaxTTL), "WithFailoverPause", maxTTL, func(c *config) *time.Duration { return &c.failoverPause })
}

// checkFailoverPause validates the option against the TTL and the dialect.
func (c *config) checkFailoverPause(d dialect.Dialect) error {
	if c.failoverPause == 0 {
		return nil
	}
	if c.failoverPause < c.ttl || c.failoverPause > MaxTTL {
		return inputErr("failover pause", c.failoverPause.String(), fmt.Sprintf("at least the TTL (%s) and at most %s", c.ttl, MaxTTL))
	}
	if d.Statements().SeePrimary == "" {
		return fmt.Errorf("lock: WithFailoverPause: dialect %q has no failover pause (no SeePrimary statement): %w", d.Name(), errors.ErrUnsupported)
	}
	return nil
}

// seePrimary runs the SeePrimary statement with pause (0: only record the
// primary) and returns the end of the pause and the database's time.
func (l *Locker) seePrimary(ctx context.Context, pause time.Duration) (until, now time.Time, err error) {
	var untilUS, nowUS int64
	err = l.db.QueryRowContext(ctx, l.st.seePrimary.SQL, l.st.seePrimary.Args(map[string]any{"pause_us": pause.Microseconds()})...).Scan(&untilUS, &nowUS)
	if err != nil {
		return time.Time{}, time.Time{}, fmt.Errorf("record the primary for the failover pause: %w", err)
	}
	return time.UnixMicro(untilUS), time.UnixMicro(nowUS), nil
}

// pauseRefusal turns a grant refused for the failover pause into a refusal
// naming the pause as the holder of key, until it ends (SPEC S7, W3). It
// records the new primary first, so the pause runs from its first sight.
func (l *Locker) pauseRefusal(ctx context.Context, key string) (acquireResult, error) {
	until, now, err := l.seePrimary(ctx, 0)
	if err != nil {
		return acquireResult{}, err
	}
	h := Holder{Key: key, Mode: FailoverPause, Owner: "failover pause of a new primary", Expiry: until}
	return acquireResult{holders: []Holder{h}, now: now}, nil
}
