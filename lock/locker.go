// Package lock is the sqlease engine: leased exclusive and shared locks per
// string key over any database/sql database, with fencing tokens, database
// time, automatic renewal and writer preference. The SQL comes from a
// dialect (package dialect); this package runs it, tracks each lease's
// trusted window and renews it.
//
// A Locker is built once per pool with New and is safe for concurrent use.
// TryAcquire never waits; Acquire waits with backoff, bounded by its context
// and an optional WaitTimeout; Do runs a function under a lease and releases
// it afterwards. A Lease renews itself every TTL/3 until Release, and its
// Context ends, with cause ErrLeaseLost, when the lease is lost.
//
// Many goroutines may hold shared leases on one key through one Locker at
// once; each gets its own lease (own lease ID, token, renewal, release and
// loss; SPEC W5). The Locker refuses, with ErrReentrant, only what would
// wait behind itself: any acquire of a key it holds or waits for
// exclusively, and an exclusive acquire of a key it holds or waits for
// shared (SPEC W4).
//
// Nesting rule: the Locker cannot tell nesting from concurrency, so a
// goroutine that holds a shared lease and asks for the same key shared
// again is treated like another reader. Like a nested RLock of a
// sync.RWMutex, that second acquire waits behind a writer that is already
// waiting (from any Locker or process, SPEC W1), and the writer waits for
// the first lease: a deadlock until the wait timeout or context ends, or
// the writer's marker expires if it gives up. Do not nest shared acquires
// of one key; pass the lease down instead.
//
// Lead builds leader election on an exclusive lease: one replica at a time
// runs a function, and another takes over when it stops, crashes or loses
// the lease.
//
// The documentation of each identifier cites the rules it keeps as "SPEC
// S1" .. "SPEC I1": the numbered rules of docs/contract.md in the
// repository, which package conformance proves on every dialect.
package lock

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/internal/advice"
	"github.com/sqlease/sqlease/migrate"
)

// Mode is the mode of a lease.
type Mode int8

const (
	// Exclusive is the writer mode: no other lease of the key is live.
	Exclusive Mode = iota + 1
	// Shared is the reader mode: any number of shared leases, no exclusive.
	Shared
	// PendingWriter marks a waiting writer's marker in a Holder report; it
	// cannot be acquired.
	PendingWriter
	// Queued marks a FIFO waiter's ticket in a Holder report (SPEC W6):
	// LeaseID is the ticket ID, Token its place in the key's queue, Expiry
	// when it lapses unless its waiter refreshes it. It cannot be acquired.
	Queued
	// FailoverPause marks, in a refusal, the failover pause of a new
	// primary (SPEC S7, WithFailoverPause): Expiry is when it ends.
	FailoverPause
)

// String returns "exclusive", "shared", "pending-writer", "queued" or
// "failover-pause".
func (m Mode) String() string {
	switch m {
	case Exclusive:
		return "exclusive"
	case Shared:
		return "shared"
	case PendingWriter:
		return "pending-writer"
	case Queued:
		return "queued"
	case FailoverPause:
		return "failover-pause"
	}
	return fmt.Sprintf("Mode(%d)", int8(m))
}

func (m Mode) code() string {
	if m == Exclusive {
		return "x"
	}
	return "s"
}

func modeFromCode(c string) Mode {
	switch c {
	case "x":
		return Exclusive
	case "s":
		return Shared
	case "q":
		return Queued
	}
	return PendingWriter
}

// Locker grants leases on one database. Build it with New; it is safe for
// concurrent use. One Locker is one holder identity for reentrancy: it
// refuses an acquire of a key it holds or is acquiring when either is
// exclusive (ErrReentrant, SPEC W4), while any number of its goroutines may
// hold shared leases of one key together (SPEC W5); two Lockers in one
// process are two independent holders.
type Locker struct {
	db      *sql.DB
	renewDB *sql.DB
	d       dialect.Dialect
	caps    dialect.Capabilities // dialect.CapabilitiesOf(d)
	cfg     config
	channel string // cfg.ns.Channel(): the release notification channel
	st      statements
	boxed   boxed // owner, TTL and channel as statement values

	// isolated: the Acquire script refused the session's isolation level
	// once; it now always runs in a transaction at st.isolation (SPEC S6).
	isolated atomic.Bool
	// lockWaits caches each pool's own lock-wait bound
	// (dialect.LockWaitReader): *sql.DB -> time.Duration.
	lockWaits sync.Map

	mu     sync.Mutex
	active map[string]*heldKey // key -> this Locker's leases and acquires of it (W4, W5)
	leases map[*Lease]struct{}
	closed bool

	// closing ends when Close starts: waiting acquires then give up with
	// ErrClosed (SPEC H6). acquires counts acquires in flight; Close waits
	// for them (added to under mu while !closed).
	closing  context.Context
	closeNow context.CancelCauseFunc
	acquires sync.WaitGroup

	ren renewerState // the renewer's state (renewer.go)

	sweepStop chan struct{}
	sweepDone chan struct{}

	// cleanups counts background undo work (bounded by one TTL each).
	cleanups sync.WaitGroup
}

