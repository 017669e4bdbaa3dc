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

	_ "github.com/mattn/go-sqlite3"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/internal/faultdb"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// setupSQLite opens a fresh SQLite file with the lock tables migrated.
func setupSQLite(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(t.TempDir(), "app.db")+"?_journal_mode=WAL&_busy_timeout=5000")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := migrate.Up(t.Context(), db, nil); err != nil {
		t.Fatal(err)
	}
	return db
}

// sqliteLocker returns a Locker on a fresh SQLite database (setupSQLite),
// closed at cleanup.
func sqliteLocker(t *testing.T, opts ...lock.Option) *lock.Locker {
	t.Helper()
	l, err := lock.New(t.Context(), setupSQLite(t), nil, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close(context.Background()) })
	return l
}

// checkInputError asserts err is the one input error of every package: an
// *InputError (lock's and dialect's are one type) matching ErrInvalidInput
// through both packages' names, with a message that starts with pkg once
// and names the value and what is allowed (SPEC I1).
func checkInputError(t *testing.T, err error, pkg string, wants ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("want an input error, got nil")
	}
	if !errors.Is(err, lock.ErrInvalidInput) || !errors.Is(err, dialect.ErrInvalidInput) {
		t.Errorf("%v: does not match lock.ErrInvalidInput and dialect.ErrInvalidInput", err)
	}
	var le *lock.InputError
	var de *dialect.InputError
	if !errors.As(err, &le) || !errors.As(err, &de) || le != de {
		t.Errorf("%v (%T): not one *InputError through both packages", err, err)
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, pkg+": ") || strings.Count(msg, pkg+":") != 1 {
		t.Errorf("message %q: want it to start with %q exactly once", msg, pkg+": ")
	}
	for _, w := range wants {
		if !strings.Contains(msg, w) {
			t.Errorf("message %q: want it to mention %q", msg, w)
		}
	}
}

func TestBadOptionsRejected(t *testing.T) {
	db := setupSQLite(t)
	d := sqlitedialect.New()
	long := strings.Repeat("a", 41)
	for _, tc := range []struct {
		name  string
		opt   lock.Option
		wants []string
		name2 bool // also matches dialect.ErrInvalidName
	}{
		{"zero TTL", lock.WithTTL(0), []string{"TTL 0s", "100ms", "24h", "leave WithTTL out"}, false},
		{"short TTL", lock.WithTTL(time.Millisecond), []string{"TTL 1ms", "100ms"}, false},
		{"empty owner", lock.WithOwner(""), []string{`owner ""`, "256 bytes", "leave WithOwner out"}, false},
		{"NUL owner", lock.WithOwner("a\x00b"), []string{`owner "a\x00b"`, "without NUL"}, false},
		{"zero renew timeout", lock.WithRenewTimeout(0), []string{"renew timeout 0s", "TTL/3"}, false},
		{"zero release timeout", lock.WithReleaseTimeout(0), []string{"release timeout 0s"}, false},
		{"zero statement timeout", lock.WithStatementTimeout(0), []string{"statement timeout 0s"}, false},
		{"zero max backoff", lock.WithMaxBackoff(0), []string{"max backoff 0s", "2ms"}, false},
		{"zero marker TTL", lock.WithPendingWriterTTL(0), []string{"pending-writer TTL 0s"}, false},
		{"zero margin", lock.WithSafetyMargin(0), []string{"safety margin 0s", "TTL/2"}, false},
		{"zero notify poll", lock.WithNotifyPollInterval(0), []string{"notify poll interval 0s"}, false},
		{"zero sweep", lock.WithSweepInterval(0, 0), []string{"sweep interval 0s", "100ms"}, false},
		{"nil logger", lock.WithLogger(nil), []string{"logger nil", "DiscardHandler"}, false},
		{"nil renew db", lock.WithRenewDB(nil), []string{"renew database nil"}, false},
		{"nil observer", lock.WithObserver(nil), []string{"observer nil"}, false},
		{"schema on sqlite", lock.WithSchema("locks"), []string{`schema "locks"`, `dialect "sqlite" has no schemas`, "table prefix"}, true},
		{"bad prefix", lock.WithTablePrefix("Bad-Prefix"), []string{`prefix "Bad-Prefix"`, "lower-case"}, true},
		{"long prefix", lock.WithTablePrefix(long), []string{"prefix", "41 bytes", "at most 40"}, true},
		{"nil option", nil, []string{"option nil (option 1 of 1)", "leave it out"}, false},
		{"zero failover pause", lock.WithFailoverPause(0), []string{"failover pause 0s", "at least the TTL"}, false},
		{"failover pause below the TTL", lock.WithFailoverPause(time.Second), []string{"failover pause 1s", "at least the TTL (30s)"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := lock.New(t.Context(), db, d, tc.opt)
			checkInputError(t, err, "lock", tc.wants...)
			if tc.name2 != errors.Is(err, dialect.ErrInvalidName) {
				t.Errorf("%v: errors.Is(err, dialect.ErrInvalidName) = %v, want %v", err, !tc.name2, tc.name2)
			}
		})
	}
}

