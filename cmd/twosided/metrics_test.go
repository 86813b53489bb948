package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/notify"
)

// serveUntilCancel runs serve with args until ctx ends; it returns serve's stdout and
// stderr lines as they come (each channel closes when serve exits) and its exit code.
func serveUntilCancel(t *testing.T, ctx context.Context, args ...string) (stdout, stderr <-chan string, code <-chan int) {
	t.Helper()
	outR, outW := io.Pipe()
	errR, errW := io.Pipe()
	c := make(chan int, 1)
	go func() {
		n := run(ctx, append([]string{"serve", "--listen", "127.0.0.1:0"}, args...), outW, errW)
		_ = outW.Close()
		_ = errW.Close()
		c <- n
	}()
	return linesOf(outR), linesOf(errR), c
}

// linesOf reads r's lines into a channel with room for all a test produces, so the writer
// never waits on the test.
func linesOf(r io.Reader) <-chan string {
	lines := make(chan string, 4096)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	return lines
}

func nextLine(t *testing.T, lines <-chan string, prefix string) string {
	t.Helper()
	select {
	case l := <-lines:
		require.True(t, strings.HasPrefix(l, prefix), "want %q…, got %q", prefix, l)
		return l[len(prefix):]
	case <-time.After(20 * time.Second):
		t.Fatalf("no line %q…", prefix)
	}
	return ""
}

func TestServeMetrics(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sctx, stop := context.WithCancel(ctx)
	lines, stderr, code := serveUntilCancel(t, sctx, "--transport", "rdma_twosided", "--count-only",
		"--metrics", "127.0.0.1:0", "--metrics-peers", "4")
	addr := strings.Fields(nextLine(t, lines, "serving on "))[0]
	url := nextLine(t, lines, "metrics on ")
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run(ctx, []string{"send", "--peer", addr, "--transport", "rdma_twosided", "-n", "7", "--quiet"}, &out, &errOut), errOut.String())

	scrape := func() string {
		resp, err := http.Get(url)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, resp.Body.Close())
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		return string(body)
	}
	// A send succeeds when the peer's NIC acknowledged it (RC): the serving loop may not
	// have reaped the last completions yet when send returns, so the scrape waits for them.
	// send closed its engine: its goodbye frees the channel and the peer here.
	var text string
	require.Eventually(t, func() bool {
		text = scrape()
		return strings.Contains(text, "\ntwosided_notifies_delivered_total 7\n") &&
			strings.Contains(text, "\ntwosided_channels_up 0\n") && strings.Contains(text, "\ntwosided_peers 0\n")
	}, 10*time.Second, 20*time.Millisecond, "want 7 delivered, the closed sender's channel and peer gone")
	require.Contains(t, text, "\ntwosided_notify_duplicates_dropped_total 0\n")
	require.Contains(t, text, "\ntwosided_peers_pruned_total 1\n")
	for _, name := range []string{"twosided_notifies_sent_total", "twosided_notifies_failed_total{reason=\"timeout\"}",
		"twosided_notify_fallbacks_total", "twosided_notify_duplicates_dropped_total", "twosided_frames_dropped_total",
		"twosided_credit_stalls_total", "twosided_device_rnr_naks_total", "twosided_peers", "twosided_receive_queue_depth",
		"twosided_reactor_wakeups_total", "twosided_reactor_busy_seconds_total", "twosided_send_to_ack_seconds_bucket",
		"twosided_receive_to_deliver_seconds_count", "go_goroutines", "process_open_fds"} {
		require.Contains(t, text, "\n"+name, name)
	}
	stop()
	require.Equal(t, 0, <-code, strings.Join(collect(stderr), "\n"))
	_, err := http.Get(url)
	require.Error(t, err, "the metrics endpoint outlived serve")
}

// collect returns the lines left, until the channel closes.
func collect(lines <-chan string) []string {
	var got []string
	for l := range lines {
		got = append(got, l)
	}
	return got
}

var statsLineRE = regexp.MustCompile(`^stats interval=\S+ sent=\d+/s delivered=\d+/s failed=\d+/s fallbacks=\d+/s dups=\d+/s ` +
	`queue=\d+ channels=\d+ peers=\d+ wakeups=\d+/s busy=\d+\.\d% ack_p50=\S+ ack_p99=\S+$`)

func TestServeStatsLine(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sctx, stop := context.WithCancel(ctx)
	lines, stderr, code := serveUntilCancel(t, sctx, "--count-only", "--stats", "10ms")
	addr := strings.Fields(nextLine(t, lines, "serving on "))[0]
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run(ctx, []string{"send", "--peer", addr, "-n", "4", "--quiet"}, &out, &errOut), errOut.String())
	for range 2 { // two intervals at least, whatever the machine's speed
		require.Regexp(t, statsLineRE, "stats interval="+nextLine(t, stderr, "stats interval="))
	}
	stop()
	got := collect(stderr)
	require.Equal(t, 0, <-code, strings.Join(got, "\n"))
	require.NotEmpty(t, got)
	for _, l := range got[:len(got)-1] {
		require.Regexp(t, statsLineRE, l)
	}
	require.Equal(t, "stats total sent=0 delivered=4 failed=0 fallbacks=0 dups=0", got[len(got)-1])
}

