package lock

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqlease/sqlease/dialect"
)

// Push wake-ups. A release through any Locker of this process wakes one
// waiter of its key in the same namespace (in-process hub): the one whose
// pending-writer marker is live (it alone can be granted, SPEC W1), else
// the oldest. On a dialect with CapNotify, each pool (*sql.DB) with waiters
// keeps one listening connection per namespace, shared by all its Lockers,
// and a release in any process notifies it; the notification names the
// marked waiter when there is one, so only its process wakes it, and
// otherwise each listening process wakes its own choice. A woken waiter
// that is granted passes the wake on to the next waiter of its process
// (readers share; after an exclusive grant the next one claims the marker,
// so the following release is targeted), a waiter refused only by another
// waiter's marker wakes that waiter, and a waiter that leaves with an
// unconsumed wake passes it on. Wake-ups are hints: polling stays the
// fallback, and a missed or misdirected wake-up costs at most one backoff
// step (at most the notify poll interval or a third of the pending-writer
// TTL).
//
// A dialect without CapNotify that implements dialect.ChangeWatcher (SQLite)
// gets a change watcher instead of a listening connection, on the same
// terms (started after a first refused attempt, lingering, one per pool and
// namespace): after each commit to the database by any process it wakes,
// for every blocked key of the pool, the marked waiter, else the oldest,
// each waiter's wake-ups paced by a token bucket (see watchBudget).
//
// The listener uses WithListenDB's pool when given, else the main pool.
// Until a listener of a pool has been ready once (the dialect's Listen
// calls ready only on a connection that can hear notifications), waiters
// poll at the normal backoff. A pool whose listener cannot hear them
// (Listen returns errors.ErrUnsupported: another driver, or a connection
// through PgBouncer) is marked deaf with one warning and gets no listener
// again in this process: its waiters poll.

type hubKey struct{ channel, key string }

// hubWaiter is one blocked acquire in the hub.
type hubWaiter struct {
	pool   *sql.DB // the pool its Locker listens or watches with
	id     string  // the attempt's lease ID: a marker's waiter ID
	ch     chan struct{}
	marked bool // its pending-writer marker was live at its last attempt

	// Change-watcher wake-ups of this waiter, paced (see watchBudget).
	budget  watchBudget
	delayed *time.Timer // a paced wake-up due later; nil: none
}

// hubState is the process's blocked acquires, per channel and key.
type hubState struct {
	sync.Mutex
	waiters map[hubKey][]*hubWaiter // in arrival order
}

// hubAdd registers a waiter of key with ID id, whose Locker listens or
// watches with pool.
func hubAdd(pool *sql.DB, channel, key, id string) (*hubWaiter, func()) {
	w := &hubWaiter{pool: pool, id: id, ch: make(chan struct{}, 1)}
	k := hubKey{channel, key}
	process.hub.Lock()
	process.hub.waiters[k] = append(process.hub.waiters[k], w)
	process.hub.Unlock()
	var once sync.Once
	return w, func() {
		once.Do(func() {
			process.hub.Lock()
			list := process.hub.waiters[k]
			for i, o := range list {
				if o == w {
					list = append(list[:i:i], list[i+1:]...)
					break
				}
			}
			if len(list) == 0 {
				delete(process.hub.waiters, k)
			} else {
				process.hub.waiters[k] = list
			}
			if w.delayed != nil {
				w.delayed.Stop()
				w.delayed = nil
			}
			process.hub.Unlock()
			select {
			case <-w.ch:
				// Woken but leaving: pass the wake-up on.
				hubWake(channel, key, "")
			default:
			}
		})
	}
}

// hubUpdate records w's current lease ID and whether its marker is live.
func hubUpdate(w *hubWaiter, id string, marked bool) {
	process.hub.Lock()
	w.id, w.marked = id, marked
	process.hub.Unlock()
}