// TestFailoverPauseUnsupported: a dialect without a failover pause (no
// SeePrimary statement; SQLite has no standbys) refuses the option with
// errors.ErrUnsupported, naming the dialect (SPEC S7).
func TestFailoverPauseUnsupported(t *testing.T) {
	_, err := lock.New(t.Context(), setupSQLite(t), sqlitedialect.New(), lock.WithFailoverPause(time.Hour))
	if !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), `dialect "sqlite" has no failover pause`) {
		t.Fatalf("WithFailoverPause on SQLite: %v, want errors.ErrUnsupported naming the dialect", err)
	}
}

// A nil AcquireOption is rejected like any bad input, before anything is
// written, by TryAcquire, Acquire and Do (SPEC I1).
func TestNilAcquireOptionRejected(t *testing.T) {
	db := setupSQLite(t)
	ctx := t.Context()
	l, err := lock.New(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	_, err = l.TryAcquire(ctx, "k", lock.Exclusive, nil)
	checkInputError(t, err, "lock", "acquire option nil (option 1 of 1)", "leave it out")
	_, err = l.Acquire(ctx, "k", lock.Exclusive, lock.WaitTimeout(time.Second), nil)
	checkInputError(t, err, "lock", "acquire option nil (option 2 of 2)")
	err = l.Do(ctx, "k", lock.Shared, func(context.Context, *lock.Lease) error { return nil }, nil)
	checkInputError(t, err, "lock", "acquire option nil")
	if hs, _, err := l.Holders(ctx, ""); err != nil || len(hs) != 0 {
		t.Fatalf("holders after rejected acquires = %v, %v; want none", hs, err)
	}
	le, err := l.TryAcquire(ctx, "k", lock.Exclusive)
	if err != nil {
		t.Fatalf("acquire after bad input: %v", err)
	}
	_ = le.Release(ctx)
}

func TestBadArgumentsRejected(t *testing.T) {
	db := setupSQLite(t)
	ctx := t.Context()
	_, err := lock.New(ctx, nil, nil)
	checkInputError(t, err, "lock", "database nil")

	l, err := lock.New(ctx, db, nil, lock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())

	for _, tc := range []struct {
		name, key string
		wants     []string
	}{
		{"empty", "", []string{`key ""`, "512 bytes"}},
		{"invalid UTF-8", "\xff\xfe", []string{`key "\xff\xfe"`, "not valid UTF-8"}},
		{"NUL", "a\x00", []string{"contains NUL"}},
		{"too long", strings.Repeat("k", 513), []string{"513 bytes"}},
	} {
		t.Run("key "+tc.name, func(t *testing.T) {
			_, err := l.TryAcquire(ctx, tc.key, lock.Exclusive)
			checkInputError(t, err, "lock", tc.wants...)
		})
	}
	for _, tc := range []struct {
		name, prefix string
		wants        []string
	}{
		{"invalid UTF-8", "\xff\xfe", []string{`key prefix "\xff\xfe"`, "not valid UTF-8"}},
		{"NUL", "a\x00", []string{"key prefix", "contains NUL"}},
		{"too long", strings.Repeat("p", 2000), []string{"key prefix", "2000 bytes", "512"}},
	} {
		t.Run("prefix "+tc.name, func(t *testing.T) {
			checkInputError(t, lock.CheckKeyPrefix(tc.prefix), "lock", tc.wants...)
			_, _, err := l.Holders(ctx, tc.prefix)
			checkInputError(t, err, "lock", tc.wants...)
		})
	}
	if err := lock.CheckKeyPrefix(""); err != nil {
		t.Errorf("CheckKeyPrefix(\"\") = %v, want nil (every key)", err)
	}
	// After every rejected input the Locker still works.
	if _, _, err := l.Holders(ctx, "jobs/"); err != nil {
		t.Fatalf("Holders after bad input: %v", err)
	}
	if err := l.Do(ctx, "jobs/x", lock.Exclusive, func(context.Context, *lock.Lease) error { return nil }); err != nil {
		t.Fatalf("Do after bad input: %v", err)
	}
	checkInputError(t, lock.CheckTTL(0), "lock", "TTL 0s", "between 100ms and 24h0m0s")
}

// A second acquire of a held key names the key once, with one "lock:"
// prefix.
func TestReentrantMessageHasOnePrefix(t *testing.T) {
	db := setupSQLite(t)
	ctx := t.Context()
	l, err := lock.New(ctx, db, nil, lock.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	le, err := l.TryAcquire(ctx, "tenant/42", lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	defer le.Release(context.Background())
	_, err = l.TryAcquire(ctx, "tenant/42", lock.Shared)
	if !errors.Is(err, lock.ErrReentrant) {
		t.Fatalf("want ErrReentrant, got %v", err)
	}
	if want := `lock: acquire shared "tenant/42": key already held by this locker`; err.Error() != want {
		t.Errorf("message %q, want %q", err, want)
	}
}

// An orphaned lease is reported as orphaned, not as a failed renewal.
func TestOrphanReportedAsOrphaned(t *testing.T) {
	db := setupSQLite(t)
	ctx := t.Context()
	l, err := lock.New(ctx, db, nil, lock.WithTTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	le, err := l.TryAcquire(ctx, "orphan", lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	le.Orphan()
	select {
	case <-le.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("orphaned lease's context did not end after its trusted window")
	}
	var lost *lock.LeaseLostError
	if err := context.Cause(le.Context()); !errors.As(err, &lost) || lost.Reason != lock.LossOrphaned {
		t.Fatalf("cause %v, want a LeaseLostError with reason LossOrphaned", err)
	}
	if !strings.Contains(lost.Error(), "orphaned") || strings.Contains(lost.Error(), "renewal succeeded") {
		t.Errorf("message %q: want it to say orphaned", lost.Error())
	}
}

// dialect.Detect's result prints as the dialect's name.
func TestDetectedDialectPrintsName(t *testing.T) {
	db := setupSQLite(t)
	d, err := dialect.Detect(db)
	if err != nil {
		t.Fatal(err)
	}
	if s := fmtV(d); s != "sqlite" {
		t.Errorf("%%v of the detected dialect = %q, want sqlite", s)
	}
}

func fmtV(v any) string { return fmt.Sprintf("%v", v) }

// A pool whose driver no registered dialect claims is bad input: one
// "lock:" prefix, the driver named, ErrUnknownDialect and ErrInvalidInput.
func TestNewUndetectableDriver(t *testing.T) {
	dsn := "file:" + filepath.Join(t.TempDir(), "app.db")
	raw, err := sql.Open("sqlite3", dsn)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := faultdb.DSNConnector(raw.Driver(), dsn)
	raw.Close()
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(faultdb.New().Connector(conn))
	defer db.Close()
	_, err = lock.New(t.Context(), db, nil)
	checkInputError(t, err, "lock", "invalid driver", "pass one explicitly")
	if !errors.Is(err, dialect.ErrUnknownDialect) {
		t.Errorf("%v: want it to match dialect.ErrUnknownDialect", err)
	}
}
