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
// Rules of ../shared/SPEC.md are cited as S1..I1 in the documentation of
// each identifier; package conformance proves them on every dialect.
package lock

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/sqlease/sqlease/dialect"
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
)

// String returns "exclusive", "shared" or "pending-writer".
func (m Mode) String() string {
	switch m {
	case Exclusive:
		return "exclusive"
	case Shared:
		return "shared"
	case PendingWriter:
		return "pending-writer"
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
	}
	return PendingWriter
}

// Locker grants leases on one database. Build it with New; it is safe for
// concurrent use. One Locker is one holder identity for reentrancy: it
// refuses a second acquire of a key it holds (ErrReentrant, SPEC W4); two
// Lockers in one process are two independent holders.
type Locker struct {
	db      *sql.DB
	renewDB *sql.DB
	d       dialect.Dialect
	cfg     config
	st      statements

	mu     sync.Mutex
	active map[string]string // key -> lease ID of the lease or acquire that has it
	leases map[*Lease]struct{}
	closed bool

	// renewer state (renewer.go)
	rmu      sync.Mutex
	rheap    leaseHeap
	rrunning bool
	rdone    chan struct{}
	rwake    chan struct{}

	sweepStop chan struct{}
	sweepDone chan struct{}
}

type statements struct {
	acquire, sweep                                                            []dialect.Stmt
	probe, renew, renewBatch, release, clearMarker, fence, holders, countRows stmt
}

type stmt struct {
	dialect.Stmt
	ok bool
}

var paramNames = []string{"key", "mode", "lease_id", "owner", "token", "ttl_us", "marker_us", "limit", "key_prefix", "leases", "channel", "watch_us"}

// New builds a Locker on db with dialect d (nil: detected from db's driver
// among registered dialects). It renders and checks every statement
// template, then checks that the lock tables are migrated to this library's
// version (skip with WithoutSchemaCheck).
//
// Errors: a nil db, a bad option or namespace (ErrInvalidInput, naming the
// value; SPEC I1, D3); an unknown dialect (dialect.ErrUnknownDialect); a bad
// template; tables missing or old (ErrSchemaNotMigrated, saying to run
// migrate.Up or `sqlease migrate`; SPEC D1); or the database's error.
func New(ctx context.Context, db *sql.DB, d dialect.Dialect, opts ...Option) (_ *Locker, err error) {
	if db == nil {
		return nil, inputErr("database", "nil", "New needs an open *sql.DB")
	}
	if d == nil {
		if d, err = dialect.Detect(db); err != nil {
			return nil, fmt.Errorf("lock: %w", err)
		}
	}
	var cfg config
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if err := cfg.finish(d); err != nil {
		return nil, err
	}
	l := &Locker{db: db, renewDB: db, d: d, cfg: cfg, active: map[string]string{}, leases: map[*Lease]struct{}{}, rwake: make(chan struct{}, 1)}
	if cfg.renewDB != nil {
		l.renewDB = cfg.renewDB
	}
	if err := l.compile(); err != nil {
		return nil, err
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
			return nil, &SchemaError{Dialect: d.Name(), Table: cfg.ns.VersionTable(), Current: current, Want: want}
		}
	}
	return l, nil
}

