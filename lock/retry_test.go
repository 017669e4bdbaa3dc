package lock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/pgdialect"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
)

// TestTransientAndUncertain: connection-level failures are transient on
// every dialect while waiting (SPEC H9), serialization failures and
// deadlocks too (S6); a loss or bad input never is. An error before the
// statement was sent is never uncertain (no undo warning for it).
func TestTransientAndUncertain(t *testing.T) {
	opErr := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for _, d := range []dialect.Dialect{pgdialect.New(), sqlitedialect.New()} {
		l := &Locker{d: d}
		for _, err := range []error{
			io.EOF, io.ErrUnexpectedEOF, driver.ErrBadConn, opErr,
			fmt.Errorf("failed to connect: %w", io.ErrUnexpectedEOF),
			fmt.Errorf("read: %w", syscall.ECONNRESET),
			&notSentError{opErr},
		} {
			if !l.transient(err) {
				t.Errorf("%s: %v not transient", d.Name(), err)
			}
		}
		lost := &LeaseLostError{Key: "k", Reason: LossWindowExhausted, Err: io.EOF}
		for _, err := range []error{lost, inputErr("key", `""`, "non-empty"), errors.New("syntax error")} {
			if l.transient(err) {
				t.Errorf("%s: %v is transient", d.Name(), err)
			}
		}
	}
	pg := &Locker{d: pgdialect.New()}
	for _, code := range []string{"40001", "40P01", "57P01", "08006"} {
		if err := (&pgconn.PgError{Code: code}); !pg.transient(err) {
			t.Errorf("SQLSTATE %s not transient", code)
		}
	}
	if err := (&pgconn.ConnectError{}); !pg.transient(err) {
		t.Errorf("pgconn.ConnectError not transient")
	}
	if pg.uncertain(&notSentError{opErr}) || pg.uncertain(&notSentError{context.DeadlineExceeded}) {
		t.Errorf("an error before sending is uncertain")
	}
	for _, err := range []error{io.ErrUnexpectedEOF, context.DeadlineExceeded, driver.ErrBadConn} {
		if !pg.uncertain(err) {
			t.Errorf("%v not uncertain", err)
		}
	}
	if pg.uncertain(&pgconn.PgError{Code: "40001"}) {
		t.Errorf("a serialization failure is uncertain")
	}
	// pgx reports a connection that closed after a send as "conn closed"
	// (pgconn.ErrConnClosed, not safe to retry): retried while waiting,
	// outcome unknown (SPEC H9; found by the chaos suite).
	closed := fmt.Errorf("begin: %w", pgconn.ErrConnClosed)
	if !pg.transient(closed) || !pg.uncertain(closed) {
		t.Errorf("%v: transient %v, uncertain %v; want both", closed, pg.transient(closed), pg.uncertain(closed))
	}
}

// TestRunFencedOnEndedLeaseTriesOnce: RunFenced retries a transient begin
// failure only while the lease's trusted window lasts (SPEC S6). A lease
// already lost has no window left: one attempt, not retries until the
// caller's context ends.
func TestRunFencedOnEndedLeaseTriesOnce(t *testing.T) {
	l, db := sqliteLocker(t)
	le, err := l.TryAcquire(t.Context(), "retry/ended", Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	loseLease(t, db, le)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	begins := 0
	start := time.Now()
	err = RunFenced(ctx, le, func(context.Context) (*sql.Tx, *sql.Tx, error) {
		begins++
		return nil, nil, fmt.Errorf("dial: %w", driver.ErrBadConn) // transient
	}, func(context.Context, *sql.Tx) error { return nil })
	if took := time.Since(start); begins != 1 || took > time.Second || !errors.Is(err, driver.ErrBadConn) {
		t.Errorf("RunFenced on a lost lease: %d begins in %s, err %v; want 1 begin at once and its error", begins, took, err)
	}
	le.Release(context.Background())
}
