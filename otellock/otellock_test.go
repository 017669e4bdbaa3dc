package otellock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mattn/go-sqlite3"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sqlease/sqlease/conformance/conftest"
	"github.com/sqlease/sqlease/dialect/sqlitedialect"
	"github.com/sqlease/sqlease/internal/faultdb"
	"github.com/sqlease/sqlease/lock"
	"github.com/sqlease/sqlease/migrate"
	"github.com/sqlease/sqlease/otellock"
)

// setup returns an Observer recording into a fresh SDK MeterProvider and
// the ManualReader to collect it with.
func setup(t *testing.T, opts ...otellock.Option) (*otellock.Observer, *sdkmetric.ManualReader) {
	t.Helper()
	r := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	obs, err := otellock.New(mp, opts...)
	if err != nil {
		t.Fatalf("otellock.New: %v", err)
	}
	return obs, r
}

// snapshot is one collection, indexed by instrument name.
type snapshot map[string]metricdata.Metrics

func collect(t *testing.T, r *sdkmetric.ManualReader) snapshot {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("collect: %v", err)
	}
	s := snapshot{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != otellock.ScopeName {
			t.Errorf("scope %q, want %q", sm.Scope.Name, otellock.ScopeName)
		}
		for _, m := range sm.Metrics {
			s[m.Name] = m
		}
	}
	return s
}

// counter returns the value of the counter data point whose attributes are
// exactly kv (0 when there is none).
func (s snapshot) counter(t *testing.T, name string, kv ...attribute.KeyValue) int64 {
	t.Helper()
	m, ok := s[name]
	if !ok {
		return 0
	}
	sum, ok := m.Data.(metricdata.Sum[int64])
	if !ok {
		t.Fatalf("%s: data is %T, want metricdata.Sum[int64]", name, m.Data)
	}
	if !sum.IsMonotonic {
		t.Errorf("%s: not monotonic", name)
	}
	want := attribute.NewSet(kv...)
	for _, dp := range sum.DataPoints {
		if dp.Attributes.Equals(&want) {
			return dp.Value
		}
	}
	return 0
}

// histogram returns the count and sum of the histogram data point whose
// attributes are exactly kv.
func (s snapshot) histogram(t *testing.T, name string, kv ...attribute.KeyValue) (uint64, float64) {
	t.Helper()
	m, ok := s[name]
	if !ok {
		return 0, 0
	}
	h, ok := m.Data.(metricdata.Histogram[float64])
	if !ok {
		t.Fatalf("%s: data is %T, want metricdata.Histogram[float64]", name, m.Data)
	}
	want := attribute.NewSet(kv...)
	for _, dp := range h.DataPoints {
		if dp.Attributes.Equals(&want) {
			return dp.Count, dp.Sum
		}
	}
	return 0, 0
}

// points returns the number of data points (series) of an instrument.
func (s snapshot) points(name string) int {
	switch d := s[name].Data.(type) {
	case metricdata.Sum[int64]:
		return len(d.DataPoints)
	case metricdata.Histogram[float64]:
		return len(d.DataPoints)
	}
	return 0
}

// checkAttributes fails the test if any data point carries an attribute
// outside the documented keys (plus extra), or a value mentioning one of
// the lease keys (bounded cardinality).
func (s snapshot) checkAttributes(t *testing.T, leaseKeys []string, extra ...attribute.Key) {
	t.Helper()
	allowed := map[attribute.Key]bool{
		otellock.AttrDialect: true, otellock.AttrMode: true,
		otellock.AttrOutcome: true, otellock.AttrLossReason: true,
	}
	for _, k := range extra {
		allowed[k] = true
	}
	check := func(name string, set attribute.Set) {
		for _, kv := range set.ToSlice() {
			if !allowed[kv.Key] {
				t.Errorf("%s: undocumented attribute %s=%s", name, kv.Key, kv.Value.Emit())
			}
			for _, k := range leaseKeys {
				if strings.Contains(kv.Value.Emit(), k) {
					t.Errorf("%s: attribute %s=%q carries the lease key %q", name, kv.Key, kv.Value.Emit(), k)
				}
			}
		}
	}
	for name, m := range s {
		switch d := m.Data.(type) {
		case metricdata.Sum[int64]:
			for _, dp := range d.DataPoints {
				check(name, dp.Attributes)
			}
		case metricdata.Histogram[float64]:
			for _, dp := range d.DataPoints {
				check(name, dp.Attributes)
			}
		default:
			t.Errorf("%s: unexpected data type %T", name, m.Data)
		}
	}
}