func (l *Locker) compile() error {
	s := l.d.Statements()
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
	if l.st.acquire, err = many("Acquire", s.Acquire, true); err != nil {
		return err
	}
	if l.st.sweep, err = many("Sweep", s.Sweep, false); err != nil {
		return err
	}
	for _, x := range []struct {
		name     string
		text     string
		dst      *stmt
		required bool
	}{
		{"Probe", s.Probe, &l.st.probe, false},
		{"Renew", s.Renew, &l.st.renew, true},
		{"RenewBatch", s.RenewBatch, &l.st.renewBatch, false},
		{"Release", s.Release, &l.st.release, true},
		{"ClearMarker", s.ClearMarker, &l.st.clearMarker, true},
		{"Fence", s.Fence, &l.st.fence, false},
		{"Holders", s.Holders, &l.st.holders, false},
		{"CountRows", s.CountRows, &l.st.countRows, false},
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

// AcquireOption configures one Acquire, TryAcquire or Do call.
type AcquireOption func(*acquireConfig)

type acquireConfig struct {
	wait    time.Duration
	waitSet bool
}

// WaitTimeout bounds how long a blocking acquire waits for the key (default:
// until the context ends). When it runs out, the acquire returns a
// *LockedError (ErrLocked) with the holders it last saw. Negative values are
// rejected with ErrInvalidInput (SPEC W3, I1).
func WaitTimeout(d time.Duration) AcquireOption {
	return func(c *acquireConfig) { c.wait, c.waitSet = d, true }
}

// TryAcquire grants a lease on key in mode, or fails at once with a
// *LockedError matching ErrLocked that lists the blocking holders (SPEC W3).
// It never waits for the key and writes no pending-writer marker.
//
// Errors: ErrInvalidInput (bad key or mode, SPEC I1), ErrReentrant (this
// Locker holds or is acquiring key, SPEC W4), ErrClosed, the context's
// error (nothing is left held, SPEC H6), or the database's error.
func (l *Locker) TryAcquire(ctx context.Context, key string, mode Mode) (*Lease, error) {
	return l.acquire(ctx, key, mode, false, acquireConfig{})
}

// Acquire grants a lease on key in mode, waiting while the key is held in a
// conflicting mode. Waits poll with exponential backoff and full jitter from
// MinBackoff up to min(WithMaxBackoff, TTL), and never sleep past the
// blocking lease's expiry, so a crashed holder is taken over within one TTL
// plus one backoff step (SPEC W2).
//
// Writer preference (SPEC W1): a waiting exclusive acquire keeps a
// pending-writer marker on the key, refreshed while it polls, so no new
// shared lease is granted; shared leases already held finish, then the
// writer is granted. Several waiting writers: the earliest to place its
// marker keeps the claim until it is granted, gives up or its marker
// expires; the others are granted in no guaranteed order. Readers wait at
// most for one writer's hold; there is no global FIFO.
//
// Errors: as TryAcquire; ErrLocked when the WaitTimeout runs out; the
// context's error when ctx ends (a grant that committed anyway is released
// first; SPEC H6). Transient database errors while waiting are retried.
func (l *Locker) Acquire(ctx context.Context, key string, mode Mode, opts ...AcquireOption) (*Lease, error) {
	var ac acquireConfig
	for _, o := range opts {
		if o != nil {
			o(&ac)
		}
	}
	return l.acquire(ctx, key, mode, true, ac)
}

// Do runs fn under a lease on key in mode and releases the lease when fn
// returns (or panics). fn's context ends when ctx ends or the lease is lost
// (cause ErrLeaseLost, SPEC H3).
//
// It returns fn's error; if the lease was lost before fn returned, an error
// matching ErrLeaseLost joined with fn's error. A renewal that fails after
// fn returned changes nothing (SPEC H4). A release that fails is logged and
// joined to the result (SPEC H5). Acquire errors are returned as from
// Acquire.
func (l *Locker) Do(ctx context.Context, key string, mode Mode, fn func(ctx context.Context, lease *Lease) error, opts ...AcquireOption) (err error) {
	if fn == nil {
		return inputErr("function", "nil", "Do needs a function to run")
	}
	lease, err := l.Acquire(ctx, key, mode, opts...)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(lease.ctx, func() { cancel(context.Cause(lease.ctx)) })
	finished := false
	var returned time.Time
	defer func() {
		stop()
		cancel(nil)
		lost := lease.finish(returned)
		relErr := lease.Release(ctx)
		if !finished {
			return // panicking: released; the panic goes on
		}
		if lost != nil {
			err = errors.Join(lost, err)
			return
		}
		if relErr != nil && !errors.Is(relErr, ErrNotHeld) {
			err = errors.Join(err, relErr)
		}
	}()
	err = fn(fctx, lease)
	returned = time.Now()
	finished = true
	return err
}

func (l *Locker) acquire(ctx context.Context, key string, mode Mode, wait bool, ac acquireConfig) (*Lease, error) {
	if ctx == nil {
		return nil, inputErr("context", "nil", "pass a non-nil context")
	}
	if err := CheckKey(key); err != nil {
		return nil, err
	}
	if mode != Exclusive && mode != Shared {
		return nil, inputErr("mode", mode.String(), "Exclusive or Shared")
	}
	if ac.waitSet && ac.wait < 0 {
		return nil, inputErr("wait timeout", ac.wait.String(), "zero (try once) or a positive duration")
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("lock: acquire %s %q: %w", mode, key, context.Cause(ctx))
	}
	leaseID := newID()
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, fmt.Errorf("lock: acquire %s %q: %w", mode, key, ErrClosed)
	}
	if _, held := l.active[key]; held {
		l.mu.Unlock()
		return nil, fmt.Errorf("lock: acquire %s %q: %w", mode, key, ErrReentrant)
	}
	l.active[key] = leaseID
	l.mu.Unlock()
	start := time.Now()
	if ac.waitSet && ac.wait == 0 {
		wait = false // WaitTimeout(0): try once
	}
	lease, err := l.poll(ctx, key, mode, leaseID, wait, ac)
	if err != nil {
		l.forget(key, leaseID)
		if !errors.Is(err, ErrLocked) { // denials were reported by poll
			l.emit(Event{Kind: EventAcquireDenied, Key: key, Mode: mode, Wait: time.Since(start), Err: err})
		}
	}
	return lease, err
}

// watchTTL is how long a blocked waiter's interest in release notifications
// for its key lasts after its last refresh (CapNotify); waiters refresh it
// when half has passed.
const watchTTL = 10 * time.Second

// notifyMinPoll is the shortest wait between polls while release
// notifications are available.
const notifyMinPoll = 100 * time.Millisecond

// acquireCancelGrace is how long an in-flight acquire statement may go on
// after the caller's context ended, before it is cancelled.
const acquireCancelGrace = 250 * time.Millisecond

// errNoOutcome: the Acquire script neither granted nor named a blocker
// (what blocked ended meanwhile); the attempt is simply repeated.
var errNoOutcome = errors.New("acquire neither granted nor reported holders")

type acquireResult struct {
	granted   bool
	grantedAt time.Time
	lease     Holder
	now       time.Time
	holders   []Holder
}

func (l *Locker) poll(ctx context.Context, key string, mode Mode, activeID string, wait bool, ac acquireConfig) (*Lease, error) {
	// The lease ID starts as the acquire's ID in l.active; it changes after
	// an attempt whose outcome is unknown (that attempt is undone first).
	leaseID := activeID
	start := time.Now()
	var deadline time.Time
	if wait && ac.waitSet {
		deadline = start.Add(ac.wait)
	}
	var markerAt time.Time // when our marker was last written; zero: not ours
	var last []Holder      // blockers seen by the last refused attempt
	var wake <-chan struct{}
	if wait {
		var done func()
		wake, done = l.waitStart(key)
		defer done()
	}
	retries := 0
	for attempt := 0; ; attempt++ {
		var markerUS int64
		if wait && mode == Exclusive && (markerAt.IsZero() || time.Since(markerAt) >= l.cfg.markerTTL/3) {
			markerUS = l.cfg.markerTTL.Microseconds()
		}
		send := time.Now()
		var watchUS int64
		if wait && l.d.Capabilities().Has(dialect.CapNotify) {
			watchUS = watchTTL.Microseconds()
		}
		res, err := l.acquireOnce(ctx, key, mode, leaseID, markerUS, watchUS)
		if ctx.Err() != nil {
			// The statement may have committed a grant or a marker after
			// the caller gave up: undo both before returning (SPEC H6).
			l.undo(ctx, key, leaseID)
			return nil, fmt.Errorf("lock: acquire %s %q: %w", mode, key, context.Cause(ctx))
		}
		if err != nil {
			// A statement that ran out of its own time (the statement
			// timeout, a busy pool) while the caller still waits is
			// retried like any transient error.
			retryable := l.d.Classify(err) == dialect.ErrorRetryable || errors.Is(err, errNoOutcome) ||
				errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
			if !retryable || (!wait && retries >= 2) {
				l.undo(ctx, key, leaseID)
				return nil, fmt.Errorf("lock: acquire %s %q: %w", mode, key, err)
			}
			retries++
			l.cfg.logger.Debug("sqlease: acquire retry", "key", key, "mode", mode.String(), "err", err)
			if uncertain(err) {
				// The attempt may have committed: undo it and go on under
				// a new lease ID, so a grant we never saw cannot block us.
				l.undo(ctx, key, leaseID)
				leaseID, markerAt = newID(), time.Time{}
			}
		} else if res.granted {
			if time.Since(send) > (l.cfg.ttl-l.cfg.margin)/3 {
				// The grant took long (it waited for locks): its trusted
				// window, counted from the send, is mostly spent. Renew
				// once so the caller gets a usable lease (SPEC H1).
				// Best effort: on failure the lease keeps its short window
				// and the renewer retries as usual.
				if err := l.freshen(ctx, &res, &send); err != nil {
					l.cfg.logger.Debug("sqlease: renewal after a slow grant failed", "key", key, "lease_id", leaseID, "err", err)
				}
			}
			l.emit(Event{Kind: EventAcquireGranted, Key: key, Mode: mode, LeaseID: leaseID, Token: res.lease.Token, Wait: time.Since(start)})
			return l.newLease(key, mode, res, send, activeID), nil
		} else {
			last = last[:0]
			mine := false
			var until time.Duration = -1
			for _, h := range res.holders {
				if h.Mode == PendingWriter && h.LeaseID == leaseID {
					mine = true // our own marker: not a blocker
					continue
				}
				last = append(last, h)
				if d := h.Expiry.Sub(res.now); until < 0 || d < until {
					until = d
				}
			}
			switch {
			case !mine:
				markerAt = time.Time{}
			case markerUS > 0:
				markerAt = send
			}
			if !wait {
				err := &LockedError{Key: key, Mode: mode, Holders: last}
				l.emit(Event{Kind: EventAcquireDenied, Key: key, Mode: mode, Wait: time.Since(start), Err: err})
				return nil, err
			}
			if !deadline.IsZero() && !time.Now().Before(deadline) {
				l.clearMarker(ctx, key, leaseID, !markerAt.IsZero())
				err := &LockedError{Key: key, Mode: mode, Holders: last, Waited: time.Since(start)}
				l.emit(Event{Kind: EventAcquireDenied, Key: key, Mode: mode, Wait: time.Since(start), Err: err})
				return nil, err
			}
			limit := l.cfg.maxBackoff
			sleep := Backoff(attempt, limit)
			if l.notifyActive() {
				// Releases wake us; poll only as a fallback, and not in a
				// burst at the start.
				sleep = max(Backoff(attempt, max(limit, l.cfg.notifyPoll)), notifyMinPoll)
			}
			if until >= 0 {
				// Wake just after the earliest blocking lease expires.
				sleep = min(sleep, max(until+time.Millisecond, MinBackoff))
			}
			if !markerAt.IsZero() {
				sleep = min(sleep, l.cfg.markerTTL/3)
			}
			if err := l.sleep(ctx, sleep, deadline, wake); err != nil {
				l.clearMarker(ctx, key, leaseID, !markerAt.IsZero())
				return nil, fmt.Errorf("lock: acquire %s %q: %w", mode, key, err)
			}
			continue
		}
		// retryable error
		if err := l.sleep(ctx, l.backoff(attempt), deadline, nil); err != nil {
			l.undo(ctx, key, leaseID)
			return nil, fmt.Errorf("lock: acquire %s %q: %w", mode, key, err)
		}
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			l.undo(ctx, key, leaseID)
			return nil, &LockedError{Key: key, Mode: mode, Holders: last, Waited: time.Since(start)}
		}
	}
}

