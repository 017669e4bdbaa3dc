package conformance

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// Storage (docs/contract.md): migrations and uninstall (D1).
func init() {
	register(
		Case{Name: "D1_MigrateUpIsIdempotent", Rule: "D1", Run: d1MigrateUpIsIdempotent},
		Case{Name: "D1_UnmigratedLockerFailsAndWritesNothing", Rule: "D1", Run: d1UnmigratedLocker},
		Case{Name: "D1_ConcurrentMigrateOnEmptyNamespace", Rule: "D1", Run: d1ConcurrentMigrate},
		Case{Name: "D1_DropLeavesNothingAndUpStartsAfresh", Rule: "D1", Run: d1DropLeavesNothing},
	)
	childRoles[stgMigrateRole] = stgMigrateChild
}

// --- D1 -------------------------------------------------------------------

const stgMigrateRole = "d1-migrate"

// stgMigrateChild runs migrate.Up at the moment given in Extra["at"] (Unix
// nanoseconds) on spec.Namespace.
func stgMigrateChild(ctx context.Context, db *sql.DB, d dialect.Dialect, spec StressSpec) error {
	at, err := strconv.ParseInt(spec.Extra["at"], 10, 64)
	if err != nil {
		return fmt.Errorf("bad start time: %w", err)
	}
	if err := db.PingContext(ctx); err != nil {
		return err
	}
	late := time.Since(time.Unix(0, at))
	time.Sleep(time.Until(time.Unix(0, at)))
	applied, err := migrate.Up(ctx, db, d, migrate.WithNamespace(spec.Namespace))
	if err != nil {
		return fmt.Errorf("migrate.Up (started %s late): %w", max(late, 0), err)
	}
	fmt.Printf("applied %q\n", applied)
	return nil
}

// stgTableExists reports whether the table called ns.Object(d, name)
// exists, by selecting from it.
func stgTableExists(e *Env, ns dialect.Namespace, name string) bool {
	e.T.Helper()
	rows, err := e.DB.QueryContext(e.Ctx(), "SELECT 1 FROM "+ns.Object(e.Dialect, name)+" WHERE 1 = 0")
	if err == nil {
		rows.Close()
		return true
	}
	if e.Dialect.Classify(err) == dialect.ErrorUndefinedTable {
		return false
	}
	e.T.Fatalf("probe %s: %v", ns.Object(e.Dialect, name), err)
	return false
}

// stgCheckMigrated checks that ns is migrated to the latest version and
// Status reports every migration applied.
func stgCheckMigrated(e *Env, ns dialect.Namespace) {
	e.T.Helper()
	ctx := e.Ctx()
	cur, want, err := migrate.Version(ctx, e.DB, e.Dialect, migrate.WithNamespace(ns))
	e.Check(err == nil && want >= 1 && cur == want, "version of %+v: current %d want %d, %v", ns, cur, want, err)
	st, err := migrate.Status(ctx, e.DB, e.Dialect, migrate.WithNamespace(ns))
	e.Must(err, "status")
	e.Check(len(st) != 0, "status lists no migration")
	for _, s := range st {
		e.Check(s.Applied && s.Version >= 1 && strings.HasSuffix(s.Name, ".sql"), "status: %+v, want an applied .sql migration", s)
	}
	if !stgTableExists(e, ns, "db_version") {
		e.T.Errorf("version table %s does not exist", ns.Object(e.Dialect, "db_version"))
	}
	// Each migration is recorded once in the version table (goose's
	// version_id column), however many callers raced to apply it.
	for _, s := range st {
		var n int
		q := "SELECT count(*) FROM " + ns.Object(e.Dialect, "db_version") + " WHERE version_id = " + e.Dialect.Placeholder(1)
		if err := e.DB.QueryRowContext(ctx, q, s.Version).Scan(&n); err != nil || n != 1 {
			e.T.Errorf("version %d is recorded %d times in %s (%v), want once", s.Version, n, ns.Object(e.Dialect, "db_version"), err)
		}
	}
	// Migrations never touch the application's goose table (unless it was
	// there before the case migrated: a schema the application shares).
	goose := dialect.Namespace{Schema: ns.Schema, Prefix: "goose_"}
	if !e.gooseBefore && stgTableExists(e, goose, "db_version") {
		e.T.Errorf("%s exists: migrations must use their own version table", goose.Object(e.Dialect, "db_version"))
	}
}

// d1MigrateUpIsIdempotent: the case's namespace is migrated; running Up
// again applies nothing and changes nothing.
func d1MigrateUpIsIdempotent(e *Env) {
	ctx := e.Ctx()
	l := e.NewLocker(nil)
	le := e.MustTryAcquire(l, "d1/k", lock.Exclusive)
	for i := 0; i < 3; i++ {
		applied, err := migrate.Up(ctx, e.DB, e.Dialect, migrate.WithNamespace(e.Namespace))
		e.Check(err == nil && len(applied) == 0, "migrate.Up #%d on a migrated namespace: applied %q, %v; want nothing, nil", i+2, applied, err)
	}
	stgCheckMigrated(e, e.Namespace)
	if hs := keyHolders(e, l, "d1/k"); len(hs) != 1 || hs[0].Token != le.Token() {
		e.T.Errorf("the lease should survive migrate.Up, the database has %v", hs)
	}
	e.CheckErr(le.Renew(ctx), "renew after migrate.Up")
	e.CheckErr(le.Release(ctx), "release")
}

