package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/notify/directory/etcdtest"
)

func TestServeAndSendByName(t *testing.T) {
	srv, err := etcdtest.New(t.TempDir())
	require.NoError(t, err)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, served := startServe(t, ctx, "--name", "decode-7", "--metadata", srv.Conn(), "--cluster-id", "cmdtest", "--expect", "2")
	var out, errOut bytes.Buffer
	code := run(ctx, []string{"send", "--peer", "decode-7", "--metadata", srv.Conn(), "--cluster-id", "cmdtest", "-n", "2"}, &out, &errOut)
	require.Equal(t, 0, code, "send: %s %s", out.String(), errOut.String())
	r := <-served
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "registered as decode-7")
	require.Equal(t, 2, strings.Count(r.stdout, "\"hello\""), r.stdout)

	// Unknown name: a clear error, non-zero exit.
	out.Reset()
	code = run(ctx, []string{"send", "--peer", "nobody", "--metadata", srv.Conn(), "--timeout", "2s"}, &out, &errOut)
	require.NotEqual(t, 0, code)
	require.Contains(t, out.String(), "peer unknown")
}
