//go:build rdma

package bench

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv"
)

// activeVerbsDevice is the device an engine on the verbs provider takes: the first libibverbs
// device with an active port (softverbs0 with LD_LIBRARY_PATH=build/softverbs, after make
// softverbs); the test skips without one.
func activeVerbsDevice(t *testing.T) string {
	t.Helper()
	p, err := ibv.LookupProvider("verbs")
	require.NoError(t, err)
	devs, err := p.GetDeviceList()
	if err != nil {
		t.Skipf("no libibverbs device (%v): make softverbs and set LD_LIBRARY_PATH=$PWD/build/softverbs", err)
	}
	for _, d := range devs {
		if _, ok := d.ActivePort(); ok {
			return d.Name
		}
	}
	t.Skip("no libibverbs device with an active port")
	return ""
}

// runOnVerbs runs the latency and burst scenarios of transports in two processes on the
// verbs provider, 64 B, and requires every run to have produced its figures.
func runOnVerbs(t *testing.T, transports ...string) *Report {
	t.Helper()
	cfg := tinyConfig(t, transports...)
	cfg.Procs = 2
	cfg.Provider = "verbs"
	cfg.Sizes = []int{64}
	cfg.Scenarios = []string{ScenarioLatency, ScenarioBurst}
	var out bytes.Buffer
	rep, err := Run(context.Background(), cfg, &out)
	require.NoError(t, err)
	t.Log("\n" + out.String())
	require.Empty(t, rep.Failures)
	return rep
}

// TestVerbsProvider: a tiny run with --provider verbs runs rdma_twosided and the verbs
// floor over libibverbs, in two processes, and the report names the device it ran on
// (verbs:softverbs0 on softverbs). With no provider set, a binary with the verbs provider
// and a libibverbs device takes that device too, not the soft one.
func TestVerbsProvider(t *testing.T) {
	dev := activeVerbsDevice(t)
	want := "verbs:" + dev
	if strings.HasPrefix(dev, "softverbs") && os.Getenv("SOFTVERBS_DEVICE") == "" {
		want = "verbs:softverbs0"
	}

	rep := runOnVerbs(t, TransportRDMA, FloorVerbs)
	require.Equal(t, want, rep.Settings.Provider)
	require.Len(t, rep.Results, 2*2)
	for _, r := range rep.Results {
		require.Zero(t, r.Errors, "%s %s: %s", r.Scenario, r.Transport, r.FirstError)
		upTo(t, 50, r.Notifies, r)
	}

	cfg := tinyConfig(t, TransportRDMA)
	cfg.Sizes = []int{64}
	cfg.Scenarios = []string{ScenarioLatency}
	var out bytes.Buffer
	rep, err := Run(context.Background(), cfg, &out)
	require.NoError(t, err)
	require.Empty(t, rep.Failures)
	require.Equal(t, want, rep.Settings.Provider, "the default provider")
}

// TestFloorVerbsEcho: on a libibverbs device floor-verbs-echo moves the engines' echoed round
// trip as SENDs (the message, the receiver's echo on a QP of its own, each answered),
// latency only, timed as the engines' echo is, with no engine breakdown; floor-verbs beside
// it stays the rdma_twosided row's floor.
func TestFloorVerbsEcho(t *testing.T) {
	activeVerbsDevice(t)
	rep := runOnVerbs(t, TransportRDMA, FloorVerbs, FloorVerbsEcho)
	require.Len(t, rep.Results, 5, "floor-verbs-echo runs no burst")
	var echo, rdma *Result
	for _, r := range rep.Results {
		require.Zero(t, r.Errors, "%s %s: %s", r.Scenario, r.Transport, r.FirstError)
		if r.Scenario != ScenarioLatency {
			require.NotEqual(t, FloorVerbsEcho, r.Transport)
			continue
		}
		upTo(t, 50, int64(r.OneWay.Count), r)
		switch r.Transport {
		case FloorVerbsEcho:
			echo = r
		case TransportRDMA:
			rdma = r
		}
	}
	require.NotNil(t, echo)
	require.Equal(t, "rtt/2 (echo notify)", echo.OneWayMethod)
	require.Nil(t, echo.Breakdown)
	require.NotNil(t, rdma)
	require.Equal(t, "one-way p50 / "+FloorVerbs, rdma.VsFloorOf)
}
