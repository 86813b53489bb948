package notify

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/ibv/soft"
)

// asyncPair is two rdma_twosided engines on soft4 (send) and soft5 (recv), OOB fallback
// on, keepalive off (so that nothing but the async event can notice the port), with their
// channel up.
func asyncPair(t *testing.T, extra ...Option) (send, recv *Engine, ctx context.Context) {
	t.Helper()
	t.Setenv(soft.EnvDevices, "6")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	opts := append([]Option{WithProvider("soft"), WithTransport(TransportRDMATwoSided), WithKeepalive(0)}, extra...)
	var err error
	recv, err = New(append(opts, WithDeviceFilters("soft5"))...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = recv.Close(ctx) })
	send, err = New(append(opts, WithDeviceFilters("soft4"))...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = send.Close(ctx) })
	sendRecv(t, ctx, send, recv, "up")
	require.Equal(t, 1, send.Stats().ChannelsUp)
	return send, recv, ctx
}

func sendRecv(t *testing.T, ctx context.Context, send, recv *Engine, name string) {
	t.Helper()
	require.NoError(t, send.SendNotify(ctx, recv.Addr(), Notify{Name: name}))
	n, err := recv.Recv(ctx)
	require.NoError(t, err)
	require.Equal(t, name, n.Name)
}

// bounded is how long a test waits for what an event does at once: it detects a hang, it
// measures nothing.
const bounded = 30 * time.Second

// PORT_ERR fails the device's channels at once, with no send and no keepalive to notice;
// notifies then go over OOB (counted as fallbacks); no channel is made while the port is
// down; PORT_ACTIVE lets one be made again. Before, the async fd was never read: the idle
// channel stayed "up" on a dead port until a send's retries ran out.
func TestAsyncPortErrFailsChannels(t *testing.T) {
	send, recv, ctx := asyncPair(t)
	require.NoError(t, soft.Default().SetPortState("soft4", false))
	require.Eventually(t, func() bool {
		ev := send.DeviceEvents()
		return ev.PortErr == 1 && ev.ChannelsFailed == 1 && send.Stats().ChannelsUp == 0
	}, bounded, 5*time.Millisecond, "the channel must fail on PORT_ERR: %+v", send.DeviceEvents())
	require.True(t, send.DeviceEvents().PortDown)
	for i := 0; i < 5; i++ {
		sendRecv(t, ctx, send, recv, "oob")
	}
	require.Zero(t, send.Stats().ChannelsUp, "no channel is made while the port is down")
	require.Positive(t, recv.Stats().OOB.NotifyServed, "notifies went over OOB")

	require.NoError(t, soft.Default().SetPortState("soft4", true))
	require.Eventually(t, func() bool { return send.DeviceEvents().PortActive == 1 }, bounded, 5*time.Millisecond)
	require.False(t, send.DeviceEvents().PortDown)
	require.Eventually(t, func() bool {
		sendRecv(t, ctx, send, recv, "again")
		return send.Stats().ChannelsUp == 1
	}, bounded, 100*time.Millisecond, "a channel is made again once the port is active")
}

// DEVICE_FATAL fails the channels too, and PORT_ACTIVE does not lift it: notifies go over
// OOB. Once the channels are closed the engine opens the device again (the soft device is
// usable: the first try succeeds) and channels are made again. Before, a fatal device
// stayed failed until Close.
func TestAsyncDeviceFatal(t *testing.T) {
	send, recv, ctx := asyncPair(t)
	require.NoError(t, soft.Default().RaiseAsyncEvent("soft4", ibv.AsyncEvent{Type: ibv.EventDeviceFatal}))
	require.Eventually(t, func() bool {
		ev := send.DeviceEvents()
		return ev.DeviceFatal == 1 && ev.ChannelsFailed == 1 && send.Stats().ChannelsUp == 0
	}, bounded, 5*time.Millisecond)
	sendRecv(t, ctx, send, recv, "oob")
	require.Eventually(t, func() bool { return send.DeviceEvents().Reopened == 1 }, bounded, 5*time.Millisecond,
		"the fatal device is opened again: %+v", send.DeviceEvents())
	require.False(t, send.DeviceEvents().PortDown)
	require.Eventually(t, func() bool {
		sendRecv(t, ctx, send, recv, "again")
		return send.Stats().ChannelsUp == 1
	}, bounded, 100*time.Millisecond, "a channel is made again on the reopened device")
	// The new context's async events are watched: a second fatal is seen too.
	require.NoError(t, soft.Default().RaiseAsyncEvent("soft4", ibv.AsyncEvent{Type: ibv.EventDeviceFatal}))
	require.Eventually(t, func() bool { return send.DeviceEvents().Reopened == 2 }, bounded, 5*time.Millisecond,
		"%+v", send.DeviceEvents())
	require.EqualValues(t, 2, send.DeviceEvents().DeviceFatal)
}

