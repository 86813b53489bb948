package notify

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/ibv/soft"
)

// softMLX5 gives the registered soft provider's devices an mlx5-like RoCE GID table (0 v1 and
// 1 v2 link-local, 2 v1 and 3 v2 of the device's IPv4 GID) for the test, on devices no other
// test opens.
func softMLX5(t *testing.T) []Option {
	t.Helper()
	t.Setenv(soft.EnvGIDTable, "mlx5")
	t.Setenv(soft.EnvDevices, "6")
	return []Option{WithProvider("soft"), WithTransport(TransportRDMATwoSided), WithOOBFallback(false)}
}

// gidPair starts two engines with opts on soft4 and soft5 and sends one notify from the
// first to the second, with OOB fallback off: nil only over a ctrl channel.
func gidPair(t *testing.T, opts []Option) (send, recv *Engine, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	recv, err = New(append(opts, WithDeviceFilters("soft5"))...)
	if err != nil {
		return nil, nil, err
	}
	t.Cleanup(func() { _ = recv.Close(ctx) })
	send, err = New(append(opts, WithDeviceFilters("soft4"))...)
	if err != nil {
		return nil, nil, err
	}
	t.Cleanup(func() { _ = send.Close(ctx) })
	sctx, scancel := context.WithTimeout(ctx, 20*time.Second)
	defer scancel()
	err = send.SendNotify(sctx, recv.Addr(), Notify{Name: "gid", Msg: []byte("x")})
	if err == nil {
		n, rerr := recv.Recv(sctx)
		require.NoError(t, rerr)
		require.Equal(t, "gid", n.Name)
	}
	return send, recv, err
}

// A default-configured pair on an mlx5-like GID table connects its ctrl channel: the GID it
// advertises and its QP's sgid_index are the same entry (index 3, RoCE v2 of the IPv4
// address). Before, the handshake advertised index 3 and the QP used index 0 (a link-local
// RoCE v1 GID), and the responder refused the RTR.
func TestGIDDefaultPairConnects(t *testing.T) {
	send, recv, err := gidPair(t, softMLX5(t))
	require.NoError(t, err, "a default-configured pair must connect over rdma_twosided")
	for _, e := range []*Engine{send, recv} {
		g, ok := e.GID()
		require.True(t, ok)
		require.Equal(t, 3, g.Index)
		require.Equal(t, ibv.GIDTypeRoCEv2, g.Type)
		st := e.Stats()
		require.Zero(t, st.Limits.Fallbacks)
	}
	require.Equal(t, 1, send.Stats().ChannelsUp)
}

// MC_GID_INDEX is honoured for both the advertised GID and the sgid_index: 3 and 2 (the
// IPv4 GID as RoCE v2 and v1) connect; 1 (link-local) is a usable entry, so New accepts it,
// but it cannot reach the peer's IPv4 GID and the channel is refused at RTR; 7 is empty and
// 300 out of range: New fails with ErrConfig naming the index.
func TestGIDIndexRequested(t *testing.T) {
	opts := softMLX5(t)
	for _, idx := range []int{3, 2} {
		send, _, err := gidPair(t, append(opts, withGIDIndex(idx)))
		require.NoError(t, err, "MC_GID_INDEX=%d", idx)
		g, _ := send.GID()
		require.Equal(t, idx, g.Index)
	}
	_, _, err := gidPair(t, append(opts, withGIDIndex(1)))
	require.Error(t, err, "a link-local source towards an IPv4 GID must not connect")
	require.False(t, errors.Is(err, ErrConfig), "%v", err)

	_, _, err = gidPair(t, append(opts, withGIDIndex(7)))
	require.ErrorIs(t, err, ErrConfig)
	require.ErrorIs(t, err, ibv.ErrGIDIndex)
	require.ErrorContains(t, err, "MC_GID_INDEX) 7")
	require.ErrorContains(t, err, "empty")
}

// An index of a type the port cannot use (an IB GID on an Ethernet port) is refused by
// name; ibv.SelectGID decides it for notify and ctrlchannel alike.
func TestGIDIndexUnusableType(t *testing.T) {
	pa := ibv.PortAttr{Num: 1, LinkLayer: "Ethernet", GIDs: []ibv.GIDEntry{{Index: 0, Type: ibv.GIDTypeIB, GID: ibv.GID{0: 0xfe, 1: 0x80, 15: 1}}}}
	_, err := ibv.SelectGID(pa, 0)
	require.ErrorIs(t, err, ibv.ErrGIDIndex)
	require.ErrorContains(t, err, "gid index 0")
	require.ErrorContains(t, err, "IB cannot be used on a port of link layer Ethernet")
}

// withGIDIndex is MC_GID_INDEX as an option (the environment's variable sets the same field).
func withGIDIndex(i int) Option { return func(c *config) { c.gidIndex = i } }

// GID may be called from a handler, on the reactor thread, without waiting on itself.
func TestGIDFromHandler(t *testing.T) {
	opts := softMLX5(t)
	got := make(chan ibv.GIDEntry, 1)
	var recv *Engine
	recv, err := New(append(opts, WithDeviceFilters("soft5"), WithHandler(func(Notify) {
		g, _ := recv.GID()
		got <- g
	}))...)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	defer func() { _ = recv.Close(ctx) }()
	send, err := New(append(opts, WithDeviceFilters("soft4"))...)
	require.NoError(t, err)
	defer func() { _ = send.Close(ctx) }()
	require.NoError(t, send.SendNotify(ctx, recv.Addr(), Notify{Name: "h"}))
	select {
	case g := <-got:
		require.Equal(t, 3, g.Index)
	case <-ctx.Done():
		t.Fatal("the handler's GID call did not return")
	}
}
