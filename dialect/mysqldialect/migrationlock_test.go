package mysqldialect_test

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"hash/crc32"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	gooselock "github.com/pressly/goose/v3/lock"

	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/conformance/conftest"
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/mysqldialect"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// openShared opens the shared server's DSN changed by edit (nil: as
// given); the pool is closed at the end of t.
func openShared(t *testing.T, edit func(*mysql.Config)) *sql.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(conftest.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(cfg)
	}
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// freshNamespace returns a namespace with a new database name, dropped
// through db at the end of t (migrate.Up creates it).
func freshNamespace(t *testing.T, db *sql.DB) dialect.Namespace {
	var rnd [5]byte
	_, _ = crand.Read(rnd[:])
	ns := dialect.Namespace{Schema: "sqlease_t_dsn_" + hex.EncodeToString(rnd[:])}
	t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+ns.Schema) })
	return ns
}

// TestDSNOptionsDoNotMatter_MySQL: sqlease needs no DSN option, and the
// driver options that change how results are read do not break it. On a
// pool with each set of options, the dialect is detected, two concurrent
// migrate.Up calls succeed (they queue on the migration lock, SPEC D1), and
// migrate.Status, lock.New and a lease's acquire, renewal and release work.
// parseTime=false is the driver's default, which the migration lock needed
// before it read no DATETIME column.
func TestDSNOptionsDoNotMatter_MySQL(t *testing.T) {
	if conformance.IsChild() {
		t.Skip("child process")
	}
	for name, edit := range map[string]func(*mysql.Config){
		"parseTime=false": func(c *mysql.Config) { c.ParseTime = false },
		"parseTime=true":  func(c *mysql.Config) { c.ParseTime = true },
		"clientFoundRows,interpolateParams,multiStatements": func(c *mysql.Config) {
			c.ClientFoundRows, c.InterpolateParams, c.MultiStatements = true, true, true
		},
		"time_zone=-05:00": func(c *mysql.Config) {
			c.Params = map[string]string{"time_zone": "'-05:00'"}
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dsnOptionsCase(t, openShared(t, edit))
		})
	}
}

func dsnOptionsCase(t *testing.T, db *sql.DB) {
	ctx := t.Context()
	ns := freshNamespace(t, db)
	d, err := dialect.Detect(db)
	if err != nil || d.Name() != mysqldialect.Name {
		t.Fatalf("Detect: %v, %v", d, err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = migrate.Up(ctx, db, d, migrate.WithNamespace(ns))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("migrate.Up %d: %v", i, err)
		}
	}
	st, err := migrate.Status(ctx, db, d, migrate.WithNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		if !s.Applied {
			t.Errorf("migration %s not applied", s.Name)
		}
	}
	l, err := lock.New(ctx, db, d, lock.WithSchema(ns.Schema), lock.WithTTL(time.Second))
	if err != nil {
		t.Fatalf("lock.New: %v", err)
	}
	defer l.Close(context.Background())
	le, err := l.TryAcquire(ctx, "k", lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	exp := le.Expiry()
	if !conformance.Eventually(5*time.Second, func() bool { return le.Expiry().After(exp) }) {
		t.Errorf("lease not renewed within 5 s (expiry %v): %v", exp, le.Err())
	}
	if err := le.Err(); err != nil {
		t.Errorf("lease lost: %v", err)
	}
	if err := le.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestMigrationLockSharedWithGoose_MySQL (SPEC D1): the dialect's
// migration lock and goose's MySQL table locker (which earlier sqlease
// versions use) take the same row, so each waits for the other; and a
// lock whose holder stopped renewing is taken over after its lease.
func TestMigrationLockSharedWithGoose_MySQL(t *testing.T) {
	if conformance.IsChild() {
		t.Skip("child process")
	}
	ctx := t.Context()
	db := openShared(t, func(c *mysql.Config) { c.ParseTime = true }) // goose's locker needs it
	ns := freshNamespace(t, db)
	d := mysqldialect.New()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE "+ns.Schema); err != nil {
		t.Fatal(err)
	}
	ours, err := d.MigrationLocker(ns)
	if err != nil {
		t.Fatal(err)
	}
	table := strings.TrimSuffix(ns.VersionTable(), "db_version") + d.MigrationLockTable()
	// The lock ID earlier versions used: crc32 of "sqlease:" + table.
	goose, err := gooselock.NewMySQLTableLocker(
		gooselock.WithTableName(table),
		gooselock.WithTableLockID(int64(crc32.ChecksumIEEE([]byte("sqlease:"+table)))),
		gooselock.WithTableLeaseDuration(10*time.Second),
		gooselock.WithTableLockTimeout(100*time.Millisecond, 5),
		gooselock.WithTableUnlockTimeout(100*time.Millisecond, 5),
	)
	if err != nil {
		t.Fatal(err)
	}
	short := func() context.Context {
		c, cancel := context.WithTimeout(ctx, time.Second)
		t.Cleanup(cancel)
		return c
	}
	if err := ours.Lock(ctx, db); err != nil {
		t.Fatal(err)
	}
	if err := goose.Lock(short(), db); err == nil {
		t.Fatal("goose's locker took the lock while ours held it")
	}
	if err := ours.Unlock(ctx, db); err != nil {
		t.Fatal(err)
	}
	if err := goose.Lock(ctx, db); err != nil {
		t.Fatalf("goose's locker after ours was released: %v", err)
	}
	if err := ours.Lock(short(), db); err == nil {
		t.Fatal("our locker took the lock while goose's held it")
	}
	if err := goose.Unlock(ctx, db); err != nil {
		t.Fatal(err)
	}
	if err := ours.Lock(ctx, db); err != nil {
		t.Fatalf("our locker after goose's was released: %v", err)
	}
	if err := ours.Unlock(ctx, db); err != nil {
		t.Fatal(err)
	}
	// A holder that stopped renewing: its lease ended a second ago.
	if _, err := db.ExecContext(ctx, "UPDATE "+ns.Object(d, d.MigrationLockTable())+
		" SET locked = true, locked_by = 'crashed', lease_expires_at = now(6) - INTERVAL 1 SECOND"); err != nil {
		t.Fatal(err)
	}
	if err := ours.Lock(short(), db); err != nil {
		t.Fatalf("lock whose holder's lease ended not taken over: %v", err)
	}
	if err := ours.Unlock(ctx, db); err != nil {
		t.Fatal(err)
	}
}