// GID_CHANGE selects the source GID again: the mlx5-like table (index 3) replaced by a
// one-entry table moves the engine to index 0; back, to 3. Other events are counted.
func TestAsyncGIDChange(t *testing.T) {
	t.Setenv(soft.EnvGIDTable, "mlx5")
	send, recv, ctx := asyncPair(t)
	g, _ := send.GID()
	require.Equal(t, 3, g.Index)
	require.NoError(t, soft.Default().SetGIDTable("soft4", soft.GIDTableSingle))
	require.Eventually(t, func() bool { g, _ := send.GID(); return g.Index == 0 }, bounded, 5*time.Millisecond)
	require.Equal(t, uint64(1), send.DeviceEvents().GIDChange)
	require.NoError(t, soft.Default().SetGIDTable("soft4", soft.GIDTableMLX5))
	require.Eventually(t, func() bool { g, _ := send.GID(); return g.Index == 3 }, bounded, 5*time.Millisecond)
	require.NoError(t, soft.Default().RaiseAsyncEvent("soft4", ibv.AsyncEvent{Type: ibv.EventSMChange, Port: 1}))
	require.Eventually(t, func() bool { return send.DeviceEvents().Other == 1 }, bounded, 5*time.Millisecond)
	sendRecv(t, ctx, send, recv, "still")
}

// The events reach Stats.DeviceEvents.
func TestAsyncStats(t *testing.T) {
	send, _, _ := asyncPair(t)
	require.NoError(t, soft.Default().SetPortState("soft4", false))
	require.Eventually(t, func() bool { return send.Stats().DeviceEvents.PortErr == 1 }, bounded, 5*time.Millisecond)
	require.True(t, send.Stats().DeviceEvents.PortDown)
	require.NoError(t, soft.Default().SetPortState("soft4", true))
}

// With the sender's port down, a second name of a peer already reached by the first (the
// soak's "localhost:P" beside "127.0.0.1:P") still learns its engine: the handshake goes
// without a channel, the name joins the pair and its sends keep their place in the pair's
// order, over OOB. Before, our own device's failure to make the channel failed the name's
// handshake as if nobody served it: its sends waited out a backoff while later sends by
// the first name went ahead, and were delivered after them (a reorder).
func TestPortDownNewNameKeepsOrder(t *testing.T) {
	send, recv, ctx := asyncPair(t)
	require.NoError(t, soft.Default().SetPortState("soft4", false))
	t.Cleanup(func() { _ = soft.Default().SetPortState("soft4", true) })
	require.Eventually(t, func() bool { return send.DeviceEvents().PortDown && send.Stats().ChannelsUp == 0 },
		bounded, 5*time.Millisecond)
	_, port, err := net.SplitHostPort(recv.Addr())
	require.NoError(t, err)
	results := make(chan error, 2)
	done := func(err error) { results <- err }
	require.NoError(t, send.SendNotifyAsync("localhost:"+port, Notify{Name: "first"}, done))
	require.NoError(t, send.SendNotifyAsync(recv.Addr(), Notify{Name: "second"}, done))
	for i := 0; i < 2; i++ {
		select {
		case err := <-results:
			require.NoError(t, err)
		case <-ctx.Done():
			t.Fatal("a send did not complete")
		}
	}
	for _, want := range []string{"first", "second"} {
		n, err := recv.Recv(ctx)
		require.NoError(t, err)
		require.Equal(t, want, n.Name, "delivered in send order across the peer's two names")
	}
	require.Zero(t, send.Stats().ChannelsUp, "no channel is made while the port is down")

	require.NoError(t, soft.Default().SetPortState("soft4", true))
	require.Eventually(t, func() bool {
		sendRecv(t, ctx, send, recv, "again")
		return send.Stats().ChannelsUp == 1
	}, bounded, 100*time.Millisecond, "a channel is made again once the port is active")
}