// backoff returns the full-jitter wait before poll attempt+1: uniform in
// [MinBackoff, min(cap, MinBackoff*2^attempt)], cap = min(WithMaxBackoff,
// TTL) (SPEC W2).
func (l *Locker) backoff(attempt int) time.Duration {
	return Backoff(attempt, l.cfg.maxBackoff)
}

// Backoff is the wait schedule of blocked acquires: for poll attempt n (from
// 0) a duration drawn uniformly from [MinBackoff, min(limit,
// MinBackoff*2^n)] (full jitter). It never exceeds limit (at least
// MinBackoff). Exported so the schedule can be tested (SPEC W2).
func Backoff(attempt int, limit time.Duration) time.Duration {
	limit = max(limit, MinBackoff)
	ceil := limit
	if attempt < 30 {
		ceil = min(limit, MinBackoff<<attempt)
	}
	if ceil <= MinBackoff {
		return MinBackoff
	}
	return MinBackoff + rand.N(ceil-MinBackoff+1)
}

// sleep waits d, or until deadline, or a wake-up; or until ctx ends (it
// then returns ctx's error).
func (l *Locker) sleep(ctx context.Context, d time.Duration, deadline time.Time, wake <-chan struct{}) error {
	if !deadline.IsZero() {
		d = min(d, max(time.Until(deadline), 0))
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
	case <-wake:
	}
	return nil
}

