package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// startServe runs `twosided serve` with args and returns its address and a channel with
// its exit code and full output.
func startServe(t *testing.T, ctx context.Context, args ...string) (string, <-chan serveResult) {
	t.Helper()
	pr, pw := io.Pipe()
	done := make(chan serveResult, 1)
	go func() {
		var errOut bytes.Buffer
		code := run(ctx, append([]string{"serve", "--listen", "127.0.0.1:0"}, args...), pw, &errOut)
		_ = pw.CloseWithError(io.EOF)
		done <- serveResult{code: code, stderr: errOut.String()}
	}()
	sc := bufio.NewScanner(pr)
	require.True(t, sc.Scan(), "serve printed nothing")
	first := sc.Text()
	require.True(t, strings.HasPrefix(first, "serving on "), first)
	addr := strings.Fields(strings.TrimPrefix(first, "serving on "))[0]
	out := make(chan serveResult, 1)
	go func() {
		var rest strings.Builder
		for sc.Scan() {
			rest.WriteString(sc.Text() + "\n")
		}
		r := <-done
		r.stdout = rest.String()
		out <- r
	}()
	return addr, out
}

type serveResult struct {
	code           int
	stdout, stderr string
}

func TestServeAndSend(t *testing.T) {
	for _, transport := range []string{"oob", "rdma_twosided"} {
		t.Run(transport, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			addr, served := startServe(t, ctx, "--transport", transport, "--expect", "3")
			var out, errOut bytes.Buffer
			code := run(ctx, []string{"send", "--peer", addr, "--transport", transport, "-n", "3",
				"--name", "kv_ready", "--msg", "req-42"}, &out, &errOut)
			require.Equal(t, 0, code, "send: %s %s", out.String(), errOut.String())
			require.Equal(t, 3, strings.Count(out.String(), ": ok in "), out.String())
			require.Contains(t, out.String(), "sent 3, failed 0")
			r := <-served
			require.Equal(t, 0, r.code, r.stderr)
			require.Equal(t, 3, strings.Count(r.stdout, "kv_ready\t\"req-42\""), r.stdout)
			require.Contains(t, r.stdout, "received 3 notifies")
		})
	}
}

func TestServeCountOnly(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr, served := startServe(t, ctx, "--count-only", "--expect", "5")
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run(ctx, []string{"send", "--peer", addr, "-n", "5", "--size", "100", "--quiet"}, &out, &errOut), errOut.String())
	r := <-served
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "received 5 notifies")
}

func TestSendRejectsBadFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no peer", nil, "--peer: required"},
		{"zero count", []string{"--peer", "127.0.0.1:1", "-n", "0"}, "--count 0"},
		{"negative size", []string{"--peer", "127.0.0.1:1", "--size", "-1"}, "--size -1"},
		{"stray argument", []string{"--peer", "127.0.0.1:1", "extra"}, `unexpected arguments: ["extra"]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			require.Equal(t, 2, run(context.Background(), append([]string{"send"}, tt.args...), &out, &errOut))
			require.Contains(t, errOut.String(), tt.want)
		})
	}
}

func TestSendToNobodyFails(t *testing.T) {
	var out, errOut bytes.Buffer
	// Port 1 on loopback: nothing listens, the connect is refused.
	code := run(context.Background(), []string{"send", "--peer", "127.0.0.1:1", "--timeout", "2s"}, &out, &errOut)
	require.Equal(t, 1, code)
	require.Contains(t, out.String(), "failed 1")
}
