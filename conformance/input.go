package conformance

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/lock"
)

// Input (docs/contract.md): bad input is refused and changes nothing (I1).
func init() {
	register(
		Case{Name: "I1_BadInputRejectedAndChangesNothing", Rule: "I1", Run: i1BadInputRejected},
		Case{Name: "I1_BadLockerConfigRejected", Rule: "I1", Run: i1BadLockerConfig},
		Case{Name: "I1_UnknownDialectAndUnmigratedSchema", Rule: "I1", Run: i1UnknownDialectAndUnmigrated},
	)
}

// inpNewLocker calls the Config's Locker constructor directly (no namespace
// options added, nil db passed through).
func inpNewLocker(e *Env, db *sql.DB, opts ...lock.Option) (*lock.Locker, error) {
	newLocker := e.Config.NewLocker
	if newLocker == nil {
		newLocker = lock.New
	}
	l, err := newLocker(e.Ctx(), db, e.Dialect, opts...)
	if err == nil {
		e.T.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = l.Close(ctx)
		})
	}
	return l, err
}

// inpWantInput checks that err is a *lock.InputError matching
// ErrInvalidInput, for field, whose message names value (a substring of
// Value) and says what is allowed.
func inpWantInput(e *Env, what string, err error, field, value string) {
	e.T.Helper()
	var ie *lock.InputError
	if !errors.Is(err, lock.ErrInvalidInput) || !errors.As(err, &ie) {
		e.T.Errorf("%s: want a *lock.InputError matching ErrInvalidInput, got %v", what, err)
		return
	}
	e.Check(ie.Field == field, "%s: error names field %q, want %q (%v)", what, ie.Field, field, err)
	e.Check(strings.Contains(ie.Value, value), "%s: error value %q should show %q", what, ie.Value, value)
	e.Check(ie.Allowed != "" && strings.Contains(err.Error(), ie.Allowed) && strings.Contains(err.Error(), ie.Value), "%s: message %q should name the value %q and what is allowed (%q)", what, err, ie.Value, ie.Allowed)
}

// inpWantName checks that err matches dialect.ErrInvalidName (and, when
// input is set, lock.ErrInvalidInput, the one input sentinel of every
// package) and names value.
func inpWantName(e *Env, what string, err error, value string, input bool) {
	e.T.Helper()
	if !errors.Is(err, dialect.ErrInvalidName) {
		e.T.Errorf("%s: want an error matching dialect.ErrInvalidName, got %v", what, err)
		return
	}
	e.Check(!input || errors.Is(err, lock.ErrInvalidInput), "%s: want an error also matching lock.ErrInvalidInput, got %v", what, err)
	e.Check(strings.Contains(err.Error(), value) || strings.Contains(err.Error(), strconv.Quote(value)), "%s: message %q should name the value %q", what, err, value)
}

