package lock

import "time"

// Observer receives the engine's events, for metrics and tracing (see
// package otellock for an OpenTelemetry adapter). OnEvent is called
// synchronously from the goroutine doing the work (an acquire, the renewal
// loop, a release, a sweep): it must be fast, must not block and must be
// safe for concurrent use. Install one with WithObserver.
type Observer interface {
	OnEvent(Event)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(Event)

// OnEvent calls f(e).
func (f ObserverFunc) OnEvent(e Event) { f(e) }

// EventKind says what happened.
type EventKind int8

const (
	// EventAcquireGranted: a lease was granted; Wait is the time from the
	// call to the grant.
	EventAcquireGranted EventKind = iota + 1
	// EventAcquireDenied: a try found the key locked, or a blocking
	// acquire gave up (wait timeout or context); Wait as above, Err says
	// why.
	EventAcquireDenied
	// EventRenewOK: a renewal succeeded; Latency is its round trip.
	EventRenewOK
	// EventRenewRetry: a renewal failed with an error and will be retried
	// within the trusted window (SPEC H2); Err is the error.
	EventRenewRetry
	// EventLeaseLost: the lease was lost; Reason says why (SPEC H3).
	EventLeaseLost
	// EventReleaseOK: a release deleted the lease; Latency is its round trip.
	EventReleaseOK
	// EventReleaseFailed: a release failed or found the lease gone; Err says
	// which (SPEC H5).
	EventReleaseFailed
	// EventSweep: a sweep ran; Removed is how many holder rows it deleted.
	EventSweep
)

// String returns the event's metric-friendly name ("acquire_granted", ...).
func (k EventKind) String() string {
	switch k {
	case EventAcquireGranted:
		return "acquire_granted"
	case EventAcquireDenied:
		return "acquire_denied"
	case EventRenewOK:
		return "renew_ok"
	case EventRenewRetry:
		return "renew_retry"
	case EventLeaseLost:
		return "lease_lost"
	case EventReleaseOK:
		return "release_ok"
	case EventReleaseFailed:
		return "release_failed"
	case EventSweep:
		return "sweep"
	}
	return "unknown"
}

// Event is one engine event. Fields that do not apply to a kind are zero.
// Key is for logs and traces; metrics should not use it as an attribute
// (unbounded cardinality).
type Event struct {
	Kind    EventKind
	Dialect string
	Key     string
	Mode    Mode
	LeaseID string
	Token   int64
	// Wait is how long an acquire call took until granted or denied.
	Wait time.Duration
	// Latency is the round trip of a renewal or release statement.
	Latency time.Duration
	// Reason is why a lease was lost.
	Reason LossReason
	// Removed is the number of holder rows a sweep deleted.
	Removed int64
	// Err is the error of a denied acquire, a renewal retry, a loss or a
	// failed release.
	Err error
}

// WithObserver installs an observer of engine events (default none; nil is
// rejected).
func WithObserver(o Observer) Option {
	return func(c *config) {
		if o == nil {
			c.rejectZero("observer", "nil", "an Observer, e.g. from package otellock", "WithObserver")
		}
		c.observer = o
	}
}

// WithSweepInterval starts a background sweeper that calls Sweep(ctx, limit)
// every interval until Close (default: off; interval >= 100ms, limit >= 1;
// zero values are rejected like any value out of range). Safe to enable on
// every replica (SPEC D2).
func WithSweepInterval(interval time.Duration, limit int) Option {
	return func(c *config) { c.sweepEvery, c.sweepLimit, c.sweepSet = interval, limit, true }
}

func (l *Locker) emit(e Event) {
	if o := l.cfg.observer; o != nil {
		e.Dialect = l.d.Name()
		o.OnEvent(e)
	}
}
