//go:build rdma

package notify

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv"
)

// verbsOpts are the options of an rdma_twosided engine on the first libibverbs device with
// an active port (softverbs0 with LD_LIBRARY_PATH=build/softverbs); the test skips without one.
func verbsOpts(t *testing.T) []Option {
	t.Helper()
	p, err := ibv.LookupProvider("verbs")
	require.NoError(t, err)
	devs, err := p.GetDeviceList()
	if err != nil {
		t.Skipf("no libibverbs device: %v", err)
	}
	for _, d := range devs {
		if _, ok := d.ActivePort(); ok {
			return []Option{WithProvider("verbs"), WithDeviceFilters(d.Name), WithTransport(TransportRDMATwoSided), WithOOBFallback(false)}
		}
	}
	t.Skip("no libibverbs device with an active port")
	return nil
}

// A default-configured pair of engines on a libibverbs device connects over
// rdma_twosided. On softverbs (an mlx5-like RoCE table: 0/1 link-local, 2/3 IPv4) this
// failed before: the handshake advertised index 3 and the QP's sgid_index was 0, and the
// responder's RTR refused the link-local source towards an IPv4 GID.
func TestGIDDefaultPairVerbs(t *testing.T) {
	opts := verbsOpts(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	recv, err := New(opts...)
	require.NoError(t, err)
	defer func() { _ = recv.Close(ctx) }()
	send, err := New(opts...)
	require.NoError(t, err)
	defer func() { _ = send.Close(ctx) }()
	for i := 0; i < 3; i++ {
		require.NoError(t, send.SendNotify(ctx, recv.Addr(), Notify{Name: "verbs", Msg: []byte{byte(i)}}))
		n, err := recv.Recv(ctx)
		require.NoError(t, err)
		require.Equal(t, []byte{byte(i)}, n.Msg)
	}
	g, ok := send.GID()
	require.True(t, ok)
	t.Logf("source GID: index %d, %s, %s", g.Index, g.Type, g.GID)
	require.Equal(t, 1, send.Stats().ChannelsUp)
	require.Zero(t, send.Stats().Limits.Fallbacks)
}

// WithForkSafe calls the libibverbs provider's ibv_fork_init before the device is opened;
// the engine then works as usual.
func TestForkSafeVerbs(t *testing.T) {
	opts := verbsOpts(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := New(append(opts, WithForkSafe(true))...)
	require.NoError(t, err)
	require.NoError(t, e.SendNotify(ctx, e.Addr(), Notify{Name: "fork"}))
	require.NoError(t, e.Close(ctx))
}
