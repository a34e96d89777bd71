package main

import (
	"fmt"
	"html"
	"math"
	"slices"
	"strings"

	"github.com/exactlyonce/idempotency/benchmarks/internal/bench"
)

// colors of the backends' bars.
var colors = map[string]string{
	bench.Memory:       "#76b7b2",
	bench.Postgres:     "#4e79a7",
	bench.Redis:        "#e15759",
	bench.RedisCluster: "#f28e2b",
	bench.Etcd:         "#59a14f",
	bench.Mongo:        "#b07aa1",
}

// chartWidth is the width of the chart, and throughputHeight the height
// of its throughput panel.
const chartWidth, throughputHeight = 860, 480

// chart draws the throughput of rows (when there are any) and, below, the
// ratios of the comparison benchmarks (when there are any) as one SVG.
func chart(rows []row, c comparisons, env string) string {
	var panels []string
	height := 0
	if len(rows) > 0 {
		panels = append(panels, fmt.Sprintf(`<g transform="translate(0 %d)">%s</g>`, height, throughput(rows, env)))
		height += throughputHeight
	}
	if !c.empty() {
		svg, h := ratios(c, env, len(rows) == 0)
		panels = append(panels, fmt.Sprintf(`<g transform="translate(0 %d)">%s</g>`, height, svg))
		height += h
	}
	return fmt.Sprintf(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif">`+"\n"+
		`<rect width="100%%" height="100%%" fill="#ffffff"/>`+"\n%s\n</svg>\n", chartWidth, height, chartWidth, height, strings.Join(panels, "\n"))
}

// throughput draws the throughput of rows as grouped bars, one group per
// workload and one bar per backend, on a logarithmic axis: the memory store
// is two orders of magnitude faster than a networked one, which a linear
// axis would flatten to nothing.
func throughput(rows []row, env string) string {
	const (
		width, height          = chartWidth, throughputHeight
		left, right, top, foot = 72, 24, 96, 56
	)
	x0, x1 := float64(left), float64(width-right)
	yTop, yBot := float64(top), float64(height-foot)

	var workloads, backends []string
	ops := map[[2]string]float64{}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range rows {
		if !slices.Contains(workloads, r.workload) {
			workloads = append(workloads, r.workload)
		}
		if !slices.Contains(backends, r.backend) {
			backends = append(backends, r.backend)
		}
		v := r.opsPerSec()
		ops[[2]string{r.backend, r.workload}] = v
		lo, hi = math.Min(lo, v), math.Max(hi, v)
	}
	// The axis runs over whole decades around the figures.
	dLo, dHi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if dHi <= dLo {
		dHi = dLo + 1
	}
	y := func(v float64) float64 {
		return yBot - (math.Log10(v)-dLo)/(dHi-dLo)*(yBot-yTop)
	}

	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p(`<text x="%d" y="26" font-size="17" font-weight="bold">idempotency.Do throughput by backend</text>`, left)
	p(`<text x="%d" y="46" font-size="12" fill="#444">operations per second, logarithmic scale, higher is better; %d-byte JSON result</text>`, left, bench.ResultSize)
	p(`<text x="%d" y="63" font-size="11" fill="#666">%s</text>`, left, html.EscapeString(env))

	// Legend.
	lx := float64(left)
	for _, be := range backends {
		p(`<rect x="%.1f" y="73" width="12" height="12" fill="%s"/>`, lx, colors[be])
		p(`<text x="%.1f" y="83" font-size="12">%s</text>`, lx+17, html.EscapeString(be))
		lx += 17 + 7*float64(len(be)) + 22
	}

	// Decade grid lines and their labels.
	for e := dLo; e <= dHi; e++ {
		for _, m := range []float64{2, 5} {
			if e < dHi {
				yy := y(m * math.Pow(10, e))
				p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#f0f0f0"/>`, x0, yy, x1, yy)
			}
		}
		yy := y(math.Pow(10, e))
		p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`, x0, yy, x1, yy)
		p(`<text x="%.1f" y="%.1f" font-size="11" text-anchor="end" fill="#444">%s</text>`, x0-6, yy+4, human(math.Pow(10, e)))
	}
	p(`<text transform="translate(16 %.1f) rotate(-90)" font-size="12" text-anchor="middle" fill="#444">ops/s</text>`, (yTop+yBot)/2)

	// Bars, one group per workload.
	gw := (x1 - x0) / float64(len(workloads))
	bw := gw * 0.8 / float64(len(backends))
	for gi, wl := range workloads {
		gx := x0 + float64(gi)*gw + gw*0.1
		for bi, be := range backends {
			v, ok := ops[[2]string{be, wl}]
			if !ok {
				continue
			}
			bx := gx + float64(bi)*bw
			by := y(v)
			p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %s: %s ops/s</title></rect>`,
				bx+1, by, bw-2, yBot-by, colors[be], html.EscapeString(be), html.EscapeString(wl), group(v))
			p(`<text x="%.1f" y="%.1f" font-size="10" text-anchor="middle">%s</text>`, bx+bw/2, by-4, human(v))
		}
		p(`<text x="%.1f" y="%.1f" font-size="13" text-anchor="middle">%s</text>`, x0+float64(gi)*gw+gw/2, yBot+20, html.EscapeString(wl))
	}
	p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#444"/>`, x0, yBot, x1, yBot)
	p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#444"/>`, x0, yTop, x0, yBot)
	p(`<text x="%d" y="%d" font-size="10" fill="#888">go run ./benchmarks/cmd/report; parallel workloads: ops/s over all goroutines</text>`, left, height-12)
	return b.String()
}

