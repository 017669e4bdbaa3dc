package conformance_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"runtime"
	"strings"
	"sync"

	"github.com/sqlease/sqlease/conformance"
	"github.com/sqlease/sqlease/conformance/conftest"
)

// A dialect proves the contract with one Run call in its tests (conftest
// holds the built-in dialects' configurations), which runs
// every case as a parallel subtest:
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, conftest.SQLite(t.TempDir()))
//	}
//
// Outside go test (a command, a deployment check), RunCase runs chosen
// cases with any T. This runs the cases of rule S3 on SQLite files.
func ExampleRunCase() {
	dir, err := os.MkdirTemp("", "sqlease-conformance")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	cfg := conftest.SQLite(dir)
	for _, c := range conformance.Cases() {
		if c.Rule != "S3" {
			continue
		}
		t := newRunner(c.Name)
		t.run(func() { conformance.RunCase(t, cfg, c) })
		fmt.Println(c.Name+":", t.result())
	}
	// Output:
	// S3_TokenStableUnderRenewal: passed
	// S3_TokensIncreasePerKey: passed
}

// runner is a minimal conformance.T, as a program running cases outside
// go test would write it.
type runner struct {
	name            string
	ctx             context.Context
	cancel          context.CancelFunc
	mu              sync.Mutex
	failed, skipped bool
	log             strings.Builder
	cleanups        []func()
}

func newRunner(name string) *runner {
	ctx, cancel := context.WithCancel(context.Background())
	return &runner{name: name, ctx: ctx, cancel: cancel}
}

// run runs f on its own goroutine (Fatalf and Skipf end it), then the
// cleanups, last registered first.
func (r *runner) run(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	<-done
	r.cancel()
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

func (r *runner) result() string {
	switch {
	case r.Failed():
		return "failed:\n" + r.log.String()
	case r.skipped:
		return "skipped"
	}
	return "passed"
}

func (r *runner) Helper()                  {}
func (r *runner) Name() string             { return r.name }
func (r *runner) Context() context.Context { return r.ctx }
func (r *runner) Cleanup(f func())         { r.mu.Lock(); r.cleanups = append(r.cleanups, f); r.mu.Unlock() }
func (r *runner) Failed() bool             { r.mu.Lock(); defer r.mu.Unlock(); return r.failed }
func (r *runner) Logf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Fprintf(&r.log, format+"\n", args...)
}
func (r *runner) Errorf(format string, args ...any) {
	r.Logf(format, args...)
	r.mu.Lock()
	r.failed = true
	r.mu.Unlock()
}
func (r *runner) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}
func (r *runner) Skipf(format string, args ...any) {
	r.Logf(format, args...)
	r.mu.Lock()
	r.skipped = true
	r.mu.Unlock()
	runtime.Goexit()
}