// hubWake wakes one waiter of key in channel's namespace: with a target
// (the waiter ID of the key's live marker), that waiter if it is in this
// process and nobody otherwise (the others are blocked by its marker);
// without, the marked waiter, else the oldest.
func hubWake(channel, key, target string) {
	process.hub.Lock()
	defer process.hub.Unlock()
	list := process.hub.waiters[hubKey{channel, key}]
	if len(list) == 0 {
		return
	}
	var pick *hubWaiter
	for _, w := range list {
		if (target != "" && w.id == target) || (target == "" && w.marked) {
			pick = w
			break
		}
	}
	if pick == nil {
		if target != "" {
			return
		}
		pick = list[0]
	}
	select {
	case pick.ch <- struct{}{}:
	default:
	}
}

// hubWakeAll wakes, for every key with waiters in channel's namespace
// whose Locker uses pool, the marked waiter, else the oldest: what a change
// to the database seen by a ChangeWatcher may have made grantable. Each
// waiter's change wake-ups are paced by its watchBudget, at a rate that
// shrinks with the number of keys blocked in the pool (watchPoolRate in
// all): one that has none left is woken when it has, once, however many
// changes come meanwhile.
func hubWakeAll(pool *sql.DB, channel string) {
	process.hub.Lock()
	defer process.hub.Unlock()
	var picks []*hubWaiter
	for k, list := range process.hub.waiters {
		if k.channel != channel {
			continue
		}
		var pick *hubWaiter
		for _, w := range list {
			if w.pool != pool {
				continue
			}
			if pick == nil || w.marked {
				pick = w
			}
			if w.marked {
				break
			}
		}
		if pick != nil {
			picks = append(picks, pick)
		}
	}
	rate, burst := watchPace(len(picks))
	now := time.Now()
	for _, pick := range picks {
		if pick.delayed != nil {
			continue
		}
		if wait, ok := pick.budget.take(now, rate, burst); !ok {
			w := pick
			w.delayed = time.AfterFunc(wait, func() {
				process.hub.Lock()
				defer process.hub.Unlock()
				if w.delayed == nil {
					return // left meanwhile
				}
				w.delayed = nil
				w.budget.take(time.Now(), w.budget.rate, w.budget.burst)
				select {
				case w.ch <- struct{}{}:
				default:
				}
			})
			continue
		}
		select {
		case pick.ch <- struct{}{}:
		default:
		}
	}
}

// Pacing of change-watcher wake-ups, per waiter: a token bucket of
// watchBurst wake-ups refilled at watchRate per second, both shrinking when
// many keys are blocked in the pool, so that all of them together get at
// most about watchPoolRate wake-ups per second (each at least 1 per second,
// with a burst of 2). A change wakes a waiter at once while it has tokens
// (a handoff is seen within the watcher's delay); a waiter blocked while
// the database keeps committing other work attempts at most that rate
// beyond its polls.
const (
	watchRate     = 20
	watchBurst    = 20
	watchPoolRate = 100
)

// watchPace returns the per-waiter rate (per second) and burst for n keys
// blocked in one pool.
func watchPace(n int) (rate, burst float64) {
	n = max(n, 1)
	rate = min(watchRate, max(1, float64(watchPoolRate)/float64(n)))
	burst = min(watchBurst, max(2, float64(watchPoolRate)/2/float64(n)))
	return rate, burst
}

// watchBudget is one waiter's token bucket; the zero value is full.
type watchBudget struct {
	spent       float64   // tokens used, net of refill, as of at
	at          time.Time // when spent was last brought up to date
	rate, burst float64   // as of the last take
}

// take spends one token at now (refilled at rate per second, at most burst
// held) and reports true, or, with none left, reports false and how long
// until one is (spending nothing).
func (b *watchBudget) take(now time.Time, rate, burst float64) (time.Duration, bool) {
	b.rate, b.burst = rate, burst
	every := float64(time.Second) / rate
	if !b.at.IsZero() {
		b.spent = max(0, b.spent-float64(now.Sub(b.at))/every)
	}
	b.at = now
	b.spent = min(b.spent, burst)
	const slack = 1e-9 // float rounding of the refill
	if b.spent+1 <= burst+slack {
		b.spent = min(b.spent+1, burst)
		return 0, true
	}
	return max(time.Duration((b.spent+1-burst)*every), time.Millisecond), false
}

