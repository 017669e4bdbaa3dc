package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"text/tabwriter"
	"time"
)

// Figure is one measured number of the comparison, with the baseline it is
// compared against (when one applies) and the target it is held to (when
// one is set). One Figure is one line of the --json output.
type Figure struct {
	// Name identifies the figure, e.g. "exclusive.1c.ops".
	Name string `json:"name"`
	// Dialect is "postgres" or "sqlite".
	Dialect string `json:"dialect"`
	// Value is sqlease's number, in Unit.
	Value float64 `json:"value"`
	// Unit is "ops/s", "ms", "stmts", "stmts/s", "bytes", ...
	Unit string `json:"unit"`
	// Baseline is the number of the baseline measured in the same run, or
	// nil when the figure has none.
	Baseline *Baseline `json:"baseline,omitempty"`
	// Ratio is Value / Baseline.Value (nil without a baseline).
	Ratio *float64 `json:"ratio,omitempty"`
	// Target is the goal in words (">= 0.9x", "<= 2 ms"); empty for
	// figures reported for information only.
	Target string `json:"target"`
	// Met says whether Value meets Target; true when there is no target.
	Met bool `json:"met"`
	// Rounds holds the per-round values behind a median, when there are
	// rounds.
	Rounds []float64 `json:"rounds,omitempty"`
	// Note explains how the number was obtained, where that is not obvious.
	Note string `json:"note,omitempty"`
	// Revision is the engine version measured (git commit, see revision).
	Revision string `json:"revision,omitempty"`
	// Load is the machine's 1-minute load average when the figure was
	// measured (-1 when unknown): wall-clock figures from a loaded machine
	// are only comparable with their baseline from the same run.
	Load float64 `json:"load"`
}

// Baseline is the comparison number of a Figure.
type Baseline struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
}

// target is a goal a figure is held to: its text and its test.
type target struct {
	text string
	met  func(value float64, ratio *float64) bool
}

// info is the target of figures reported for information only.
var info = target{}

// ratioAtLeast wants sqlease to reach x times the baseline.
func ratioAtLeast(x float64) target {
	return target{text: fmt.Sprintf(">= %gx", x), met: func(_ float64, r *float64) bool { return r != nil && *r >= x }}
}

// atMost wants the value to be at most limit (inclusive), shown in unit.
func atMost(limit float64, unit string) target {
	return target{text: "<= " + formatValue(limit, unit), met: func(v float64, _ *float64) bool { return v <= limit }}
}

// below wants the value to be less than limit, shown in unit.
func below(limit float64, unit string) target {
	return target{text: "< " + formatValue(limit, unit), met: func(v float64, _ *float64) bool { return v < limit }}
}

// exactly wants the value to equal want.
func exactly(want float64, unit string) target {
	return target{text: "= " + formatValue(want, unit), met: func(v float64, _ *float64) bool { return v == want }}
}

// onlyOn keeps t for the named dialect and makes the figure informational
// on the others.
func onlyOn(dialect, current string, t target) target {
	if dialect != current {
		return info
	}
	return t
}

// figure builds a Figure; base may be nil.
func figure(name, dialect string, value float64, unit string, base *Baseline, t target) Figure {
	f := Figure{Name: name, Dialect: dialect, Value: value, Unit: unit, Baseline: base, Target: t.text, Met: true}
	if base != nil && base.Value != 0 && !math.IsNaN(base.Value) {
		r := value / base.Value
		f.Ratio = &r
	}
	if t.met != nil {
		f.Met = t.met(value, f.Ratio)
	}
	return f
}

// base returns a *Baseline.
func base(name string, value float64) *Baseline { return &Baseline{Name: name, Value: value} }

