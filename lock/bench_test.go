package lock_test

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/mattn/go-sqlite3"

	"github.com/sqlease/sqlease/dialect"
	"github.com/sqlease/sqlease/dialect/pgdialect"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/internal/faultdb"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
)

// Benchmarks of the engine's hot paths, on a SQLite temp file always and on
// PostgreSQL when SQLEASE_POSTGRES_DSN is set (in a fresh schema, dropped
// afterwards). Every statement goes through a faultdb counter, so each
// benchmark also reports stmts/op. The comparison with baselines (raw
// leases, advisory locks, goose) is the bench program: go run ./bench.
//
//	go test -run '^$' -bench . -benchtime 2s ./lock

// benchTarget is one migrated database to benchmark on.
type benchTarget struct {
	name string
	d    dialect.Dialect
	db   *sql.DB
	inj  *faultdb.Injector
	ns   dialect.Namespace
}

// benchTargets prepares SQLite, and PostgreSQL when configured; everything
// is removed when b ends.
func benchTargets(b *testing.B) []benchTarget {
	b.Helper()
	ctx := context.Background()
	path := filepath.Join(b.TempDir(), "bench.db")
	out := []benchTarget{benchOpen(b, "sqlite", sqlitedialect.New(), "sqlite3",
		"file:"+path+"?_journal_mode=WAL&_busy_timeout=5000", dialect.Namespace{})}
	dsn := os.Getenv("SQLEASE_POSTGRES_DSN")
	if dsn == "" {
		b.Log("SQLEASE_POSTGRES_DSN is not set: PostgreSQL benchmarks skipped")
		return out
	}
	buf := make([]byte, 5)
	_, _ = crand.Read(buf)
	schema := "sqlease_bench_" + hex.EncodeToString(buf)
	t := benchOpen(b, "postgres", pgdialect.New(), "pgx", dsn, dialect.Namespace{Schema: schema})
	b.Cleanup(func() {
		db, err := sql.Open("pgx", dsn)
		if err != nil {
			return
		}
		defer db.Close()
		_, _ = db.ExecContext(ctx, "DROP SCHEMA IF EXISTS "+pgdialect.New().QuoteIdent(schema)+" CASCADE")
	})
	out = append(out, t)
	// The same schema through sessions defaulting to REPEATABLE READ: the
	// acquire runs in an explicit READ COMMITTED transaction (SPEC S6).
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	rr := benchOpen(b, "postgres-repeatable-read", pgdialect.New(), "pgx",
		dsn+sep+"options=-c%20default_transaction_isolation%3Drepeatable%5C%20read", dialect.Namespace{Schema: schema})
	return append(out, rr)
}

// benchOpen opens a counting pool on dsn and migrates the lock tables.
func benchOpen(b *testing.B, name string, d dialect.Dialect, driverName, dsn string, ns dialect.Namespace) benchTarget {
	b.Helper()
	raw, err := sql.Open(driverName, dsn)
	if err != nil {
		b.Fatal(err)
	}
	conn, err := faultdb.DSNConnector(raw.Driver(), dsn)
	_ = raw.Close()
	if err != nil {
		b.Fatal(err)
	}
	inj := faultdb.New()
	db := sql.OpenDB(inj.Connector(conn))
	db.SetMaxIdleConns(16)
	b.Cleanup(func() { _ = db.Close() })
	if _, err := migrate.Up(context.Background(), db, d, migrate.WithNamespace(ns)); err != nil {
		b.Fatalf("%s: migrate: %v", name, err)
	}
	return benchTarget{name: name, d: d, db: db, inj: inj, ns: ns}
}

// locker builds a silent Locker on the target, closed when b ends.
func (t benchTarget) locker(b *testing.B, opts ...lock.Option) *lock.Locker {
	b.Helper()
	base := []lock.Option{lock.WithSchema(t.ns.Schema), lock.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}
	l, err := lock.New(context.Background(), t.db, t.d, append(base, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = l.Close(ctx)
	})
	return l
}

// measure resets the timer and the statement count, runs the loop, and
// reports statements per operation.
func (t benchTarget) measure(b *testing.B, loop func()) {
	b.Helper()
	t.inj.ResetCounts()
	// allocs/op includes the statement counter's driver wrapper (a few
	// per statement); compare builds with each other, not with raw.
	b.ReportAllocs()
	b.ResetTimer()
	loop()
	b.StopTimer()
	b.ReportMetric(float64(t.inj.Count(""))/float64(b.N), "stmts/op")
}