var (
	sqlite    = otellock.AttrDialect.String("sqlite")
	postgres  = otellock.AttrDialect.String("postgres")
	exclusive = otellock.AttrMode.String("exclusive")
	shared    = otellock.AttrMode.String("shared")
)

func outcome(v string) attribute.KeyValue { return otellock.AttrOutcome.String(v) }
func reason(v string) attribute.KeyValue  { return otellock.AttrLossReason.String(v) }

// near reports whether a and b are equal up to float rounding.
func near(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }

// TestEvents feeds synthetic events and checks every instrument's data
// points, attributes, units and values.
func TestEvents(t *testing.T) {
	t.Parallel()
	obs, r := setup(t)
	const key = "tenants/acme/invoices/2024-06"
	ev := func(e lock.Event) {
		e.Key, e.LeaseID, e.Token = key, "0123456789abcdef", 42
		obs.OnEvent(e)
	}
	ev(lock.Event{Kind: lock.EventAcquireGranted, Dialect: "sqlite", Mode: lock.Exclusive, Wait: 20 * time.Millisecond})
	ev(lock.Event{Kind: lock.EventAcquireGranted, Dialect: "sqlite", Mode: lock.Exclusive, Wait: 30 * time.Millisecond})
	ev(lock.Event{Kind: lock.EventAcquireDenied, Dialect: "sqlite", Mode: lock.Shared, Wait: time.Second, Err: lock.ErrLocked})
	ev(lock.Event{Kind: lock.EventAcquireGranted, Dialect: "postgres", Mode: lock.Shared, Wait: 5 * time.Millisecond})
	ev(lock.Event{Kind: lock.EventRenewOK, Dialect: "sqlite", Mode: lock.Exclusive, Latency: 3 * time.Millisecond})
	ev(lock.Event{Kind: lock.EventRenewOK, Dialect: "sqlite", Mode: lock.Exclusive, Latency: 4 * time.Millisecond})
	ev(lock.Event{Kind: lock.EventRenewRetry, Dialect: "sqlite", Mode: lock.Exclusive, Err: errors.New("database is locked")})
	ev(lock.Event{Kind: lock.EventLeaseLost, Dialect: "sqlite", Mode: lock.Exclusive, Reason: lock.LossNotOurs})
	ev(lock.Event{Kind: lock.EventLeaseLost, Dialect: "sqlite", Mode: lock.Exclusive, Reason: lock.LossWindowExhausted, Err: errors.New("timeout")})
	ev(lock.Event{Kind: lock.EventLeaseLost, Dialect: "sqlite", Mode: lock.Shared, Reason: lock.LossFenceFailed})
	ev(lock.Event{Kind: lock.EventLeaseLost, Dialect: "sqlite", Mode: lock.Shared, Reason: lock.LossReason("a reason from a newer engine")})
	ev(lock.Event{Kind: lock.EventReleaseOK, Dialect: "sqlite", Mode: lock.Exclusive, Latency: 2 * time.Millisecond})
	ev(lock.Event{Kind: lock.EventReleaseFailed, Dialect: "sqlite", Mode: lock.Exclusive, Latency: 7 * time.Millisecond, Err: lock.ErrNotHeld})
	ev(lock.Event{Kind: lock.EventSweep, Dialect: "sqlite", Removed: 3})
	ev(lock.Event{Kind: lock.EventSweep, Dialect: "sqlite", Removed: 0})
	ev(lock.Event{Kind: lock.EventKind(99), Dialect: "sqlite", Mode: lock.Exclusive}) // ignored
	ev(lock.Event{Kind: lock.EventAcquireGranted, Dialect: "sqlite", Mode: lock.Mode(9), Wait: time.Millisecond})

	s := collect(t, r)
	s.checkAttributes(t, []string{key, "0123456789abcdef"})

	units := map[string]string{
		otellock.MetricAcquireCount: "{acquire}", otellock.MetricAcquireWait: "s",
		otellock.MetricRenewCount: "{renew}", otellock.MetricRenewLatency: "s",
		otellock.MetricLeaseLost: "{lease}", otellock.MetricReleaseCount: "{release}",
		otellock.MetricReleaseLatency: "s", otellock.MetricSweepRemoved: "{row}",
	}
	for name, unit := range units {
		m, ok := s[name]
		if !ok {
			t.Errorf("%s: not collected", name)
			continue
		}
		if m.Unit != unit {
			t.Errorf("%s: unit %q, want %q", name, m.Unit, unit)
		}
		if m.Description == "" {
			t.Errorf("%s: no description", name)
		}
	}
	if len(s) != len(units) {
		t.Errorf("collected %d instruments, want %d", len(s), len(units))
	}

	counters := []struct {
		name string
		kv   []attribute.KeyValue
		want int64
	}{
		{otellock.MetricAcquireCount, []attribute.KeyValue{sqlite, exclusive, outcome("granted")}, 2},
		{otellock.MetricAcquireCount, []attribute.KeyValue{sqlite, shared, outcome("denied")}, 1},
		{otellock.MetricAcquireCount, []attribute.KeyValue{postgres, shared, outcome("granted")}, 1},
		{otellock.MetricAcquireCount, []attribute.KeyValue{sqlite, otellock.AttrMode.String("unknown"), outcome("granted")}, 1},
		{otellock.MetricRenewCount, []attribute.KeyValue{sqlite, exclusive, outcome("ok")}, 2},
		{otellock.MetricRenewCount, []attribute.KeyValue{sqlite, exclusive, outcome("retry")}, 1},
		{otellock.MetricLeaseLost, []attribute.KeyValue{sqlite, exclusive, reason("not_ours")}, 1},
		{otellock.MetricLeaseLost, []attribute.KeyValue{sqlite, exclusive, reason("window_exhausted")}, 1},
		{otellock.MetricLeaseLost, []attribute.KeyValue{sqlite, shared, reason("fence_failed")}, 1},
		{otellock.MetricLeaseLost, []attribute.KeyValue{sqlite, shared, reason("other")}, 1},
		{otellock.MetricReleaseCount, []attribute.KeyValue{sqlite, exclusive, outcome("ok")}, 1},
		{otellock.MetricReleaseCount, []attribute.KeyValue{sqlite, exclusive, outcome("failed")}, 1},
		{otellock.MetricSweepRemoved, []attribute.KeyValue{sqlite}, 3},
	}
	series := map[string]int{}
	for _, c := range counters {
		series[c.name]++
		if got := s.counter(t, c.name, c.kv...); got != c.want {
			t.Errorf("%s%v = %d, want %d", c.name, c.kv, got, c.want)
		}
	}

	histograms := []struct {
		name  string
		kv    []attribute.KeyValue
		count uint64
		sum   float64
	}{
		{otellock.MetricAcquireWait, []attribute.KeyValue{sqlite, exclusive, outcome("granted")}, 2, 0.050},
		{otellock.MetricAcquireWait, []attribute.KeyValue{sqlite, shared, outcome("denied")}, 1, 1},
		{otellock.MetricAcquireWait, []attribute.KeyValue{postgres, shared, outcome("granted")}, 1, 0.005},
		{otellock.MetricAcquireWait, []attribute.KeyValue{sqlite, otellock.AttrMode.String("unknown"), outcome("granted")}, 1, 0.001},
		{otellock.MetricRenewLatency, []attribute.KeyValue{sqlite, exclusive}, 2, 0.007},
		{otellock.MetricReleaseLatency, []attribute.KeyValue{sqlite, exclusive, outcome("ok")}, 1, 0.002},
		{otellock.MetricReleaseLatency, []attribute.KeyValue{sqlite, exclusive, outcome("failed")}, 1, 0.007},
	}
	for _, h := range histograms {
		series[h.name]++
		count, sum := s.histogram(t, h.name, h.kv...)
		if count != h.count || !near(sum, h.sum) {
			t.Errorf("%s%v = count %d sum %g, want count %d sum %g", h.name, h.kv, count, sum, h.count, h.sum)
		}
	}
	// No other series: the unknown event kind recorded nothing, and no
	// event made a series of its own (by key, lease ID or error).
	for name := range units {
		if got := s.points(name); got != series[name] {
			t.Errorf("%s: %d series, want %d", name, got, series[name])
		}
	}
}

