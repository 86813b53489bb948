// Command targets summarizes the runs of bench/targets.sh: for each of the stack's cost
// targets, the figure of every round (each round runs ours and its reference side by side),
// the median over the rounds and whether it meets the target.
//
//	go run ./bench/targets DIR
//
// DIR holds round-N-ev.json (latency, events: oob, floor-block, floor-echo, UCX ucp_am_lat),
// round-N-ack.json (latency, events, --no-echo: oob, floor-block, floor-epoll, floor-loop,
// floor-node and floor-uring, each round trip one message and its acknowledgement),
// round-N-busy.json (latency, --busy-poll: oob, floor-spin), round-N-burst.json (burst,
// window 256: oob, UCX ucp_am_bw) and, when the verbs provider ran, round-N-rdma.json (latency: rdma_twosided,
// floor-verbs, floor-verbs-echo) and round-N-rdma-ack.json (rdma_twosided and floor-verbs
// with --no-echo), as twosided bench --json writes them.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/twosided/twosided/bench"
)

// target is one row: a figure computed from one round's reports, and its bound.
type target struct {
	name   string
	file   string  // the round's report it reads
	unit   string  // "×" (a ratio) or "µs" (a difference)
	bound  float64 // 0: a figure shown for reference, not a target (no verdict)
	atMost bool    // the figure must be at most bound (else at least)
	value  func(r *bench.Report) (float64, bool)
}

func find(r *bench.Report, scenario, transport string) *bench.Result {
	for _, x := range r.Results {
		if x.Scenario == scenario && x.Transport == transport {
			return x
		}
	}
	return nil
}

func p50(x *bench.Result) (float64, bool) {
	if x == nil || x.OneWay == nil || x.OneWay.P50 <= 0 {
		return 0, false
	}
	return x.OneWay.P50, true
}

// p50Ratio is a row's figure: transport a's latency p50 over transport b's, of one report.
func p50Ratio(a, b string) func(r *bench.Report) (float64, bool) {
	return func(r *bench.Report) (float64, bool) {
		x, okX := p50(find(r, "latency", a))
		y, okY := p50(find(r, "latency", b))
		return ratio(x, y, okX, okY)
	}
}

func ratio(a, b float64, okA, okB bool) (float64, bool) {
	if !okA || !okB || b <= 0 {
		return 0, false
	}
	return a / b, true
}

var targets = []target{
	{"oob one-way p50 / floor-block (events)", "ev", "×", 1.3, true, p50Ratio("oob", "floor-block")},
	{"oob one-way p50 / floor-spin (busy poll)", "busy", "×", 1.3, true, p50Ratio("oob", "floor-spin")},
	// The echoed round trip's like for like: floor-echo moves the echo's four frames (the
	// message, the echo on the receiver's own connection, both acked) over raw sockets.
	{"floor-echo p50 / floor-block (events)", "ev", "×", 0, true, p50Ratio(bench.FloorEcho, "floor-block")},
	{"oob one-way p50 / floor-echo (events)", "ev", "×", 0, true, p50Ratio("oob", bench.FloorEcho)},
	{"oob busy-poll p50 / UCX ucp_am_lat (TCP)", "busy+ev", "×", 2, true, nil}, // two reports: below
	// The acked runs compare like with like: a round trip is one notify and its ACK, as
	// floor-block's is one message and its ack (the echo runs above move two notifies and
	// two ACKs per round trip against the floor's message and ack).
	{"oob p50 / floor-block (acked, no echo)", "ack", "×", 1.3, true, p50Ratio("oob", "floor-block")},
	{"CPU per notify, oob / floor-block (acked)", "ack", "×", 1.5, true, func(r *bench.Report) (float64, bool) {
		return cpuRatio(r, "oob", "floor-block")
	}},
	// Where the acked ratio comes from: the reactor's waits alone (floor-epoll: epoll_wait
	// then read, ExecWait's disarm and re-arm, no engine), then the engine's code over them.
	{"floor-epoll p50 / floor-block (acked)", "ack", "×", 0, true, p50Ratio(bench.FloorEpoll, "floor-block")},
	{"oob p50 / floor-epoll (acked)", "ack", "×", 0, true, p50Ratio("oob", bench.FloorEpoll)},
	// The layers above the waits, one at a time: the same exchange on the engines' reactor
	// (floor-loop: fd handlers, the turn, ExecWait), then as the engine's OOB frames through
	// an oob.Node on it (floor-node); oob adds the notify engine on top.
	{"floor-loop p50 / floor-block (acked)", "ack", "×", 0, true, p50Ratio(bench.FloorLoop, "floor-block")},
	{"floor-node p50 / floor-block (acked)", "ack", "×", 0, true, p50Ratio(bench.FloorNode, "floor-block")},
	// The same exchange waited for as a reactor on io_uring would wait (one io_uring_enter
	// per hop, the sender's disarm carried in it, its re-arm an epoll_ctl).
	{"floor-uring p50 / floor-block (acked)", "ack", "×", 0, true, p50Ratio(bench.FloorURing, "floor-block")},
	{"CPU, floor-uring / floor-block (acked)", "ack", "×", 0, true, func(r *bench.Report) (float64, bool) {
		return cpuRatio(r, bench.FloorURing, "floor-block")
	}},
	{"CPU, echoed round trip / floor-block's", "ev", "×", 0, true, func(r *bench.Report) (float64, bool) {
		return cpuRatio(r, "oob", "floor-block")
	}},
	{"burst, window 256: oob / UCX ucp_am_bw", "burst", "×", 1, false, func(r *bench.Report) (float64, bool) {
		a, b := find(r, "burst", "oob"), find(r, "burst", bench.TransportUCX)
		if a == nil || b == nil {
			return 0, false
		}
		return ratio(a.OpsPerSec, b.OpsPerSec, true, true)
	}},
	{"rdma_twosided p50 - floor-verbs p50", "rdma", "µs", 3, true, p50Gap(bench.TransportRDMA, "floor-verbs")},
	// The echoed round trip's like for like on the device: floor-verbs-echo moves the
	// echo's SENDs (the message, the echo on the receiver's own QP, each answered).
	{"floor-verbs-echo p50 - floor-verbs p50", "rdma", "µs", 0, true, p50Gap(bench.FloorVerbsEcho, "floor-verbs")},
	{"rdma_twosided p50 - floor-verbs-echo p50", "rdma", "µs", 0, true, p50Gap(bench.TransportRDMA, bench.FloorVerbsEcho)},
	// As for oob: floor-verbs's round trip is one SEND and its one-byte answer, so the
	// like-for-like round trip of rdma_twosided is a notify and its ACK.
	{"rdma_twosided p50 - floor-verbs p50 (acked)", "rdma-ack", "µs", 3, true, p50Gap(bench.TransportRDMA, "floor-verbs")},
	{"CPU per notify, rdma_twosided / floor-verbs (acked)", "rdma-ack", "×", 1.5, true, func(r *bench.Report) (float64, bool) {
		return cpuRatio(r, bench.TransportRDMA, "floor-verbs")
	}},
	{"CPU, rdma echoed round trip / floor-verbs's", "rdma", "×", 0, true, func(r *bench.Report) (float64, bool) {
		return cpuRatio(r, bench.TransportRDMA, "floor-verbs")
	}},
	// How evenly the machine's CPUs ran a fixed loop around the echo's run: on a VM whose
	// host slows one vCPU, a round's ratios depend on which vCPU each process ran on.
	{"CPU speeds, slowest / fastest (echo run)", "ev", "×", 0, true, func(r *bench.Report) (float64, bool) {
		if r.Settings.CPUCheck == nil {
			return 0, false
		}
		return r.Settings.CPUCheck.Spread(), true
	}},
}

