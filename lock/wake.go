package lock

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/sqlease/sqlease/dialect"
)

// Push wake-ups. A release through any Locker of this process wakes the
// waiters of its key in the same namespace at once (in-process hub). On a
// dialect with CapNotify, each Locker that has waiters keeps one listening
// connection, and releases from other processes wake its waiters too.
// Polling stays the fallback: a missed wake-up costs at most one backoff
// step.

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

// listenGrace is how long a Locker keeps its listening connection after its
// last waiter left.
const listenGrace = 2 * time.Second

// notifyActive reports whether the Locker's listener is up, so waiters may
// poll less often.
func (l *Locker) notifyActive() bool {
	l.lmu.Lock()
	defer l.lmu.Unlock()
	return l.listening
}

// waitStart registers a waiter for key: in the hub, and (CapNotify) with the
// Locker's listener, which it starts if needed.
func (l *Locker) waitStart(key string) (<-chan struct{}, func()) {
	ch, remove := hubAdd(l.cfg.ns.Channel(), key)
	ln, ok := l.d.(dialect.Listener)
	if !ok || !l.d.Capabilities().Has(dialect.CapNotify) {
		return ch, remove
	}
	l.lmu.Lock()
	l.lwaiters++
	if l.lstop != nil {
		l.lstop.Stop() // cancel a pending shutdown
		l.lstop = nil
	}
	if l.lcancel == nil {
		ctx, cancel := context.WithCancel(context.Background())
		l.lcancel = cancel
		done := make(chan struct{})
		l.ldone = done
		go l.listen(ctx, ln, done)
	}
	l.lmu.Unlock()
	return ch, func() {
		remove()
		l.lmu.Lock()
		defer l.lmu.Unlock()
		l.lwaiters--
		if l.lwaiters == 0 && l.lcancel != nil {
			cancel := l.lcancel
			l.lstop = time.AfterFunc(listenGrace, func() {
				l.lmu.Lock()
				defer l.lmu.Unlock()
				if l.lwaiters == 0 && l.lcancel != nil {
					l.lcancel = nil
					cancel()
				}
			})
		}
	}
}

// listen keeps a listening connection until ctx ends, reconnecting after
// failures with a pause.
func (l *Locker) listen(ctx context.Context, ln dialect.Listener, done chan struct{}) {
	defer close(done)
	channel := l.cfg.ns.Channel()
	for ctx.Err() == nil {
		conn, err := l.db.Conn(ctx)
		if err == nil {
			err = ln.Listen(ctx, conn, channel, func(key string) {
				l.lmu.Lock()
				l.listening = true
				l.lmu.Unlock()
				hubWake(channel, key)
			}, func() {
				l.lmu.Lock()
				l.listening = true
				l.lmu.Unlock()
			})
			_ = conn.Close()
		}
		l.lmu.Lock()
		l.listening = false
		l.lmu.Unlock()
		if errors.Is(err, errors.ErrUnsupported) {
			l.cfg.logger.Debug("sqlease: driver cannot receive notifications; waiters poll", "err", err)
			<-ctx.Done()
			return
		}
		if ctx.Err() == nil {
			l.cfg.logger.Debug("sqlease: notification listener failed; waiters poll until it is back", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

// stopListener stops the listener (Close).
func (l *Locker) stopListener() {
	l.lmu.Lock()
	cancel, done := l.lcancel, l.ldone
	l.lcancel = nil
	if l.lstop != nil {
		l.lstop.Stop()
		l.lstop = nil
	}
	l.lmu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}