// acquireOnce runs the Acquire script once. The statement runs on a context
// detached from ctx (bounded by the statement timeout) so its outcome is
// always known (SPEC H6).
func (l *Locker) acquireOnce(ctx context.Context, key string, mode Mode, leaseID string, markerUS, watchUS int64) (acquireResult, error) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.stmtTimeout)
	defer cancel()
	// When the caller gives up, let the statement finish for a moment, then
	// cancel it through the driver (which aborts it on the server); either
	// way its outcome is known before undo runs.
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(acquireCancelGrace, cancel) })
	defer stop()
	vals := map[string]any{
		"key": key, "mode": mode.code(), "lease_id": leaseID, "owner": l.cfg.owner,
		"ttl_us": l.cfg.ttl.Microseconds(), "marker_us": markerUS, "watch_us": watchUS,
	}
	var res acquireResult
	scan := func(rows *sql.Rows) error {
		for rows.Next() {
			var granted bool
			var h Holder
			var m string
			var exp, now int64
			if err := rows.Scan(&granted, &h.LeaseID, &m, &h.Owner, &h.Token, &exp, &now); err != nil {
				return err
			}
			h.Key, h.Mode, h.Expiry = key, modeFromCode(m), time.UnixMicro(exp)
			res.now = time.UnixMicro(now)
			if granted {
				if h.LeaseID != leaseID {
					return fmt.Errorf("lock: dialect %q granted lease %q, asked for %q", l.d.Name(), h.LeaseID, leaseID)
				}
				res.granted, res.lease, res.grantedAt = true, h, h.Expiry.Add(-l.cfg.ttl)
			} else {
				res.holders = append(res.holders, h)
			}
		}
		return rows.Err()
	}
	if l.st.probe.ok && markerUS == 0 && watchUS == 0 {
		// Read-only first: a refused poll writes nothing.
		rows, err := l.db.QueryContext(sctx, l.st.probe.SQL, l.st.probe.Args(vals)...)
		if err == nil {
			err = scan(rows)
			if cerr := rows.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			return res, err
		}
		if len(res.holders) > 0 {
			return res, nil
		}
		res = acquireResult{}
	}
	_, err := l.script(sctx, l.db, l.st.acquire, vals, scan)
	if err == nil && !res.granted && len(res.holders) == 0 {
		err = errNoOutcome
	}
	return res, err
}

