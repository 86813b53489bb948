package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSoakFlags: a bad soak command line is a usage error that says which flag and why,
// before any agent starts. The soak itself runs in bench/soak's tests.
func TestSoakFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"soak", "--faults", "kill,flood"}, "unknown fault flood"},
		{[]string{"soak", "--plant", "burn"}, "--plant: want lose, dup, reorder or leak"},
		{[]string{"soak", "--procs", "0"}, "--procs 0 needs --remote"},
		{[]string{"soak", "--procs", "65"}, "--procs: want 0..64"},
		{[]string{"soak", "--remote", "nohost"}, `--remote: "nohost" is not ip:port`},
		{[]string{"soak", "--bind", "x"}, `--bind: "x" is not an IP`},
		{[]string{"soak", "--agent-host", "--listen", "0.0.0.0:7411"}, "--listen: want ip:port with the IP peers reach"},
		{[]string{"soak", "--transports", "tcp"}, `--transports: "tcp" is not rdma_twosided or oob`},
		{[]string{"soak", "--max-size", "2000000"}, "--max-size: want 0..1048448"},
		{[]string{"soak", "--agent", "--spec", "{}"}, "--spec: no engines"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			require.Equal(t, 2, run(context.Background(), tc.args, &out, &errOut), errOut.String())
			require.Contains(t, errOut.String(), tc.want)
		})
	}
	var out, errOut bytes.Buffer
	require.Equal(t, 1, run(context.Background(), []string{"soak", "--provider", "nope"}, &out, &errOut))
	require.Contains(t, errOut.String(), `provider "nope"`)
	out.Reset()
	require.Equal(t, 0, run(context.Background(), []string{"help", "soak"}, &out, &errOut))
	require.Contains(t, out.String(), "-plant")
}