type statements struct {
	acquire, sweep                                                            []dialect.Stmt
	probe, renew, renewBatch, release, clearMarker, fence, holders, countRows stmt
	acquireFIFO                                                               []dialect.Stmt // SPEC W6
	probeFIFO, dequeue                                                        stmt
	grant, mark                                                               stmt // fast paths
	seePrimary                                                                stmt
	fenceEnd                                                                  stmt // SPEC F1
	beginWrite                                                                string
	// replicated: the dialect's servers can have replicas (Statements.Primary
	// is set), so a success reported after its deadline is an unknown
	// outcome (errUnconfirmed).
	replicated        bool
	isolation         sql.IsolationLevel
	sweepReturnsCount bool
}

type stmt struct {
	dialect.Stmt
	ok bool
}

var paramNames = []string{"key", "mode", "lease_id", "owner", "token", "ttl_us", "marker_us", "limit", "key_prefix", "leases", "channel", "watch_us", "ticket_id", "ticket_us", "pause_us", limitParam}

// New builds a Locker on db with dialect d (nil: detected from db's driver
// among registered dialects). It renders and checks every statement
// template, then checks that the lock tables are migrated to this library's
// version (skip with WithoutSchemaCheck).
//
// Errors: a nil db, a bad option or namespace (ErrInvalidInput, naming the
// value; SPEC I1, D3); an unknown dialect (dialect.ErrUnknownDialect); a bad
// template; a read-only replica (ErrReadOnly, naming the server; SPEC S7)
// or a server the dialect cannot keep its rules on (errors.ErrUnsupported);
// tables missing or old (ErrSchemaNotMigrated, saying to run
// `sqlease migrate up` or migrate.Up; SPEC D1); or the database's error.
func New(ctx context.Context, db *sql.DB, d dialect.Dialect, opts ...Option) (_ *Locker, err error) {
	if db == nil {
		return nil, inputErr("database", "nil", "New needs an open *sql.DB")
	}
	if d == nil {
		if d, err = dialect.Detect(db); err != nil {
			return nil, dialect.Relabel(err, "lock")
		}
	}
	if err := dialect.CheckConsistent(d); err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	var cfg config
	for i, o := range opts {
		if o == nil {
			return nil, inputErr("option", fmt.Sprintf("nil (option %d of %d)", i+1, len(opts)), "a lock.Option such as WithTTL(30*time.Second); leave it out instead of passing nil")
		}
		o(&cfg)
	}
	if err := cfg.finish(d); err != nil {
		return nil, err
	}
	l := &Locker{db: db, renewDB: db, d: d, caps: dialect.CapabilitiesOf(d), cfg: cfg, channel: cfg.ns.Channel(), active: map[string]*heldKey{}, leases: map[*Lease]struct{}{}, ren: renewerState{limit: renewBatchSize, wake: make(chan struct{}, 1)}}
	l.boxed = boxed{owner: cfg.owner, ttlUS: cfg.ttl.Microseconds(), channel: l.channel}
	l.closing, l.closeNow = context.WithCancelCause(context.Background())
	if cfg.renewDB != nil {
		l.renewDB = cfg.renewDB
	}
	if err := l.compile(); err != nil {
		return nil, err
	}
	if err := dialect.CheckPrimary(ctx, db, d, "lock"); err != nil {
		return nil, err
	}
	if cfg.renewDB != nil && cfg.renewDB != db {
		// Renewals must reach the primary too (SPEC S7).
		if err := dialect.CheckPrimary(ctx, cfg.renewDB, d, ""); err != nil {
			return nil, fmt.Errorf("lock: the renewal pool (WithRenewDB): %w", err)
		}
	}
	if cfg.sweepEvery > 0 {
		defer func() {
			if err == nil {
				l.startSweeper()
			}
		}()
	}
	if !cfg.skipCheck {
		current, want, err := migrate.Version(ctx, db, d, migrate.WithNamespace(cfg.ns))
		if err != nil {
			return nil, fmt.Errorf("lock: check schema version: %w", err)
		}
		if current < want {
			se := &SchemaError{Dialect: d.Name(), Table: cfg.ns.VersionTable(), Current: current, Want: want, Namespace: cfg.ns}
			if current == 0 {
				se.Elsewhere = advice.Elsewhere(ctx, db, d, cfg.ns, advice.Options)
			}
			return nil, se
		}
	}
	if cfg.failoverPause > 0 {
		if _, _, err := l.seePrimary(ctx, cfg.failoverPause); err != nil {
			return nil, fmt.Errorf("lock: %w", err)
		}
	}
	return l, nil
}