// script runs statements in order: one alone in autocommit, several in one
// write transaction. With scan, the last statement is a query whose rows
// scan reads; otherwise it returns the last statement's RowsAffected.
func (l *Locker) script(ctx context.Context, db *sql.DB, stmts []dialect.Stmt, vals map[string]any, scan func(*sql.Rows) error) (int64, error) {
	type runner interface {
		ExecContext(context.Context, string, ...any) (sql.Result, error)
		QueryContext(context.Context, string, ...any) (*sql.Rows, error)
	}
	run := func(r runner) (int64, error) {
		var affected int64
		for i, s := range stmts {
			args := s.Args(vals)
			if i == len(stmts)-1 && scan != nil {
				rows, err := r.QueryContext(ctx, s.SQL, args...)
				if err != nil {
					return 0, err
				}
				err = scan(rows)
				if cerr := rows.Close(); err == nil {
					err = cerr
				}
				return 0, err
			}
			res, err := r.ExecContext(ctx, s.SQL, args...)
			if err != nil {
				return 0, err
			}
			if affected, err = res.RowsAffected(); err != nil {
				return 0, err
			}
		}
		return affected, nil
	}
	leave, err := l.enter(ctx)
	if err != nil {
		return 0, err
	}
	defer leave()
	if len(stmts) == 1 {
		return run(db)
	}
	begin := l.d.Statements().BeginWrite
	if begin == "" {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return 0, err
		}
		n, err := run(tx)
		if err != nil {
			_ = tx.Rollback()
			return 0, err
		}
		return n, tx.Commit()
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, begin); err != nil {
		return 0, err
	}
	n, err := run(conn)
	if err == nil {
		_, err = conn.ExecContext(ctx, "COMMIT")
	}
	if err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.releaseTimeout)
		defer cancel()
		if _, rerr := conn.ExecContext(rctx, "ROLLBACK"); rerr != nil {
			// Never hand a connection with an open transaction back to
			// the pool.
			_ = conn.Raw(func(any) error { return errBadConn })
		}
		return 0, err
	}
	return n, nil
}

