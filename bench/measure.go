package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// series is what the rounds of one workload measured: ops/s per round and
// the latency of every operation of every round.
type series struct {
	rounds []float64
	lat    []time.Duration
}

// median returns the median of the per-round values.
func (s *series) median() float64 { return medianOf(s.rounds) }

// pct returns the p-th percentile (0..100) of the latencies.
func (s *series) pct(p float64) time.Duration { return percentile(s.lat, p) }

// medianOf returns the median of xs (NaN-free; 0 for none).
func medianOf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// percentile returns the p-th percentile of ds by the nearest-rank method.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(p/100*float64(len(s))+0.999999) - 1
	return s[min(max(rank, 0), len(s)-1)]
}

// workload is one way of doing an acquire+release, run by several clients
// at once. Client c only ever touches its own key(s).
type workload struct {
	name string
	// op does one acquire+release for client c.
	op func(ctx context.Context, c int) error
	// close releases what the workload set up (may be nil).
	close func()
}

// interleave runs every workload for rounds rounds of d each, one workload
// after the other inside a round (the order rotates from round to round, so
// no workload always runs first), with clients concurrent clients. Each
// workload is warmed up once first. It closes every workload.
func interleave(ctx context.Context, rounds, clients int, d time.Duration, ws []workload) (map[string]*series, error) {
	defer func() {
		for _, w := range ws {
			if w.close != nil {
				w.close()
			}
		}
	}()
	out := map[string]*series{}
	for _, w := range ws {
		out[w.name] = &series{}
		// The warm-up also opens the clients' connections; the server is
		// shared, so a moment of "too many clients" is waited out.
		for try := 0; ; try++ {
			_, _, err := runFor(ctx, clients, min(d/5, 200*time.Millisecond), w.op)
			if err == nil {
				break
			}
			if try == 4 || !tooManyClients(err) {
				return nil, fmt.Errorf("%s warm-up: %w", w.name, err)
			}
			time.Sleep(2 * time.Second)
		}
	}
	for r := 0; r < rounds; r++ {
		for i := range ws {
			w := ws[(i+r)%len(ws)]
			opsPerSec, lat, err := runFor(ctx, clients, d, w.op)
			if err != nil {
				return nil, fmt.Errorf("%s round %d: %w", w.name, r+1, err)
			}
			s := out[w.name]
			s.rounds = append(s.rounds, opsPerSec)
			s.lat = append(s.lat, lat...)
		}
	}
	return out, nil
}

// tooManyClients reports whether err is PostgreSQL's "sorry, too many
// clients already" (SQLSTATE 53300).
func tooManyClients(err error) bool { return err != nil && strings.Contains(err.Error(), "53300") }

// runFor runs op in clients goroutines until d has passed and returns the
// operations per second and every operation's latency.
func runFor(ctx context.Context, clients int, d time.Duration, op func(context.Context, int) error) (float64, []time.Duration, error) {
	var (
		mu    sync.Mutex
		all   []time.Duration
		first error
		wg    sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(d)
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lat []time.Duration
			var err error
			for time.Now().Before(deadline) && ctx.Err() == nil {
				t := time.Now()
				if err = op(ctx, c); err != nil {
					break
				}
				lat = append(lat, time.Since(t))
			}
			mu.Lock()
			all = append(all, lat...)
			if err != nil && first == nil {
				first = err
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	elapsed := time.Since(start)
	return float64(len(all)) / elapsed.Seconds(), all, first
}
