package lock

// Inspecting and cleaning the tables: Holders, Sweep, RowCount and the
// background sweeper (SPEC D2).

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Holders lists the leases, pending-writer markers and FIFO tickets (mode
// Queued, on dialects with dialect.CapFIFO; SPEC W6) whose key starts with
// keyPrefix ("" for all), expired ones included, with the database's current
// time (the zero time when nothing matched). Transient errors (serialization
// failure, dropped connection) are retried until ctx ends or for at most
// the statement timeout (SPEC S6). Errors: an *InputError matching
// ErrInvalidInput for a prefix CheckKeyPrefix rejects (SPEC I1),
// errors.ErrUnsupported when the dialect has no Holders statement, or the
// database's error.
func (l *Locker) Holders(ctx context.Context, keyPrefix string) ([]Holder, time.Time, error) {
	if err := CheckKeyPrefix(keyPrefix); err != nil {
		return nil, time.Time{}, err
	}
	if !l.st.holders.ok {
		return nil, time.Time{}, fmt.Errorf("lock: holders: dialect %q: %w", l.d.Name(), errors.ErrUnsupported)
	}
	var out []Holder
	var now time.Time
	err := l.retryTransient(ctx, l.cfg.stmtTimeout, func(ctx context.Context) error {
		out, now = nil, time.Time{}
		rows, err := l.db.QueryContext(ctx, l.st.holders.SQL, l.st.holders.Args(map[string]any{"key_prefix": keyPrefix})...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var h Holder
			var m string
			var exp, n int64
			if err := rows.Scan(&h.Key, &m, &h.LeaseID, &h.Owner, &h.Token, &exp, &n); err != nil {
				return err
			}
			h.Mode, h.Expiry, now = modeFromCode(m), time.UnixMicro(exp), time.UnixMicro(n)
			out = append(out, h)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("lock: holders: %w", err)
	}
	return out, now, nil
}

// Sweep deletes at most limit expired holder rows, plus expired
// pending-writer markers, FIFO tickets and idle per-key rows, in one short transaction,
// and returns how many holder rows it removed. It never removes a live lease
// or a live marker, skips rows a fenced transaction holds, and is safe to run
// from every replica at once (SPEC D2). Transient errors are retried as by
// Holders.
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
	var scan func(rowScanner) error
	var counted int64
	var rows int
	if l.st.sweepReturnsCount {
		scan = func(row rowScanner) error {
			if rows++; rows > 1 {
				return nil
			}
			return row.Scan(&counted)
		}
	}
	var n int64
	err := l.retryTransient(ctx, l.cfg.stmtTimeout, func(ctx context.Context) (err error) {
		rows = 0
		n, err = l.script(ctx, l.db, l.st.sweep, argMap{"limit": int64(limit)}, scan, nil, lockWait{})
		if scan != nil {
			n = counted
			if err == nil && rows == 0 {
				err = fmt.Errorf("dialect %q: the Sweep script returned no count row", l.d.Name())
			}
		}
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("lock: sweep: %w", err)
	}
	l.emit(Event{Kind: EventSweep, Removed: n})
	return n, nil
}

// RowCount returns the number of rows in the lock tables (holders, per-key
// rows, markers and FIFO tickets; not the token counter), for checking that they stay
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