func (l *Locker) compile() error {
	s, fp := l.d.Statements(), dialect.FastPathOf(l.d)
	one := func(name, text string, required bool) (stmt, error) {
		if text == "" {
			if required {
				return stmt{}, fmt.Errorf("lock: dialect %q has no %s statement", l.d.Name(), name)
			}
			return stmt{}, nil
		}
		c, err := dialect.Compile(l.d, l.cfg.ns, text, paramNames)
		if err != nil {
			return stmt{}, fmt.Errorf("lock: dialect %q %s statement: %w", l.d.Name(), name, err)
		}
		return stmt{Stmt: c, ok: true}, nil
	}
	many := func(name string, texts []string, required bool) ([]dialect.Stmt, error) {
		if len(texts) == 0 && required {
			return nil, fmt.Errorf("lock: dialect %q has no %s statement", l.d.Name(), name)
		}
		var out []dialect.Stmt
		for i, t := range texts {
			c, err := one(fmt.Sprintf("%s[%d]", name, i), t, true)
			if err != nil {
				return nil, err
			}
			out = append(out, c.Stmt)
		}
		return out, nil
	}
	var err error
	l.st.replicated = s.Primary != ""
	l.st.beginWrite, l.st.isolation, l.st.sweepReturnsCount = s.BeginWrite, s.Isolation, s.SweepReturnsCount
	if l.st.acquire, err = many("Acquire", s.Acquire, true); err != nil {
		return err
	}
	if l.st.sweep, err = many("Sweep", s.Sweep, false); err != nil {
		return err
	}
	if l.st.acquireFIFO, err = many("AcquireFIFO", s.AcquireFIFO, false); err != nil {
		return err
	}
	for _, x := range []struct {
		name     string
		text     string
		dst      *stmt
		required bool
	}{
		{"Probe", fp.Probe, &l.st.probe, false},
		{"Renew", s.Renew, &l.st.renew, true},
		{"RenewBatch", s.RenewBatch, &l.st.renewBatch, false},
		{"Release", s.Release, &l.st.release, true},
		{"ClearMarker", s.ClearMarker, &l.st.clearMarker, true},
		{"Fence", s.Fence, &l.st.fence, false},
		{"Holders", s.Holders, &l.st.holders, false},
		{"CountRows", s.CountRows, &l.st.countRows, false},
		{"ProbeFIFO", fp.ProbeFIFO, &l.st.probeFIFO, false},
		{"Dequeue", s.Dequeue, &l.st.dequeue, false}, // with AcquireFIFO: dialect.CheckConsistent
		{"Grant", fp.Grant, &l.st.grant, false},
		{"Mark", fp.Mark, &l.st.mark, false},
		{"SeePrimary", s.SeePrimary, &l.st.seePrimary, false},
		{"FenceEnd", s.FenceEnd, &l.st.fenceEnd, false},
	} {
		if *x.dst, err = one(x.name, x.text, x.required); err != nil {
			return err
		}
	}
	return nil
}

// Dialect returns the dialect the Locker uses.
func (l *Locker) Dialect() dialect.Dialect { return l.d }

// TTL returns the lease TTL.
func (l *Locker) TTL() time.Duration { return l.cfg.ttl }

// Owner returns the owner label stored with this Locker's leases.
func (l *Locker) Owner() string { return l.cfg.owner }

// DB returns the pool the Locker acquires and releases through.
func (l *Locker) DB() *sql.DB { return l.db }