func TestReasonName(t *testing.T) {
	t.Parallel()
	for r, want := range map[lock.LossReason]string{
		lock.LossNotOurs:         "not_ours",
		lock.LossWindowExhausted: "window_exhausted",
		lock.LossOrphaned:        "orphaned",
		lock.LossMaxLife:         "max_life",
		lock.LossFenceFailed:     "fence_failed",
		"":                       "other",
		"something else":         "other",
	} {
		if got := otellock.ReasonName(r); got != want {
			t.Errorf("ReasonName(%q) = %q, want %q", r, got, want)
		}
	}
}

func TestOptions(t *testing.T) {
	t.Parallel()
	t.Run("attributes and buckets", func(t *testing.T) {
		t.Parallel()
		pool := attribute.String("pool", "billing")
		obs, r := setup(t, otellock.WithAttributes(pool), otellock.WithDurationBuckets(0.1, 1))
		obs.OnEvent(lock.Event{Kind: lock.EventAcquireGranted, Dialect: "sqlite", Key: "k", Mode: lock.Exclusive, Wait: 500 * time.Millisecond})
		obs.OnEvent(lock.Event{Kind: lock.EventSweep, Dialect: "sqlite", Removed: 2})
		s := collect(t, r)
		s.checkAttributes(t, nil, "pool")
		if got := s.counter(t, otellock.MetricAcquireCount, pool, sqlite, exclusive, outcome("granted")); got != 1 {
			t.Errorf("acquire.count with pool = %d, want 1", got)
		}
		if got := s.counter(t, otellock.MetricSweepRemoved, pool, sqlite); got != 2 {
			t.Errorf("sweep.removed with pool = %d, want 2", got)
		}
		h := s[otellock.MetricAcquireWait].Data.(metricdata.Histogram[float64])
		if len(h.DataPoints) != 1 {
			t.Fatalf("acquire.wait: %d points, want 1", len(h.DataPoints))
		}
		dp := h.DataPoints[0]
		if fmt.Sprint(dp.Bounds) != "[0.1 1]" || fmt.Sprint(dp.BucketCounts) != "[0 1 0]" {
			t.Errorf("acquire.wait buckets: bounds %v counts %v, want [0.1 1] and [0 1 0]", dp.Bounds, dp.BucketCounts)
		}
	})
	t.Run("default buckets", func(t *testing.T) {
		t.Parallel()
		obs, r := setup(t)
		obs.OnEvent(lock.Event{Kind: lock.EventRenewOK, Dialect: "sqlite", Mode: lock.Shared, Latency: 3 * time.Millisecond})
		dp := collect(t, r)[otellock.MetricRenewLatency].Data.(metricdata.Histogram[float64]).DataPoints[0]
		if fmt.Sprint(dp.Bounds) != fmt.Sprint(otellock.DefaultDurationBuckets) {
			t.Errorf("bounds %v, want %v", dp.Bounds, otellock.DefaultDurationBuckets)
		}
	})
	for name, bounds := range map[string][]float64{
		"empty": {}, "decreasing": {1, 0.5}, "repeated": {1, 1}, "NaN": {0.1, nan()},
	} {
		t.Run("bad buckets "+name, func(t *testing.T) {
			t.Parallel()
			obs, err := otellock.New(noop.NewMeterProvider(), otellock.WithDurationBuckets(bounds...))
			if err == nil || obs != nil || !strings.HasPrefix(err.Error(), "otellock: duration buckets") {
				t.Errorf("New with buckets %v = %v, %v; want an otellock: duration buckets error", bounds, obs, err)
			}
		})
	}
}