// listener is one listening connection of a pool for a namespace.
type listener struct {
	waiters   int
	cancel    context.CancelFunc
	done      chan struct{}
	listening bool        // not known to have failed
	readyAt   time.Time   // when it last started listening; zero: not (yet)
	linger    *time.Timer // stops it when no waiter came back meanwhile
}

type listenerKey struct {
	db      *sql.DB
	channel string
}

// pushVerdict is what the listeners of a pool and namespace have shown.
// Verdicts are kept for the life of the process (one small entry per pool
// and namespace that ever had waiters).
type pushVerdict int

const (
	pushUnknown pushVerdict = iota
	pushWorks               // a listener was ready once
	pushDeaf                // Listen returned errors.ErrUnsupported
)

// listenerState is the process's listeners, one per pool and channel, and
// what was learnt of each pool's push support.
type listenerState struct {
	sync.Mutex
	m       map[listenerKey]*listener
	verdict map[listenerKey]pushVerdict
}

// listenPool is the pool the Locker's listener connects with.
func (l *Locker) listenPool() *sql.DB {
	if l.cfg.listenDB != nil {
		return l.cfg.listenDB
	}
	return l.db
}

// listenerLinger is how long a pool's listener stays up after its last
// waiter left, so that a key under steady contention does not open a
// listening connection per wait.
const listenerLinger = 2 * time.Second

// notifyReady reports whether a listener for the Locker's pool and
// namespace listens, and since when, so waiters may poll less often.
func (l *Locker) notifyReady() (bool, time.Time) {
	process.listeners.Lock()
	defer process.listeners.Unlock()
	ln := process.listeners.m[listenerKey{l.listenPool(), l.channel}]
	if ln == nil || !ln.listening || ln.readyAt.IsZero() {
		return false, time.Time{}
	}
	return true, ln.readyAt
}

// waitStart registers a waiter for key (attempt ID id) in the hub. The
// returned func removes it (calling it again does nothing). It is called
// before the first attempt, so that a wake-up sent while that attempt
// sets the waiter's marker is not lost.
func (l *Locker) waitStart(key, id string) (*hubWaiter, func()) {
	return hubAdd(l.listenPool(), l.channel, key, id)
}

// listenStart registers a blocked waiter with the pool's listener (with
// CapNotify) or change watcher (dialect.ChangeWatcher), starting it if
// needed; an acquire calls it after its first refused attempt, so an
// uncontended acquire never opens a listening connection or watches a
// file. The returned func undoes it (calling it again does nothing); the
// listener stops listenerLinger after its last waiter left, or when a
// Locker of the pool closes while it has none.
func (l *Locker) listenStart() func() {
	dl, push := l.d.(dialect.Listener)
	cw, watch := l.d.(dialect.ChangeWatcher)
	if !push && !watch {
		return func() {}
	}
	channel := l.channel
	k := listenerKey{l.listenPool(), channel}
	process.listeners.Lock()
	if process.listeners.verdict[k] == pushDeaf {
		process.listeners.Unlock()
		return func() {}
	}
	ln := process.listeners.m[k]
	if ln == nil {
		ctx, cancel := context.WithCancel(context.Background())
		// Once a listener of this pool has heard notifications, be
		// optimistic until the first failure: waiters skip the fast first
		// polls while the listener connects.
		ln = &listener{cancel: cancel, done: make(chan struct{}), listening: process.listeners.verdict[k] == pushWorks}
		process.listeners.m[k] = ln
		if push {
			go ln.run(ctx, k, dl, l.cfg.logger)
		} else {
			go ln.watch(ctx, k, cw, l.cfg.logger)
		}
	}
	if ln.linger != nil {
		ln.linger.Stop()
		ln.linger = nil
	}
	ln.waiters++
	process.listeners.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			process.listeners.Lock()
			defer process.listeners.Unlock()
			ln.waiters--
			if ln.waiters == 0 {
				ln.linger = time.AfterFunc(listenerLinger, func() { stopListener(k, ln) })
			}
		})
	}
}

// stopListener stops ln (the listener of k) unless a waiter came back.
func stopListener(k listenerKey, ln *listener) {
	process.listeners.Lock()
	if ln.waiters > 0 || process.listeners.m[k] != ln {
		process.listeners.Unlock()
		return
	}
	delete(process.listeners.m, k)
	if ln.linger != nil {
		ln.linger.Stop()
		ln.linger = nil
	}
	process.listeners.Unlock()
	ln.cancel()
	<-ln.done
}

