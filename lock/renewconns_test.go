package lock

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/pgdialect"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/internal/faultdb"
	"github.com/sqlease/sqlease/migrate"
)

// The renewer sends a run's batches on several connections at once where
// the database takes concurrent writers, and one after the other through
// one kept connection on SQLite (renewer.go); when it cannot keep up it
// logs a warning (renewload.go). These tests hold 40 leases with a batch
// limit of 10, so a renewal round has about four batches.

// faultyPostgres migrates a fresh schema on SQLEASE_POSTGRES_DSN and opens
// a pool whose statements go through a faultdb Injector; t closes the pool
// and drops the schema. It skips t when the DSN is not set.
func faultyPostgres(t *testing.T) (*sql.DB, *faultdb.Injector, string) {
	t.Helper()
	dsn := os.Getenv("SQLEASE_POSTGRES_DSN")
	if dsn == "" {
		t.Skip("SQLEASE_POSTGRES_DSN is not set: this test needs PostgreSQL (concurrent writers)")
	}
	b := make([]byte, 6)
	_, _ = crand.Read(b)
	schema := "sqlease_t_" + hex.EncodeToString(b)
	raw, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	connector, err := faultdb.DSNConnector(raw.Driver(), dsn)
	if err != nil {
		_ = raw.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = raw.ExecContext(ctx, "DROP SCHEMA IF EXISTS "+pgdialect.New().QuoteIdent(schema)+" CASCADE")
		_ = raw.Close()
	})
	inj := faultdb.New()
	db := sql.OpenDB(inj.Connector(connector))
	t.Cleanup(func() { db.Close() })
	if _, err := migrate.Up(t.Context(), db, pgdialect.New(), migrate.WithNamespace(dialect.Namespace{Schema: schema})); err != nil {
		t.Fatal(err)
	}
	return db, inj, schema
}