// BenchmarkTryAcquireRelease: one uncontended TryAcquire + Release per
// operation, one client.
func BenchmarkTryAcquireRelease(b *testing.B) {
	ctx := context.Background()
	for _, t := range benchTargets(b) {
		for _, mode := range []lock.Mode{lock.Exclusive, lock.Shared} {
			b.Run(t.name+"/"+mode.String(), func(b *testing.B) {
				l := t.locker(b)
				t.measure(b, func() {
					for b.Loop() {
						le, err := l.TryAcquire(ctx, "bench/one", mode)
						if err != nil {
							b.Fatal(err)
						}
						if err := le.Release(ctx); err != nil {
							b.Fatal(err)
						}
					}
				})
			})
		}
	}
}

// BenchmarkTryAcquireReleaseParallel: uncontended TryAcquire + Release from
// GOMAXPROCS*4 goroutines of one Locker, each on its own key.
func BenchmarkTryAcquireReleaseParallel(b *testing.B) {
	ctx := context.Background()
	for _, t := range benchTargets(b) {
		b.Run(t.name, func(b *testing.B) {
			l := t.locker(b)
			var next atomic.Int64
			b.SetParallelism(4)
			t.measure(b, func() {
				b.RunParallel(func(pb *testing.PB) {
					key := "bench/p/" + strconv.FormatInt(next.Add(1), 10)
					for pb.Next() {
						le, err := l.TryAcquire(ctx, key, lock.Exclusive)
						if err != nil {
							b.Error(err)
							return
						}
						if err := le.Release(ctx); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		})
	}
}

// BenchmarkTryAcquireRefused: a poll of a key another Locker holds (the
// waiter's hot path; on PostgreSQL it writes nothing).
func BenchmarkTryAcquireRefused(b *testing.B) {
	ctx := context.Background()
	for _, t := range benchTargets(b) {
		b.Run(t.name, func(b *testing.B) {
			holder, poller := t.locker(b), t.locker(b)
			le, err := holder.TryAcquire(ctx, "bench/held", lock.Exclusive)
			if err != nil {
				b.Fatal(err)
			}
			defer le.Release(ctx)
			t.measure(b, func() {
				for b.Loop() {
					if _, err := poller.TryAcquire(ctx, "bench/held", lock.Exclusive); !errors.Is(err, lock.ErrLocked) {
						b.Fatalf("want ErrLocked, got %v", err)
					}
				}
			})
		})
	}
}

// BenchmarkRenew: an explicit Lease.Renew (the background renewer batches
// many leases into one such statement).
func BenchmarkRenew(b *testing.B) {
	ctx := context.Background()
	for _, t := range benchTargets(b) {
		b.Run(t.name, func(b *testing.B) {
			l := t.locker(b)
			le, err := l.TryAcquire(ctx, "bench/renew", lock.Exclusive)
			if err != nil {
				b.Fatal(err)
			}
			defer le.Release(ctx)
			t.measure(b, func() {
				for b.Loop() {
					if err := le.Renew(ctx); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkRunInTx: an empty fenced transaction (begin, fence, commit).
func BenchmarkRunInTx(b *testing.B) {
	ctx := context.Background()
	for _, t := range benchTargets(b) {
		b.Run(t.name, func(b *testing.B) {
			l := t.locker(b)
			le, err := l.TryAcquire(ctx, "bench/fence", lock.Exclusive)
			if err != nil {
				b.Fatal(err)
			}
			defer le.Release(ctx)
			t.measure(b, func() {
				for b.Loop() {
					if err := le.RunInTx(ctx, t.db, nil, func(context.Context, *sql.Tx) error { return nil }); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkDo: Locker.Do with a function that does nothing (acquire,
// run, release).
func BenchmarkDo(b *testing.B) {
	ctx := context.Background()
	for _, t := range benchTargets(b) {
		b.Run(t.name, func(b *testing.B) {
			l := t.locker(b)
			t.measure(b, func() {
				for b.Loop() {
					if err := l.Do(ctx, "bench/do", lock.Exclusive, func(context.Context, *lock.Lease) error { return nil }); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkFIFO: what the FIFO option (SPEC W6) costs next to the default.
// try: an uncontended TryAcquire + Release (a FIFO try takes no ticket,
// but checks the queue); refused: a poll of a held key (read-only in both
// modes); handoff: 4 Lockers take turns on one key with blocking Do calls
// (FIFO waiters write their ticket when they start waiting and at a third
// of its TTL).
func BenchmarkFIFO(b *testing.B) {
	ctx := context.Background()
	for _, t := range benchTargets(b) {
		for _, fifo := range []bool{false, true} {
			var opts []lock.AcquireOption
			name := t.name + "/default"
			if fifo {
				opts, name = []lock.AcquireOption{lock.FIFO()}, t.name+"/fifo"
			}
			b.Run(name+"/try", func(b *testing.B) {
				l := t.locker(b)
				t.measure(b, func() {
					for b.Loop() {
						le, err := l.TryAcquire(ctx, "bench/fifo/try", lock.Exclusive, opts...)
						if err != nil {
							b.Fatal(err)
						}
						if err := le.Release(ctx); err != nil {
							b.Fatal(err)
						}
					}
				})
			})
			b.Run(name+"/refused", func(b *testing.B) {
				holder, poller := t.locker(b), t.locker(b)
				le, err := holder.TryAcquire(ctx, "bench/fifo/held", lock.Exclusive)
				if err != nil {
					b.Fatal(err)
				}
				defer le.Release(ctx)
				t.measure(b, func() {
					for b.Loop() {
						if _, err := poller.TryAcquire(ctx, "bench/fifo/held", lock.Exclusive, opts...); !errors.Is(err, lock.ErrLocked) {
							b.Fatalf("want ErrLocked, got %v", err)
						}
					}
				})
			})
			b.Run(name+"/handoff", func(b *testing.B) {
				const workers = 4
				var ls []*lock.Locker
				for range workers {
					ls = append(ls, t.locker(b, lock.WithMaxBackoff(20*time.Millisecond)))
				}
				var next atomic.Int64
				b.SetParallelism(max(1, workers/runtime.GOMAXPROCS(0)))
				t.measure(b, func() {
					b.RunParallel(func(pb *testing.PB) {
						l := ls[int(next.Add(1)-1)%workers]
						for pb.Next() {
							if err := l.Do(ctx, "bench/fifo/handoff", lock.Exclusive, func(context.Context, *lock.Lease) error { return nil }, append(opts, lock.WaitTimeout(time.Minute))...); err != nil {
								b.Error(err)
								return
							}
						}
					})
				})
			})
		}
	}
}

// BenchmarkAcquireDeadline: blocking Acquire + Release, uncontended, with
// a context deadline shorter (2s) and longer (30s) than the SQLite busy
// timeout (10s here). Only the short one needs the lock-wait bound of SPEC
// H9 (PRAGMA busy_timeout set and restored around each write) on SQLite.
func BenchmarkAcquireDeadline(b *testing.B) {
	for _, t := range benchTargets(b) {
		for _, d := range []time.Duration{2 * time.Second, 30 * time.Second} {
			b.Run(t.name+"/"+d.String(), func(b *testing.B) {
				l := t.locker(b)
				t.measure(b, func() {
					for b.Loop() {
						ctx, cancel := context.WithTimeout(context.Background(), d)
						le, err := l.Acquire(ctx, "bench/deadline", lock.Exclusive)
						if err != nil {
							b.Fatal(err)
						}
						if err := le.Release(ctx); err != nil {
							b.Fatal(err)
						}
						cancel()
					}
				})
			})
		}
	}
}

// BenchmarkHandoff: 16 Lockers of one pool contend for one key with
// blocking Acquire, release at once; stmts/op is statements per handoff
// (a release wakes one waiter, not all 16).
func BenchmarkHandoff(b *testing.B) {
	ctx := context.Background()
	for _, t := range benchTargets(b) {
		b.Run(t.name, func(b *testing.B) {
			const workers = 16
			var ls []*lock.Locker
			for range workers {
				ls = append(ls, t.locker(b))
			}
			var next atomic.Int64
			b.SetParallelism(max(1, workers/runtime.GOMAXPROCS(0)))
			t.measure(b, func() {
				b.RunParallel(func(pb *testing.PB) {
					l := ls[int(next.Add(1)-1)%workers]
					for pb.Next() {
						le, err := l.Acquire(ctx, "bench/handoff", lock.Exclusive, lock.WaitTimeout(time.Minute))
						if err != nil {
							b.Error(err)
							return
						}
						if err := le.Release(ctx); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		})
	}
}
