package main

import (
	"fmt"
	"html"
	"io"
	"math"
	"strconv"
	"strings"
)

// A small SVG line-chart writer, so the bench draws its curves without a
// plotting dependency: axes with ticks, one polyline with markers per
// series, and a legend.

// chart is one line chart.
type chart struct {
	Title, XLabel, YLabel string
	LogX                  bool // logarithmic x axis (every x must be > 0)
	Series                []plotSeries
}

// plotSeries is one line of a chart; X and Y have the same length.
type plotSeries struct {
	Name string
	X, Y []float64
}

// series2 builds a plotSeries.
func series2(name string, x, y []float64) plotSeries { return plotSeries{Name: name, X: x, Y: y} }

var plotColors = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf"}

const (
	plotW, plotH                   = 640, 400
	padL, padR, padT, padB float64 = 70, 170, 40, 50
)

// writeSVG draws c on w.
func (c chart) writeSVG(w io.Writer) error {
	x0, x1, y0, y1 := c.bounds()
	scale := func(x float64) float64 { return x }
	if c.LogX {
		scale = math.Log10
	}
	tx := func(x float64) float64 {
		return padL + (scale(x)-scale(x0))/(scale(x1)-scale(x0))*(plotW-padL-padR)
	}
	ty := func(y float64) float64 { return plotH - padB - (y-y0)/(y1-y0)*(plotH-padT-padB) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", plotW, plotH)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="22" text-anchor="middle" font-size="14">%s</text>`+"\n", plotW/2, html.EscapeString(c.Title))
	left, right, top, bottom := padL, plotW-padR, padT, plotH-padB
	fmt.Fprintf(&b, `<path d="M%.1f %.1fV%.1fH%.1f" fill="none" stroke="black"/>`+"\n", left, top, bottom, right)
	for _, v := range c.xTicks(x0, x1) {
		x := tx(v)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/><text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x, bottom, x, bottom+5, x, bottom+18, tickLabel(v))
	}
	for _, v := range linearTicks(y0, y1) {
		y := ty(v)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/><text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", left, y, right, y, left-6, y+4, tickLabel(v))
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", (left+right)/2, plotH-10, html.EscapeString(c.XLabel))
	fmt.Fprintf(&b, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", (top+bottom)/2, html.EscapeString(c.YLabel))
	for i, s := range c.Series {
		col := plotColors[i%len(plotColors)]
		var pts []string
		for j := range s.X {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", tx(s.X[j]), ty(s.Y[j])))
		}
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(pts, " "), col)
		if len(s.X) <= 30 {
			for _, p := range pts {
				x, y, _ := strings.Cut(p, ",")
				fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3" fill="%s"/>`+"\n", x, y, col)
			}
		}
		ly := top + 10 + float64(i)*18
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"/><text x="%.1f" y="%.1f">%s</text>`+"\n", right+10, ly, right+30, ly, col, right+35, ly+4, html.EscapeString(s.Name))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// bounds returns the data's x range and a y range from 0 (or the least y,
// when negative) to the greatest y, padded by 5%.
func (c chart) bounds() (x0, x1, y0, y1 float64) {
	x0, x1, y0, y1 = math.Inf(1), math.Inf(-1), 0, math.Inf(-1)
	for _, s := range c.Series {
		for j := range s.X {
			x0, x1 = math.Min(x0, s.X[j]), math.Max(x1, s.X[j])
			y0, y1 = math.Min(y0, s.Y[j]), math.Max(y1, s.Y[j])
		}
	}
	if math.IsInf(x0, 0) {
		return 0, 1, 0, 1
	}
	if x1 == x0 {
		x0, x1 = x0-1, x1+1
		if c.LogX {
			x0, x1 = x1/20, x1*10
		}
	}
	if y1 <= y0 {
		y1 = y0 + 1
	}
	return x0, x1, y0, y1 + (y1-y0)*0.05
}

// xTicks are powers of ten on a log axis, linear ticks otherwise.
func (c chart) xTicks(x0, x1 float64) []float64 {
	if !c.LogX {
		return linearTicks(x0, x1)
	}
	var out []float64
	for p := math.Floor(math.Log10(x0)); p <= math.Ceil(math.Log10(x1)); p++ {
		if v := math.Pow(10, p); v >= x0*0.999 && v <= x1*1.001 {
			out = append(out, v)
		}
	}
	return out
}

// linearTicks returns about five round ticks between lo and hi.
func linearTicks(lo, hi float64) []float64 {
	step := math.Pow(10, math.Floor(math.Log10((hi-lo)/5)))
	for _, m := range []float64{1, 2, 5, 10} {
		if (hi-lo)/(step*m) <= 6 {
			step *= m
			break
		}
	}
	var out []float64
	for v := math.Ceil(lo/step) * step; v <= hi+step*1e-9; v += step {
		out = append(out, v)
	}
	return out
}

// tickLabel renders a tick value compactly (1k, 2.5M).
func tickLabel(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 1e9:
		return strconv.FormatFloat(v/1e9, 'g', 3, 64) + "G"
	case a >= 1e6:
		return strconv.FormatFloat(v/1e6, 'g', 3, 64) + "M"
	case a >= 1e3:
		return strconv.FormatFloat(v/1e3, 'g', 3, 64) + "k"
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}