// ms converts a duration to float milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// formatValue renders a number with its unit for the table.
func formatValue(v float64, unit string) string {
	switch unit {
	case "ops/s":
		return fmt.Sprintf("%.0f ops/s", v)
	case "ms":
		if v >= 100 {
			return fmt.Sprintf("%.0f ms", v)
		}
		return fmt.Sprintf("%.2f ms", v)
	case "bytes":
		if math.Abs(v) >= 10*1024 {
			return fmt.Sprintf("%.1f KiB", v/1024)
		}
		return fmt.Sprintf("%.0f B", v)
	case "bytes/lease":
		return fmt.Sprintf("%.0f B/lease", v)
	case "stmts":
		return fmt.Sprintf("%.4g stmts", v)
	}
	return fmt.Sprintf("%.3g %s", v, unit)
}

// printTable writes the figures as an aligned table.
func printTable(w io.Writer, figs []Figure) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tsqlease\tbaseline\tratio\ttarget\tmet\tload")
	for _, f := range figs {
		b, r, t, m := "-", "-", "-", "-"
		if f.Baseline != nil {
			b = f.Baseline.Name + " " + formatValue(f.Baseline.Value, f.Unit)
		}
		if f.Ratio != nil {
			r = fmt.Sprintf("%.2fx", *f.Ratio)
		}
		if f.Target != "" {
			t = f.Target
			m = "yes"
			if !f.Met {
				m = "NO"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.2f\n", f.Name, formatValue(f.Value, f.Unit), b, r, t, m, f.Load)
	}
	_ = tw.Flush()
}

// baselineLegend says in one line what each baseline is (docs/performance.md,
// "Baselines", has the details).
var baselineLegend = []struct{ name, text string }{
	{"raw", "the hand-rolled single-statement lease: an upsert to take the key, a delete to release it"},
	{"raw+notify", "raw whose delete also calls pg_notify, as sqlease's release notifies"},
	{rawListen, "the raw lease whose delete also calls pg_notify, and a waiter on one pgx connection that LISTENs and retries its upsert when notified"},
	{"advisory", "PostgreSQL session advisory locks on pinned connections (nothing written)"},
	{"advisory-shared", "the shared variants of advisory"},
	{"goose", "goose's PostgreSQL table locker"},
	{"get_lock", "MySQL named locks, GET_LOCK(name, 0) and RELEASE_LOCK, on pinned connections (nothing written)"},
}

// controlLegend says what an A/A control row is (controlFigure), in the
// legend and in the row's note.
const controlLegend = "the raw lease run again in the same rounds, against raw (its value is raw's, not sqlease's); its distance from 1.00x is one measurement of this run's noise"

// legend returns baselineLegend's text for the baseline name ("" when it
// has none).
func legend(name string) string {
	for _, b := range baselineLegend {
		if b.name == name {
			return b.text
		}
	}
	return ""
}

// printLegend explains, after a blank line, the baselines the figures
// name, and the A/A control rows when there are any; nothing when there
// are neither.
func printLegend(w io.Writer, figs []Figure) {
	seen, control := map[string]bool{}, false
	for _, f := range figs {
		if f.Baseline != nil {
			seen[f.Baseline.Name] = true
		}
		control = control || strings.HasPrefix(f.Name, "control.")
	}
	var lines []string
	for _, b := range baselineLegend {
		if seen[b.name] {
			lines = append(lines, b.name+": "+b.text)
		}
	}
	if control {
		lines = append(lines, "control.*: "+controlLegend)
	}
	if len(lines) > 0 {
		fmt.Fprintf(w, "\nbaselines:\n  %s\n", strings.Join(lines, "\n  "))
	}
}

// writeJSON writes one JSON object per line per figure.
func writeJSON(w io.Writer, figs []Figure) error {
	enc := json.NewEncoder(w)
	for _, f := range figs {
		if err := enc.Encode(f); err != nil {
			return err
		}
	}
	return nil
}

// missed lists the figures whose target is not met.
func missed(figs []Figure) []string {
	var out []string
	for _, f := range figs {
		if f.Target != "" && !f.Met {
			out = append(out, f.Name+" ("+strings.TrimSpace(formatValue(f.Value, f.Unit))+", target "+f.Target+")")
		}
	}
	return out
}

// loadAverage returns the 1-minute load average from /proc/loadavg, or -1.
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	var l float64
	if _, err := fmt.Sscan(string(b), &l); err != nil {
		return -1
	}
	return l
}
