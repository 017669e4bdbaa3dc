package lock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/internal/faultdb"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// The checks of this file were conformance cases: the engine refuses the
// input before any statement, so the outcome does not depend on the
// dialect, and one run on SQLite proves them. Their rules keep cases on
// every dialect in the suite (docs/contract.md).

// countedSQLite opens a migrated SQLite file whose statements go through a
// faultdb Injector (to count them), and a second pool on the same file
// that the Injector does not see; t closes both.
func countedSQLite(t *testing.T) (db *sql.DB, inj *faultdb.Injector, other *sql.DB) {
	t.Helper()
	dsn := "file:" + filepath.Join(t.TempDir(), "app.db") + "?_journal_mode=WAL&_busy_timeout=5000"
	other, err := sql.Open("sqlite3", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	conn, err := faultdb.DSNConnector(other.Driver(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	inj = faultdb.New()
	db = sql.OpenDB(inj.Connector(conn))
	t.Cleanup(func() { db.Close() })
	if _, err := migrate.Up(t.Context(), db, sqlitedialect.New()); err != nil {
		t.Fatal(err)
	}
	return db, inj, other
}

// newLocker builds a Locker on db, closed at cleanup.
func newLocker(t *testing.T, db *sql.DB, opts ...lock.Option) *lock.Locker {
	t.Helper()
	l, err := lock.New(t.Context(), db, sqlitedialect.New(), opts...)
	if err != nil {
		t.Fatalf("new locker: %v", err)
	}
	t.Cleanup(func() { l.Close(context.Background()) })
	return l
}

// wantInput checks that err is a *lock.InputError matching
// ErrInvalidInput, for field, whose message names value (a substring of
// Value) and says what is allowed.
func wantInput(t *testing.T, what string, err error, field, value string) {
	t.Helper()
	var ie *lock.InputError
	if !errors.Is(err, lock.ErrInvalidInput) || !errors.As(err, &ie) {
		t.Errorf("%s: want a *lock.InputError matching ErrInvalidInput, got %v", what, err)
		return
	}
	if ie.Field != field {
		t.Errorf("%s: error names field %q, want %q (%v)", what, ie.Field, field, err)
	}
	if !strings.Contains(ie.Value, value) {
		t.Errorf("%s: error value %q should show %q", what, ie.Value, value)
	}
	if ie.Allowed == "" || !strings.Contains(err.Error(), ie.Allowed) || !strings.Contains(err.Error(), ie.Value) {
		t.Errorf("%s: message %q should name the value %q and what is allowed (%q)", what, err, ie.Value, ie.Allowed)
	}
}

// rowCount returns l.RowCount or fails t.
func rowCount(t *testing.T, l *lock.Locker) int64 {
	t.Helper()
	n, err := l.RowCount(t.Context())
	if err != nil {
		t.Fatalf("row count: %v", err)
	}
	return n
}

// noHolders fails t when l lists holders under prefix.
func noHolders(t *testing.T, l *lock.Locker, prefix string) {
	t.Helper()
	if hs, _, err := l.Holders(t.Context(), prefix); err != nil || len(hs) != 0 {
		t.Errorf("refused input left holders %v (err %v), want none", hs, err)
	}
}

// TestBadInputRejectedAndChangesNothing: each bad argument of an operation
// gets an *InputError naming the field, the value and what is allowed,
// before any statement, and the database is left as it was (SPEC I1).
func TestBadInputRejectedAndChangesNothing(t *testing.T) {
	ctx := t.Context()
	db, inj, otherDB := countedSQLite(t)
	l := newLocker(t, db)
	// Something in the tables, so "unchanged" is not just "empty"; through
	// the other pool, so that its statements are not counted below.
	held, err := newLocker(t, otherDB).TryAcquire(ctx, "i1/held", lock.Shared)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	rows, stmts := rowCount(t, l), inj.Count("")

	longKey := strings.Repeat("k", lock.MaxKeyLength+1)
	longRunes := strings.Repeat("é", lock.MaxKeyLength/2) + "x" // 513 bytes, 257 runes
	fn := func(context.Context, *lock.Lease) error { return nil }
	for _, bk := range []struct{ key, value string }{
		{"", `""`}, {longKey, `"kkkk`}, {longRunes, `"é`}, {"bad\xffutf8", `\xff`},
		{"\xc3", `\xc3`}, {"nul\x00inside", `\x00`}, {"\x00", `\x00`},
	} {
		what := func(op string) string { return fmt.Sprintf("%s key %.20q", op, bk.key) }
		_, err := l.TryAcquire(ctx, bk.key, lock.Exclusive)
		wantInput(t, what("TryAcquire"), err, "key", bk.value)
		_, err = l.Acquire(ctx, bk.key, lock.Shared, lock.WaitTimeout(time.Second))
		wantInput(t, what("Acquire"), err, "key", bk.value)
		wantInput(t, what("Do"), l.Do(ctx, bk.key, lock.Exclusive, fn), "key", bk.value)
	}
	if err := lock.CheckKey(strings.Repeat("k", lock.MaxKeyLength)); err != nil {
		t.Errorf("a key of exactly MaxKeyLength bytes is allowed: %v", err)
	}
	if _, err := l.TryAcquire(ctx, longKey, lock.Exclusive); err == nil || !strings.Contains(err.Error(), fmt.Sprint(lock.MaxKeyLength)) {
		t.Errorf("the error for a long key should state the limit %d: %v", lock.MaxKeyLength, err)
	}
	for _, m := range []lock.Mode{0, lock.PendingWriter, 99, -1} {
		_, err := l.TryAcquire(ctx, "i1/mode", m)
		wantInput(t, fmt.Sprintf("TryAcquire mode %d", m), err, "mode", m.String())
		_, err = l.Acquire(ctx, "i1/mode", m)
		wantInput(t, fmt.Sprintf("Acquire mode %d", m), err, "mode", m.String())
	}
	for _, d := range []time.Duration{-1, -time.Second} {
		_, err := l.Acquire(ctx, "i1/wait", lock.Exclusive, lock.WaitTimeout(d))
		wantInput(t, fmt.Sprintf("Acquire WaitTimeout(%s)", d), err, "wait timeout", d.String())
		err = l.Do(ctx, "i1/wait", lock.Exclusive, fn, lock.WaitTimeout(d))
		wantInput(t, fmt.Sprintf("Do WaitTimeout(%s)", d), err, "wait timeout", d.String())
	}
	var nilCtx context.Context
	//lint:ignore SA1012 a nil context is the bad input under test
	_, err = l.TryAcquire(nilCtx, "i1/ctx", lock.Exclusive)
	wantInput(t, "TryAcquire with a nil context", err, "context", "nil")
	_, err = l.Acquire(nilCtx, "i1/ctx", lock.Exclusive)
	wantInput(t, "Acquire with a nil context", err, "context", "nil")
	wantInput(t, "Do with a nil context", l.Do(nilCtx, "i1/ctx", lock.Exclusive, fn), "context", "nil")
	wantInput(t, "Do with a nil function", l.Do(ctx, "i1/fn", lock.Exclusive, nil), "function", "nil")
	for _, n := range []int{0, -1} {
		_, err := l.Sweep(ctx, n)
		wantInput(t, fmt.Sprintf("Sweep limit %d", n), err, "sweep limit", fmt.Sprint(n))
	}

	// Nothing reached the database, nothing changed, and the valid keys
	// used with bad arguments are free: no attempt left them registered.
	if n := inj.Count("") - stmts; n != 0 {
		t.Errorf("bad input was rejected only after %d statements reached the database; it must be rejected before", n)
	}
	if got := rowCount(t, l); got != rows {
		t.Errorf("row count changed from %d to %d", rows, got)
	}
	for _, k := range []string{"i1/mode", "i1/wait", "i1/ctx", "i1/fn"} {
		le, err := l.TryAcquire(ctx, k, lock.Exclusive)
		if err != nil {
			t.Errorf("key %q used with bad arguments should be free for this Locker: %v", k, err)
			continue
		}
		_ = le.Release(ctx)
	}

	// Bad arguments of a held lease.
	le, err := l.TryAcquire(ctx, "i1/lease", lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	wantInput(t, "Fence with a nil transaction", le.Fence(ctx, nil), "transaction", "nil")
	err = le.RunInTx(ctx, nil, nil, func(context.Context, *sql.Tx) error { return nil })
	wantInput(t, "RunInTx with a nil database", err, "database", "nil")
	wantInput(t, "RunInTx with a nil function", le.RunInTx(ctx, db, nil, nil), "function", "nil")
	if err := le.Err(); err != nil {
		t.Errorf("bad arguments ended the lease: %v", err)
	}
	if err := le.Release(ctx); err != nil {
		t.Errorf("release: %v", err)
	}
}

// TestBadLockerConfigRejected: lock.New refuses a nil database and bad
// options, naming the value and the allowed range, before touching the
// database (SPEC I1).
func TestBadLockerConfigRejected(t *testing.T) {
	db, inj, _ := countedSQLite(t)
	l := newLocker(t, db)
	rows, stmts := rowCount(t, l), inj.Count("")
	newWith := func(opt lock.Option) error {
		l, err := lock.New(t.Context(), db, sqlitedialect.New(), opt)
		if err == nil {
			l.Close(context.Background())
		}
		return err
	}

	_, err := lock.New(t.Context(), nil, sqlitedialect.New())
	wantInput(t, "lock.New with a nil *sql.DB", err, "database", "nil")
	for _, ttl := range []time.Duration{lock.MinTTL - 1, lock.MinTTL - time.Millisecond, lock.MaxTTL + 1, 1000 * time.Hour, -time.Second} {
		err := newWith(lock.WithTTL(ttl))
		wantInput(t, fmt.Sprintf("WithTTL(%s)", ttl), err, "TTL", ttl.String())
		if err != nil && (!strings.Contains(err.Error(), lock.MinTTL.String()) || !strings.Contains(err.Error(), lock.MaxTTL.String())) {
			t.Errorf("WithTTL(%s): the message should state the range %s..%s: %v", ttl, lock.MinTTL, lock.MaxTTL, err)
		}
		if err := lock.CheckTTL(ttl); !errors.Is(err, lock.ErrInvalidInput) {
			t.Errorf("CheckTTL(%s): want ErrInvalidInput, got %v", ttl, err)
		}
	}
	for _, c := range []struct {
		opt          lock.Option
		field, value string
	}{
		{lock.WithOwner("a\x00b"), "owner", `\x00`},
		{lock.WithOwner("bad\xff"), "owner", `\xff`},
		{lock.WithOwner(strings.Repeat("o", lock.MaxOwnerLength+1)), "owner", "ooo"},
		{lock.WithReleaseTimeout(-time.Second), "release timeout", "-1s"},
		{lock.WithStatementTimeout(-time.Second), "statement timeout", "-1s"},
		{lock.WithMaxBackoff(-time.Second), "max backoff", "-1s"},
		{lock.WithSafetyMargin(-time.Second), "safety margin", "-1s"},
		{lock.WithSafetyMargin(lock.DefaultTTL), "safety margin", lock.DefaultTTL.String()},
		{lock.WithRenewTimeout(lock.DefaultTTL), "renew timeout", lock.DefaultTTL.String()},
		{lock.WithPendingWriterTTL(2 * lock.DefaultTTL), "pending-writer TTL", (2 * lock.DefaultTTL).String()},
		// A zero value is rejected, never silently replaced by the default.
		{lock.WithTTL(0), "TTL", "0s"},
		{lock.WithOwner(""), "owner", `""`},
		{lock.WithRenewTimeout(0), "renew timeout", "0s"},
		{lock.WithReleaseTimeout(0), "release timeout", "0s"},
		{lock.WithMaxBackoff(0), "max backoff", "0s"},
		{lock.WithSweepInterval(0, 0), "sweep interval", "0s"},
	} {
		wantInput(t, "option "+c.field+" "+c.value, newWith(c.opt), c.field, c.value)
	}
	// Key-prefix filters are validated like keys.
	for _, c := range []struct{ prefix, value string }{
		{"\xff\xfe", `\xff`}, {"a\x00", `\x00`}, {strings.Repeat("p", lock.MaxKeyLength+1), "ppp"},
	} {
		_, _, err := l.Holders(t.Context(), c.prefix)
		wantInput(t, "Holders with key prefix "+c.value, err, "key prefix", c.value)
		wantInput(t, "CheckKeyPrefix "+c.value, lock.CheckKeyPrefix(c.prefix), "key prefix", c.value)
	}
	if n := inj.Count("") - stmts; n != 0 {
		t.Errorf("%d statements reached the database while bad options were refused; they must be refused before", n)
	}
	if got := rowCount(t, l); got != rows {
		t.Errorf("row count changed from %d to %d", rows, got)
	}
	// The limits themselves are allowed.
	for _, ttl := range []time.Duration{lock.MinTTL, lock.MaxTTL} {
		if err := newWith(lock.WithTTL(ttl)); err != nil {
			t.Errorf("WithTTL(%s) is allowed: %v", ttl, err)
		}
	}
}

// TestNegativeWaitTimeoutRejected: a negative wait timeout is bad input,
// named in the error; Do does not run its function, and nothing is
// written (SPEC W3).
func TestNegativeWaitTimeoutRejected(t *testing.T) {
	ctx := t.Context()
	l := newLocker(t, setupSQLite(t))
	_, err := l.Acquire(ctx, "k", lock.Exclusive, lock.WaitTimeout(-1500*time.Millisecond))
	wantInput(t, "Acquire with WaitTimeout(-1.5s)", err, "wait timeout", "-1.5s")
	called := false
	err = l.Do(ctx, "k", lock.Exclusive, func(context.Context, *lock.Lease) error { called = true; return nil }, lock.WaitTimeout(-time.Nanosecond))
	if !errors.Is(err, lock.ErrInvalidInput) || called {
		t.Errorf("Do with a negative wait timeout = %v (function called: %v), want ErrInvalidInput", err, called)
	}
	noHolders(t, l, "")
	le, err := l.TryAcquire(ctx, "k", lock.Exclusive)
	if err != nil {
		t.Fatalf("acquire after the refused input: %v", err)
	}
	_ = le.Release(ctx)
}

// TestBadHoldRefused: HoldAtLeast and HoldAtMost out of range, or on a
// shared acquire, are bad input naming the value and what is allowed, and
// Do does not run its function (SPEC H10).
func TestBadHoldRefused(t *testing.T) {
	ctx := t.Context()
	l := newLocker(t, setupSQLite(t))
	for _, c := range []struct {
		name  string
		mode  lock.Mode
		opts  []lock.AcquireOption
		value string
	}{
		{"shared with HoldAtLeast", lock.Shared, []lock.AcquireOption{lock.HoldAtLeast(time.Second)}, "shared"},
		{"shared with HoldAtMost", lock.Shared, []lock.AcquireOption{lock.HoldAtMost(time.Second)}, "shared"},
		{"zero HoldAtLeast", lock.Exclusive, []lock.AcquireOption{lock.HoldAtLeast(0)}, "0s"},
		{"negative HoldAtLeast", lock.Exclusive, []lock.AcquireOption{lock.HoldAtLeast(-time.Second)}, "-1s"},
		{"zero HoldAtMost", lock.Exclusive, []lock.AcquireOption{lock.HoldAtMost(0)}, "0s"},
		{"HoldAtMost past MaxHold", lock.Exclusive, []lock.AcquireOption{lock.HoldAtMost(lock.MaxHold + time.Second)}, "24h0m1s"},
		{"HoldAtMost below HoldAtLeast", lock.Exclusive, []lock.AcquireOption{lock.HoldAtLeast(2 * time.Second), lock.HoldAtMost(time.Second)}, "1s"},
	} {
		_, err := l.TryAcquire(ctx, "h10/bad", c.mode, c.opts...)
		var in *lock.InputError
		if !errors.Is(err, lock.ErrInvalidInput) || !errors.As(err, &in) {
			t.Errorf("%s: TryAcquire = %v, want an *InputError matching ErrInvalidInput", c.name, err)
			continue
		}
		if !strings.Contains(err.Error(), c.value) || in.Allowed == "" {
			t.Errorf("%s: error %q does not name the value %q and what is allowed", c.name, err, c.value)
		}
		ran := false
		err = l.Do(ctx, "h10/bad", c.mode, func(context.Context, *lock.Lease) error { ran = true; return nil }, c.opts...)
		if !errors.Is(err, lock.ErrInvalidInput) || ran {
			t.Errorf("%s: Do = %v (function ran: %v), want ErrInvalidInput without running", c.name, err, ran)
		}
	}
	noHolders(t, l, "h10/bad")
}

// TestLimitRefusesBadInput: Limit(n) with n < 1, or on an exclusive
// acquire, is bad input for every acquire form (SPEC W7, I1).
func TestLimitRefusesBadInput(t *testing.T) {
	ctx := t.Context()
	const key = "w7/input"
	l := newLocker(t, setupSQLite(t), lock.WithOwner("w7-input"))
	for _, c := range []struct {
		mode  lock.Mode
		n     int
		value string
	}{{lock.Shared, 0, "0"}, {lock.Shared, -3, "-3"}, {lock.Exclusive, 2, "2"}} {
		for name, call := range map[string]func() error{
			"TryAcquire": func() error {
				le, err := l.TryAcquire(ctx, key, c.mode, lock.Limit(c.n))
				if err == nil {
					_ = le.Release(ctx)
				}
				return err
			},
			"Acquire": func() error {
				le, err := l.Acquire(ctx, key, c.mode, lock.Limit(c.n), lock.WaitTimeout(time.Second))
				if err == nil {
					_ = le.Release(ctx)
				}
				return err
			},
			"Do": func() error {
				return l.Do(ctx, key, c.mode, func(context.Context, *lock.Lease) error { return nil }, lock.Limit(c.n))
			},
		} {
			err := call()
			var ie *lock.InputError
			if !errors.Is(err, lock.ErrInvalidInput) || !errors.As(err, &ie) {
				t.Errorf("%s %s with Limit(%d): want an *InputError (ErrInvalidInput), got %v", name, c.mode, c.n, err)
				continue
			}
			if !strings.Contains(err.Error(), c.value) || ie.Allowed == "" {
				t.Errorf("%s %s with Limit(%d): %q does not name the value and what is allowed", name, c.mode, c.n, err)
			}
		}
	}
	noHolders(t, l, key)
}

// TestBackoffScheduleBoundedAndGrowing: the wait schedule of blocked
// acquires stays within [MinBackoff, cap], and grows exponentially with
// full jitter up to the cap (SPEC W2).
func TestBackoffScheduleBoundedAndGrowing(t *testing.T) {
	for _, limit := range []time.Duration{0, lock.MinBackoff, 3 * time.Millisecond, 50 * time.Millisecond, lock.DefaultMaxBackoff, 10 * time.Second} {
		hi := max(limit, lock.MinBackoff)
		for attempt := 0; attempt < 70; attempt++ {
			for i := 0; i < 50; i++ {
				if d := lock.Backoff(attempt, limit); d < lock.MinBackoff || d > hi {
					t.Fatalf("Backoff(%d, %s) = %s, outside [%s, %s]", attempt, limit, d, lock.MinBackoff, hi)
				}
			}
		}
	}
	const limit, draws = time.Second, 2000
	prevMean := time.Duration(0)
	for attempt := 0; attempt < 12; attempt++ {
		ceil := min(limit, lock.MinBackoff<<attempt)
		var sum, lo, hi time.Duration
		lo = limit
		for i := 0; i < draws; i++ {
			d := lock.Backoff(attempt, limit)
			sum += d
			lo, hi = min(lo, d), max(hi, d)
		}
		mean := sum / draws
		if hi > ceil {
			t.Errorf("attempt %d: draw %s above min(cap, %s·2^n) = %s", attempt, hi, lock.MinBackoff, ceil)
		}
		if spread := ceil - lock.MinBackoff; ceil > lock.MinBackoff && (hi < ceil-spread/4 || lo > lock.MinBackoff+spread/4) {
			t.Errorf("attempt %d: draws span [%s, %s], want full jitter over [%s, %s]", attempt, lo, hi, lock.MinBackoff, ceil)
		}
		if ceil < limit && attempt > 0 && mean <= prevMean {
			t.Errorf("attempt %d: mean wait %s did not grow from %s", attempt, mean, prevMean)
		}
		prevMean = mean
	}
}
