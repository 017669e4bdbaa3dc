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
	"github.com/sqlease/sqlease/migrate"
)

// Cases for SPEC D3 (identifiers and keys) and I1 (bad input).

func init() {
	register(
		Case{Name: "D3_BadSchemaAndPrefixRejected", Rule: "D3", Run: d3BadSchemaAndPrefixRejected},
		Case{Name: "D3_KeysAreBoundAndByteExact", Rule: "D3", Run: d3KeysAreBoundAndByteExact},
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
	if ie.Field != field {
		e.T.Errorf("%s: error names field %q, want %q (%v)", what, ie.Field, field, err)
	}
	if !strings.Contains(ie.Value, value) {
		e.T.Errorf("%s: error value %q should show %q", what, ie.Value, value)
	}
	if ie.Allowed == "" || !strings.Contains(err.Error(), ie.Allowed) || !strings.Contains(err.Error(), ie.Value) {
		e.T.Errorf("%s: message %q should name the value %q and what is allowed (%q)", what, err, ie.Value, ie.Allowed)
	}
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
	if input && !errors.Is(err, lock.ErrInvalidInput) {
		e.T.Errorf("%s: want an error also matching lock.ErrInvalidInput, got %v", what, err)
	}
	if !strings.Contains(err.Error(), value) && !strings.Contains(err.Error(), strconv.Quote(value)) {
		e.T.Errorf("%s: message %q should name the value %q", what, err, value)
	}
}

// d3BadSchemaAndPrefixRejected: bad schema names and prefixes are refused
// by lock.New and by migrate (Up, Status, Version, FS) before any SQL runs.
func d3BadSchemaAndPrefixRejected(e *Env) {
	ctx := e.Ctx()
	l := e.NewLocker(nil)
	rows := stgRowCount(e, l)
	stmts := e.Faults.Count("")
	bad := []string{"Bad-Name", "x;drop", "1abc", strings.Repeat("a", dialect.MaxIdentifierLength+1), "ABC", "a b", `a"b`, "a.b", "é", "x'--"}
	for _, v := range bad {
		_, err := inpNewLocker(e, e.DB, lock.WithTablePrefix(v))
		inpWantName(e, fmt.Sprintf("lock.New with prefix %q", v), err, v, true)
		_, err = inpNewLocker(e, e.DB, lock.WithSchema(v))
		inpWantName(e, fmt.Sprintf("lock.New with schema %q", v), err, v, true)
		for _, ns := range []dialect.Namespace{{Prefix: v}, {Schema: v}} {
			_, err = migrate.Up(ctx, e.DB, e.Dialect, migrate.WithNamespace(ns))
			inpWantName(e, fmt.Sprintf("migrate.Up with %+v", ns), err, v, true)
			_, err = migrate.Status(ctx, e.DB, e.Dialect, migrate.WithNamespace(ns))
			inpWantName(e, fmt.Sprintf("migrate.Status with %+v", ns), err, v, true)
			_, _, err = migrate.Version(ctx, e.DB, e.Dialect, migrate.WithNamespace(ns))
			inpWantName(e, fmt.Sprintf("migrate.Version with %+v", ns), err, v, true)
			_, err = migrate.FS(e.Dialect, migrate.WithNamespace(ns))
			inpWantName(e, fmt.Sprintf("migrate.FS with %+v", ns), err, v, true)
		}
	}
	// A database's own catalogs are refused as schemas on every dialect,
	// with the same error, before anything is written.
	for _, v := range []string{"information_schema", "pg_catalog", "pg_toast", "mysql", "sys", "performance_schema"} {
		_, err := inpNewLocker(e, e.DB, lock.WithSchema(v))
		inpWantName(e, fmt.Sprintf("lock.New with schema %q", v), err, v, true)
		ns := dialect.Namespace{Schema: v}
		_, err = migrate.Up(ctx, e.DB, e.Dialect, migrate.WithNamespace(ns))
		inpWantName(e, fmt.Sprintf("migrate.Up with %+v", ns), err, v, true)
		if err != nil && !strings.Contains(err.Error(), "reserved") {
			e.T.Errorf("migrate.Up with %+v = %v; want it to say the schema is reserved", ns, err)
		}
		_, err = migrate.FS(e.Dialect, migrate.WithNamespace(ns))
		inpWantName(e, fmt.Sprintf("migrate.FS with %+v", ns), err, v, true)
	}
	if n := e.Faults.Count("") - stmts; n != 0 {
		e.T.Errorf("bad identifiers were rejected only after %d statements reached the database; they must be rejected before", n)
	}
	if got := stgRowCount(e, l); got != rows {
		e.T.Errorf("row count changed from %d to %d", rows, got)
	}
	// The longest allowed prefix works end to end (migrated, then used).
	ns := e.SubNamespace(strings.Repeat("p", max(0, dialect.MaxIdentifierLength-len(e.Namespace.Prefix)-1)) + "_")
	if _, err := migrate.Up(ctx, e.DB, e.Dialect, migrate.WithNamespace(ns)); err != nil {
		e.T.Fatalf("migrate.Up with a %d-byte prefix: %v", len(ns.Prefix), err)
	}
	long, err := inpNewLocker(e, e.DB, lock.WithSchema(ns.Schema), lock.WithTablePrefix(ns.Prefix))
	if err != nil {
		e.T.Fatalf("lock.New with a %d-byte prefix: %v", len(ns.Prefix), err)
	}
	le, err := long.TryAcquire(ctx, "d3/k", lock.Exclusive)
	if err != nil {
		e.T.Fatalf("acquire with a %d-byte prefix: %v", len(ns.Prefix), err)
	}
	// A writer waits for the key (so that a release has someone to wake),
	// then the holder releases and the writer is granted.
	waiter, err := inpNewLocker(e, e.DB, lock.WithSchema(ns.Schema), lock.WithTablePrefix(ns.Prefix), lock.WithLogger(e.Logger))
	if err != nil {
		e.T.Fatalf("lock.New with a %d-byte prefix: %v", len(ns.Prefix), err)
	}
	granted := make(chan error, 1)
	go func() {
		w, err := waiter.Acquire(ctx, "d3/k", lock.Exclusive, lock.WaitTimeout(10*time.Second))
		if err == nil {
			err = w.Release(ctx)
		}
		granted <- err
	}()
	if !Eventually(5*time.Second, func() bool { return len(stgHolders(e, long, "d3/k")) == 2 }) {
		e.T.Errorf("the waiting writer left no marker: %v", stgHolders(e, long, "d3/k"))
	}
	if err := le.Release(ctx); err != nil {
		e.T.Errorf("release with a %d-byte prefix while a writer waits: %v", len(ns.Prefix), err)
	}
	if err := <-granted; err != nil {
		e.T.Errorf("the waiting writer with a %d-byte prefix: %v", len(ns.Prefix), err)
	}
}

// d3KeysAreBoundAndByteExact: keys full of SQL metacharacters are plain keys;
// keys are compared byte for byte (Key and key, a and "a " are four keys);
// prefix listing treats % and _ literally.
func d3KeysAreBoundAndByteExact(e *Env) {
	ctx := e.Ctx()
	victim := e.Table("victim")
	if _, err := e.DB.ExecContext(ctx, "CREATE TABLE "+victim+" (x INTEGER)"); err != nil {
		e.T.Fatalf("create table: %v", err)
	}
	holders := e.Namespace.Object(e.Dialect, "holders")
	keys := []string{
		"'; DROP TABLE " + victim + "; --",
		"'); DROP TABLE " + holders + "; --",
		`" OR 1=1 --`,
		`\'; SELECT 1; --`,
		`back\slash`, `back\\slash`, `\`,
		"%", "_", "a%", "a_", "ab", "aXb", "a%b", "a_b",
		"K", "k", "Key", "key", "a", "a ", // a collation would fold case or pad spaces
		"\u00e9", "e\u0301", // é precomposed and decomposed
		"$1", "?1", "?", "@key", "@key_prefix", "{holders}", ":key",
		"/* c */", "--", ";", "\t\n\r", " ", "  ", "\u2028",
		"*", "[a-z]", "^a$", "NULL", "null",
		strings.Repeat("'", lock.MaxKeyLength),
	}
	a := e.NewLocker(nil)
	b := e.NewLocker(nil)
	leases := map[string]*lock.Lease{}
	for _, k := range keys {
		le, err := a.TryAcquire(ctx, k, lock.Exclusive)
		if err != nil {
			e.T.Errorf("acquire %q: %v", k, err)
			continue
		}
		if le.Key() != k {
			e.T.Errorf("lease key %q, want %q", le.Key(), k)
		}
		leases[k] = le
	}
	// Every key is held exactly once, exclusively, under its exact bytes.
	all, _, err := a.Holders(ctx, "")
	if err != nil {
		e.T.Fatalf("holders: %v", err)
	}
	seen := map[string]int{}
	for _, h := range all {
		seen[h.Key]++
		if le := leases[h.Key]; le == nil || le.LeaseID() != h.LeaseID {
			e.T.Errorf("listing has %q (%s) which no lease of this case has under that exact key", h.Key, h.LeaseID)
		}
	}
	for _, k := range keys {
		if seen[k] != 1 {
			e.T.Errorf("key %q listed %d times, want once", k, seen[k])
		}
		if _, err := b.TryAcquire(ctx, k, lock.Shared); !errors.Is(err, lock.ErrLocked) {
			e.T.Errorf("shared %q by another Locker while held exclusively: want ErrLocked, got %v", k, err)
		}
	}
	// Prefix listing: % and _ (and \) are literal characters.
	for prefix, want := range map[string][]string{
		"a%":    {"a%", "a%b"},
		"a_":    {"a_", "a_b"},
		"%":     {"%"},
		"_":     {"_"},
		`back\`: {`back\slash`, `back\\slash`},
		`\`:     {`\`, `\'; SELECT 1; --`},
		"e":     {"e\u0301"},
		"K":     {"K", "Key"},
		"a ":    {"a "},
		"'; ":   {keys[0]},
	} {
		hs, _, err := a.Holders(ctx, prefix)
		if err != nil {
			e.T.Fatalf("holders %q: %v", prefix, err)
		}
		var got []string
		for _, h := range hs {
			got = append(got, h.Key)
		}
		if strings.Join(got, "\x00") != strings.Join(want, "\x00") && !sameSet(got, want) {
			e.T.Errorf("holders with prefix %q: got %q, want %q", prefix, got, want)
		}
	}
	// Release all; the injected statements did nothing.
	for k, le := range leases {
		if err := le.Release(ctx); err != nil {
			e.T.Errorf("release %q: %v", k, err)
		}
	}
	if _, err := e.DB.ExecContext(ctx, "INSERT INTO "+victim+" (x) VALUES (1)"); err != nil {
		e.T.Errorf("the case's table is damaged: %v", err)
	}
	if n := stgRowCount(e, a); n != 0 {
		e.T.Errorf("%d rows left after releasing every key", n)
	}
	// Pairs that differ only by case, normalization or a LIKE wildcard are
	// independent keys: both held exclusively at once by two Lockers.
	for _, pair := range [][2]string{{"a%", "ab"}, {"a_", "ab"}, {"K", "k"}, {"\u00e9", "e\u0301"}, {"%", "x"}, {"ß", "ss"}, {"İ", "i"}} {
		x, err := a.TryAcquire(ctx, pair[0], lock.Exclusive)
		if err != nil {
			e.T.Fatalf("acquire %q: %v", pair[0], err)
		}
		y, err := b.TryAcquire(ctx, pair[1], lock.Exclusive)
		if err != nil {
			e.T.Errorf("%q is held; %q must be an independent key: %v", pair[0], pair[1], err)
		} else {
			_ = y.Release(ctx)
		}
		_ = x.Release(ctx)
	}
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]int{}
	for _, s := range a {
		m[s]++
	}
	for _, s := range b {
		m[s]--
	}
	for _, n := range m {
		if n != 0 {
			return false
		}
	}
	return true
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
	held, err := other.TryAcquire(ctx, "i1/held", lock.Shared)
	if err != nil {
		e.T.Fatalf("%v", err)
	}
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
	if err := lock.CheckKey(strings.Repeat("k", lock.MaxKeyLength)); err != nil {
		e.T.Errorf("a key of exactly MaxKeyLength bytes is allowed: %v", err)
	}
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
	_, err = l.TryAcquire(nilCtx, "i1/ctx", lock.Exclusive)
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
	le, err := l.TryAcquire(ctx, "i1/lease", lock.Exclusive)
	if err != nil {
		e.T.Fatalf("%v", err)
	}
	err = le.Fence(ctx, nil)
	inpWantInput(e, "Fence with a nil transaction", err, "transaction", "nil")
	err = le.RunInTx(ctx, nil, nil, func(context.Context, *sql.Tx) error { return nil })
	inpWantInput(e, "RunInTx with a nil database", err, "database", "nil")
	err = le.RunInTx(ctx, e.DB, nil, nil)
	inpWantInput(e, "RunInTx with a nil function", err, "function", "nil")
	if err := le.Err(); err != nil {
		e.T.Errorf("bad arguments ended the lease: %v", err)
	}
	if err := le.Release(ctx); err != nil {
		e.T.Errorf("release: %v", err)
	}
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
		if err != nil && (!strings.Contains(err.Error(), lock.MinTTL.String()) || !strings.Contains(err.Error(), lock.MaxTTL.String())) {
			e.T.Errorf("WithTTL(%s): the message should state the range %s..%s: %v", ttl, lock.MinTTL, lock.MaxTTL, err)
		}
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
		if !strings.Contains(err.Error(), fmt.Sprintf("%q", name)) {
			e.T.Errorf("Lookup(%q): message %q should name the value", name, err)
		}
		for _, n := range dialect.Names() {
			if !strings.Contains(err.Error(), n) {
				e.T.Errorf("Lookup(%q): message %q should list registered dialect %q", name, err, n)
			}
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
	if se.Current != 0 || se.Want < 1 || se.Dialect != e.Dialect.Name() || se.Table != ns.VersionTable() {
		e.T.Errorf("schema error %+v: want current 0, want >= 1, dialect %q, table %q", se, e.Dialect.Name(), ns.VersionTable())
	}
	for _, s := range []string{"migrate.Up", "sqlease migrate"} {
		if !strings.Contains(err.Error(), s) {
			e.T.Errorf("schema error %q should say to run %s", err, s)
		}
	}
	for _, name := range []string{"holders", "markers", "keys"} {
		if stgTableExists(e, ns, name) {
			e.T.Errorf("lock.New on unmigrated tables created %s", ns.Object(e.Dialect, name))
		}
	}
	// Without the schema check, the first operation reports the missing
	// tables instead of acting.
	l, err := inpNewLocker(e, e.DB, lock.WithSchema(ns.Schema), lock.WithTablePrefix(ns.Prefix), lock.WithoutSchemaCheck(), lock.WithLogger(discard))
	if err != nil {
		e.T.Fatalf("lock.New without schema check: %v", err)
	}
	if le, err := l.TryAcquire(ctx, "i1/k", lock.Exclusive); err == nil {
		_ = le.Release(ctx)
		e.T.Errorf("TryAcquire on tables that do not exist succeeded")
	}
}
