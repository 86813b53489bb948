package bench

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestIdleHundredPeers is `twosided bench --scenario idle --peers 100 --transport
// rdma_twosided`, shortened: a sender connected to 100 peers in the child process, over the
// soft provider's TCP connections, every one of the 100 ctrl channels up on both sides (the
// sender's engine watches 100 completion channels; the child's 100 engines share one soft
// device). Before a soft device's progress set was held by one channel, connecting failed
// at the 51st peer with "watch cq: reactor: epoll_ctl add fd N: invalid argument" (checked).
func TestIdleHundredPeers(t *testing.T) {
	cfg := tinyConfig(t, TransportRDMA)
	cfg.Procs = 2
	cfg.Scenarios = []string{ScenarioIdle}
	cfg.Peers = 100
	cfg.Duration = 50 * time.Millisecond
	var out bytes.Buffer
	rep, err := Run(context.Background(), cfg, &out)
	t.Log("\n" + out.String())
	require.NoError(t, err)
	require.Empty(t, rep.Failures)
	require.Len(t, rep.Results, 1)
	r := rep.Results[0]
	require.Zero(t, r.Errors, "%s", r.FirstError)
	require.Equal(t, 100, r.Peers)
}
