package lock

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/sqlease/sqlease/dialect"
)

// Push wake-ups. A release through any Locker of this process wakes the
// waiters of its key in the same namespace at once (in-process hub). On a
// dialect with CapNotify, each pool (*sql.DB) with waiters keeps one
// listening connection per namespace, shared by all its Lockers, and
// releases from other processes wake its waiters too. Polling stays the
// fallback: a missed wake-up costs at most one backoff step.

type hubKey struct{ channel, key string }

var hub = struct {
	sync.Mutex
	waiters map[hubKey]map[chan struct{}]struct{}
}{waiters: map[hubKey]map[chan struct{}]struct{}{}}

func hubAdd(channel, key string) (chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	k := hubKey{channel, key}
	hub.Lock()
	set := hub.waiters[k]
	if set == nil {
		set = map[chan struct{}]struct{}{}
		hub.waiters[k] = set
	}
	set[ch] = struct{}{}
	hub.Unlock()
	return ch, func() {
		hub.Lock()
		delete(set, ch)
		if len(set) == 0 {
			delete(hub.waiters, k)
		}
		hub.Unlock()
	}
}

// hubWake wakes every waiter of key in channel's namespace.
func hubWake(channel, key string) {
	hub.Lock()
	defer hub.Unlock()
	for ch := range hub.waiters[hubKey{channel, key}] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// listener is one listening connection of a pool for a namespace.
type listener struct {
	waiters   int
	cancel    context.CancelFunc
	done      chan struct{}
	listening bool
}

type listenerKey struct {
	db      *sql.DB
	channel string
}

var listeners = struct {
	sync.Mutex
	m map[listenerKey]*listener
}{m: map[listenerKey]*listener{}}

// notifyActive reports whether a listener for the Locker's pool and
// namespace is up, so waiters may poll less often.
func (l *Locker) notifyActive() bool {
	listeners.Lock()
	defer listeners.Unlock()
	ln := listeners.m[listenerKey{l.db, l.cfg.ns.Channel()}]
	return ln != nil && ln.listening
}

// waitStart registers a waiter for key in the hub and, with CapNotify, with
// the pool's listener, starting it if needed. The returned func undoes
// both; the last waiter out stops the listener.
func (l *Locker) waitStart(key string) (<-chan struct{}, func()) {
	channel := l.cfg.ns.Channel()
	ch, remove := hubAdd(channel, key)
	dl, ok := l.d.(dialect.Listener)
	if !ok || !l.d.Capabilities().Has(dialect.CapNotify) {
		return ch, remove
	}
	k := listenerKey{l.db, channel}
	listeners.Lock()
	ln := listeners.m[k]
	if ln == nil {
		ctx, cancel := context.WithCancel(context.Background())
		// Optimistic until the first failure: waiters skip the fast first
		// polls while the listener connects.
		ln = &listener{cancel: cancel, done: make(chan struct{}), listening: true}
		listeners.m[k] = ln
		go ln.run(ctx, l.db, dl, channel, l.cfg.logger)
	}
	ln.waiters++
	listeners.Unlock()
	return ch, func() {
		remove()
		listeners.Lock()
		ln.waiters--
		last := ln.waiters == 0
		if last {
			delete(listeners.m, k)
		}
		listeners.Unlock()
		if last {
			ln.cancel()
			<-ln.done
		}
	}
}

// run keeps a listening connection until ctx ends, reconnecting after
// failures with a pause.
func (ln *listener) run(ctx context.Context, db *sql.DB, dl dialect.Listener, channel string, logger *slog.Logger) {
	defer close(ln.done)
	setListening := func(v bool) {
		listeners.Lock()
		ln.listening = v
		listeners.Unlock()
	}
	for ctx.Err() == nil {
		conn, err := db.Conn(ctx)
		if err == nil {
			err = dl.Listen(ctx, conn, channel, func(key string) { hubWake(channel, key) }, func() { setListening(true) })
			_ = conn.Close()
		}
		setListening(false)
		if errors.Is(err, errors.ErrUnsupported) {
			logger.Debug("sqlease: driver cannot receive notifications; waiters poll", "err", err)
			<-ctx.Done()
			return
		}
		if ctx.Err() == nil {
			logger.Debug("sqlease: notification listener failed; waiters poll until it is back", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}