func TestStatsLineFormat(t *testing.T) {
	bounds := []time.Duration{time.Microsecond, 10 * time.Microsecond, 100 * time.Microsecond}
	prev := notify.Stats{
		Sent: 100, Delivered: 10, Failed: map[string]uint64{"timeout": 1}, Limits: notify.LimitStats{Fallbacks: 1},
		Reactor:     notify.ReactorStats{Wakeups: 50, Busy: time.Second},
		SendLatency: notify.Histogram{Bounds: bounds, Counts: []uint64{5, 5, 0, 0}, Count: 10},
	}
	cur := notify.Stats{
		Sent: 300, Delivered: 30, Failed: map[string]uint64{"timeout": 3, "unreachable": 2},
		Limits: notify.LimitStats{Fallbacks: 5, Duplicates: 2}, Queued: 7, ChannelsUp: 2, PeerCount: 3,
		Reactor: notify.ReactorStats{Wakeups: 250, Busy: time.Second + 500*time.Millisecond},
		// The interval: 100 sends ≤10µs, 99 ≤100µs, 1 above.
		SendLatency: notify.Histogram{Bounds: bounds, Counts: []uint64{5, 105, 99, 1}, Count: 210},
	}
	require.Equal(t, "stats interval=2s sent=100/s delivered=10/s failed=2/s fallbacks=2/s dups=1/s queue=7 channels=2 peers=3 wakeups=100/s busy=25.0% ack_p50=≤10µs ack_p99=≤100µs",
		statsLine(prev, cur, 2*time.Second))
	require.Equal(t, "stats total sent=300 delivered=30 failed=unreachable:2,timeout:3 fallbacks=5 dups=2", statsTotal(cur))

	h := func(counts ...uint64) notify.Histogram {
		var n uint64
		for _, c := range counts {
			n += c
		}
		return notify.Histogram{Bounds: bounds, Counts: counts, Count: n}
	}
	zero := h(0, 0, 0, 0)
	require.Equal(t, "-", quantile(zero, zero, 0.5), "no sends")
	require.Equal(t, ">100µs", quantile(zero, h(0, 0, 0, 1), 0.5))
	require.Equal(t, "≤1µs", quantile(zero, h(1, 0, 0, 0), 0.99))
	require.Equal(t, "≤1µs", quantile(zero, h(99, 1, 0, 0), 0.99))
	require.Equal(t, "≤10µs", quantile(zero, h(98, 2, 0, 0), 0.99))
}

func TestServeRejectsBadObserveFlags(t *testing.T) {
	for _, args := range [][]string{{"--stats", "0"}, {"--stats", "-1s"}, {"--stats", "soon"}, {"--metrics-peers", "-1"}} {
		var out, errOut bytes.Buffer
		require.Equal(t, 2, run(context.Background(), append([]string{"serve"}, args...), &out, &errOut), args)
		require.Contains(t, errOut.String(), "flag "+args[0][1:], args)
	}
	// The metrics port is taken: serve says so and exits 1.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sctx, stop := context.WithCancel(ctx)
	lines, _, code := serveUntilCancel(t, sctx, "--metrics", "127.0.0.1:0")
	nextLine(t, lines, "serving on ")
	taken := strings.TrimSuffix(strings.TrimPrefix(nextLine(t, lines, "metrics on "), "http://"), "/metrics")
	var out, errOut bytes.Buffer
	require.Equal(t, 1, run(ctx, []string{"serve", "--listen", "127.0.0.1:0", "--metrics", taken}, &out, &errOut))
	require.Contains(t, errOut.String(), "--metrics "+taken)
	require.Empty(t, out.String(), "nothing claims to serve before every listener is bound")
	stop()
	require.Equal(t, 0, <-code)
}

// openScreen is a pseudo-terminal to stand for a terminal stderr: write to tty, close it,
// then screen gives all that was drawn. Skips where there is none.
func openScreen(t *testing.T) (tty *os.File, screen <-chan string) {
	t.Helper()
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pseudo-terminal here to stand for a terminal stderr: %v", err)
	}
	t.Cleanup(func() { _ = ptmx.Close() })
	c := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(ptmx) // until tty closes (EIO)
		c <- string(b)
	}()
	return tty, c
}

// TestSendProgress: send -n draws a bar on a terminal stderr and writes nothing to a stderr
// that is not one; stdout has the same lines either way.
func TestSendProgress(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr, served := startServe(t, ctx, "--count-only", "--expect", "40")

	tty, screen := openScreen(t)
	var out bytes.Buffer
	require.Equal(t, 0, run(ctx, []string{"send", "--peer", addr, "-n", "20", "--quiet"}, &out, tty))
	require.NoError(t, tty.Close())
	drawn := <-screen
	require.Contains(t, drawn, "send")
	require.Regexp(t, `\([1-9][0-9]*/20, `, drawn, "the bar never advanced")
	require.Contains(t, drawn, "notifies/s")
	require.NotContains(t, out.String(), "notifies/s", "the bar went to stdout")

	var out2, errOut bytes.Buffer
	require.Equal(t, 0, run(ctx, []string{"send", "--peer", addr, "-n", "20", "--quiet"}, &out2, &errOut))
	require.Empty(t, errOut.String(), "progress on a stderr that is not a terminal")
	require.Equal(t, strings.Count(out.String(), "\n"), strings.Count(out2.String(), "\n"))
	require.Equal(t, 0, (<-served).code)
}
