package lock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"math"
	"net"
	"syscall"
	"time"

	"github.com/sqlease/sqlease/dialect"
)

// transient reports whether err means the statement may simply be sent
// again: the dialect classifies it retryable (serialization failure,
// deadlock, busy, shutdown), or the connection failed (SPEC H8, H9).
func (l *Locker) transient(err error) bool {
	if err == nil || errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrInvalidInput) {
		return false
	}
	c := l.d.Classify(err)
	return c == dialect.ErrorRetryable || c == dialect.ErrorConnection || connFailed(err)
}

// connFailed reports a connection-level failure: a dropped or refused
// connection, EOF in the middle of a reply, a network error.
func connFailed(err error) bool {
	var ne net.Error
	return errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNABORTED) ||
		errors.As(err, &ne)
}

// untilCtx is the retryTransient budget of an operation retried until its
// context, which has a deadline of its own, ends.
const untilCtx = time.Duration(math.MaxInt64)

// retryTransient runs op until it succeeds, fails with an error that is not
// transient, ctx ends, or budget has passed since the first attempt (never,
// for untilCtx); a budget of 0 or less means one attempt (a lease whose
// trusted window has ended gets no retries). Between attempts it sleeps
// with full-jitter backoff. It returns op's last error (SPEC S6, H8).
func (l *Locker) retryTransient(ctx context.Context, budget time.Duration, op func(ctx context.Context) error) error {
	if budget <= 0 {
		return op(ctx)
	}
	var until time.Time
	if budget != untilCtx {
		until = time.Now().Add(budget)
	}
	for attempt := 0; ; attempt++ {
		err := op(ctx)
		if err == nil || !l.transient(err) || ctx.Err() != nil {
			return err
		}
		sleep := Backoff(attempt, min(l.cfg.maxBackoff, 250*time.Millisecond))
		if !until.IsZero() {
			left := time.Until(until)
			if left <= 0 {
				return err
			}
			sleep = min(sleep, left)
		}
		l.cfg.logger.Debug("sqlease: transient error, retrying", "err", err, "attempt", attempt+1)
		t := time.NewTimer(sleep)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}
