// Package otellock records the events of a sqlease lock.Locker as
// OpenTelemetry metrics. Build an Observer on a MeterProvider and install it
// with lock.WithObserver:
//
//	obs, err := otellock.New(meterProvider) // nil: otel.GetMeterProvider()
//	if err != nil {
//		return err
//	}
//	locker, err := lock.New(ctx, db, dialect, lock.WithObserver(obs))
//
// One Observer may serve any number of Lockers, on any dialects.
//
// # Instruments
//
// The meter is named "github.com/sqlease/sqlease/otellock". Durations are
// recorded in seconds, as float64 histograms.
//
//	Name                     Kind       Unit      Attributes                  Recorded on
//	sqlease.acquire.count    counter    {acquire} dialect, mode, outcome      every acquire that ended: outcome granted or denied
//	sqlease.acquire.wait     histogram  s         dialect, mode, outcome      same; time from the call to the grant or the denial
//	sqlease.renew.count      counter    {renew}   dialect, mode, outcome      every renewal: outcome ok, or retry (it failed and is retried within the trusted window)
//	sqlease.renew.latency    histogram  s         dialect, mode               successful renewals only; round trip of the statement
//	sqlease.lease.lost       counter    {lease}   dialect, mode, loss_reason  every lease lost
//	sqlease.release.count    counter    {release} dialect, mode, outcome      every release: outcome ok, or failed (error, or the lease was already gone)
//	sqlease.release.latency  histogram  s         dialect, mode, outcome      same; round trip of the release
//	sqlease.sweep.removed    counter    {row}     dialect                     every sweep: holder rows it removed (0 adds no rows but keeps the series alive)
//
// The attribute keys are prefixed "sqlease.", and every value comes from a
// small fixed set:
//
//	sqlease.dialect      the dialect's name: "sqlite", "postgres", ...
//	sqlease.mode         "exclusive" or "shared" ("unknown" for any other mode)
//	sqlease.outcome      "granted" | "denied" (acquire), "ok" | "retry" (renew), "ok" | "failed" (release)
//	sqlease.loss_reason  "not_ours" (the database no longer has the lease: it
//	                     expired and was taken over or swept, or was deleted),
//	                     "window_exhausted" (renewals kept failing until the
//	                     trusted window ended), "fence_failed" (a fence found the
//	                     lease no longer live), "orphaned" (Lease.Orphan),
//	                     "max_life" (lock.HoldAtMost reached); "other" for a
//	                     reason this package does not know
//
// Attributes given with WithAttributes are added to every data point.
//
// # Cardinality
//
// The lease key, lease ID, owner and token are never attributes: keys are
// chosen by the application and unbounded, and one time series per key
// would grow without limit in every metrics backend. The error of a denied
// acquire, a renewal retry or a failed release is not an attribute either.
// Per-key detail belongs in logs (lock.WithLogger) and traces; a
// lock.ObserverFunc that calls Observer.OnEvent and also logs or traces
// e.Key gives both.
//
// # Cost
//
// All attribute sets are computed once per dialect (at the first event of
// that dialect), so OnEvent does not allocate on this package's side; it
// only calls the instruments, which is non-blocking in the OpenTelemetry
// SDK. OnEvent is safe for concurrent use.
//
// "SPEC H3" and the like cite the numbered rules of docs/contract.md in the
// repository, the contract sqlease keeps on every dialect.
package otellock

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sqlease/sqlease/lock"
)

// ScopeName is the instrumentation scope (meter) name.
const ScopeName = "github.com/sqlease/sqlease/otellock"

// Instrument names (see the package documentation).
const (
	MetricAcquireCount   = "sqlease.acquire.count"   // counter of ended acquires
	MetricAcquireWait    = "sqlease.acquire.wait"    // histogram of acquire waits, s
	MetricRenewCount     = "sqlease.renew.count"     // counter of renewals
	MetricRenewLatency   = "sqlease.renew.latency"   // histogram of successful renewals, s
	MetricLeaseLost      = "sqlease.lease.lost"      // counter of lost leases
	MetricReleaseCount   = "sqlease.release.count"   // counter of releases
	MetricReleaseLatency = "sqlease.release.latency" // histogram of releases, s
	MetricSweepRemoved   = "sqlease.sweep.removed"   // counter of rows removed by sweeps
)

// Attribute keys (see the package documentation for their values).
const (
	AttrDialect    = attribute.Key("sqlease.dialect")     // dialect name
	AttrMode       = attribute.Key("sqlease.mode")        // exclusive, shared
	AttrOutcome    = attribute.Key("sqlease.outcome")     // granted, denied, ok, retry, failed
	AttrLossReason = attribute.Key("sqlease.loss_reason") // not_ours, window_exhausted, fence_failed, orphaned, max_life, other
)