// i1BadInputRejected: each bad argument of an operation gets an
// *InputError naming the field, the value and what is allowed, and the
// database is left as it was.
func i1BadInputRejected(e *Env) {
	ctx := e.Ctx()
	l := e.NewLocker(nil)
	// Through its own pool, so that its renewals are not counted below.
	other := e.NewLocker(e.OpenDB())
	// Something in the tables, so "unchanged" is not just "empty".
	held := e.MustTryAcquire(other, "i1/held", lock.Shared)
	defer held.Release(ctx)
	rows := stgRowCount(e, l)
	writes := e.Faults.Count("")

	longKey := strings.Repeat("k", lock.MaxKeyLength+1)
	longRunes := strings.Repeat("é", lock.MaxKeyLength/2) + "x" // 513 bytes, 257 runes
	badKeys := []struct{ key, value string }{
		{"", `""`},
		{longKey, `"kkkk`},
		{longRunes, `"é`},
		{"bad\xffutf8", `\xff`},
		{"\xc3", `\xc3`},
		{"nul\x00inside", `\x00`},
		{"\x00", `\x00`},
	}
	var nilCtx context.Context
	fn := func(context.Context, *lock.Lease) error { return nil }
	for _, bk := range badKeys {
		what := func(op string) string { return fmt.Sprintf("%s key %q", op, clipKey(bk.key)) }
		_, err := l.TryAcquire(ctx, bk.key, lock.Exclusive)
		inpWantInput(e, what("TryAcquire"), err, "key", bk.value)
		_, err = l.Acquire(ctx, bk.key, lock.Shared, lock.WaitTimeout(time.Second))
		inpWantInput(e, what("Acquire"), err, "key", bk.value)
		err = l.Do(ctx, bk.key, lock.Exclusive, fn)
		inpWantInput(e, what("Do"), err, "key", bk.value)
	}
	e.CheckErr(lock.CheckKey(strings.Repeat("k", lock.MaxKeyLength)), "a key of exactly MaxKeyLength bytes is allowed")
	// The message says what the limit is.
	if _, err := l.TryAcquire(ctx, longKey, lock.Exclusive); err == nil || !strings.Contains(err.Error(), fmt.Sprint(lock.MaxKeyLength)) {
		e.T.Errorf("the error for a long key should state the limit %d: %v", lock.MaxKeyLength, err)
	}

	for _, m := range []lock.Mode{0, lock.PendingWriter, 99, -1} {
		_, err := l.TryAcquire(ctx, "i1/mode", m)
		inpWantInput(e, fmt.Sprintf("TryAcquire mode %d", m), err, "mode", m.String())
		_, err = l.Acquire(ctx, "i1/mode", m)
		inpWantInput(e, fmt.Sprintf("Acquire mode %d", m), err, "mode", m.String())
	}
	for _, d := range []time.Duration{-1, -time.Second} {
		_, err := l.Acquire(ctx, "i1/wait", lock.Exclusive, lock.WaitTimeout(d))
		inpWantInput(e, fmt.Sprintf("Acquire WaitTimeout(%s)", d), err, "wait timeout", d.String())
		err = l.Do(ctx, "i1/wait", lock.Exclusive, fn, lock.WaitTimeout(d))
		inpWantInput(e, fmt.Sprintf("Do WaitTimeout(%s)", d), err, "wait timeout", d.String())
	}
	//lint:ignore SA1012 a nil context is the bad input under test
	_, err := l.TryAcquire(nilCtx, "i1/ctx", lock.Exclusive)
	inpWantInput(e, "TryAcquire with a nil context", err, "context", "nil")
	_, err = l.Acquire(nilCtx, "i1/ctx", lock.Exclusive)
	inpWantInput(e, "Acquire with a nil context", err, "context", "nil")
	err = l.Do(nilCtx, "i1/ctx", lock.Exclusive, fn)
	inpWantInput(e, "Do with a nil context", err, "context", "nil")
	err = l.Do(ctx, "i1/fn", lock.Exclusive, nil)
	inpWantInput(e, "Do with a nil function", err, "function", "nil")
	for _, n := range []int{0, -1} {
		_, err := l.Sweep(ctx, n)
		inpWantInput(e, fmt.Sprintf("Sweep limit %d", n), err, "sweep limit", fmt.Sprint(n))
	}

	// Nothing reached the database, nothing changed, and the valid keys
	// used with bad arguments are free: no attempt left them registered.
	if n := e.Faults.Count("") - writes; n != 0 {
		e.T.Errorf("bad input was rejected only after %d statements reached the database; it must be rejected before", n)
	}
	if got := stgRowCount(e, l); got != rows {
		e.T.Errorf("row count changed from %d to %d", rows, got)
	}
	for _, k := range []string{"i1/mode", "i1/wait", "i1/ctx", "i1/fn"} {
		le, err := l.TryAcquire(ctx, k, lock.Exclusive)
		if err != nil {
			e.T.Errorf("key %q used with bad arguments should be free for this Locker: %v", k, err)
			continue
		}
		_ = le.Release(ctx)
	}

	// Bad arguments of a held lease.
	le := e.MustTryAcquire(l, "i1/lease", lock.Exclusive)
	err = le.Fence(ctx, nil)
	inpWantInput(e, "Fence with a nil transaction", err, "transaction", "nil")
	err = le.RunInTx(ctx, nil, nil, func(context.Context, *sql.Tx) error { return nil })
	inpWantInput(e, "RunInTx with a nil database", err, "database", "nil")
	err = le.RunInTx(ctx, e.DB, nil, nil)
	inpWantInput(e, "RunInTx with a nil function", err, "function", "nil")
	e.CheckErr(le.Err(), "bad arguments ended the lease")
	e.CheckErr(le.Release(ctx), "release")
}

func clipKey(k string) string {
	if len(k) > 20 {
		return k[:20] + "..."
	}
	return k
}

