package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twosided/twosided/bench"
)

func writeReport(t *testing.T, dir string, round int, kind string, rs ...*bench.Result) {
	t.Helper()
	b, err := json.Marshal(&bench.Report{Results: rs})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("round-%d-%s.json", round, kind)), b, 0o644))
}

func lat(transport string, p50, cpu float64) *bench.Result {
	return &bench.Result{Scenario: "latency", Transport: transport, OneWay: &bench.Summary{P50: p50}, CPUPerNotifyUS: cpu}
}

// Each round's figure is ours over the reference of the same round; the verdict is taken
// on the median of the rounds; a target without its runs says so and does not count.
func TestSummarize(t *testing.T) {
	dir := t.TempDir()
	for r, oob := range []float64{20, 26, 30} { // over floor-block 20: 1.0, 1.3, 1.5
		n := r + 1
		writeReport(t, dir, n, "ev", lat("oob", oob, 90), lat("floor-block", 20, 50), lat(bench.FloorEcho, 21, 80), lat(bench.TransportUCX, 10, 0))
		writeReport(t, dir, n, "ack", lat("oob", oob*1.2, 70), lat("floor-block", 20, 50), lat(bench.FloorEpoll, 22, 55), lat(bench.FloorLoop, 23, 56), lat(bench.FloorNode, 24, 58), lat(bench.FloorURing, 20.4, 45)) // 1.2, 1.56, 1.8; CPU 1.4
		writeReport(t, dir, n, "busy", lat("oob", 15, 0), lat("floor-spin", 10, 0))
		writeReport(t, dir, n, "burst",
			&bench.Result{Scenario: "burst", Transport: "oob", OpsPerSec: 100},
			&bench.Result{Scenario: "burst", Transport: bench.TransportUCX, OpsPerSec: 200})
	}
	var out strings.Builder
	code := summarize(&out, dir)
	s := out.String()
	require.Equal(t, 1, code, s)
	line := func(prefix string) string {
		for _, l := range strings.Split(s, "\n") {
			if strings.HasPrefix(l, prefix) {
				return l
			}
		}
		t.Fatalf("no line %q in\n%s", prefix, s)
		return ""
	}
	require.Contains(t, line("oob one-way p50 / floor-block"), "1.00 1.30 1.50")
	require.Contains(t, line("oob one-way p50 / floor-block"), "1.30×")
	require.True(t, strings.HasSuffix(line("oob one-way p50 / floor-block"), "  met"))
	require.Contains(t, line("oob one-way p50 / floor-spin"), "NOT met")
	require.True(t, strings.HasSuffix(line("floor-echo p50 / floor-block"), "1.05×        -  for reference"), line("floor-echo p50 / floor-block"))
	require.Contains(t, line("oob one-way p50 / floor-echo"), "0.95 1.24 1.43") // 20, 26, 30 over 21
	require.Contains(t, line("oob busy-poll p50 / UCX"), "1.50×")
	require.Contains(t, line("oob p50 / floor-block (acked"), "1.20 1.56 1.80")
	require.Contains(t, line("oob p50 / floor-block (acked"), "NOT met") // 1.56
	require.True(t, strings.HasSuffix(line("CPU per notify, oob"), "1.40×    ≤1.5×  met"), line("CPU per notify, oob"))
	require.True(t, strings.HasSuffix(line("floor-epoll p50 / floor-block"), "1.10×        -  for reference"), line("floor-epoll p50 / floor-block"))
	require.True(t, strings.HasSuffix(line("floor-loop p50 / floor-block"), "1.15×        -  for reference"), line("floor-loop p50 / floor-block"))
	require.True(t, strings.HasSuffix(line("floor-node p50 / floor-block"), "1.20×        -  for reference"), line("floor-node p50 / floor-block"))
	require.True(t, strings.HasSuffix(line("floor-uring p50 / floor-block"), "1.02×        -  for reference"), line("floor-uring p50 / floor-block"))
	require.True(t, strings.HasSuffix(line("CPU, floor-uring / floor-block"), "0.90×        -  for reference"), line("CPU, floor-uring / floor-block"))
	// The echoed round trip's CPU (1.8×) is shown for reference: no bound, no verdict.
	require.True(t, strings.HasSuffix(line("CPU, echoed round trip"), "1.80×        -  for reference"), line("CPU, echoed round trip"))
	require.Contains(t, line("burst, window 256"), "0.50×")
	require.Contains(t, line("rdma_twosided p50 - floor-verbs p50 "), "not run")
	require.Contains(t, line("rdma_twosided p50 - floor-verbs p50 (acked)"), "not run")

	// The rdma rows: the echoed gap and the acked gap are targets, the echoed CPU is shown
	// for reference and the acked CPU is the target.
	rd := t.TempDir()
	for r, gap := range []float64{4, 2, 9} {
		n := r + 1
		writeReport(t, rd, n, "ev", lat("oob", 20, 50), lat("floor-block", 20, 50))
		writeReport(t, rd, n, "rdma", lat(bench.TransportRDMA, 40+gap+10, 200), lat("floor-verbs", 40, 100), lat(bench.FloorVerbsEcho, 47, 180))
		writeReport(t, rd, n, "rdma-ack", lat(bench.TransportRDMA, 40+gap, 90), lat("floor-verbs", 40, 100))
	}
	out.Reset()
	summarize(&out, rd)
	s = out.String()
	require.Contains(t, line("rdma_twosided p50 - floor-verbs p50 "), "14.00 12.00 19.00")
	require.Contains(t, line("rdma_twosided p50 - floor-verbs p50 "), "NOT met")
	require.Contains(t, line("rdma_twosided p50 - floor-verbs p50 (acked)"), "4.00 2.00 9.00")
	require.True(t, strings.HasSuffix(line("rdma_twosided p50 - floor-verbs p50 (acked)"), "4.00µs     ≤3µs  NOT met"), line("rdma_twosided p50 - floor-verbs p50 (acked)"))
	require.True(t, strings.HasSuffix(line("CPU per notify, rdma_twosided"), "0.90×    ≤1.5×  met"), line("CPU per notify, rdma_twosided"))
	require.True(t, strings.HasSuffix(line("CPU, rdma echoed"), "2.00×        -  for reference"), line("CPU, rdma echoed"))
	// The echo's like for like on the device: the floor's own echo over its ping-pong, and
	// ours over that (54, 52, 59 against 47).
	require.True(t, strings.HasSuffix(line("floor-verbs-echo p50 - floor-verbs p50"), "7.00µs        -  for reference"), line("floor-verbs-echo p50 - floor-verbs p50"))
	require.Contains(t, line("rdma_twosided p50 - floor-verbs-echo p50"), "7.00 5.00 12.00")

	var none strings.Builder
	require.Equal(t, 2, summarize(&none, t.TempDir()))
}
