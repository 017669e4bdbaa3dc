package lock

import (
	"context"

	"github.com/sqlease/sqlease/dialect"
)

// On a database that serializes writers (no CapConcurrentWriters, e.g.
// SQLite), writers of one process that collide are put to sleep by the
// database's busy handler, in steps of up to 100 ms. The engine queues its
// own write statements per *sql.DB instead, so contention inside one
// process costs no busy sleeps; other processes still meet the busy handler.
// The gate also keeps an acquire stream from starving renewals in the busy
// handler (SPEC H7). Its price is throughput with many clients: the Go work
// around a write is serial too. Measured in December 2026 with 8 clients
// on 2 CPUs, without the gate: 0.73x raw instead of 0.64x, and twice the
// p99; a gate of two writers: no gain (docs/performance.md, "SQLite, 8
// clients: the write gate").

// enter waits for the write gate of the Locker's database (a no-op on
// dialects with concurrent writers); the returned func leaves it. The gate
// is keyed by the Locker's main pool, whichever pool the write goes
// through, so writes through WithRenewDB's pool queue on the same gate.
func (l *Locker) enter(ctx context.Context) (func(), error) {
	gate := l.gate()
	if gate == nil {
		return func() {}, nil
	}
	select {
	case gate <- struct{}{}:
		return func() { <-gate }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// tryEnter enters the write gate when no one holds it, without waiting:
// a writer that left the gate and finds another already in it (a waiting
// writer takes the gate the moment it is left) knows it is contended.
func (l *Locker) tryEnter() (func(), bool) {
	gate := l.gate()
	if gate == nil {
		return func() {}, true
	}
	select {
	case gate <- struct{}{}:
		return func() { <-gate }, true
	default:
		return nil, false
	}
}

// gate returns the write gate of the Locker's database, or nil on a
// dialect with concurrent writers.
func (l *Locker) gate() chan struct{} {
	if l.caps.Has(dialect.CapConcurrentWriters) {
		return nil
	}
	g, ok := process.gates.Load(l.db)
	if !ok {
		// (LoadOrStore alone would make a channel on every write.)
		g, _ = process.gates.LoadOrStore(l.db, make(chan struct{}, 1))
	}
	return g.(chan struct{})
}
