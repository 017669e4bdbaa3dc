package gooselock_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/sqlease/sqlease/gooselock"
	"github.com/sqlease/sqlease/internal/testnote"
)

// Environment of a child migrator (see startChild): its backend, DSN and
// schema, how long migration 00002 sleeps, and the wall-clock moment (Unix
// nanoseconds) at which it calls Provider.Up.
const (
	childEnv       = "SQLEASE_GOOSELOCK_CHILD"
	childDSNEnv    = "SQLEASE_GOOSELOCK_DSN"
	childSchemaEnv = "SQLEASE_GOOSELOCK_SCHEMA"
	childSleepEnv  = "SQLEASE_GOOSELOCK_SLEEP"
	childStartEnv  = "SQLEASE_GOOSELOCK_START"
)

// childTTL is the lease TTL of every migrator in these tests.
const childTTL = time.Second

// TestMain says, in one line, when the PostgreSQL or MySQL tests are
// skipped; in a child migrator it runs the migrator instead of the tests.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	testnote.Skipped("sqlease/gooselock", testnote.PostgreSQL, testnote.MySQL)
	os.Exit(m.Run())
}

// runChild is one migrator process: it runs Provider.Up through a
// gooselock.Locker and prints "migrating 2" when migration 00002 starts and
// "applied N" at the end.
func runChild() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "gooselock child:", err); return 1 }
	b := backend{name: os.Getenv(childEnv), dsn: os.Getenv(childDSNEnv), schema: os.Getenv(childSchemaEnv)}
	b.driver, b.d = driverOf(b.name)
	pause, err := time.ParseDuration(os.Getenv(childSleepEnv))
	if err != nil {
		return fail(err)
	}
	startNS, err := strconv.ParseInt(os.Getenv(childStartEnv), 10, 64)
	if err != nil {
		return fail(err)
	}
	db, err := sql.Open(b.driver, b.dsn)
	if err != nil {
		return fail(err)
	}
	defer db.Close()
	locker, err := gooselock.New(b.d, gooselock.WithTTL(childTTL), gooselock.WithNamespace(b.ns()),
		gooselock.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, nil))))
	if err != nil {
		return fail(err)
	}
	m := b.migrations(func(ctx context.Context, tx *sql.Tx) error {
		fmt.Println("gooselock child: migrating 2")
		return sleep(pause)(ctx, tx)
	})
	p, err := newProvider(b, db, locker, m)
	if err != nil {
		return fail(err)
	}
	time.Sleep(time.Until(time.Unix(0, startNS)))
	res, err := p.Up(context.Background())
	if err != nil {
		return fail(err)
	}
	fmt.Printf("gooselock child: applied %d\n", len(res))
	return 0
}
