//go:build rdma

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// envCLIChild holds the arguments TestBadLibraryChild runs the command line with.
const envCLIChild = "TWOSIDED_TEST_CLI_ARGS"

// stubSymbols are the entry points the verbs provider resolves (ibv/verbs/shim.c), which a
// stub library exports without symbol versions.
var stubSymbols = []string{
	"ibv_get_device_list", "ibv_free_device_list", "ibv_get_device_name", "ibv_get_device_guid",
	"ibv_open_device", "ibv_close_device", "ibv_fork_init", "ibv_query_device", "ibv_query_port",
	"ibv_query_gid", "ibv_alloc_pd", "ibv_dealloc_pd", "ibv_reg_mr", "ibv_dereg_mr",
	"ibv_create_comp_channel", "ibv_destroy_comp_channel", "ibv_create_cq", "ibv_destroy_cq",
	"ibv_get_cq_event", "ibv_ack_cq_events", "ibv_create_qp", "ibv_query_qp", "ibv_modify_qp",
	"ibv_destroy_qp", "ibv_get_async_event", "ibv_ack_async_event", "_ibv_query_gid_table",
}

// badLibraries are files TWOSIDED_LIBIBVERBS may name by mistake: copies of a real
// libibverbs cut short, a file that is no ELF at all, and (with gcc) a stub that exports
// the ibv_ names without rdma-core's symbol versions, whose ibv_get_device_list returns a
// device list that is no such thing.
func badLibraries(t *testing.T) map[string]string {
	t.Helper()
	var real []byte
	for _, p := range []string{filepath.Join("..", "..", "build", "softverbs", "libibverbs.so.1"),
		"/usr/lib/x86_64-linux-gnu/libibverbs.so.1", "/usr/lib/aarch64-linux-gnu/libibverbs.so.1", "/usr/lib64/libibverbs.so.1"} {
		if b, err := os.ReadFile(p); err == nil {
			real = b
			break
		}
	}
	if real == nil {
		t.Skip("no libibverbs.so.1 to cut short (make softverbs, or install libibverbs1)")
	}
	dir := t.TempDir()
	libs := map[string]string{}
	write := func(name string, b []byte) {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, b, 0o755))
		libs[name] = p
	}
	write("first-4KiB", real[:4096])
	write("half", real[:len(real)/2])
	write("not-elf", []byte("#!/bin/sh\nexit 0\n"))
	if cc, err := exec.LookPath("gcc"); err == nil {
		var src strings.Builder
		src.WriteString("static long junk[64];\nvoid *ibv_get_device_list(int *n) { if (n) *n = 3; return junk + 1; }\n")
		for _, s := range stubSymbols[1:] {
			fmt.Fprintf(&src, "long %s(void) { return 1; }\n", s)
		}
		c := filepath.Join(dir, "stub.c")
		require.NoError(t, os.WriteFile(c, []byte(src.String()), 0o644))
		out, err := exec.Command(cc, "-shared", "-fPIC", "-Wl,-soname,libibverbs.so.1", "-o", filepath.Join(dir, "stub.so"), c).CombinedOutput()
		require.NoError(t, err, "%s", out)
		libs["unversioned-stub"] = filepath.Join(dir, "stub.so")
	} else {
		t.Log("no gcc: the unversioned stub is not tried")
	}
	return libs
}

// Each command that loads libibverbs, with TWOSIDED_LIBIBVERBS naming a bad file, ends as
// it does without libibverbs: exit status 0, the verbs provider's error names the variable,
// the soft provider does the work. Never a signal (dlopen of a truncated copy died of
// SIGBUS; the stub's device list crashed `devices`). Each run is a child process, since
// libibverbs is loaded once per process.
func TestBadLibrary(t *testing.T) {
	if os.Getenv(envCLIChild) != "" {
		t.Skip("the child runs TestBadLibraryChild")
	}
	for name, lib := range badLibraries(t) {
		for _, args := range [][]string{
			{"version"},
			{"devices"},
			{"serve", "--listen", "127.0.0.1:0", "--transport", "rdma_twosided", "--duration", "200ms"},
		} {
			t.Run(name+"/"+args[0], func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hang guard
				defer cancel()
				cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestBadLibraryChild$", "-test.count=1")
				cmd.Env = append(os.Environ(), "TWOSIDED_LIBIBVERBS="+lib, envCLIChild+"="+strings.Join(args, "\x1f"))
				out, err := cmd.CombinedOutput()
				var exit *exec.ExitError
				if errors.As(err, &exit) {
					require.False(t, exit.Sys() != nil && !exit.Exited(), "killed by a signal: %v\n%s", err, out)
				}
				require.NoError(t, err, "%s", out)
				require.NotContains(t, string(out), "SIGBUS")
				require.NotContains(t, string(out), "SIGSEGV")
				if args[0] != "serve" {
					require.Contains(t, string(out), `libibverbs not loaded: "`+lib+`" (TWOSIDED_LIBIBVERBS) is not a usable libibverbs: `)
					require.Contains(t, string(out), "(check TWOSIDED_LIBIBVERBS, or unset it to load libibverbs.so.1)")
				}
				if args[0] == "devices" {
					require.Contains(t, string(out), "using the soft provider")
				}
			})
		}
	}
}

func TestBadLibraryChild(t *testing.T) {
	args := os.Getenv(envCLIChild)
	if args == "" {
		t.Skip("run by TestBadLibrary")
	}
	os.Exit(run(context.Background(), strings.Split(args, "\x1f"), os.Stdout, os.Stderr))
}