func nan() float64 {
	zero := 0.0
	return zero / zero
}

// TestGlobalMeterProvider: a nil MeterProvider means otel.GetMeterProvider().
// Not parallel: it swaps the global provider.
func TestGlobalMeterProvider(t *testing.T) {
	prev := otel.GetMeterProvider()
	t.Cleanup(func() { otel.SetMeterProvider(prev) })
	r := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	otel.SetMeterProvider(mp)
	obs, err := otellock.New(nil)
	if err != nil {
		t.Fatalf("New(nil): %v", err)
	}
	obs.OnEvent(lock.Event{Kind: lock.EventReleaseOK, Dialect: "sqlite", Mode: lock.Exclusive, Latency: time.Millisecond})
	if got := collect(t, r).counter(t, otellock.MetricReleaseCount, sqlite, exclusive, outcome("ok")); got != 1 {
		t.Errorf("release.count on the global provider = %d, want 1", got)
	}
}

// TestOnEventAllocations: with attribute sets precomputed, OnEvent itself
// allocates nothing (measured against the no-op provider, so only this
// package's work counts).
func TestOnEventAllocations(t *testing.T) {
	obs, err := otellock.New(noop.NewMeterProvider())
	if err != nil {
		t.Fatal(err)
	}
	events := []lock.Event{
		{Kind: lock.EventAcquireGranted, Dialect: "sqlite", Key: "k", Mode: lock.Exclusive, Wait: time.Millisecond},
		{Kind: lock.EventAcquireDenied, Dialect: "sqlite", Key: "k", Mode: lock.Shared, Err: lock.ErrLocked},
		{Kind: lock.EventRenewOK, Dialect: "sqlite", Key: "k", Mode: lock.Exclusive, Latency: time.Millisecond},
		{Kind: lock.EventRenewRetry, Dialect: "sqlite", Key: "k", Mode: lock.Exclusive},
		{Kind: lock.EventLeaseLost, Dialect: "sqlite", Key: "k", Mode: lock.Exclusive, Reason: lock.LossNotOurs},
		{Kind: lock.EventReleaseOK, Dialect: "sqlite", Key: "k", Mode: lock.Exclusive},
		{Kind: lock.EventReleaseFailed, Dialect: "sqlite", Key: "k", Mode: lock.Exclusive},
		{Kind: lock.EventSweep, Dialect: "sqlite", Removed: 4},
	}
	for _, e := range events { // build the sets of dialect "sqlite"
		obs.OnEvent(e)
	}
	allocs := testing.AllocsPerRun(100, func() {
		for _, e := range events {
			obs.OnEvent(e)
		}
	})
	if allocs != 0 {
		t.Errorf("OnEvent allocated %.1f times per %d events, want 0", allocs, len(events))
	}
}