// stopIdleListeners stops the listeners of db that have no waiter (on
// Close, so that no listening connection outlives the Lockers).
func stopIdleListeners(db *sql.DB) {
	process.listeners.Lock()
	var idle []listenerKey
	for k, ln := range process.listeners.m {
		if k.db == db && ln.waiters == 0 {
			idle = append(idle, k)
		}
	}
	lns := make([]*listener, len(idle))
	for i, k := range idle {
		lns[i] = process.listeners.m[k]
	}
	process.listeners.Unlock()
	for i, k := range idle {
		stopListener(k, lns[i])
	}
}

// setListening records whether ln (the listener of k) listens now.
func (ln *listener) setListening(k listenerKey, v bool) {
	process.listeners.Lock()
	ln.listening = v
	if v {
		process.listeners.verdict[k] = pushWorks
		ln.readyAt = time.Now()
	} else {
		ln.readyAt = time.Time{}
	}
	process.listeners.Unlock()
}

// setDeaf records that k's pool cannot be listened to or watched, and
// reports whether that is news.
func setDeaf(k listenerKey) bool {
	process.listeners.Lock()
	defer process.listeners.Unlock()
	first := process.listeners.verdict[k] != pushDeaf
	process.listeners.verdict[k] = pushDeaf
	return first
}

// listenerWarnAfter is how many attempts in a row must fail before
// listening for a failure to be logged at WARN: a dropped connection comes
// back at the next attempt, a missing right or procedure never does.
const listenerWarnAfter = 3

// run keeps a listening connection until ctx ends, reconnecting after
// failures with a pause.
func (ln *listener) run(ctx context.Context, k listenerKey, dl dialect.Listener, logger *slog.Logger) {
	defer close(ln.done)
	channel := k.channel
	failed := 0 // attempts in a row that failed before listening
	for ctx.Err() == nil {
		var ready atomic.Bool
		conn, err := k.db.Conn(ctx)
		if err == nil {
			err = dl.Listen(ctx, conn, channel, func(p string) { w := dialect.ParseWake(p); hubWake(channel, w.Key, w.WaiterID) }, func() { ready.Store(true); ln.setListening(k, true) })
			_ = conn.Close()
		}
		ln.setListening(k, false)
		if errors.Is(err, errors.ErrUnsupported) && ctx.Err() == nil {
			if setDeaf(k) {
				logger.Warn("sqlease: push wake-ups unavailable on this pool; waiters poll (use lock.WithListenDB for a direct pool)", "channel", channel, "err", err)
			}
			<-ctx.Done()
			return
		}
		if ctx.Err() == nil {
			if failed++; ready.Load() {
				failed = 0
			}
			if failed == listenerWarnAfter {
				logger.Warn("sqlease: notification listener keeps failing before it listens; waiters poll until it is back (a missing right or migration?)", "channel", channel, "attempts", failed, "err", err)
			} else {
				logger.Debug("sqlease: notification listener failed; waiters poll until it is back", "err", err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

// watch runs the dialect's change watcher on k's pool until ctx ends,
// restarting it after failures with a pause, and wakes the pool's waiters
// (one per key) after changes, paced.
func (ln *listener) watch(ctx context.Context, k listenerKey, cw dialect.ChangeWatcher, logger *slog.Logger) {
	defer close(ln.done)
	signal := func() { hubWakeAll(k.db, k.channel) }
	for ctx.Err() == nil {
		err := cw.WatchChanges(ctx, k.db, signal, func() { ln.setListening(k, true) })
		ln.setListening(k, false)
		if errors.Is(err, errors.ErrUnsupported) && ctx.Err() == nil {
			if setDeaf(k) {
				logger.Debug("sqlease: this database cannot be watched for changes; waiters poll", "channel", k.channel, "err", err)
			}
			<-ctx.Done()
			return
		}
		if ctx.Err() == nil {
			logger.Debug("sqlease: change watcher failed; waiters poll until it is back", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}
