package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/twosided/twosided/notify"
	"github.com/twosided/twosided/notify/metrics"
)

// observeFlags are serve's --metrics and --stats: a Prometheus endpoint and a rate line
// on stderr, both reading the engine's Stats.
type observeFlags struct {
	metricsAddr string
	peerLabels  nonNegInt
	interval    positiveDuration
	ln          net.Listener // bound by listen, served by start
}

func (f *observeFlags) define(fs *flag.FlagSet) {
	fs.StringVar(&f.metricsAddr, "metrics", "", "serve Prometheus metrics on http://`host:port`/metrics, e.g. 127.0.0.1:9464 (default: off)")
	fs.Var(&f.peerLabels, "metrics-peers", "per-peer metric series for at most `n` peers (default 0: engine-wide only)")
	fs.Var(&f.interval, "stats", "print a one-line rate summary on stderr every `interval`, e.g. 1s (default: off)")
}

// nonNegInt is an int flag that refuses negative values when parsed.
type nonNegInt int

func (v *nonNegInt) String() string { return strconv.Itoa(int(*v)) }

func (v *nonNegInt) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return fmt.Errorf("%q: want a count, 0 or more", s)
	}
	*v = nonNegInt(n)
	return nil
}

// positiveDuration is a duration flag that refuses 0 and negative values when parsed.
type positiveDuration time.Duration

func (v *positiveDuration) String() string { return time.Duration(*v).String() }

func (v *positiveDuration) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return fmt.Errorf("%q: want a positive duration, e.g. 1s", s)
	}
	*v = positiveDuration(d)
	return nil
}

// listen binds the --metrics listener, before the engine starts, so that serve claims to
// serve only once every listener is bound. close releases it when start is not called.
func (f *observeFlags) listen() (close func(), err error) {
	close = func() {}
	if f.metricsAddr == "" {
		return close, nil
	}
	ln, err := net.Listen("tcp", f.metricsAddr)
	if err != nil {
		return close, fmt.Errorf("--metrics %s: %w", f.metricsAddr, err)
	}
	f.ln = ln
	return func() {
		if f.ln != nil {
			_ = f.ln.Close()
		}
	}, nil
}

// start serves /metrics on the listener listen bound and prints the stats line on stderr,
// as asked; stop ends both, printing the stats totals last. metricsURL is where the
// metrics are served ("" without --metrics).
func (f *observeFlags) start(e *notify.Engine, stderr io.Writer) (stop func(), metricsURL string) {
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	if f.ln != nil {
		s := serveMetrics(e, f.ln, int(f.peerLabels))
		f.ln = nil // the server owns it now
		metricsURL = "http://" + s.addr + "/metrics"
		stops = append(stops, s.stop)
	}
	if f.interval > 0 {
		stops = append(stops, startStatsLine(e, time.Duration(f.interval), stderr))
	}
	return stop, metricsURL
}

type metricsServer struct {
	addr string
	srv  *http.Server
	done chan struct{}
}

// serveMetrics serves the engine's collector, with the Go runtime's and the process's, on
// /metrics of ln.
func serveMetrics(e *notify.Engine, ln net.Listener, peerLabels int) *metricsServer {
	reg := prometheus.NewRegistry()
	var opts []metrics.Option
	if peerLabels > 0 {
		opts = append(opts, metrics.WithPeerLabels(peerLabels))
	}
	reg.MustRegister(metrics.New(e, opts...), collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	s := &metricsServer{addr: ln.Addr().String(), done: make(chan struct{}),
		srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}}
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(ln)
	}()
	return s
}

func (s *metricsServer) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		_ = s.srv.Close()
	}
	<-s.done
}

// startStatsLine prints statsLine every interval on w until stop, which prints statsTotal.
func startStatsLine(e *notify.Engine, interval time.Duration, w io.Writer) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	prev, at := e.Stats(), time.Now()
	go func() {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-quit:
				fmt.Fprintln(w, statsTotal(e.Stats()))
				return
			case <-t.C:
				cur, now := e.Stats(), time.Now()
				fmt.Fprintln(w, statsLine(prev, cur, now.Sub(at)))
				prev, at = cur, now
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(quit); <-done }) }
}

// statsLine is one interval's summary, as key=value pairs: rates per second of the counters,
// the gauges now, the reactor's share of busy time and the interval's send-to-ack quantiles
// (the upper bound of the bucket they fall in; "-" without sends).
func statsLine(prev, cur notify.Stats, d time.Duration) string {
	sec := d.Seconds()
	rate := func(a, b uint64) string { return fmt.Sprintf("%.0f/s", float64(b-a)/sec) }
	var failedPrev, failedCur uint64
	for _, r := range notify.FailureReasons() {
		failedPrev += prev.Failed[r]
		failedCur += cur.Failed[r]
	}
	busy := float64(cur.Reactor.Busy-prev.Reactor.Busy) / float64(d) * 100
	return fmt.Sprintf("stats interval=%v sent=%s delivered=%s failed=%s fallbacks=%s dups=%s queue=%d channels=%d peers=%d wakeups=%s busy=%.1f%% ack_p50=%s ack_p99=%s",
		d.Round(time.Millisecond), rate(prev.Sent, cur.Sent), rate(prev.Delivered, cur.Delivered),
		rate(failedPrev, failedCur), rate(prev.Limits.Fallbacks, cur.Limits.Fallbacks), rate(prev.Limits.Duplicates, cur.Limits.Duplicates),
		cur.Queued, cur.ChannelsUp, cur.PeerCount, rate(prev.Reactor.Wakeups, cur.Reactor.Wakeups), busy,
		quantile(prev.SendLatency, cur.SendLatency, 0.5), quantile(prev.SendLatency, cur.SendLatency, 0.99))
}

// statsTotal is the summary at exit: the counters since the engine started.
func statsTotal(s notify.Stats) string {
	var failed []string
	for _, r := range notify.FailureReasons() {
		if n := s.Failed[r]; n > 0 {
			failed = append(failed, fmt.Sprintf("%s:%d", r, n))
		}
	}
	fs := "0"
	if len(failed) > 0 {
		fs = strings.Join(failed, ",")
	}
	return fmt.Sprintf("stats total sent=%d delivered=%d failed=%s fallbacks=%d dups=%d",
		s.Sent, s.Delivered, fs, s.Limits.Fallbacks, s.Limits.Duplicates)
}

// quantile is the upper bound of the bucket holding quantile q of the observations made
// between two snapshots of one histogram.
func quantile(prev, cur notify.Histogram, q float64) string {
	n := cur.Count - prev.Count
	if n == 0 || len(cur.Counts) != len(prev.Counts) {
		return "-"
	}
	rank := uint64(q*float64(n-1)) + 1
	var cum uint64
	for i, c := range cur.Counts {
		cum += c - prev.Counts[i]
		if cum >= rank {
			if i == len(cur.Bounds) {
				return ">" + cur.Bounds[i-1].String()
			}
			return "≤" + cur.Bounds[i].String()
		}
	}
	return "-"
}
