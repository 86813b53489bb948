package bench

import (
	"bytes"
	"fmt"
	"os"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// writePlot draws two panels into one SVG: the one-way latency CDF of every transport
// (latency scenario), and burst throughput against message size.
func writePlot(path string, rep *Report) error {
	cdf := plot.New()
	cdf.Title.Text = "latency: one-way CDF"
	cdf.X.Label.Text = "one-way latency (µs, log)"
	cdf.Y.Label.Text = "fraction of notifies"
	cdf.X.Scale, cdf.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{}
	cdf.Legend.Top, cdf.Legend.Left = true, true
	var args []any
	for _, r := range rep.Results {
		if r.Scenario != ScenarioLatency || r.OneWay == nil || len(r.OneWay.CDF) == 0 {
			continue
		}
		pts := make(plotter.XYs, 0, len(r.OneWay.CDF))
		for _, p := range r.OneWay.CDF {
			if p.US > 0 {
				pts = append(pts, plotter.XY{X: p.US, Y: p.Quantile})
			}
		}
		if len(pts) > 0 {
			args = append(args, r.Transport, pts)
		}
	}
	if len(args) > 0 {
		if err := plotutil.AddLines(cdf, args...); err != nil {
			return fmt.Errorf("bench: plot: %w", err)
		}
	} else {
		empty(cdf)
	}

	tp := plot.New()
	tp.Title.Text = "burst: throughput vs message size"
	tp.X.Label.Text = "message size (bytes, log)"
	tp.Y.Label.Text = "MB/s"
	tp.X.Scale, tp.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{}
	tp.Legend.Top, tp.Legend.Left = true, true
	args = args[:0]
	for _, t := range append(slices.Clone(AllTransports), TransportUCX) {
		var pts plotter.XYs
		for _, r := range rep.Results {
			if r.Scenario == ScenarioBurst && r.Transport == t && r.OpsPerSec > 0 {
				pts = append(pts, plotter.XY{X: float64(r.Size), Y: r.MBPerSec})
			}
		}
		if len(pts) == 0 {
			continue
		}
		slices.SortFunc(pts, func(a, b plotter.XY) int { return int(a.X - b.X) })
		args = append(args, t, pts)
	}
	if len(args) > 0 {
		if err := plotutil.AddLinePoints(tp, args...); err != nil {
			return fmt.Errorf("bench: plot: %w", err)
		}
	} else {
		empty(tp)
	}

	const w, h = 18 * vg.Centimeter, 22 * vg.Centimeter
	c := vgsvg.New(w, h)
	dc := draw.New(c)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadY: vg.Centimeter, PadTop: vg.Millimeter * 3,
		PadBottom: vg.Millimeter * 3, PadLeft: vg.Millimeter * 3, PadRight: vg.Millimeter * 3}
	plots := [][]*plot.Plot{{cdf}, {tp}}
	canvases := plot.Align(plots, tiles, dc)
	cdf.Draw(canvases[0][0])
	tp.Draw(canvases[1][0])
	var buf bytes.Buffer
	if _, err := c.WriteTo(&buf); err != nil {
		return fmt.Errorf("bench: plot: %w", err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("bench: plot: %w", err)
	}
	return nil
}

// empty marks a panel without data; a log axis cannot span an empty range.
func empty(p *plot.Plot) {
	p.Title.Text += " (not run)"
	p.X.Scale, p.X.Tick.Marker = plot.LinearScale{}, plot.DefaultTicks{}
	p.X.Min, p.X.Max, p.Y.Min, p.Y.Max = 0, 1, 0, 1
}
