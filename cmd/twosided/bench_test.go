package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBenchCommandTinyRun(t *testing.T) {
	dir := t.TempDir()
	jsonPath, svgPath := filepath.Join(dir, "b.json"), filepath.Join(dir, "b.svg")
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"bench", "--procs", "1", "--transport", "floor-block",
		"--scenario", "latency,burst", "-n", "20", "--size", "16,1K", "--warmup", "2",
		"--json", jsonPath, "--plot", svgPath}, &out, &errOut)
	require.Equal(t, 0, code, "stderr: %s", errOut.String())
	require.Contains(t, out.String(), "latency: sequential")
	require.Contains(t, out.String(), "1 KiB")

	b, err := os.ReadFile(jsonPath)
	require.NoError(t, err)
	var rep struct {
		Settings map[string]any   `json:"settings"`
		Results  []map[string]any `json:"results"`
	}
	require.NoError(t, json.Unmarshal(b, &rep))
	require.Len(t, rep.Results, 3) // latency at 16 B, burst at 16 B and 1 KiB
	require.NotEmpty(t, rep.Settings["commit"])

	svg, err := os.ReadFile(svgPath)
	require.NoError(t, err)
	require.NoError(t, xml.Unmarshal(svg, new(struct {
		XMLName xml.Name `xml:"svg"`
	})))
}

func TestBenchCommandRejectsBadFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"unknown scenario", []string{"--scenario", "warp"}, 1, "scenario: \"warp\""},
		{"bad size", []string{"--size", "12Q"}, 2, "size \"12Q\""},
		{"procs", []string{"--procs", "3"}, 1, "procs: 3"},
		{"stray argument", []string{"extra"}, 2, "unexpected arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(context.Background(), append([]string{"bench"}, tt.args...), &out, &errOut)
			require.Equal(t, tt.code, code)
			require.Contains(t, errOut.String(), tt.want)
		})
	}
}

func TestParseSize(t *testing.T) {
	tests := []struct {
		in   string
		want int
		ok   bool
	}{
		{"64", 64, true}, {"4K", 4096, true}, {"64KiB", 65536, true}, {"1m", 1 << 20, true},
		{"16B", 16, true}, {"0", 0, false}, {"-1", 0, false}, {"K", 0, false}, {"1.5K", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseSize(tt.in)
			if !tt.ok {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestBenchHelp(t *testing.T) {
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run(context.Background(), []string{"bench", "--help"}, &out, &errOut))
	require.True(t, strings.Contains(errOut.String(), "-busy-poll") || strings.Contains(out.String(), "-busy-poll"))
}

// TestBenchProgress: bench draws its status line on a terminal stderr once a run lasts past
// 2 s, and never on stdout; a stderr that is not a terminal gets nothing.
func TestBenchProgress(t *testing.T) {
	tty, screen := openScreen(t)
	args := []string{"bench", "--procs", "1", "--transport", "oob", "--scenario", "idle", "--peers", "1", "-D", "3s"}
	var out bytes.Buffer
	require.Equal(t, 0, run(context.Background(), args, &out, tty))
	require.NoError(t, tty.Close())
	drawn := <-screen
	require.Contains(t, drawn, "bench [1/1] idle oob")
	require.NotContains(t, out.String(), "bench [1/1]", "the status line went to stdout")
	require.Contains(t, out.String(), "idle: 1 peers connected")

	var out2, errOut bytes.Buffer
	require.Equal(t, 0, run(context.Background(), args, &out2, &errOut))
	require.Empty(t, errOut.String(), "a status line on a stderr that is not a terminal")
}
