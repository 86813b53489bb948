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
		writeReport(t, dir, n, "ev", lat("oob", oob, 90), lat("floor-block", 20, 50), lat(bench.TransportUCX, 10, 0))
		writeReport(t, dir, n, "ack", lat("oob", oob*1.2, 70), lat("floor-block", 20, 50), lat(bench.FloorEpoll, 22, 55)) // 1.2, 1.56, 1.8; CPU 1.4
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
	require.Contains(t, line("oob busy-poll p50 / UCX"), "1.50×")
	require.Contains(t, line("oob p50 / floor-block (acked"), "1.20 1.56 1.80")
	require.Contains(t, line("oob p50 / floor-block (acked"), "NOT met") // 1.56
	require.True(t, strings.HasSuffix(line("CPU per notify, oob"), "1.40×    ≤1.5×  met"), line("CPU per notify, oob"))
	require.True(t, strings.HasSuffix(line("floor-epoll p50 / floor-block"), "1.10×        -  for reference"), line("floor-epoll p50 / floor-block"))
	// The echoed round trip's CPU (1.8×) is shown for reference: no bound, no verdict.
	require.True(t, strings.HasSuffix(line("CPU, echoed round trip"), "1.80×        -  for reference"), line("CPU, echoed round trip"))
	require.Contains(t, line("burst, window 256"), "0.50×")
	require.Contains(t, line("rdma_twosided p50 - floor-verbs"), "not run")

	var none strings.Builder
	require.Equal(t, 2, summarize(&none, t.TempDir()))
}
