package main

import (
	"context"
	"encoding/xml"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary serve as the bench's child processes
// (the crowd figure re-executes it with childEnv set).
func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(childDispatch(mode))
	}
	os.Exit(m.Run())
}

// tinyScale is a scale configuration small enough for a test of seconds.
func tinyScale(dsn string) config {
	return config{dsn: dsn, rounds: 1, duration: 100 * time.Millisecond, waiterHold: 500 * time.Millisecond,
		batchTTL: 900 * time.Millisecond,
		scale:    scaleConfig{liveLeases: []int{1, 300}, crowdWaiters: []int{6}, crowdProcs: 2, churnGrants: 400, renewLeases: 300, renewTTL: 900 * time.Millisecond}}
}

// TestScaleFiguresSQLite runs every scale figure at a tiny size on SQLite
// and draws the plots.
func TestScaleFiguresSQLite(t *testing.T) {
	runScaleFigures(t, "")
}

// TestScaleFiguresPostgres is TestScaleFiguresSQLite on
// SQLEASE_POSTGRES_DSN (the churn figure starts a private cluster when it
// can).
func TestScaleFiguresPostgres(t *testing.T) {
	pgEnv(t).close() // skips without a DSN
	runScaleFigures(t, os.Getenv("SQLEASE_POSTGRES_DSN"))
}

func runScaleFigures(t *testing.T, dsn string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	clear(curves)
	e, err := setup(ctx, tinyScale(dsn))
	if err != nil {
		t.Fatal(err)
	}
	defer e.close()
	var figs []Figure
	for _, f := range []func(context.Context, *env) ([]Figure, error){figScaleLeases, figCrowd, figChurn, figRenewMany} {
		fs, err := f(ctx, e)
		if err != nil {
			t.Fatal(err)
		}
		figs = append(figs, fs...)
	}
	byName := map[string]Figure{}
	for _, f := range figs {
		byName[f.Name] = f
	}
	for _, name := range []string{"scaleleases.300.vs_raw", "crowd.6.waiter_load", "crowd.6.handoff.p50", "crowd.6.rss_per_waiter", "churn.ops.end", "churn.size.end", "renewmany.cpu_per_interval", "renewmany.lost"} {
		if _, ok := byName[name]; !ok {
			t.Errorf("no figure %s", name)
		}
	}
	if f := byName["scaleleases.300.ops"]; f.Value <= 0 {
		t.Errorf("scaleleases.300.ops = %v, want > 0", f.Value)
	}
	if f := byName["renewmany.lost"]; f.Value != 0 {
		t.Errorf("renewmany.lost = %v: %s", f.Value, f.Note)
	}
	if f := byName["churn.size.end"]; f.Value <= 0 {
		t.Errorf("churn.size.end = %v, want > 0", f.Value)
	}
	checkPlots(t, figs, "scaleleases.ops", "crowd.handoff", "churn.size")
}

// checkPlots writes the plots and checks that the named ones exist and
// are well-formed SVG.
func checkPlots(t *testing.T, figs []Figure, want ...string) {
	t.Helper()
	dir := t.TempDir()
	files, err := writePlots(dir, figs)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		found := false
		for _, f := range files {
			if strings.HasPrefix(filepath.Base(f), w+".") {
				found = true
			}
		}
		if !found {
			t.Errorf("no plot %s in %v", w, files)
		}
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		d := xml.NewDecoder(strings.NewReader(string(b)))
		for {
			if _, err := d.Token(); err != nil {
				if err.Error() != "EOF" {
					t.Errorf("%s: %v", f, err)
				}
				break
			}
		}
		if !strings.Contains(string(b), "<polyline") {
			t.Errorf("%s draws no line", f)
		}
	}
}
