package main

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The plots of a run: figures register their curves with addCurve (or
// their latency samples with addSamples) as they are measured, and
// writePlots draws them, with throughput against clients from the
// throughput figures, as SVG files named <plot>.<dialect>.svg.

// curves holds the charts registered during the run, by file stem.
var curves = map[string]chart{}

// addCurve registers a chart of the run under name and dialect.
func addCurve(name, dialect, xlabel, ylabel string, logX bool, series ...plotSeries) {
	curves[name+"."+dialect] = chart{Title: name + " (" + dialect + ")", XLabel: xlabel, YLabel: ylabel, LogX: logX, Series: series}
}

// addSamples adds the latency distribution of samples, as a CDF, to the
// chart name of dialect (one series per call).
func addSamples(name, dialect, series string, samples []time.Duration) {
	if len(samples) == 0 {
		return
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	var xs, ys []float64
	for i, d := range s {
		xs, ys = append(xs, max(ms(d), 0.001)), append(ys, float64(i+1)/float64(len(s))) // log axis: > 0
	}
	key := name + "." + dialect
	c, ok := curves[key]
	if !ok {
		c = chart{Title: name + " (" + dialect + "), cumulative distribution", XLabel: "ms (log)", YLabel: "fraction of samples", LogX: true}
	}
	c.Series = append(c.Series, series2(series, xs, ys))
	curves[key] = c
}

// throughputCurves adds, from the throughput figures, ops/s against
// clients per mode, one series per workload (sqlease and its baselines).
func throughputCurves(figs []Figure) {
	for _, mode := range []string{"exclusive", "shared"} {
		pts := map[string]map[float64]float64{}
		add := func(series string, clients, v float64) {
			if pts[series] == nil {
				pts[series] = map[float64]float64{}
			}
			pts[series][clients] = v
		}
		dialect := ""
		for _, f := range figs {
			var clients float64
			if _, err := fmt.Sscanf(f.Name, mode+".%gc.ops", &clients); err != nil || !strings.HasSuffix(f.Name, "c.ops") {
				continue
			}
			dialect = f.Dialect
			add("sqlease", clients, f.Value)
			if f.Baseline != nil {
				add(f.Baseline.Name, clients, f.Baseline.Value)
			}
		}
		var ss []plotSeries
		for _, name := range slices.Sorted(maps.Keys(pts)) {
			s := plotSeries{Name: name}
			for _, c := range slices.Sorted(maps.Keys(pts[name])) {
				s.X, s.Y = append(s.X, c), append(s.Y, pts[name][c])
			}
			if name == "sqlease" {
				ss = append([]plotSeries{s}, ss...)
			} else {
				ss = append(ss, s)
			}
		}
		if len(ss) > 0 && len(ss[0].X) > 1 {
			addCurve("throughput."+mode, dialect, "clients", "ops/s", false, ss...)
		}
	}
}

// writePlots draws every registered chart into dir and returns the files
// written.
func writePlots(dir string, figs []Figure) ([]string, error) {
	throughputCurves(figs)
	if len(curves) == 0 {
		return nil, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var files []string
	for _, stem := range slices.Sorted(maps.Keys(curves)) {
		path := filepath.Join(dir, stem+".svg")
		f, err := os.Create(path)
		if err != nil {
			return files, err
		}
		err = curves[stem].writeSVG(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return files, err
		}
		files = append(files, path)
	}
	return files, nil
}
