package migrate_test

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"

	"github.com/sqlease/sqlease/conformance/conftest"
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/pgdialect"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// Environment of a child process of TestUpConcurrent*: the DSN, the schema
// and the wall-clock moment (Unix nanoseconds) at which to call Up.
const (
	childDSNEnv    = "SQLEASE_MIGRATE_CHILD_DSN"
	childSchemaEnv = "SQLEASE_MIGRATE_CHILD_SCHEMA"
	childStartEnv  = "SQLEASE_MIGRATE_CHILD_START"
)

// TestUpConcurrentThroughPgBouncer runs migrate.Up from eight processes at
// the same moment, through PgBouncer in transaction pooling mode, on an
// empty schema (SPEC D1). Every process must succeed, every migration must
// be applied exactly once, and no advisory lock may be left on the server:
// the migration lock (pgdialect.MigrationLocker) is a table row, not session
// state that PgBouncer would strand on a pooled server connection.
func TestUpConcurrentThroughPgBouncer(t *testing.T) {
	if os.Getenv(childDSNEnv) != "" {
		migrateChild(t)
		return
	}
	testUpConcurrent(t, conftest.PgBouncerDSN(t), "TestUpConcurrentThroughPgBouncer")
}

// TestUpConcurrentDirect is TestUpConcurrentThroughPgBouncer on a direct
// connection to PostgreSQL.
func TestUpConcurrentDirect(t *testing.T) {
	if os.Getenv(childDSNEnv) != "" {
		migrateChild(t)
		return
	}
	testUpConcurrent(t, conftest.PostgresDSN(t), "TestUpConcurrentDirect")
}

