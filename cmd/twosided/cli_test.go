package main

import (
	"bytes"
	"context"
	"errors"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/notify"
)

// A wrong flag or argument prints its error and one line pointing to --help, not the
// whole help; --help still prints it all.
func TestBadFlagPointsToHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"send", "--bogus"}, "twosided send: flag provided but not defined: -bogus"},
		{[]string{"serve", "--expect", "x"}, `twosided serve: invalid value "x" for flag -expect`},
		{[]string{"serve", "--expect", "-1"}, "twosided serve: --expect -1: must not be negative"},
		{[]string{"send", "--peer", "127.0.0.1:1", "extra"}, `twosided send: unexpected arguments: ["extra"]`},
		{[]string{"version", "extra"}, `twosided version: unexpected arguments: ["extra"]`},
		{[]string{"send"}, "twosided send: --peer: required"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			require.Equal(t, 2, run(context.Background(), tc.args, &out, &errOut))
			lines := strings.Split(strings.TrimSuffix(errOut.String(), "\n"), "\n")
			require.True(t, strings.HasPrefix(lines[0], tc.want), errOut.String())
			require.Equal(t, "Run 'twosided "+tc.args[0]+" --help' for usage.", lines[len(lines)-1])
			require.LessOrEqual(t, len(lines), 3, errOut.String())
			require.NotContains(t, errOut.String(), "usage:")
			require.Empty(t, out.String())
		})
	}
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run(context.Background(), []string{"send", "--help"}, &out, &errOut))
	require.Contains(t, errOut.String(), "usage: twosided send --peer")
	require.Contains(t, errOut.String(), "-notify-name")
	out.Reset()
	require.Equal(t, 0, run(context.Background(), []string{"help", "serve"}, &out, &errOut))
	require.Contains(t, out.String(), "usage: twosided serve")
	require.Contains(t, out.String(), "-full", "help <command> lists the command's flags")
	errOut.Reset()
	require.Equal(t, 2, run(context.Background(), []string{"frobnicate"}, &out, &errOut))
	require.Equal(t, "twosided: unknown command \"frobnicate\"\nRun 'twosided --help' for the commands.\n", errOut.String())
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		var out, errOut bytes.Buffer
		require.Equal(t, 0, run(context.Background(), args, &out, &errOut), errOut.String())
		require.True(t, strings.HasPrefix(out.String(), "twosided "), out.String())
		require.Contains(t, out.String(), "\ngo:        go1.")
		require.Contains(t, out.String(), "\nproviders: soft")
		require.Contains(t, out.String(), "\nsoft:      compiled in (RC over TCP, pure Go: needs no library)\n")
		if _, err := ibv.LookupProvider(verbsProvider); err != nil {
			require.Contains(t, out.String(), "\nverbs:     not compiled in (build with -tags rdma)\n")
		} else {
			require.Regexp(t, "\nverbs:     compiled in, libibverbs (loaded from /|not loaded: )", out.String())
		}
	}
	bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/twosided/twosided", Version: "v0.3.0"},
		Settings: []debug.BuildSetting{{Key: "-tags", Value: "rdma"}, {Key: "vcs.revision", Value: "f7db041"},
			{Key: "vcs.time", Value: "2026-12-04T19:00:00Z"}, {Key: "vcs.modified", Value: "true"}}}
	require.Equal(t, []string{
		"twosided v0.3.0",
		"module:    github.com/twosided/twosided",
		"commit:    f7db041 (2026-12-04T19:00:00Z), with local changes",
		"go:        go1.26.8 " + goPlatform(),
		"tags:      rdma",
		"providers: soft, verbs",
	}, versionLines(bi, []string{"soft", "verbs"}))
	lines := versionLines(&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}}, []string{"soft"})
	require.Contains(t, lines[0], "(devel)")
	require.Contains(t, lines[2], "unknown (no VCS stamp")
	require.Equal(t, "tags:      none", lines[4])
	require.Equal(t, "providers: soft (build with -tags rdma for the libibverbs provider)", lines[5])
}

