package conformance

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// Storage (docs/contract.md): schema, prefix and key names (D3).
func init() {
	register(
		Case{Name: "D3_BadSchemaAndPrefixRejected", Rule: "D3", Run: d3BadSchemaAndPrefixRejected},
		Case{Name: "D3_KeysAreBoundAndByteExact", Rule: "D3", Run: d3KeysAreBoundAndByteExact},
	)
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
		e.Check(err == nil || strings.Contains(err.Error(), "reserved"), "migrate.Up with %+v = %v; want it to say the schema is reserved", ns, err)
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
	e.Must(err, "lock.New with a %d-byte prefix", len(ns.Prefix))
	le := e.MustTryAcquire(long, "d3/k", lock.Exclusive)
	// A writer waits for the key (so that a release has someone to wake),
	// then the holder releases and the writer is granted.
	waiter, err := inpNewLocker(e, e.DB, lock.WithSchema(ns.Schema), lock.WithTablePrefix(ns.Prefix), lock.WithLogger(e.Logger))
	e.Must(err, "lock.New with a %d-byte prefix", len(ns.Prefix))
	granted := make(chan error, 1)
	go func() {
		w, err := waiter.Acquire(ctx, "d3/k", lock.Exclusive, lock.WaitTimeout(10*time.Second))
		if err == nil {
			err = w.Release(ctx)
		}
		granted <- err
	}()
	if !Eventually(5*time.Second, func() bool { return len(keyHolders(e, long, "d3/k")) == 2 }) {
		e.T.Errorf("the waiting writer left no marker: %v", keyHolders(e, long, "d3/k"))
	}
	e.CheckErr(le.Release(ctx), "release with a %d-byte prefix while a writer waits", len(ns.Prefix))
	e.CheckErr(<-granted, "the waiting writer with a %d-byte prefix", len(ns.Prefix))
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
		e.Check(le.Key() == k, "lease key %q, want %q", le.Key(), k)
		leases[k] = le
	}
	// Every key is held exactly once, exclusively, under its exact bytes.
	all, _, err := a.Holders(ctx, "")
	e.Must(err, "holders")
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
		e.Must(err, "holders %q", prefix)
		var got []string
		for _, h := range hs {
			got = append(got, h.Key)
		}
		e.Check(strings.Join(got, "\x00") == strings.Join(want, "\x00") || sameSet(got, want), "holders with prefix %q: got %q, want %q", prefix, got, want)
	}
	// Release all; the injected statements did nothing.
	for k, le := range leases {
		e.CheckErr(le.Release(ctx), "release %q", k)
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
