package lock

import (
	"time"
)

// The renewer's load: how long, over each window of one renewal interval
// (TTL/3), at least one renewal batch was in flight, and how many leases
// the batches that ended carried. A renewer busy for (nearly) the whole
// window renews no more leases per interval than it did in that window;
// when the Locker holds more leases than that, renewals fall behind and
// leases will be lost once they fall behind by their trusted window (SPEC
// H1, H2). The Locker then logs a warning naming the figures, at most once
// per loadWarnEvery.

// renewLoad is the renewer's load over the current window (under l.ren.mu).
type renewLoad struct {
	window   time.Time     // start of the current window
	active   int           // batches in flight
	since    time.Time     // when active last went from 0 to 1
	work     time.Duration // time with a batch in flight in this window, until since
	leases   int           // leases in the batches that ended in this window
	inflight int           // leases in the batches in flight
	warned   time.Time     // when the last warning was logged
}

// loadWarnEvery is the least time between two warnings of a Locker's
// renewer falling behind.
const loadWarnEvery = time.Minute

// saturated is the share of a window the renewer must be busy for its
// window to count as the most it can do.
const saturated = 0.9

// batchStarted counts a batch of n leases in flight.
func (l *Locker) batchStarted(n int) {
	l.ren.mu.Lock()
	defer l.ren.mu.Unlock()
	now := time.Now() // under the lock: times in the load only go forward
	ld := &l.ren.load
	if ld.window.IsZero() {
		ld.window = now
	}
	if ld.active == 0 {
		ld.since = now
	}
	ld.active++
	ld.inflight += n
}

// batchEnded counts the end of a batch of n leases and, once a window has
// passed, checks it and starts the next (conns: batches at once).
func (l *Locker) batchEnded(n, conns int) {
	l.ren.mu.Lock()
	now := time.Now()
	ld := &l.ren.load
	ld.active--
	ld.inflight -= n
	ld.leases += n
	if ld.active == 0 {
		ld.work += now.Sub(ld.since)
	}
	interval := l.cfg.ttl / 3
	elapsed := now.Sub(ld.window)
	if elapsed < interval {
		l.ren.mu.Unlock()
		return
	}
	work := ld.work
	if ld.active > 0 {
		work += now.Sub(ld.since)
		ld.since = now
	}
	held := len(l.ren.heap) + ld.inflight
	renewed := ld.leases
	capacity := int(float64(renewed) * float64(interval) / float64(max(work, time.Microsecond)))
	warn := float64(work) >= saturated*float64(elapsed) && held > capacity &&
		(ld.warned.IsZero() || now.Sub(ld.warned) >= loadWarnEvery)
	if warn {
		ld.warned = now
	}
	limit := l.ren.limit
	ld.window, ld.work, ld.leases = now, 0, 0
	l.ren.mu.Unlock()
	if warn {
		l.cfg.logger.Warn("sqlease: renewals cannot keep up: the Locker holds more leases than it can renew per renewal interval (TTL/3), so renewals fall behind and leases will be lost; renew through a pool with more connections (WithRenewDB, at most 4 batches at once, half the pool's SetMaxOpenConns), use a longer TTL or hold fewer leases per Locker",
			"leases_held", held, "renewable_per_interval", capacity, "renewal_interval", interval,
			"renewed", renewed, "busy", work.Round(time.Millisecond), "window", elapsed.Round(time.Millisecond),
			"connections", conns, "batch_limit", limit)
	}
}
