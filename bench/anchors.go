package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Anchors are outside references run beside ours: UCX's ucx_perftest over UCX's tcp
// transport on this host's loopback (or, against a bench server, between the hosts: the
// server runs ucx_perftest's server side), ucp_am_lat beside the latency rows (its p50 is half
// the round trip, as UCX reports it, with both sides busy polling) and ucp_am_bw beside the
// burst rows, at the same sizes. They appear in the tables as transport TransportUCX, and
// in the JSON under "anchors" with the exact commands.

// AnchorUCX names the UCX anchors (Config.Anchors, --anchors ucx).
const AnchorUCX = "ucx"

// TransportUCX is the anchors' rows in the tables and the JSON.
const TransportUCX = "ucx-am/tcp"

// Anchor is one ucx_perftest run, or the reason there was none.
type Anchor struct {
	Tool     string `json:"tool"`
	Test     string `json:"test,omitempty"`
	Scenario string `json:"scenario,omitempty"`
	Size     int    `json:"size,omitempty"`
	Command  string `json:"command,omitempty"` // the client's, with its environment
	Skipped  string `json:"skipped,omitempty"`
	Error    string `json:"error,omitempty"`
	// Figures of the run ("Final:" line): latency p50 and mean in µs (one-way: UCX's
	// latency tests report half the round trip), message rate and bandwidth.
	Iterations int64   `json:"iterations,omitempty"`
	P50US      float64 `json:"p50_us,omitempty"`
	AvgUS      float64 `json:"avg_us,omitempty"`
	OpsPerSec  float64 `json:"ops_per_s,omitempty"`
	MBPerSec   float64 `json:"mb_per_s,omitempty"`
}

// ucxFigures is what parseUCXPerftest reads off ucx_perftest's output.
type ucxFigures struct {
	iterations      int64
	p50, avg        float64 // µs: latency (lat tests) or overhead (bw tests)
	mbps, msgRate   float64 // overall
	latency, typeOK bool    // the table's head named latency (true) or overhead
}

var errUCXOutput = errors.New("bench: ucx_perftest output")

// parseUCXPerftest reads the "Final:" line of ucx_perftest's table: iterations, then
// typical (percentile) latency, average and overall latency in µs, average and overall
// bandwidth in MB/s, average and overall message rate. Thousands separators (-N) are
// accepted; a run that printed no Final line (killed, failed) is an error naming why.
func parseUCXPerftest(out []byte) (ucxFigures, error) {
	var f ucxFigures
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	final := ""
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.Contains(line, "latency (usec)"):
			f.latency, f.typeOK = true, true
		case strings.Contains(line, "overhead (usec)"):
			f.latency, f.typeOK = false, true
		case strings.HasPrefix(line, "Final:"):
			final = strings.TrimSpace(strings.TrimPrefix(line, "Final:"))
		}
	}
	if final == "" {
		tail := strings.TrimSpace(string(out))
		if i := strings.LastIndexByte(tail, '\n'); i >= 0 {
			tail = tail[i+1:]
		}
		if len(tail) > 200 {
			tail = tail[len(tail)-200:]
		}
		return f, fmt.Errorf("%w: no Final line (last line: %q)", errUCXOutput, tail)
	}
	fields := strings.Fields(final)
	if len(fields) != 8 {
		return f, fmt.Errorf("%w: Final line has %d fields, want 8: %q", errUCXOutput, len(fields), final)
	}
	nums := make([]float64, len(fields))
	for i, s := range fields {
		v, err := strconv.ParseFloat(strings.ReplaceAll(s, ",", ""), 64)
		if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
			return f, fmt.Errorf("%w: Final line field %d %q is not a finite number", errUCXOutput, i+1, s)
		}
		nums[i] = v
	}
	f.iterations = int64(nums[0])
	f.p50, f.avg = nums[1], nums[2]
	f.mbps, f.msgRate = nums[5], nums[7]
	return f, nil
}

