package lock

// Semaphores: a shared acquire that admits at most n holders of its key
// (SPEC W7).

import (
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/sqlease/sqlease/dialect"
)

// limitParam is the statement parameter that carries Limit's n (0: no
// limit). A dialect supports Limit when its Acquire script (and, for FIFO
// acquires, its AcquireFIFO script) binds it.
const limitParam = dialect.ParamSharedLimit

// Limit makes a shared acquire a semaphore acquire (SPEC W7): it is
// granted only while fewer than n live shared leases of the key exist, in
// the database's view when the grant is decided, so the key never has
// more than n holders at once, counted across every Locker and process.
// Each holder gets its own lease, fencing token, renewal and loss, like
// any shared lease; a holder that crashes frees its slot when its lease
// expires (within one TTL). A refused acquire returns a *LockedError
// (ErrLocked) listing the holders that fill the key.
//
// Writer preference (SPEC W1) and FIFO (SPEC W6) apply between semaphore
// holders and exclusive acquirers as between readers and writers: a
// waiting exclusive acquire's pending-writer marker stops new semaphore
// grants until it has been granted, and with FIFO a semaphore waiter is
// granted only when no ticket of the key is ahead of its own, so waiters
// are admitted strictly in arrival order.
//
// Like a counting semaphore, a goroutine that holds a slot and acquires
// another may wait for itself while the slots are full (the Locker cannot
// tell nesting from concurrency, SPEC W5).
//
// Every request is checked against its own n: a shared acquire without
// Limit is never refused for the count, and acquires of one key that pass
// different limits each count all shared leases of the key against their
// own n. Use one n per key.
//
// n must be at least 1, and Limit only goes with Shared: an acquire with
// n < 1 or with Exclusive fails with an *InputError matching
// ErrInvalidInput (SPEC I1). On a dialect whose Acquire statement does not
// take the @shared_limit parameter (see docs/writing-a-dialect.md) the
// acquire fails with an error matching errors.ErrUnsupported that names
// the dialect.
func Limit(n int) AcquireOption {
	return func(c *acquireConfig) { c.limit, c.limitSet = n, true }
}

// checkLimit returns the error of an acquire whose Limit option is refused
// before it starts: bad input (SPEC I1) or a dialect without semaphores.
func (l *Locker) checkLimit(key string, mode Mode, ac acquireConfig) error {
	if !ac.limitSet {
		return nil
	}
	if ac.limit < 1 {
		return inputErr("limit", strconv.Itoa(ac.limit), "at least 1: the most shared leases of the key at once (lock.Limit, SPEC W7)")
	}
	if mode != Shared {
		return inputErr("limit", strconv.Itoa(ac.limit)+" with mode "+mode.String(), "lock.Limit goes only with lock.Shared (an exclusive lease has one holder)")
	}
	script := l.st.acquire
	if ac.fifo {
		script = l.st.acquireFIFO
	}
	if !usesLimit(script...) {
		what := "Limit"
		if ac.fifo {
			what = "Limit with FIFO"
		}
		return fmt.Errorf("lock: acquire %s %q: %s: dialect %q has no semaphores (its acquire statement does not take @%s): %w",
			mode, key, what, l.d.Name(), limitParam, errors.ErrUnsupported)
	}
	return nil
}

// usesLimit reports whether any of the statements binds @shared_limit.
func usesLimit(stmts ...dialect.Stmt) bool {
	for _, s := range stmts {
		if slices.Contains(s.Params, limitParam) {
			return true
		}
	}
	return false
}