// stgNewLockerIn builds a Locker in ns with the Config's constructor.
func stgNewLockerIn(e *Env, ns dialect.Namespace, opts ...lock.Option) (*lock.Locker, error) {
	newLocker := e.Config.NewLocker
	if newLocker == nil {
		newLocker = lock.New
	}
	opts = append([]lock.Option{lock.WithSchema(ns.Schema), lock.WithTablePrefix(ns.Prefix), lock.WithLogger(e.Logger)}, opts...)
	l, err := newLocker(e.Ctx(), e.DB, e.Dialect, opts...)
	if err == nil {
		e.T.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = l.Close(ctx)
		})
	}
	return l, err
}

// d1UnmigratedLocker: on a namespace never migrated, a Locker refuses to
// start (ErrSchemaNotMigrated, saying how to migrate) and writes nothing;
// reading the version or the status writes nothing either.
func d1UnmigratedLocker(e *Env) {
	ctx := e.Ctx()
	ns := e.SubNamespace("d1_")
	_, err := stgNewLockerIn(e, ns)
	var se *lock.SchemaError
	if !errors.Is(err, lock.ErrSchemaNotMigrated) || !errors.As(err, &se) {
		e.T.Fatalf("lock.New on an unmigrated namespace: want *SchemaError matching ErrSchemaNotMigrated, got %v", err)
	}
	e.Check(se.Current == 0 && se.Want >= 1 && se.Table == ns.VersionTable() && strings.HasSuffix(se.Table, "d1_db_version"), "schema error: %+v; want current 0, want >= 1, table %q", se, ns.VersionTable())
	for _, s := range []string{"migrate.Up", "sqlease migrate", ns.VersionTable()} {
		e.Check(strings.Contains(err.Error(), s), "schema error %q should mention %q", err, s)
	}
	for _, name := range []string{"db_version", "holders"} {
		if stgTableExists(e, ns, name) {
			e.T.Errorf("lock.New on an unmigrated namespace created %s; it must write nothing", ns.Object(e.Dialect, name))
		}
	}
	// Reading the version and the status writes nothing either (checked on
	// another namespace, untouched by lock.New).
	ns = e.SubNamespace("d1v_")
	if cur, _, err := migrate.Version(ctx, e.DB, e.Dialect, migrate.WithNamespace(ns)); err != nil || cur != 0 {
		e.T.Errorf("version of the unmigrated namespace: %d, %v", cur, err)
	}
	if st, err := migrate.Status(ctx, e.DB, e.Dialect, migrate.WithNamespace(ns)); err != nil || len(st) == 0 || st[0].Applied {
		e.T.Errorf("status of the unmigrated namespace: %+v, %v", st, err)
	}
	for _, name := range []string{"db_version", "holders"} {
		if stgTableExists(e, ns, name) {
			e.T.Errorf("migrate.Version or migrate.Status on an unmigrated namespace created %s; they must write nothing", ns.Object(e.Dialect, name))
		}
	}
}

// d1ConcurrentMigrate: several goroutines and two processes run migrate.Up
// at the same moment on a namespace nothing has touched, and all succeed;
// each migration is recorded once; the namespace then works.
func d1ConcurrentMigrate(e *Env) {
	ctx := e.Ctx()
	// Everyone migrates at once, on a namespace nothing has touched yet.
	ns := e.SubNamespace("d1race_")
	e.Require(!stgTableExists(e, ns, "db_version"), "the namespace should be empty")
	at := time.Now().Add(1500 * time.Millisecond)
	wait := SpawnChildren(e, 2, StressSpec{
		Role: stgMigrateRole, Extra: map[string]string{"at": strconv.FormatInt(at.UnixNano(), 10)},
		Dialect: e.Dialect.Name(), Driver: e.Config.DriverName, DSN: e.DSN, Namespace: ns,
	})
	const goroutines = 6
	var wg sync.WaitGroup
	var mu sync.Mutex
	var applied []string
	for i := 0; i < goroutines; i++ {
		db := e.OpenDB()
		e.Go(&wg, func() {
			time.Sleep(time.Until(at))
			names, err := migrate.Up(ctx, db, e.Dialect, migrate.WithNamespace(ns))
			e.Check(err == nil, "concurrent migrate.Up #%d: %v", i, err)
			mu.Lock()
			applied = append(applied, names...)
			mu.Unlock()
		})
	}
	wg.Wait()
	e.CheckErr(wait(), "migrate.Up in a child process")
	seen := map[string]int{}
	for _, n := range applied {
		seen[n]++
		if seen[n] > 1 {
			e.T.Errorf("migration %s applied %d times", n, seen[n])
		}
	}
	e.T.Logf("in-process callers applied %q", applied)
	stgCheckMigrated(e, ns)
	if again, err := migrate.Up(ctx, e.DB, e.Dialect, migrate.WithNamespace(ns)); err != nil || len(again) != 0 {
		e.T.Errorf("migrate.Up after the race: applied %q, %v", again, err)
	}

	// The new namespace works, independently of the case's namespace.
	l, err := stgNewLockerIn(e, ns)
	e.Must(err, "lock.New after migrating")
	le := e.MustTryAcquire(l, "d1/k", lock.Exclusive)
	if _, err := e.NewLocker(nil).TryAcquire(ctx, "d1/k", lock.Exclusive); err != nil {
		e.T.Errorf("the same key in another namespace should be independent: %v", err)
	}
	e.CheckErr(le.Release(ctx), "release")
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
	e.CheckErr(le.Release(ctx), "release")
}