// p50Gap is a row's figure: transport a's latency p50 minus transport b's, of one report.
func p50Gap(a, b string) func(r *bench.Report) (float64, bool) {
	return func(r *bench.Report) (float64, bool) {
		x, okX := p50(find(r, "latency", a))
		y, okY := p50(find(r, "latency", b))
		return x - y, okX && okY
	}
}

func cpuRatio(r *bench.Report, ours, ref string) (float64, bool) {
	a, b := find(r, "latency", ours), find(r, "latency", ref)
	if a == nil || b == nil {
		return 0, false
	}
	return ratio(a.CPUPerNotifyUS, b.CPUPerNotifyUS, true, true)
}

// info reports whether t is shown for reference only.
func (t target) info() bool { return t.bound == 0 }

func load(dir string, round int, kind string) *bench.Report {
	b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("round-%d-%s.json", round, kind)))
	if err != nil {
		return nil
	}
	var r bench.Report
	if json.Unmarshal(b, &r) != nil {
		return nil
	}
	return &r
}

func rounds(dir string) []int {
	var out []int
	m, _ := filepath.Glob(filepath.Join(dir, "round-*-ev.json"))
	for _, f := range m {
		var n int
		if _, err := fmt.Sscanf(filepath.Base(f), "round-%d-ev.json", &n); err == nil {
			out = append(out, n)
		}
	}
	sort.Ints(out)
	return out
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func summarize(w io.Writer, dir string) int {
	rs := rounds(dir)
	if len(rs) == 0 {
		fmt.Fprintf(os.Stderr, "targets: no round-N-ev.json in %s\n", dir)
		return 2
	}
	fmt.Fprintf(w, "%-52s %-26s %8s %8s  %s\n", "target", "rounds", "median", "bound", "")
	missed := 0
	for _, t := range targets {
		var vals []string
		var got []float64
		for _, n := range rs {
			var v float64
			var ok bool
			if t.value == nil { // busy-poll p50 over the same round's UCX ucp_am_lat
				busy, ev := load(dir, n, "busy"), load(dir, n, "ev")
				if busy != nil && ev != nil {
					a, okA := p50(find(busy, "latency", "oob"))
					b, okB := p50(find(ev, "latency", bench.TransportUCX))
					v, ok = ratio(a, b, okA, okB)
				}
			} else if r := load(dir, n, t.file); r != nil {
				v, ok = t.value(r)
			}
			if !ok {
				vals = append(vals, "-")
				continue
			}
			got = append(got, v)
			vals = append(vals, fmt.Sprintf("%.2f", v))
		}
		if len(got) == 0 {
			fmt.Fprintf(w, "%-52s %-26s %8s %8s  not run\n", t.name, strings.Join(vals, " "), "-", bound(t))
			continue
		}
		m := median(got)
		if t.info() {
			fmt.Fprintf(w, "%-52s %-26s %7.2f%s %8s  for reference\n", t.name, strings.Join(vals, " "), m, t.unit, bound(t))
			continue
		}
		met := (t.atMost && m <= t.bound) || (!t.atMost && m >= t.bound)
		verdict := "met"
		if !met {
			verdict = "NOT met"
			missed++
		}
		fmt.Fprintf(w, "%-52s %-26s %7.2f%s %8s  %s\n", t.name, strings.Join(vals, " "), m, t.unit, bound(t), verdict)
	}
	if missed > 0 {
		return 1
	}
	return 0
}

func bound(t target) string {
	if t.info() {
		return "-"
	}
	op := "≥"
	if t.atMost {
		op = "≤"
	}
	return fmt.Sprintf("%s%g%s", op, t.bound, t.unit)
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: go run ./bench/targets DIR")
		os.Exit(2)
	}
	os.Exit(summarize(os.Stdout, os.Args[1]))
}