// i1BadLockerConfigRejected: lock.New refuses a nil database and bad
// options, naming the value and the allowed range, before touching the
// database.
func i1BadLockerConfig(e *Env) {
	l := e.NewLocker(nil)
	rows := stgRowCount(e, l)
	stmts := e.Faults.Count("")

	_, err := inpNewLocker(e, nil)
	inpWantInput(e, "lock.New with a nil *sql.DB", err, "database", "nil")

	for _, ttl := range []time.Duration{lock.MinTTL - 1, lock.MinTTL - time.Millisecond, lock.MaxTTL + 1, 1000 * time.Hour, -time.Second} {
		_, err := e.TryNewLocker(nil, lock.WithTTL(ttl))
		inpWantInput(e, fmt.Sprintf("WithTTL(%s)", ttl), err, "TTL", ttl.String())
		e.Check(err == nil || strings.Contains(err.Error(), lock.MinTTL.String()) && strings.Contains(err.Error(), lock.MaxTTL.String()), "WithTTL(%s): the message should state the range %s..%s: %v", ttl, lock.MinTTL, lock.MaxTTL, err)
		if err := lock.CheckTTL(ttl); !errors.Is(err, lock.ErrInvalidInput) {
			e.T.Errorf("CheckTTL(%s): want ErrInvalidInput, got %v", ttl, err)
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
		_, err := e.TryNewLocker(nil, c.opt)
		inpWantInput(e, "option "+c.field+" "+c.value, err, c.field, c.value)
	}
	// Key-prefix filters are validated like keys.
	for _, c := range []struct{ prefix, value string }{
		{"\xff\xfe", `\xff`}, {"a\x00", `\x00`}, {strings.Repeat("p", lock.MaxKeyLength+1), "ppp"},
	} {
		_, _, err := l.Holders(e.Ctx(), c.prefix)
		inpWantInput(e, "Holders with key prefix "+c.value, err, "key prefix", c.value)
		inpWantInput(e, "CheckKeyPrefix "+c.value, lock.CheckKeyPrefix(c.prefix), "key prefix", c.value)
	}
	if n := e.Faults.Count("") - stmts; n != 0 {
		e.T.Errorf("%d statements reached the database while bad options were refused; they must be refused before", n)
	}
	if got := stgRowCount(e, l); got != rows {
		e.T.Errorf("row count changed from %d to %d", rows, got)
	}
	// The limits themselves are allowed.
	for _, ttl := range []time.Duration{lock.MinTTL, lock.MaxTTL} {
		if _, err := e.TryNewLocker(nil, lock.WithTTL(ttl)); err != nil {
			e.T.Errorf("WithTTL(%s) is allowed: %v", ttl, err)
		}
	}
}

// i1UnknownDialectAndUnmigratedSchema: an unknown dialect name lists the
// registered ones; a Locker on lock tables that do not exist says to run the
// migrations, and creates no lock table.
func i1UnknownDialectAndUnmigrated(e *Env) {
	ctx := e.Ctx()
	for _, name := range []string{"nosuchdialect", "", "Postgres ", "sqlease-surely-unregistered-dialect"} {
		d, err := dialect.Lookup(name)
		if d != nil || !errors.Is(err, dialect.ErrUnknownDialect) {
			e.T.Errorf("Lookup(%q): want ErrUnknownDialect, got %v, %v", name, d, err)
			continue
		}
		e.Check(strings.Contains(err.Error(), fmt.Sprintf("%q", name)), "Lookup(%q): message %q should name the value", name, err)
		for _, n := range dialect.Names() {
			e.Check(strings.Contains(err.Error(), n), "Lookup(%q): message %q should list registered dialect %q", name, err, n)
		}
	}
	if d, err := dialect.Lookup(e.Dialect.Name()); err != nil || d.Name() != e.Dialect.Name() {
		e.T.Errorf("Lookup(%q): %v, %v", e.Dialect.Name(), d, err)
	}

	ns := e.SubNamespace("i1_")
	_, err := inpNewLocker(e, e.DB, lock.WithSchema(ns.Schema), lock.WithTablePrefix(ns.Prefix))
	var se *lock.SchemaError
	if !errors.Is(err, lock.ErrSchemaNotMigrated) || !errors.As(err, &se) {
		e.T.Fatalf("lock.New on unmigrated tables: want *SchemaError matching ErrSchemaNotMigrated, got %v", err)
	}
	e.Check(se.Current == 0 && se.Want >= 1 && se.Dialect == e.Dialect.Name() && se.Table == ns.VersionTable(), "schema error %+v: want current 0, want >= 1, dialect %q, table %q", se, e.Dialect.Name(), ns.VersionTable())
	for _, s := range []string{"migrate.Up", "sqlease migrate"} {
		e.Check(strings.Contains(err.Error(), s), "schema error %q should say to run %s", err, s)
	}
	for _, name := range []string{"holders", "markers", "keys"} {
		if stgTableExists(e, ns, name) {
			e.T.Errorf("lock.New on unmigrated tables created %s", ns.Object(e.Dialect, name))
		}
	}
	// Without the schema check, the first operation reports the missing
	// tables instead of acting.
	l, err := inpNewLocker(e, e.DB, lock.WithSchema(ns.Schema), lock.WithTablePrefix(ns.Prefix), lock.WithoutSchemaCheck(), lock.WithLogger(discard))
	e.Must(err, "lock.New without schema check")
	if le, err := l.TryAcquire(ctx, "i1/k", lock.Exclusive); err == nil {
		_ = le.Release(ctx)
		e.T.Errorf("TryAcquire on tables that do not exist succeeded")
	}
}
