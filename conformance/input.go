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