func testUpConcurrent(t *testing.T, dsn, testName string) {
	const procs = 8
	ctx := t.Context()
	b := make([]byte, 6)
	_, _ = crand.Read(b)
	schema := "sqlease_t_" + hex.EncodeToString(b)
	appName := "sqlease_migrate_" + hex.EncodeToString(b)
	childDSN := dsn + sep(dsn) + "application_name=" + appName
	t.Cleanup(func() {
		_ = conftest.DropNamespace("pgx", dsn, "DROP SCHEMA IF EXISTS "+pgdialect.New().QuoteIdent(schema)+" CASCADE")
	})

	start := time.Now().Add(3 * time.Second)
	type child struct {
		cmd *exec.Cmd
		out *bytes.Buffer
	}
	var children []child
	for i := 0; i < procs; i++ {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+testName+"$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(),
			childDSNEnv+"="+childDSN, childSchemaEnv+"="+schema,
			childStartEnv+"="+strconv.FormatInt(start.UnixNano(), 10))
		out := &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatalf("start child %d: %v", i, err)
		}
		children = append(children, child{cmd, out})
	}
	appliedRE := regexp.MustCompile(`(?m)^migrate child: applied (\d+)$`)
	total := 0
	for i, c := range children {
		err := c.cmd.Wait()
		if err != nil {
			t.Errorf("child %d failed: %v\n%s", i, err, c.out.String())
			continue
		}
		m := appliedRE.FindStringSubmatch(c.out.String())
		if m == nil {
			t.Errorf("child %d printed no result:\n%s", i, c.out.String())
			continue
		}
		n, _ := strconv.Atoi(m[1])
		total += n
	}
	if t.Failed() {
		return
	}

	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	d := pgdialect.New()
	ns := dialect.Namespace{Schema: schema}
	current, want, err := migrate.Version(ctx, db, d, migrate.WithNamespace(ns))
	if err != nil || current != want || want < 1 {
		t.Fatalf("after %d concurrent Up: version %d of %d, %v", procs, current, want, err)
	}
	status, err := migrate.Status(ctx, db, d, migrate.WithNamespace(ns))
	if err != nil {
		t.Fatal(err)
	}
	if total != len(status) {
		t.Errorf("the %d processes applied %d migrations in all, want each of the %d exactly once", procs, total, len(status))
	}

	// No advisory lock left on the server: none held by a backend that
	// served the children (PgBouncer passes their application_name on), and
	// none with the key goose's session locker would have used. Other
	// packages' tests may run through the same PgBouncer at the same time,
	// and a server connection keeps the children's application_name while
	// it serves a client that sets none: their transaction-scoped locks come
	// and go, so only a lock present in every one of several samples
	// counts as left behind.
	h := fnv.New64a()
	h.Write([]byte("sqlease:" + ns.VersionTable()))
	key := int64(h.Sum64() >> 1)
	left := map[string]int{}
	const samples = 4
	for i := 0; i < samples; i++ {
		if i > 0 {
			time.Sleep(400 * time.Millisecond)
		}
		rows, err := db.QueryContext(ctx, `SELECT l.pid || ':' || l.classid || ':' || l.objid || ':' || l.objsubid
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory'
  AND (a.application_name = $1 OR ((l.classid::bigint << 32) | l.objid::bigint) = $2)`, appName, key)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			left[id]++
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
	}
	for id, n := range left {
		if n == samples {
			t.Errorf("advisory lock (pid:classid:objid:objsubid) %s held by a backend that served the children, or with the migration key, in all %d samples", id, samples)
		}
	}
	var held int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM `+d.QuoteIdent(schema)+`.sqlease_migration_lock WHERE locked`).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if held != 0 {
		t.Errorf("%d migration lock rows still locked", held)
	}

	// The migrated schema works: a lease through the same DSN, and a
	// further Up is a no-op.
	l, err := lock.New(ctx, db, d, lock.WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	lease, err := l.TryAcquire(ctx, "migrated", lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if applied, err := migrate.Up(ctx, db, d, migrate.WithNamespace(ns)); err != nil || len(applied) != 0 {
		t.Errorf("Up after the concurrent runs: applied %v, %v; want nothing", applied, err)
	}
}

// migrateChild is one process of testUpConcurrent: it waits for the shared
// start moment and runs Up.
func migrateChild(t *testing.T) {
	ctx := t.Context()
	db, err := sql.Open("pgx", os.Getenv(childDSNEnv))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.PingContext(ctx); err != nil {
		t.Fatal(err)
	}
	startNS, err := strconv.ParseInt(os.Getenv(childStartEnv), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(time.Unix(0, startNS)))
	applied, err := migrate.Up(ctx, db, pgdialect.New(), migrate.WithNamespace(dialect.Namespace{Schema: os.Getenv(childSchemaEnv)}))
	if err != nil {
		t.Fatalf("migrate child: %v", err)
	}
	fmt.Printf("migrate child: applied %d\n", len(applied))
}

func sep(dsn string) string {
	if strings.Contains(dsn, "?") {
		return "&"
	}
	return "?"
}

// TestUpNeedsTwoConnections: with a MigrationLocker, goose runs the
// migrations on one connection while the lock uses another, so a pool
// limited to one connection is refused with a clear error instead of
// waiting forever; the same pool with two works.
func TestUpNeedsTwoConnections(t *testing.T) {
	dsn := conftest.PostgresDSN(t)
	ctx := t.Context()
	b := make([]byte, 6)
	_, _ = crand.Read(b)
	schema := "sqlease_t_" + hex.EncodeToString(b)
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	t.Cleanup(func() {
		_ = conftest.DropNamespace("pgx", dsn, "DROP SCHEMA IF EXISTS "+pgdialect.New().QuoteIdent(schema)+" CASCADE")
	})
	ns := migrate.WithNamespace(dialect.Namespace{Schema: schema})
	db.SetMaxOpenConns(1)
	_, err = migrate.Up(ctx, db, pgdialect.New(), ns)
	if err == nil || !strings.Contains(err.Error(), "SetMaxOpenConns(1)") {
		t.Fatalf("Up on a one-connection pool: %v, want an error naming SetMaxOpenConns(1)", err)
	}
	// Reads take no lock: they work on one connection.
	if current, _, err := migrate.Version(ctx, db, pgdialect.New(), ns); err != nil || current != 0 {
		t.Fatalf("Version on a one-connection pool: %d, %v", current, err)
	}
	db.SetMaxOpenConns(2)
	if applied, err := migrate.Up(ctx, db, pgdialect.New(), ns); err != nil || len(applied) == 0 {
		t.Fatalf("Up on a two-connection pool: %v, %v", applied, err)
	}
}
