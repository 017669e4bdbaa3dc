package conformance

import (
	"errors"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// Case for SPEC D1 (migrations): uninstalling with migrate.Drop.

func init() {
	register(Case{Name: "D1_DropLeavesNothingAndUpStartsAfresh", Rule: "D1", Run: d1DropLeavesNothing})
}

// d1DropLeavesNothing: migrate.Drop reverts every applied migration, drops
// the version table and the migration lock's table, and takes every lease
// with it; afterwards a Locker refuses to start (not migrated) and a fresh
// Up installs the namespace again, where the old lease no longer exists.
func d1DropLeavesNothing(e *Env) {
	ctx := e.Ctx()
	opt := migrate.WithNamespace(e.Namespace)
	st, err := migrate.Status(ctx, e.DB, e.Dialect, opt)
	e.Must(err, "migrate status")
	l, err := e.TryNewLocker(nil)
	e.Must(err, "new locker")
	if _, err := l.TryAcquire(ctx, "d1/drop", lock.Exclusive); err != nil {
		e.T.Fatalf("acquire: %v", err)
	}
	// The holder stops without releasing: Drop takes its lease with it.
	l.Close(ctx)

	reverted, err := migrate.Drop(ctx, e.DB, e.Dialect, opt)
	e.Must(err, "drop")
	e.Check(len(reverted) == len(st) && (len(st) <= 0 || reverted[0] == st[len(st)-1].Name), "drop reverted %v; want all %d migrations, newest first", reverted, len(st))
	for _, name := range migrate.DropTables(e.Dialect) {
		obj := e.Namespace.Object(e.Dialect, name)
		rows, err := e.DB.QueryContext(ctx, "SELECT 1 FROM "+obj+" WHERE 1 = 0")
		if err == nil {
			rows.Close()
			e.T.Errorf("table %s is left after drop", obj)
		} else if c := e.Dialect.Classify(err); c != dialect.ErrorUndefinedTable {
			e.T.Errorf("probe %s after drop: %v (class %v), want an undefined table", obj, err, c)
		}
	}
	if cur, _, err := migrate.Version(ctx, e.DB, e.Dialect, opt); err != nil || cur != 0 {
		e.T.Errorf("version after drop = %d, %v; want 0", cur, err)
	}
	if _, err := e.TryNewLocker(nil); !errors.Is(err, lock.ErrSchemaNotMigrated) {
		e.T.Errorf("new locker after drop: %v; want ErrSchemaNotMigrated", err)
	}

	applied, err := migrate.Up(ctx, e.DB, e.Dialect, opt)
	e.Require(err == nil && len(applied) == len(st), "up after drop = %v, %v; want all %d migrations", applied, err, len(st))
	l2 := e.NewLocker(nil)
	le, err := l2.TryAcquire(ctx, "d1/drop", lock.Exclusive)
	e.Require(err == nil, "acquire after drop and up: %v (the dropped lease is still there?)", err)
	if err := le.Release(ctx); err != nil {
		e.T.Errorf("release: %v", err)
	}
}
