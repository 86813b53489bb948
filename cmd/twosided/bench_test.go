package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"flag"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
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

func TestBenchServerFlags(t *testing.T) {
	tests := []struct {
		in   []string
		want string
	}{
		{[]string{"--server"}, ":18515"},
		{[]string{"--server", "10.0.0.1:7000"}, "10.0.0.1:7000"},
		{[]string{"--server=10.0.0.1:7000"}, "10.0.0.1:7000"},
		{[]string{"--server", "10.0.0.1"}, "10.0.0.1:18515"},
		{[]string{"--server", ":7000"}, ":7000"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.in, " "), func(t *testing.T) {
			fs := flag.NewFlagSet("bench", flag.ContinueOnError)
			var f serverFlag
			fs.Var(&f, "server", "")
			require.NoError(t, fs.Parse(joinServerAddr(tt.in)))
			require.True(t, f.set)
			require.Equal(t, tt.want, f.addr)
			require.Zero(t, fs.NArg())
		})
	}
}

func TestBenchClientAndServerErrors(t *testing.T) {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	closed := l.Addr().String()
	l.Close()
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"server not reachable", []string{"--client", closed, "--scenario", "latency", "--transport", "floor-block"}, 1, "server not reachable: --client " + closed},
		{"client without a port", []string{"--client", "somehost"}, 1, "client: \"somehost\""},
		{"server with run flags", []string{"--server", "127.0.0.1:0", "--scenario", "burst"}, 2, "--server takes no run flags (--scenario)"},
		{"server address in use", []string{"--server", "256.1.1.1:1"}, 1, "server: listen 256.1.1.1:1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(context.Background(), append([]string{"bench"}, tt.args...), &out, &errOut)
			require.Equal(t, tt.code, code, "stdout %s\nstderr %s", out.String(), errOut.String())
			require.Contains(t, errOut.String(), tt.want)
		})
	}
}

// TestBenchServerServes: `bench --server` serves until its context ends.
func TestBenchServerServes(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut syncBuf
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"bench", "--server", "127.0.0.1:0"}, &out, &errOut) }()
	var addr string
	require.Eventually(t, func() bool {
		s := out.String()
		i := strings.Index(s, "listening on ")
		if i < 0 {
			return false
		}
		addr = strings.Fields(s[i+len("listening on "):])[0]
		return true
	}, 60*time.Second, 10*time.Millisecond)
	var o2, e2 bytes.Buffer
	code := run(context.Background(), []string{"bench", "--client", addr, "--scenario", "latency", "--transport", "floor-block", "-n", "10", "--warmup", "2"}, &o2, &e2)
	require.Equal(t, 0, code, "stderr: %s", e2.String())
	require.Contains(t, o2.String(), "2 hosts: client 127.0.0.1, server "+addr)
	cancel()
	select {
	case code := <-done:
		require.Equal(t, 0, code, "stderr: %s", errOut.String())
	case <-time.After(60 * time.Second): // a hang guard only
		t.Fatal("bench --server did not stop")
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