// DefaultDurationBuckets are the bucket boundaries, in seconds, of the
// three duration histograms unless WithDurationBuckets is given: from 1ms
// (a renewal on a nearby database) to 60s (a long blocking acquire).
var DefaultDurationBuckets = []float64{
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
}

// Option configures an Observer.
type Option func(*config)

type config struct {
	attrs   []attribute.KeyValue
	buckets []float64
}

// WithAttributes adds constant attributes to every data point (a pool or
// deployment name, say). Their values must come from a small set; never
// pass a lease key.
func WithAttributes(kv ...attribute.KeyValue) Option {
	return func(c *config) { c.attrs = append(c.attrs, kv...) }
}

// WithDurationBuckets sets the explicit bucket boundaries, in seconds, of
// sqlease.acquire.wait, sqlease.renew.latency and sqlease.release.latency
// (default DefaultDurationBuckets). Give at least one; they must be finite
// and strictly increasing. A view configured in the SDK takes precedence.
func WithDurationBuckets(bounds ...float64) Option {
	return func(c *config) { c.buckets = append([]float64(nil), bounds...) }
}

// Observer records lock events as OpenTelemetry metrics. It implements
// lock.Observer; build it with New. It is safe for concurrent use.
type Observer struct {
	acquireCount   metric.Int64Counter
	acquireWait    metric.Float64Histogram
	renewCount     metric.Int64Counter
	renewLatency   metric.Float64Histogram
	leaseLost      metric.Int64Counter
	releaseCount   metric.Int64Counter
	releaseLatency metric.Float64Histogram
	sweepRemoved   metric.Int64Counter

	attrs []attribute.KeyValue
	sets  sync.Map // dialect name -> *dialectSets
}

var _ lock.Observer = (*Observer)(nil)

// New creates the instruments on a meter of mp (otel.GetMeterProvider()
// when mp is nil) and returns an Observer recording to them.
//
// Errors: a bad option (WithDurationBuckets), or the error of the meter
// provider creating an instrument.
func New(mp metric.MeterProvider, opts ...Option) (*Observer, error) {
	c := config{buckets: DefaultDurationBuckets}
	for _, o := range opts {
		o(&c)
	}
	if err := checkBuckets(c.buckets); err != nil {
		return nil, err
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(ScopeName)
	o := &Observer{attrs: append([]attribute.KeyValue(nil), c.attrs...)}
	buckets := metric.WithExplicitBucketBoundaries(c.buckets...)
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		ins, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return ins
	}
	histogram := func(name, desc string) metric.Float64Histogram {
		ins, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc), buckets)
		errs = append(errs, err)
		return ins
	}
	o.acquireCount = counter(MetricAcquireCount, "{acquire}", "Acquire calls that ended, by outcome (granted or denied).")
	o.acquireWait = histogram(MetricAcquireWait, "Time from an acquire call to its grant or denial.")
	o.renewCount = counter(MetricRenewCount, "{renew}", "Lease renewals, by outcome (ok, or retry after a failure).")
	o.renewLatency = histogram(MetricRenewLatency, "Round trip of successful lease renewals.")
	o.leaseLost = counter(MetricLeaseLost, "{lease}", "Leases lost, by reason.")
	o.releaseCount = counter(MetricReleaseCount, "{release}", "Lease releases, by outcome (ok or failed).")
	o.releaseLatency = histogram(MetricReleaseLatency, "Round trip of lease releases.")
	o.sweepRemoved = counter(MetricSweepRemoved, "{row}", "Expired holder rows removed by sweeps.")
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("otellock: create instruments: %w", err)
	}
	return o, nil
}

func checkBuckets(b []float64) error {
	if len(b) == 0 {
		return errors.New("otellock: duration buckets: need at least one boundary")
	}
	for i, v := range b {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("otellock: duration buckets: boundary %v is not finite", v)
		}
		if i > 0 && v <= b[i-1] {
			return fmt.Errorf("otellock: duration buckets: %v after %v: boundaries must be strictly increasing", v, b[i-1])
		}
	}
	return nil
}

// Indexes into the precomputed attribute sets.
const (
	modeUnknown = iota
	modeExclusive
	modeShared
	numModes
)

var modeNames = [numModes]string{"unknown", "exclusive", "shared"}

func modeIndex(m lock.Mode) int {
	switch m {
	case lock.Exclusive:
		return modeExclusive
	case lock.Shared:
		return modeShared
	}
	return modeUnknown
}

const (
	reasonOther = iota
	reasonNotOurs
	reasonWindowExhausted
	reasonFenceFailed
	reasonOrphaned
	reasonMaxLife
	numReasons
)

var reasonNames = [numReasons]string{"other", "not_ours", "window_exhausted", "fence_failed", "orphaned", "max_life"}