// TestConcurrent: OnEvent from many goroutines, on dialects first seen
// concurrently, while collections run, loses no count (run with -race).
func TestConcurrent(t *testing.T) {
	t.Parallel()
	obs, r := setup(t)
	const goroutines, perG = 8, 500
	dialects := []string{"sqlite", "postgres", "mysql"}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var collecting sync.WaitGroup
	collecting.Add(1)
	go func() {
		defer collecting.Done()
		for {
			select {
			case <-stop:
				return
			default:
				var rm metricdata.ResourceMetrics
				_ = r.Collect(context.Background(), &rm)
			}
		}
	}()
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perG {
				obs.OnEvent(lock.Event{Kind: lock.EventRenewOK, Dialect: dialects[(g+i)%len(dialects)], Mode: lock.Shared, Latency: time.Millisecond})
			}
		}()
	}
	wg.Wait()
	close(stop)
	collecting.Wait()
	s := collect(t, r)
	var total int64
	for _, d := range dialects {
		total += s.counter(t, otellock.MetricRenewCount, otellock.AttrDialect.String(d), shared, outcome("ok"))
	}
	if total != goroutines*perG {
		t.Errorf("renew.count total %d, want %d", total, goroutines*perG)
	}
}

// recorder tees events to the Observer under test and keeps their kinds in
// order, so the test can check the order the engine reported them in.
type recorder struct {
	obs   lock.Observer
	mu    sync.Mutex
	kinds []lock.EventKind
}

func (r *recorder) OnEvent(e lock.Event) {
	r.obs.OnEvent(e)
	r.mu.Lock()
	r.kinds = append(r.kinds, e.Kind)
	r.mu.Unlock()
}

func (r *recorder) seen() []lock.EventKind {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]lock.EventKind(nil), r.kinds...)
}

func (r *recorder) count(k lock.EventKind) int64 {
	var n int64
	for _, x := range r.seen() {
		if x == k {
			n++
		}
	}
	return n
}