// ucxEnv is the environment of both ucx_perftest processes: UCX's tcp transport (the
// wire ours use here), on loopback.
var ucxEnv = []string{"UCX_TLS=tcp"}

// runUCXAnchors runs ucp_am_lat at the latency size and ucp_am_bw at every burst size (each
// Repeat times, the median reported with its spread), adds their rows to rep.Results and
// returns what ran.
func runUCXAnchors(ctx context.Context, cfg *Config, rep *Report) []*Anchor {
	path, err := exec.LookPath("ucx_perftest")
	if err != nil {
		return []*Anchor{{Tool: "ucx_perftest", Skipped: "ucx_perftest not found in PATH (Debian/Ubuntu package ucx-utils): UCX anchors skipped"}}
	}
	size := defaultSize
	if len(cfg.Sizes) > 0 {
		size = cfg.Sizes[0]
	}
	var out []*Anchor
	if slices.Contains(cfg.Scenarios, ScenarioLatency) {
		n := cfg.Count
		if n == 0 {
			n = defaultCount
		}
		// ucx_perftest has no time limit, and its round trip is short: a count that keeps
		// ours busy for a second may end its run in half of one. A short run measures the
		// round trip, and the run then has at least BurstTime's worth of iterations (as
		// ucp_am_bw's below; at most 1 000 000).
		if c := runUCX(ctx, cfg, path, "ucp_am_lat", ScenarioLatency, size, 2000); c.Error == "" && c.AvgUS > 0 {
			n = max(n, min(int(1e6), int(math.Ceil(float64(cfg.BurstTime/time.Microsecond)/(2*c.AvgUS)))))
		}
		a := runUCX(ctx, cfg, path, "ucp_am_lat", ScenarioLatency, size, n)
		out = append(out, a)
		if a.Error == "" {
			rep.Results = append(rep.Results, &Result{Scenario: ScenarioLatency, Transport: TransportUCX, Procs: 2, Size: size, Peers: 1,
				Notifies: a.Iterations, OneWay: &Summary{Count: a.Iterations, P50: a.P50US, Mean: a.AvgUS},
				OneWayMethod: "ucx_perftest: rtt/2, busy polling (p50, mean)", OpsPerSec: a.OpsPerSec, MBPerSec: a.MBPerSec})
		}
	}
	if slices.Contains(cfg.Scenarios, ScenarioBurst) {
		sizes := cfg.Sizes
		if len(sizes) == 0 {
			sizes = DefaultSizes
		}
		for _, sz := range sizes {
			n := cfg.Count
			if n == 0 {
				// ucx_perftest has no time limit: a short run measures the rate, and each
				// repeat then runs about BurstTime at it (2 000 to 1 000 000 iterations).
				n = 2000
				if a := runUCX(ctx, cfg, path, "ucp_am_bw", ScenarioBurst, sz, n); a.Error == "" && a.OpsPerSec > 0 {
					n = int(max(2000, min(1e6, a.OpsPerSec*cfg.BurstTime.Seconds())))
				}
			}
			var runs []*Result
			for range cfg.Repeat {
				a := runUCX(ctx, cfg, path, "ucp_am_bw", ScenarioBurst, sz, n)
				out = append(out, a)
				if a.Error != "" {
					break
				}
				runs = append(runs, &Result{Scenario: ScenarioBurst, Transport: TransportUCX, Procs: 2, Size: max(sz, minSize), Peers: 1,
					Notifies: a.Iterations, OpsPerSec: a.OpsPerSec, MBPerSec: a.MBPerSec})
			}
			if len(runs) > 0 {
				rep.Results = append(rep.Results, mergeRepeats(runs))
			}
		}
	}
	return out
}

// runUCX runs one ucx_perftest server and client pair on loopback; a server that finds its
// port taken (another process got it after freePort) is tried on another, up to 3 times.
func runUCX(ctx context.Context, cfg *Config, path, test, scenario string, size, n int) *Anchor {
	var a *Anchor
	for range 3 {
		a = runUCXOnce(ctx, cfg, path, test, scenario, size, n)
		if !strings.Contains(a.Error, "Address already in use") {
			break
		}
	}
	return a
}