// Namespace returns the schema and table prefix of the Locker's lock tables
// (WithSchema, WithTablePrefix; a Prefix of "" stands for
// dialect.DefaultPrefix), as migrate.Up must be given them (SPEC D3).
func (l *Locker) Namespace() dialect.Namespace { return l.cfg.ns }

// heldKey is what one Locker has of one key, granted or still being
// acquired: one exclusive lease or acquire, or any number of shared ones
// (each its own database lease; SPEC W4, W5). IDs are the acquires' IDs
// (Lease.activeID).
type heldKey struct {
	mode Mode
	ids  map[string]*Lease // nil while the acquire runs
}

// claim records an acquire of key in mode under id, or returns ErrReentrant
// when it would wait behind this Locker itself: any acquire while the
// Locker holds or waits for key exclusively, an exclusive one while it
// holds or waits for key shared (SPEC W4). Shared claims add up (SPEC W5).
// The caller holds l.mu.
func (l *Locker) claim(key string, mode Mode, id string) error {
	h := l.active[key]
	if h == nil {
		l.active[key] = &heldKey{mode: mode, ids: map[string]*Lease{id: nil}}
		return nil
	}
	if h.mode == Exclusive || mode == Exclusive {
		return ErrReentrant
	}
	h.ids[id] = nil
	return nil
}

// endWindows ends the leases of key whose trusted window has passed by the
// local clock, whether or not their watchdog timer has run yet (a loaded
// machine can run it late): a lease is held only within its window (SPEC
// H1), so an acquire must not be refused for it (SPEC W4). It reports
// whether it ended any.
func (l *Locker) endWindows(key string) bool {
	var ended []*Lease
	l.mu.Lock()
	if h := l.active[key]; h != nil {
		for _, le := range h.ids {
			if le != nil && le.Remaining() == 0 {
				ended = append(ended, le)
			}
		}
	}
	l.mu.Unlock()
	for _, le := range ended {
		le.checkWindow()
	}
	return len(ended) > 0
}

// forget drops the claim id on key (release, loss, failed acquire); other
// claims of the key stay. Forgetting twice is harmless.
func (l *Locker) forget(key, id string) {
	l.mu.Lock()
	if h := l.active[key]; h != nil {
		delete(h.ids, id)
		if len(h.ids) == 0 {
			delete(l.active, key)
		}
	}
	l.mu.Unlock()
}

// Close makes further acquires fail with ErrClosed, ends acquires already
// in flight (waiting ones included: they undo what they wrote, such as
// pending-writer markers and FIFO tickets, and return an error matching
// ErrClosed; SPEC H6) and waits, until ctx ends, for them to return, so no
// lease is granted after Close returns. It then stops the background
// sweeper, releases every lease this Locker still holds (each bounded by
// the release timeout), and waits, until ctx ends, for background undo work
// of abandoned acquires (each bounded by one TTL). It returns the release
// errors, joined; leases that had already ended are not errors. It does not
// close the *sql.DB. Calling Close again is harmless.
func (l *Locker) Close(ctx context.Context) error {
	l.mu.Lock()
	if !l.closed && l.sweepStop != nil {
		close(l.sweepStop)
		defer func() { <-l.sweepDone }()
	}
	l.closed = true
	defer stopIdleListeners(l.listenPool())
	l.mu.Unlock()
	l.closeNow(ErrClosed)
	left := make(chan struct{})
	go func() { l.acquires.Wait(); close(left) }()
	select {
	case <-left:
	case <-ctx.Done():
	}
	l.mu.Lock()
	leases := make([]*Lease, 0, len(l.leases))
	for le := range l.leases {
		leases = append(leases, le)
	}
	l.mu.Unlock()
	var errs []error
	for _, le := range leases {
		if err := le.Release(ctx); err != nil && !errors.Is(err, ErrNotHeld) {
			errs = append(errs, err)
		}
	}
	// Wait for background undo work (each bounded by one TTL).
	cleaned := make(chan struct{})
	go func() { l.cleanups.Wait(); close(cleaned) }()
	select {
	case <-cleaned:
	case <-ctx.Done():
	}
	// No renewal starts after Close returns (a run in progress ends).
	l.stopRenewer(ctx)
	return join(errs...)
}

func newID() string {
	var b [16]byte
	_, _ = crand.Read(b[:])
	return hex.EncodeToString(b[:])
}