// undo removes whatever an acquire attempt may have committed: the lease
// (by its random lease ID) and the waiter's marker (SPEC H6).
func (l *Locker) undo(ctx context.Context, key, leaseID string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.releaseTimeout)
	defer cancel()
	if _, err := l.releaseRows(rctx, leaseID, 0); err != nil {
		l.cfg.logger.Warn("sqlease: undo of an abandoned acquire failed; the lease, if granted, ends by expiry", "key", key, "lease_id", leaseID, "err", err)
	}
	l.clearMarker(ctx, key, leaseID, true)
}

// uncertain reports whether a failed statement may still have taken effect
// (its reply was lost: timeout, cancellation, dropped connection).
func uncertain(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		errors.Is(err, driver.ErrBadConn) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ne)
}

// freshen renews a just-granted lease whose grant was slow, moving the send
// time and expiry in res.
func (l *Locker) freshen(ctx context.Context, res *acquireResult, send *time.Time) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.renewTimeout)
	defer cancel()
	leave, err := l.enter(rctx)
	if err != nil {
		return err
	}
	defer leave()
	t := time.Now()
	var exp, now int64
	err = l.renewDB.QueryRowContext(rctx, l.st.renew.SQL, l.st.renew.Args(map[string]any{
		"lease_id": res.lease.LeaseID, "token": res.lease.Token, "ttl_us": l.cfg.ttl.Microseconds(),
	})...).Scan(&exp, &now)
	if err != nil {
		return err
	}
	*send = t
	res.lease.Expiry = time.UnixMicro(exp)
	return nil
}

// releaseRows runs the Release statement and returns how many holder rows
// it deleted.
func (l *Locker) releaseRows(ctx context.Context, leaseID string, token int64) (int64, error) {
	leave, err := l.enter(ctx)
	if err != nil {
		return 0, err
	}
	defer leave()
	rows, err := l.db.QueryContext(ctx, l.st.release.SQL, l.st.release.Args(map[string]any{
		"lease_id": leaseID, "token": token, "channel": l.cfg.ns.Channel(),
	})...)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var n int64
	for rows.Next() {
		n++
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	return n, rows.Close()
}

func (l *Locker) clearMarker(ctx context.Context, key, leaseID string, ours bool) {
	if !ours {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.releaseTimeout)
	defer cancel()
	leave, err := l.enter(rctx)
	if err != nil {
		return
	}
	defer leave()
	if _, err := l.db.ExecContext(rctx, l.st.clearMarker.SQL, l.st.clearMarker.Args(map[string]any{"key": key, "lease_id": leaseID})...); err != nil {
		l.cfg.logger.Warn("sqlease: clearing a pending-writer marker failed; it ends by expiry", "key", key, "lease_id", leaseID, "err", err)
	}
}

func (l *Locker) forget(key, leaseID string) {
	l.mu.Lock()
	if l.active[key] == leaseID {
		delete(l.active, key)
	}
	l.mu.Unlock()
}

// Holders lists the leases and pending-writer markers whose key starts with
// keyPrefix ("" for all), expired ones included, with the database's current
// time (the zero time when nothing matched). Errors: errors.ErrUnsupported when the dialect has no Holders
// statement, or the database's error.
func (l *Locker) Holders(ctx context.Context, keyPrefix string) ([]Holder, time.Time, error) {
	if !l.st.holders.ok {
		return nil, time.Time{}, fmt.Errorf("lock: holders: dialect %q: %w", l.d.Name(), errors.ErrUnsupported)
	}
	rows, err := l.db.QueryContext(ctx, l.st.holders.SQL, l.st.holders.Args(map[string]any{"key_prefix": keyPrefix})...)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("lock: holders: %w", err)
	}
	defer rows.Close()
	var out []Holder
	var now time.Time
	for rows.Next() {
		var h Holder
		var m string
		var exp, n int64
		if err := rows.Scan(&h.Key, &m, &h.LeaseID, &h.Owner, &h.Token, &exp, &n); err != nil {
			return nil, time.Time{}, fmt.Errorf("lock: holders: %w", err)
		}
		h.Mode, h.Expiry, now = modeFromCode(m), time.UnixMicro(exp), time.UnixMicro(n)
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, time.Time{}, fmt.Errorf("lock: holders: %w", err)
	}
	return out, now, nil
}

