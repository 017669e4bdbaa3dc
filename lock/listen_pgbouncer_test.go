package lock_test

import (
	"bufio"
	"bytes"
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"

	"github.com/sqlease/sqlease/conformance/conftest"
	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/pgdialect"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// Environment of the holder child process of the wake-up tests.
const (
	holderDSNEnv    = "SQLEASE_LOCK_HOLDER_DSN"
	holderSchemaEnv = "SQLEASE_LOCK_HOLDER_SCHEMA"
)

// TestWaitBehindPgBouncerPolls: a Locker whose only pool goes through
// PgBouncer in transaction mode cannot hear notifications. Its listener
// must find that out (one warning) instead of listening in vain, and a
// release in another process must reach the waiter by polling within
// WithMaxBackoff (500 ms by default) plus a round trip, although
// WithNotifyPollInterval (the slow poll used while push wake-ups work) is
// 20 s here (SPEC W2).
func TestWaitBehindPgBouncerPolls(t *testing.T) {
	if os.Getenv(holderDSNEnv) != "" {
		holderChild(t)
		return
	}
	pgb := conftest.PgBouncerDSN(t)
	latency, logs := handoff(t, "TestWaitBehindPgBouncerPolls", pgb, 4*time.Second,
		lock.WithNotifyPollInterval(20*time.Second))
	if !strings.Contains(logs, "push wake-ups unavailable") {
		t.Errorf("no warning that push wake-ups are unavailable behind PgBouncer; logs:\n%s", logs)
	}
	// Bound: one max backoff (500 ms) and a round trip; generous for a busy
	// machine, far below the 20 s a deaf listener would cost.
	if bound := 3 * time.Second; latency > bound {
		t.Errorf("waiter got the lease %s after the release, want within %s (polling)", latency, bound)
	}
}

// TestWaitBehindPgBouncerWithListenDB: the same Locker given a direct pool
// for LISTEN (lock.WithListenDB) is woken by the release's notification,
// although it polls at most every 20 s.
func TestWaitBehindPgBouncerWithListenDB(t *testing.T) {
	if os.Getenv(holderDSNEnv) != "" {
		holderChild(t)
		return
	}
	pgb := conftest.PgBouncerDSN(t)
	direct, err := sql.Open("pgx", conftest.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	latency, logs := handoff(t, "TestWaitBehindPgBouncerWithListenDB", pgb, 8*time.Second,
		lock.WithListenDB(direct), lock.WithNotifyPollInterval(20*time.Second), lock.WithMaxBackoff(20*time.Second))
	if strings.Contains(logs, "push wake-ups unavailable") {
		t.Errorf("the direct listen pool was found deaf; logs:\n%s", logs)
	}
	if bound := 1500 * time.Millisecond; latency > bound {
		t.Errorf("waiter got the lease %s after the release, want within %s (push wake-up; polls are up to 20 s apart)", latency, bound)
	}
}

// handoff migrates a fresh schema through dsn, has a child process take
// key "k" and release it after hold, while a Locker of this process built
// with opts on a pool of dsn waits for it. It returns the time from the
// child's release to the grant, and the waiter's logs.
func handoff(t *testing.T, testName, dsn string, hold time.Duration, opts ...lock.Option) (time.Duration, string) {
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
	d := pgdialect.New()
	if _, err := migrate.Up(ctx, db, d, migrate.WithNamespace(dialect.Namespace{Schema: schema})); err != nil {
		t.Fatal(err)
	}

	stdin, next := startChild(ctx, t, testName, holderDSNEnv+"="+dsn, holderSchemaEnv+"="+schema)
	next("holder: held")

	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	l, err := lock.New(ctx, db, d, append([]lock.Option{lock.WithSchema(schema), lock.WithTTL(30 * time.Second), lock.WithLogger(logger)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	type result struct {
		at  time.Time
		err error
	}
	got := make(chan result, 1)
	go func() {
		lease, err := l.Acquire(ctx, "k", lock.Exclusive, lock.WaitTimeout(time.Minute))
		at := time.Now()
		if err == nil {
			err = lease.Release(context.Background())
		}
		got <- result{at, err}
	}()
	time.Sleep(hold)
	select {
	case r := <-got:
		t.Fatalf("acquired while the child held the key: %v", r.err)
	default:
	}
	if _, err := io.WriteString(stdin, "release\n"); err != nil {
		t.Fatal(err)
	}
	ns, err := strconv.ParseInt(next("holder: released "), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("waiter: %v\nlogs:\n%s", r.err, logs.String())
	}
	latency := r.at.Sub(time.Unix(0, ns))
	t.Logf("handoff %s after the release", latency)
	return latency, logs.String()
}

// holderChild holds "k" until a line arrives on stdin, then releases it and
// prints the wall-clock time the release returned.
func holderChild(t *testing.T) {
	ctx := t.Context()
	db, err := sql.Open("pgx", os.Getenv(holderDSNEnv))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	l, err := lock.New(ctx, db, pgdialect.New(), lock.WithSchema(os.Getenv(holderSchemaEnv)), lock.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	lease, err := l.TryAcquire(ctx, "k", lock.Exclusive)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println("holder: held")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("holder: released %d\n", time.Now().UnixNano())
}

// syncBuffer is a bytes.Buffer safe for the logger's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
