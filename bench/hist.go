package bench

import (
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Hist is a latency histogram in nanoseconds, 1 ns to 100 s at three significant digits.
// Record allocates nothing. A Hist is not safe for concurrent use.
type Hist struct {
	h *hdrhistogram.Histogram
}

const histMax = int64(100 * time.Second)

// NewHist returns an empty histogram.
func NewHist() *Hist { return &Hist{h: hdrhistogram.New(1, histMax, 3)} }

// Record adds one value in nanoseconds; values outside 1 ns..100 s are clamped.
func (h *Hist) Record(ns int64) {
	if ns < 1 {
		ns = 1
	}
	if ns > histMax {
		ns = histMax
	}
	_ = h.h.RecordValue(ns)
}

// Merge adds every value of o to h.
func (h *Hist) Merge(o *Hist) { h.h.Merge(o.h) }

// Count is the number of values recorded.
func (h *Hist) Count() int64 { return h.h.TotalCount() }

// Summary is a histogram's figures, in microseconds.
type Summary struct {
	Count int64   `json:"count"`
	Min   float64 `json:"min_us"`
	Mean  float64 `json:"mean_us"`
	P50   float64 `json:"p50_us"`
	P90   float64 `json:"p90_us"`
	P99   float64 `json:"p99_us"`
	P999  float64 `json:"p99_9_us"`
	Max   float64 `json:"max_us"`
	// CDF is the cumulative distribution: latency (µs) against quantile (0..1), for plots.
	CDF []CDFPoint `json:"cdf,omitempty"`
}

// CDFPoint is one step of a cumulative distribution.
type CDFPoint struct {
	US       float64 `json:"us"`
	Quantile float64 `json:"q"`
}

func us(ns int64) float64 { return float64(ns) / 1e3 }

// Summary returns the figures of h, or nil when h is empty. scale divides every value (2 for
// a round trip reported as one-way).
func (h *Hist) Summary(scale float64) *Summary {
	if h == nil || h.h.TotalCount() == 0 {
		return nil
	}
	if scale <= 0 {
		scale = 1
	}
	s := &Summary{
		Count: h.h.TotalCount(),
		Min:   us(h.h.Min()) / scale,
		Mean:  h.h.Mean() / 1e3 / scale,
		P50:   us(h.h.ValueAtQuantile(50)) / scale,
		P90:   us(h.h.ValueAtQuantile(90)) / scale,
		P99:   us(h.h.ValueAtQuantile(99)) / scale,
		P999:  us(h.h.ValueAtQuantile(99.9)) / scale,
		Max:   us(h.h.Max()) / scale,
	}
	vals := h.h.ValueAtPercentilesSlice(cdfPercentiles)
	for i, v := range vals {
		s.CDF = append(s.CDF, CDFPoint{US: us(v) / scale, Quantile: cdfPercentiles[i] / 100})
	}
	return s
}

// cdfPercentiles are the steps of Summary.CDF: fine in the tail, where latency lives.
var cdfPercentiles = func() []float64 {
	var ps []float64
	for p := 0.0; p < 90; p += 2.5 {
		ps = append(ps, p)
	}
	for p := 90.0; p < 99; p++ {
		ps = append(ps, p)
	}
	return append(ps, 99, 99.5, 99.9, 99.95, 99.99, 100)
}()
