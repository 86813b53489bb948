package bench

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/notify/directory/etcdtest"
)

func directoryConfig(t testing.TB) DirectoryConfig {
	srv, err := etcdtest.New(t.TempDir())
	require.NoError(t, err)
	t.Cleanup(srv.Close)
	return DirectoryConfig{Metadata: srv.Conn(), Executable: os.Args[0], ChildArgs: []string{"-test.run=^$"}}
}

// TestDirectoryScenario runs the scenario small: two sender processes find the receiver by
// name and by address, and every notify arrives.
func TestDirectoryScenario(t *testing.T) {
	cfg := directoryConfig(t)
	cfg.Senders, cfg.Count, cfg.Resolves = 2, 20, 1000
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	rep, err := RunDirectory(ctx, cfg, &out)
	require.NoError(t, err, out.String())
	require.Len(t, rep.Modes, 2)
	for _, m := range rep.Modes {
		require.Equal(t, 40, m.Notifies)
	}
	require.Equal(t, "name", rep.Modes[1].Peer)
	require.Contains(t, out.String(), "resolve: cached")
	t.Log("\n" + out.String())

	_, err = RunDirectory(ctx, DirectoryConfig{Metadata: "P2PHANDSHAKE"}, &out)
	require.ErrorIs(t, err, ErrConfig)
}

// BenchmarkDirectoryFanin is the full scenario: 16 sender processes registered in an
// embedded etcd, 2000 notifies each by host:port and by name, and the resolve costs.
//
//	go test -run '^$' -bench DirectoryFanin -benchtime 1x ./bench/
func BenchmarkDirectoryFanin(b *testing.B) {
	cfg := directoryConfig(b)
	var out bytes.Buffer
	var rep *DirectoryReport
	for b.Loop() {
		var err error
		rep, err = RunDirectory(context.Background(), cfg, &out)
		require.NoError(b, err, out.String())
	}
	for _, m := range rep.Modes {
		b.ReportMetric(m.Rate, "notifies/s-by-"+m.Peer)
		b.ReportMetric(m.CallUS, "call-µs-by-"+m.Peer)
	}
	b.ReportMetric(rep.ResolveCachedNS, "ns/resolve-cached")
	b.ReportMetric(rep.ResolveUncachedNS, "ns/resolve-uncached")
	b.Log("\n" + out.String())
}