// Sweep deletes at most limit expired holder rows, plus expired
// pending-writer markers and idle per-key rows, in one short transaction,
// and returns how many holder rows it removed. It never removes a live lease
// or a live marker, skips rows a fenced transaction holds, and is safe to run
// from every replica at once (SPEC D2).
//
// Errors: ErrInvalidInput for limit < 1; errors.ErrUnsupported when the
// dialect has no Sweep statement; the database's error.
func (l *Locker) Sweep(ctx context.Context, limit int) (int64, error) {
	if limit < 1 {
		return 0, inputErr("sweep limit", fmt.Sprint(limit), "at least 1")
	}
	if len(l.st.sweep) == 0 {
		return 0, fmt.Errorf("lock: sweep: dialect %q: %w", l.d.Name(), errors.ErrUnsupported)
	}
	n, err := l.script(ctx, l.db, l.st.sweep, map[string]any{"limit": int64(limit)}, nil)
	if err != nil {
		return 0, fmt.Errorf("lock: sweep: %w", err)
	}
	l.emit(Event{Kind: EventSweep, Removed: n})
	return n, nil
}

// RowCount returns the number of rows in the lock tables (holders, per-key
// rows and markers; not the token counter), for checking that they stay
// bounded (SPEC D2). Errors: errors.ErrUnsupported, or the database's error.
func (l *Locker) RowCount(ctx context.Context) (int64, error) {
	if !l.st.countRows.ok {
		return 0, fmt.Errorf("lock: row count: dialect %q: %w", l.d.Name(), errors.ErrUnsupported)
	}
	var n int64
	if err := l.db.QueryRowContext(ctx, l.st.countRows.SQL).Scan(&n); err != nil {
		return 0, fmt.Errorf("lock: row count: %w", err)
	}
	return n, nil
}

func (l *Locker) startSweeper() {
	l.sweepStop, l.sweepDone = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(l.sweepDone)
		t := time.NewTicker(l.cfg.sweepEvery)
		defer t.Stop()
		for {
			select {
			case <-l.sweepStop:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), max(l.cfg.sweepEvery, 5*time.Second))
			if _, err := l.Sweep(ctx, l.cfg.sweepLimit); err != nil {
				l.cfg.logger.Warn("sqlease: background sweep failed", "err", err)
			}
			cancel()
		}
	}()
}

// Close makes further acquires fail with ErrClosed, stops the background
// sweeper, and releases every lease this Locker still holds (each bounded
// by the release timeout). It returns the release errors, joined; leases
// that had already ended are not errors. It does not close the *sql.DB.
// Calling Close again is harmless.
func (l *Locker) Close(ctx context.Context) error {
	l.mu.Lock()
	if !l.closed && l.sweepStop != nil {
		close(l.sweepStop)
		defer func() { <-l.sweepDone }()
	}
	l.closed = true
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
	// Wait for the renewer to see that no lease is left.
	l.rmu.Lock()
	running, done := l.rrunning, l.rdone
	l.rmu.Unlock()
	if running {
		select {
		case <-done:
		case <-ctx.Done():
		}
	}
	return errors.Join(errs...)
}

func newID() string {
	var b [16]byte
	_, _ = crand.Read(b[:])
	return hex.EncodeToString(b[:])
}