func runUCXOnce(ctx context.Context, cfg *Config, path, test, scenario string, size, n int) *Anchor {
	ctx, cancel := context.WithTimeout(ctx, cfg.RunTimeout)
	defer cancel()
	a := &Anchor{Tool: "ucx_perftest", Test: test, Scenario: scenario, Size: size}
	host := "127.0.0.1"
	var (
		port   int
		exited <-chan struct{}
		why    func() string
	)
	if cfg.Server != "" {
		// The server host runs ucx_perftest's server for this one run.
		rs, err := startRemoteUCX(ctx, cfg.Server)
		if err != nil {
			a.Error = err.Error()
			return a
		}
		defer rs.close()
		host, port, exited, why = rs.host, rs.port, rs.done, func() string { return "the bench server ended the ucx_perftest run" }
	} else {
		p, err := freePort("127.0.0.1")
		if err != nil {
			a.Error = err.Error()
			return a
		}
		ls, err := startUCXServer(ctx, path, p)
		if err != nil {
			a.Error = err.Error()
			return a
		}
		defer ls.stop()
		port, exited, why = p, ls.exited, func() string { return "the ucx_perftest server exited: " + lastLines(ls.out.String(), 3) }
	}
	args := []string{host, "-p", strconv.Itoa(port), "-t", test, "-s", strconv.Itoa(size), "-n", strconv.Itoa(n)}
	a.Command = strings.Join(ucxEnv, " ") + " ucx_perftest " + strings.Join(args, " ")
	// The server says nothing a pipe sees before it exits (its stdout is block-buffered),
	// so the client retries while the server is not listening yet: up to 10 s.
	var b bytes.Buffer // ucx_perftest prints its errors on stdout
	for start := time.Now(); ; {
		cli := exec.CommandContext(ctx, path, args...)
		cli.Env = append(os.Environ(), ucxEnv...)
		b.Reset()
		cli.Stdout, cli.Stderr = &b, &b
		err := cli.Run()
		if err == nil {
			break
		}
		select {
		case <-exited:
			a.Error = why()
			return a
		default:
		}
		if !strings.Contains(b.String(), "Connection refused") || time.Since(start) > 10*time.Second || ctx.Err() != nil {
			a.Error = fmt.Sprintf("ucx_perftest client: %v: %s", err, lastLines(b.String(), 3))
			return a
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	f, err := parseUCXPerftest(b.Bytes())
	if err != nil {
		a.Error = err.Error()
		return a
	}
	a.Iterations, a.P50US, a.AvgUS, a.OpsPerSec, a.MBPerSec = f.iterations, f.p50, f.avg, f.msgRate, f.mbps
	return a
}

// ucxServer is a running ucx_perftest server process.
type ucxServer struct {
	cmd    *exec.Cmd
	out    *syncBuffer
	exited chan struct{}
}

// startUCXServer starts `ucx_perftest -p port` with ucxEnv; stop kills it.
func startUCXServer(ctx context.Context, path string, port int) (*ucxServer, error) {
	srv := exec.CommandContext(ctx, path, "-p", strconv.Itoa(port))
	srv.Env = append(os.Environ(), ucxEnv...)
	s := &ucxServer{cmd: srv, out: &syncBuffer{}, exited: make(chan struct{})}
	srv.Stdout, srv.Stderr = s.out, s.out
	if err := srv.Start(); err != nil {
		return nil, fmt.Errorf("start the ucx_perftest server: %w", err)
	}
	go func() {
		_ = srv.Wait()
		close(s.exited)
	}()
	return s, nil
}

func (s *ucxServer) stop() {
	_ = s.cmd.Process.Kill()
	<-s.exited
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// freePort asks the kernel for a free TCP port on host (ucx_perftest takes a port, not
// a listener; another process may take it first, and the run then fails with the reason).
func freePort(host string) (int, error) {
	l, err := net.Listen("tcp4", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("bench: a free port for ucx_perftest: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