// eventually polls cond every 5ms until it holds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSQLiteFaults runs a real Locker on a SQLite file, through the
// fault-injecting driver, and checks what the Observer recorded: a grant
// and a denial, a renewal that fails once and is retried successfully
// (SPEC H2), a lease lost because its row was deleted underneath (SPEC S4,
// H3), a lease lost because its trusted window ran out (orphaned), a
// failed and a successful release, and a sweep.
func TestSQLiteFaults(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	d := sqlitedialect.New()
	dsn := conftest.SQLiteDSN(filepath.Join(t.TempDir(), "otellock.db"))

	// Pools close at cleanup, after the Lockers (cleanups run last first).
	plain, err := sql.Open("sqlite3", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = plain.Close() })
	if _, err := migrate.Up(ctx, plain, d); err != nil {
		t.Fatalf("migrate: %v", err)
	}

	inj := faultdb.New()
	conn, err := faultdb.DSNConnector(&sqlite3.SQLiteDriver{}, dsn)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(inj.Connector(conn))
	t.Cleanup(func() { _ = db.Close() })

	obs, r := setup(t)
	rec := &recorder{obs: obs}
	const ttl = 300 * time.Millisecond
	newLocker := func(owner string) *lock.Locker {
		l, err := lock.New(ctx, db, d, lock.WithTTL(ttl), lock.WithOwner(owner), lock.WithObserver(rec),
			lock.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			t.Fatalf("lock.New: %v", err)
		}
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		return l
	}
	locker, other := newLocker("otellock-a"), newLocker("otellock-b")
	dialectName := otellock.AttrDialect.String(d.Name())

	// The first renewal batch fails once; only the renewer's RenewBatch
	// statement reads json_each. Installed before the acquire, so the
	// first renewal (at TTL/3) is the one that fails.
	var hits atomic.Int64
	inj.Add(faultdb.Rule{Match: "json_each", Action: faultdb.Fail, Err: errors.New("injected: connection reset"), Times: 1, Hits: &hits})

	const key1, key2, key3 = "otellock/alpha", "otellock/bravo", "otellock/charlie"
	lease1, err := locker.TryAcquire(ctx, key1, lock.Exclusive)
	if err != nil {
		t.Fatalf("acquire %s: %v", key1, err)
	}
	if _, err := other.TryAcquire(ctx, key1, lock.Exclusive); !errors.Is(err, lock.ErrLocked) {
		t.Fatalf("second locker acquire %s: %v, want ErrLocked", key1, err)
	}

	// Renewal: retry, then ok, with the lease still held.
	eventually(t, 5*time.Second, "a renewal retry followed by a successful renewal", func() bool {
		k := rec.seen()
		for i, x := range k {
			if x == lock.EventRenewRetry {
				for _, y := range k[i+1:] {
					if y == lock.EventRenewOK {
						return true
					}
				}
			}
		}
		return false
	})
	if err := lease1.Err(); err != nil {
		t.Fatalf("lease lost after one failed renewal: %v", err)
	}
	if hits.Load() != 1 {
		t.Fatalf("fault rule hit %d times, want 1", hits.Load())
	}
	s := collect(t, r)
	if got := s.counter(t, otellock.MetricRenewCount, dialectName, exclusive, outcome("retry")); got != 1 {
		t.Errorf("renew.count{retry} = %d, want 1", got)
	}
	if got := s.counter(t, otellock.MetricRenewCount, dialectName, exclusive, outcome("ok")); got < 1 {
		t.Errorf("renew.count{ok} = %d, want >= 1", got)
	}
	if got := s.counter(t, otellock.MetricLeaseLost, dialectName, exclusive, reason("not_ours")); got != 0 {
		t.Errorf("lease.lost{not_ours} = %d before the row was deleted", got)
	}

	// Delete the lease underneath: the next renewal finds it gone.
	if _, err := db.ExecContext(ctx, "DELETE FROM sqlease_holders"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lease1.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("lease not lost 5s after its row was deleted")
	}
	var lost *lock.LeaseLostError
	if err := lease1.Err(); !errors.As(err, &lost) || lost.Reason != lock.LossNotOurs {
		t.Fatalf("lease cause %v, want a *LeaseLostError with reason LossNotOurs", err)
	}
	// Releasing the lost lease finds nothing to delete: a failed release.
	if err := lease1.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("release of the deleted lease: %v, want ErrNotHeld", err)
	}

	// A lease released normally.
	lease2, err := locker.TryAcquire(ctx, key2, lock.Exclusive)
	if err != nil {
		t.Fatalf("acquire %s: %v", key2, err)
	}
	if err := lease2.Release(ctx); err != nil {
		t.Fatalf("release %s: %v", key2, err)
	}

	// A lease orphaned: lost when its trusted window ends, then swept.
	lease3, err := locker.TryAcquire(ctx, key3, lock.Exclusive)
	if err != nil {
		t.Fatalf("acquire %s: %v", key3, err)
	}
	lease3.Orphan()
	select {
	case <-lease3.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("orphaned lease not lost 5s after its window")
	}
	if err := lease3.Err(); !errors.As(err, &lost) || lost.Reason != lock.LossOrphaned {
		t.Fatalf("orphaned lease cause %v, want a *LeaseLostError with reason LossOrphaned", err)
	}
	var removed int64
	eventually(t, 5*time.Second, "a sweep removing the orphaned lease", func() bool {
		n, err := locker.Sweep(ctx, 100)
		if err != nil {
			t.Fatalf("sweep: %v", err)
		}
		removed += n
		return removed > 0
	})

	s = collect(t, r)
	s.checkAttributes(t, []string{key1, key2, key3, lease1.LeaseID(), "otellock-a", "otellock-b"})
	renewOK := rec.count(lock.EventRenewOK)
	counters := []struct {
		name string
		kv   []attribute.KeyValue
		want int64
	}{
		{otellock.MetricAcquireCount, []attribute.KeyValue{dialectName, exclusive, outcome("granted")}, 3},
		{otellock.MetricAcquireCount, []attribute.KeyValue{dialectName, exclusive, outcome("denied")}, 1},
		{otellock.MetricRenewCount, []attribute.KeyValue{dialectName, exclusive, outcome("retry")}, 1},
		{otellock.MetricRenewCount, []attribute.KeyValue{dialectName, exclusive, outcome("ok")}, renewOK},
		{otellock.MetricLeaseLost, []attribute.KeyValue{dialectName, exclusive, reason("not_ours")}, 1},
		{otellock.MetricLeaseLost, []attribute.KeyValue{dialectName, exclusive, reason("orphaned")}, 1},
		{otellock.MetricReleaseCount, []attribute.KeyValue{dialectName, exclusive, outcome("ok")}, 1},
		{otellock.MetricReleaseCount, []attribute.KeyValue{dialectName, exclusive, outcome("failed")}, 1},
		{otellock.MetricSweepRemoved, []attribute.KeyValue{dialectName}, 1},
	}
	for _, c := range counters {
		if got := s.counter(t, c.name, c.kv...); got != c.want {
			t.Errorf("%s%v = %d, want %d", c.name, c.kv, got, c.want)
		}
	}
	if removed != 1 {
		t.Errorf("sweeps removed %d rows, want 1 (the orphaned lease)", removed)
	}
	if got := s.points(otellock.MetricLeaseLost); got != 2 {
		t.Errorf("lease.lost: %d series, want 2", got)
	}
	histograms := []struct {
		name string
		kv   []attribute.KeyValue
		want uint64
	}{
		{otellock.MetricAcquireWait, []attribute.KeyValue{dialectName, exclusive, outcome("granted")}, 3},
		{otellock.MetricAcquireWait, []attribute.KeyValue{dialectName, exclusive, outcome("denied")}, 1},
		{otellock.MetricRenewLatency, []attribute.KeyValue{dialectName, exclusive}, uint64(renewOK)},
		{otellock.MetricReleaseLatency, []attribute.KeyValue{dialectName, exclusive, outcome("ok")}, 1},
		{otellock.MetricReleaseLatency, []attribute.KeyValue{dialectName, exclusive, outcome("failed")}, 1},
	}
	for _, h := range histograms {
		count, sum := s.histogram(t, h.name, h.kv...)
		if count != h.want {
			t.Errorf("%s%v count = %d, want %d", h.name, h.kv, count, h.want)
		}
		if count > 0 && (sum <= 0 || sum > 10*float64(count)) {
			t.Errorf("%s%v sum = %gs over %d records: not a plausible duration in seconds", h.name, h.kv, sum, count)
		}
	}
}