// holdMany acquires n exclusive leases through l with the renewal batch
// limit set to limit (and kept there), and returns them.
func holdMany(t *testing.T, l *Locker, n, limit int) []*Lease {
	t.Helper()
	l.ren.mu.Lock()
	l.ren.limit, l.ren.shrunk = limit, time.Now().Add(time.Hour) // no growth
	l.ren.mu.Unlock()
	leases := make([]*Lease, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 4 {
				le, err := l.TryAcquire(t.Context(), fmt.Sprintf("many/%d", i), Exclusive)
				if err != nil {
					errs <- err
					return
				}
				leases[i] = le
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return leases
}

// TestRenewerBatchesOnSeveralConnections: one batch of a renewal round
// hangs until its leases' trusted windows end. The round's other batches
// are renewed meanwhile, so on other connections; only the hung batch's
// leases are lost (SPEC H1, H2), and the next rounds renew every other
// lease again. A renewer that sent the batches one after the other would
// have sent the others only once their windows had ended too.
func TestRenewerBatchesOnSeveralConnections(t *testing.T) {
	db, inj, schema := faultyPostgres(t)
	var renewedOK, lost atomic.Int64
	obs := ObserverFunc(func(ev Event) {
		switch ev.Kind {
		case EventRenewOK:
			renewedOK.Add(1)
		case EventLeaseLost:
			lost.Add(1)
		}
	})
	// TTL 6 s with a margin of 2.8 s: a window of 3.2 s from each send;
	// renewals 1.5-2 s after it, each allowed up to the window's end.
	l, err := New(t.Context(), db, pgdialect.New(), WithSchema(schema), WithTTL(6*time.Second),
		WithSafetyMargin(2800*time.Millisecond), WithRenewTimeout(2*time.Second), WithObserver(obs),
		WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	if n := l.renewConns(); n < 2 {
		t.Fatalf("renewConns() = %d on an unlimited PostgreSQL pool; want at least 2", n)
	}
	leases := holdMany(t, l, 40, 10)
	var hits atomic.Int64
	release := make(chan struct{})
	defer close(release)
	inj.Add(faultdb.Rule{Match: "jsonb_array_elements_text", Action: faultdb.Hang, Release: release, Times: 1, Hits: &hits})

	// While the hung batch's statement waits, the others are renewed.
	deadline := time.Now().Add(8 * time.Second)
	for hits.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if hits.Load() == 0 {
		t.Fatal("no renewal batch reached the database within 8 s")
	}
	atHang := renewedOK.Load()
	for renewedOK.Load()-atHang < 20 && lost.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got, gone := renewedOK.Load()-atHang, lost.Load(); got < 20 || gone != 0 {
		t.Fatalf("while one batch hung: %d leases renewed, %d lost; want at least 20 renewed (other batches, other connections) before any loss", got, gone)
	}

	// The hung batch ends with its leases' windows: those are lost, no
	// other; later rounds renew the rest.
	for lost.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	var alive []*Lease
	for _, le := range leases {
		if le.Err() == nil {
			alive = append(alive, le)
		}
	}
	if gone := len(leases) - len(alive); gone < 1 || gone > 10 {
		t.Fatalf("%d of 40 leases lost; want those of the hung batch only (1 to 10, the batch limit)", gone)
	}
	before := make([]time.Time, len(alive))
	for i, le := range alive {
		before[i] = le.Expiry()
	}
	time.Sleep(2500 * time.Millisecond)
	for i, le := range alive {
		if err := le.Err(); err != nil {
			t.Errorf("lease %s lost after the hung batch: %v", le.Key(), err)
		} else if !le.Expiry().After(before[i]) {
			t.Errorf("lease %s not renewed in the 2.5 s after the hung batch (interval 2 s)", le.Key())
		}
	}
}

// lockedBuffer is a bytes.Buffer safe for a logger and a test at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestRenewerWarnsWhenItFallsBehind: each renewal batch takes 350 ms, so
// four batches take longer than the 1 s renewal interval of a 3 s TTL: the
// Locker logs, once, a warning naming the leases held and how many one
// interval can renew. A Locker that keeps up logs none.
func TestRenewerWarnsWhenItFallsBehind(t *testing.T) {
	for _, slow := range []bool{false, true} {
		t.Run(fmt.Sprintf("slow=%v", slow), func(t *testing.T) {
			db, inj := faultySQLite(t)
			var logs lockedBuffer
			l, err := New(t.Context(), db, sqlitedialect.New(), WithTTL(3*time.Second),
				WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close(context.Background())
			holdMany(t, l, 40, 10)
			if slow {
				inj.Add(faultdb.Rule{Match: "json_each", Action: faultdb.Delay, Delay: 350 * time.Millisecond})
			}
			deadline := time.Now().Add(6 * time.Second)
			for !strings.Contains(logs.String(), "cannot keep up") && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			out := logs.String()
			if !slow {
				if strings.Contains(out, "cannot keep up") {
					t.Fatalf("a Locker renewing 40 leases in fast batches warned:\n%s", out)
				}
				return
			}
			if n := strings.Count(out, "cannot keep up"); n != 1 {
				t.Fatalf("%d warnings in 6 s; want 1 (at most one a minute). Logs:\n%s", n, out)
			}
			for _, want := range []string{"level=WARN", "leases_held=40", "renewable_per_interval=", "renewal_interval=1s", "connections=1", "batch_limit=10"} {
				if !strings.Contains(out, want) {
					t.Errorf("warning lacks %q:\n%s", want, out)
				}
			}
		})
	}
}

// TestRenewerSetsBusyTimeoutOncePerRun: on SQLite, with a renew timeout
// (TTL/5 = 600 ms) below the pool's busy timeout (5 s), the engine bounds
// the renewal's busy wait (SPEC H9) with a PRAGMA busy_timeout pair, once
// per renewer run on the connection it keeps for the run, not around each
// batch.
//
// On a pool of one connection it keeps none between batches: an
// application query waiting for that connection would wait for the whole
// round. It then sends a pair per batch, as every writer there does.
func TestRenewerSetsBusyTimeoutOncePerRun(t *testing.T) {
	t.Run("pool", func(t *testing.T) { busyTimeoutPairs(t, 0) })
	t.Run("pool of one", func(t *testing.T) { busyTimeoutPairs(t, 1) })
}

// busyTimeoutPairs checks the busy-timeout statements of 40 leases renewed
// in batches of 10 through a pool of at most maxOpen connections (0: no
// limit).
func busyTimeoutPairs(t *testing.T, maxOpen int) {
	db, inj := faultySQLite(t)
	db.SetMaxOpenConns(maxOpen)
	l, err := New(t.Context(), db, sqlitedialect.New(), WithTTL(3*time.Second), WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	leases := holdMany(t, l, 40, 10)
	time.Sleep(1500 * time.Millisecond) // past the first renewals
	inj.ResetCounts()
	time.Sleep(3 * time.Second)
	batches, pragmas := inj.Count("json_each"), inj.Count("PRAGMA busy_timeout")
	if batches < 8 {
		t.Fatalf("%d renewal batches in 3 s of 40 leases in batches of 10 at a 1 s interval; want at least 8", batches)
	}
	// Two per run; a run renews 2 to 4 batches here.
	if maxOpen != 1 && pragmas > batches {
		t.Errorf("%d PRAGMA busy_timeout statements for %d renewal batches; want a pair per run, not per batch", pragmas, batches)
	}
	if maxOpen == 1 && pragmas < 2*batches {
		t.Errorf("%d PRAGMA busy_timeout statements for %d renewal batches on a pool of one; want a pair per batch (the connection is not kept)", pragmas, batches)
	}
	if pragmas == 0 {
		t.Errorf("no PRAGMA busy_timeout for %d renewal batches: the renewal's busy wait was left at the pool's 5 s (SPEC H9)", batches)
	}
	for _, le := range leases {
		if err := le.Err(); err != nil {
			t.Errorf("lease %s lost: %v", le.Key(), err)
		}
	}
}