// ReasonName returns the short value of the sqlease.loss_reason attribute
// for r: "not_ours", "window_exhausted", "fence_failed", "orphaned",
// "max_life", or "other".
func ReasonName(r lock.LossReason) string { return reasonNames[reasonIndex(r)] }

func reasonIndex(r lock.LossReason) int {
	switch r {
	case lock.LossNotOurs:
		return reasonNotOurs
	case lock.LossWindowExhausted:
		return reasonWindowExhausted
	case lock.LossFenceFailed:
		return reasonFenceFailed
	case lock.LossOrphaned:
		return reasonOrphaned
	case lock.LossMaxLife:
		return reasonMaxLife
	}
	return reasonOther
}

// Outcome indexes: first is the good outcome (granted, ok), second the bad
// one (denied, retry, failed).
const (
	good = iota
	bad
)

var (
	acquireOutcomes = [2]string{"granted", "denied"}
	renewOutcomes   = [2]string{"ok", "retry"}
	releaseOutcomes = [2]string{"ok", "failed"}
)

// opts is one precomputed attribute set, as the option slices the
// instruments take (passing a slice to a variadic parameter does not
// allocate).
type opts struct {
	add []metric.AddOption
	rec []metric.RecordOption
}

func newOpts(kv ...attribute.KeyValue) opts {
	o := metric.WithAttributeSet(attribute.NewSet(kv...))
	return opts{add: []metric.AddOption{o}, rec: []metric.RecordOption{o}}
}

// dialectSets holds every attribute set of one dialect.
type dialectSets struct {
	acquire      [numModes][2]opts
	renew        [numModes][2]opts
	renewLatency [numModes]opts
	lost         [numModes][numReasons]opts
	release      [numModes][2]opts
	sweep        opts
}

func (o *Observer) setsFor(dialectName string) *dialectSets {
	if s, ok := o.sets.Load(dialectName); ok {
		return s.(*dialectSets)
	}
	s, _ := o.sets.LoadOrStore(dialectName, o.buildSets(dialectName))
	return s.(*dialectSets)
}

func (o *Observer) buildSets(dialectName string) *dialectSets {
	kv := func(extra ...attribute.KeyValue) opts {
		all := make([]attribute.KeyValue, 0, len(o.attrs)+1+len(extra))
		all = append(all, o.attrs...)
		all = append(all, AttrDialect.String(dialectName))
		return newOpts(append(all, extra...)...)
	}
	s := &dialectSets{sweep: kv()}
	for m := range numModes {
		mode := AttrMode.String(modeNames[m])
		for i := range 2 {
			s.acquire[m][i] = kv(mode, AttrOutcome.String(acquireOutcomes[i]))
			s.renew[m][i] = kv(mode, AttrOutcome.String(renewOutcomes[i]))
			s.release[m][i] = kv(mode, AttrOutcome.String(releaseOutcomes[i]))
		}
		s.renewLatency[m] = kv(mode)
		for r := range numReasons {
			s.lost[m][r] = kv(mode, AttrLossReason.String(reasonNames[r]))
		}
	}
	return s
}

// OnEvent records e. It implements lock.Observer; it never blocks on this
// package's side and is safe for concurrent use. Events of unknown kinds
// are ignored.
func (o *Observer) OnEvent(e lock.Event) {
	ctx := context.Background()
	s := o.setsFor(e.Dialect)
	m := modeIndex(e.Mode)
	switch e.Kind {
	case lock.EventAcquireGranted, lock.EventAcquireDenied:
		i := good
		if e.Kind == lock.EventAcquireDenied {
			i = bad
		}
		o.acquireCount.Add(ctx, 1, s.acquire[m][i].add...)
		o.acquireWait.Record(ctx, e.Wait.Seconds(), s.acquire[m][i].rec...)
	case lock.EventRenewOK:
		o.renewCount.Add(ctx, 1, s.renew[m][good].add...)
		o.renewLatency.Record(ctx, e.Latency.Seconds(), s.renewLatency[m].rec...)
	case lock.EventRenewRetry:
		o.renewCount.Add(ctx, 1, s.renew[m][bad].add...)
	case lock.EventLeaseLost:
		o.leaseLost.Add(ctx, 1, s.lost[m][reasonIndex(e.Reason)].add...)
	case lock.EventReleaseOK, lock.EventReleaseFailed:
		i := good
		if e.Kind == lock.EventReleaseFailed {
			i = bad
		}
		o.releaseCount.Add(ctx, 1, s.release[m][i].add...)
		o.releaseLatency.Record(ctx, e.Latency.Seconds(), s.release[m][i].rec...)
	case lock.EventSweep:
		if e.Removed >= 0 {
			o.sweepRemoved.Add(ctx, e.Removed, s.sweep.add...)
		}
	}
}
