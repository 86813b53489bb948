//go:build rdma

package soak

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv"
	_ "github.com/twosided/twosided/ibv/verbs" // the agents (this test binary) need the provider
)

// TestSoakVerbs: the short soak with the rdma_twosided engines on the verbs provider (on
// softverbs in make test), with the faults of ciFaults. It skips without a libibverbs device.
func TestSoakVerbs(t *testing.T) {
	p, err := ibv.LookupProvider("verbs")
	require.NoError(t, err)
	if _, err := p.GetDeviceList(); err != nil {
		t.Skipf("no libibverbs device (%v): make softverbs and set LD_LIBRARY_PATH=$PWD/build/softverbs", err)
	}
	cfg := testConfig(t, 4*time.Second, ciFaults)
	cfg.Provider = "verbs"
	r, err := runSoak(t, cfg)
	for _, v := range r.Details {
		t.Logf("%s at step %d, %s: %s\n%v", v.Kind, v.Step, v.Stream, v.Detail, v.History)
	}
	require.NoError(t, err)
	require.Empty(t, r.Violations)
	require.Positive(t, r.NotifiesChecked)
}