// Per provider: compiled in or not, and for verbs whether libibverbs loaded (from where, or
// why not, in dlerror's words).
func TestVersionProviderStatus(t *testing.T) {
	const why = `libibverbs not loaded: dlopen "libibverbs.so.1": libibverbs.so.1: cannot open shared object file: No such file or directory`
	for _, tc := range []struct {
		name      string
		providers []ibv.Provider
		want      []string
	}{
		{"without -tags rdma", []ibv.Provider{fakeSoft}, []string{
			"soft:      compiled in (RC over TCP, pure Go: needs no library)",
			"verbs:     not compiled in (build with -tags rdma)",
		}},
		{"libibverbs loaded", []ibv.Provider{fakeSoft, fakeLibProvider{fakeProvider{name: "verbs"}, "/usr/lib/libibverbs.so.1", nil}}, []string{
			"soft:      compiled in (RC over TCP, pure Go: needs no library)",
			"verbs:     compiled in, libibverbs loaded from /usr/lib/libibverbs.so.1",
		}},
		{"libibverbs missing", []ibv.Provider{fakeSoft, fakeLibProvider{fakeProvider{name: "verbs"}, "", errors.New(why)}}, []string{
			"soft:      compiled in (RC over TCP, pure Go: needs no library)",
			"verbs:     compiled in, " + why,
		}},
		{"a provider without a library", []ibv.Provider{fakeProvider{name: "other"}, fakeProvider{name: "verbs"}}, []string{
			"other:     compiled in",
			"verbs:     compiled in",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, providerStatusLines(tc.providers))
		})
	}
}

func goPlatform() string {
	l := versionLines(&debug.BuildInfo{GoVersion: "x"}, nil)[3]
	return strings.TrimPrefix(l, "go:        x ")
}

// send's notify name is --notify-name; --name still works, saying it is deprecated.
func TestSendNotifyName(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr, served := startServe(t, ctx, "--expect", "2")
	for _, flag := range []string{"--notify-name", "--name"} {
		var out, errOut bytes.Buffer
		require.Equal(t, 0, run(ctx, []string{"send", "--peer", addr, flag, "kv_" + flag[2:]}, &out, &errOut), errOut.String())
		if flag == "--name" {
			require.Contains(t, errOut.String(), "--name is deprecated, use --notify-name")
		} else {
			require.Empty(t, errOut.String())
		}
	}
	r := <-served
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "\tkv_notify-name\t\"hello\"")
	require.Contains(t, r.stdout, "\tkv_name\t\"hello\"")
}

// serve cuts a long message (saying how much it left out) unless --full.
func TestServeTruncatesLongMessages(t *testing.T) {
	for _, full := range []bool{false, true} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		args := []string{"--expect", "1"}
		if full {
			args = append(args, "--full")
		}
		addr, served := startServe(t, ctx, args...)
		var out, errOut bytes.Buffer
		require.Equal(t, 0, run(ctx, []string{"send", "--peer", addr, "-s", "1000", "--msg", "m"}, &out, &errOut), errOut.String())
		r := <-served
		cancel()
		require.Equal(t, 0, r.code, r.stderr)
		if full {
			require.Contains(t, r.stdout, `"m`+strings.Repeat("x", 999)+`"`)
		} else {
			require.Contains(t, r.stdout, `"m`+strings.Repeat("x", maxShown-1)+`"… (1000 bytes, 744 not shown; --full prints them)`)
		}
	}
	require.Equal(t, `"a\x00"`, shown([]byte("a\x00"), false))
}

// An rdma_twosided sender whose peer serves no ctrl channel says that its notifies went
// over OOB.
func TestSendReportsThePathTaken(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr, served := startServe(t, ctx, "--transport", "oob", "--expect", "3")
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run(ctx, []string{"send", "--peer", addr, "--transport", "rdma_twosided", "-n", "3", "--quiet"}, &out, &errOut), errOut.String())
	require.Contains(t, out.String(), "sent 3, failed 0, transport rdma_twosided")
	require.Contains(t, out.String(), "\ntransport rdma_twosided: 3 notifies, 0 over the ctrl channel, 3 over OOB (fallback")
	require.Equal(t, 0, (<-served).code)

	// Over its own path, nothing more is said.
	var st notify.Stats
	st.Channels.NotifiesSent = 5
	require.Empty(t, pathLine(notify.TransportRDMATwoSided, st))
	st.OOB.NotifySent = 7
	require.Empty(t, pathLine(notify.TransportOOB, st))
	st.Limits.Fallbacks = 2
	require.Equal(t, "transport rdma_twosided: 12 notifies, 5 over the ctrl channel, 7 over OOB (fallback; 2 retried after their channel failed)",
		pathLine(notify.TransportRDMATwoSided, st))
}