// ratios draws the ratio of every floor and scale comparison as a
// horizontal bar (the median, with a whisker over the range of the runs)
// on a linear axis from 0 to 1.2, with the target of each marked: the
// floor's (floorRow.target) for the raw floors, whose JSON floors follow,
// lighter and without a target; 0.8 for the scale runs against an empty
// store, and 0.8 of the ratio with no records for the scale runs against
// a floor. withEnv adds the line describing the
// machine, when no throughput panel above has it. It returns the SVG and
// its height.
func ratios(c comparisons, env string, withEnv bool) (string, int) {
	type bar struct {
		label, color string
		s            stat
		target       float64
		light        bool // the second floor's: drawn lighter
	}
	var bars []bar
	for _, f := range c.floors {
		bars = append(bars, bar{fmt.Sprintf("%s %s, %d caller(s): Do vs raw floor", f.backend, f.workload, f.callers), colors[f.backend], f.ratio, f.target(), false})
		if f.jsonRatio.med > 0 {
			bars = append(bars, bar{fmt.Sprintf("%s %s, %d caller(s): Do vs JSON floor", f.backend, f.workload, f.callers), colors[f.backend], f.jsonRatio, 0, true})
		}
	}
	for _, s := range c.scales {
		if !s.againstFloor() {
			bars = append(bars, bar{fmt.Sprintf("%s %s, %s records: loaded vs empty", s.backend, s.workload, s.records), colors[s.backend], s.ratio, 0.8, false})
			continue
		}
		// Against a floor at each size, the target is 0.8 of the ratio
		// with no records stored (none is marked without that run).
		target := 0.0
		for _, base := range c.scales {
			if base.againstFloor() && base.backend == s.backend && base.workload == s.workload && base.callers == s.callers && base.records == "0" {
				target = 0.8 * base.ratio.med
			}
		}
		bars = append(bars, bar{fmt.Sprintf("%s %s, %s records: Do vs raw floor", s.backend, s.workload, s.records), colors[s.backend], s.ratio, target, false})
	}
	const (
		left, right, top, rowH = 300, 40, 70, 22
		maxRatio               = 1.2
	)
	height := top + rowH*len(bars) + 40
	x0, x1 := float64(left), float64(chartWidth-right)
	x := func(v float64) float64 { return x0 + math.Min(v, maxRatio)/maxRatio*(x1-x0) }
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p(`<text x="24" y="26" font-size="17" font-weight="bold">Ratios to a baseline in the same run</text>`)
	p(`<text x="24" y="44" font-size="12" fill="#444">baseline time ÷ Do time, median and range of the runs; 1 = no slower than the baseline; | marks the target</text>`)
	if withEnv {
		p(`<text x="24" y="60" font-size="11" fill="#666">%s</text>`, html.EscapeString(env))
	}
	for _, v := range []float64{0, 0.2, 0.4, 0.6, 0.8, 1, 1.2} {
		p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/>`, x(v), top-4, x(v), height-36)
		p(`<text x="%.1f" y="%d" font-size="10" text-anchor="middle" fill="#444">%.1f</text>`, x(v), height-24, v)
	}
	for i, br := range bars {
		y := float64(top + i*rowH)
		color := br.color
		if color == "" {
			color = "#999"
		}
		p(`<text x="%.1f" y="%.1f" font-size="11" text-anchor="end">%s</text>`, x0-8, y+13, html.EscapeString(br.label))
		opacity := 1.0
		if br.light {
			opacity = 0.45
		}
		p(`<rect x="%.1f" y="%.1f" width="%.1f" height="14" fill="%s" fill-opacity="%.2f"><title>%s: %.2f (%.2f–%.2f)</title></rect>`,
			x0, y+2, x(br.s.med)-x0, color, opacity, html.EscapeString(br.label), br.s.med, br.s.lo, br.s.hi)
		p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`, x(br.s.lo), y+9, x(br.s.hi), y+9)
		if br.target > 0 {
			p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#000" stroke-width="2"/>`, x(br.target), y, x(br.target), y+18)
		}
		p(`<text x="%.1f" y="%.1f" font-size="10">%.2f</text>`, x(math.Max(br.s.med, br.s.hi))+4, y+13, br.s.med)
	}
	return b.String(), height
}

// human formats a rate briefly: 950, 9.5k, 95k, 1.25M.
func human(v float64) string {
	switch {
	case v >= 1e6:
		return strings.TrimSuffix(strings.TrimSuffix(fmt.Sprintf("%.2f", v/1e6), "0"), ".0") + "M"
	case v >= 1e5:
		return fmt.Sprintf("%.0fk", v/1e3)
	case v >= 1e3:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", v/1e3), ".0") + "k"
	}
	return fmt.Sprintf("%.0f", v)
}
