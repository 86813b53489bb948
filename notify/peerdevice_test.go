package notify

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv/soft"
	"github.com/twosided/twosided/oob"
)

// A peer whose device cannot make the channel our handshake asks for (its port is down,
// the device failed) refuses with "limit" and the cause "device": with fallback off the
// send fails with ErrNoCtrlChannel, counted as "peer_device", never ErrLimit. A peer that
// sends no cause (an older twosided) keeps meaning a cap: ErrLimit, as before.
func TestMachinePeerDeviceRefusal(t *testing.T) {
	require.Equal(t, oob.CauseDevice, causeDevice)
	require.Equal(t, oob.RefuseLimit, refuseLimit)
	const portDown = "cannot make a ctrl channel here: new ctrl channel: port 1 is PORT_DOWN"
	for _, tc := range []struct {
		name, cause, msg string
		kind             error
		reason, text     string
	}{
		{"device", causeDevice, portDown, ErrNoCtrlChannel, "peer_device",
			"notify: peer has no ctrl channel: the peer's device cannot make one: send to b (handshake): the peer refused: " + portDown},
		{"device without text", causeDevice, "", ErrNoCtrlChannel, "peer_device",
			"notify: peer has no ctrl channel: the peer's device cannot make one: send to b (handshake): the peer refused: its device cannot make a ctrl channel"},
		{"a cap", "", "max_channels: 4 channels open, the limit", ErrLimit, "limit",
			"notify: limit reached: send to b (handshake): the peer refused: max_channels: 4 channels open, the limit"},
		{"unknown cause", "future_cause", "", ErrLimit, "limit",
			"notify: limit reached: send to b (handshake): the peer refused: a limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := simCfg()
			cfg.fallback = false
			m, kinds := directMachine(cfg)
			now := time.Unix(1000, 0)
			m.send(now, 1, "b", "", now.Add(time.Hour), 0)
			c := kinds(aConnect)
			require.Len(t, c, 1)
			require.NotZero(t, c[0].ch)
			m.connected(now, "b", c[0].ch, hsResult{session: 20, token: 7, peerName: "b",
				refuse: refuseLimit, refuseCause: tc.cause, refuseMsg: tc.msg})
			done := kinds(aComplete)
			require.Len(t, done, 1)
			err := done[0].err
			require.ErrorIs(t, err, tc.kind)
			require.Equal(t, tc.reason, FailureReason(err))
			require.Equal(t, tc.text, err.Error())
			if tc.kind == ErrNoCtrlChannel {
				require.NotErrorIs(t, err, ErrLimit)
			}
			require.NotErrorIs(t, err, ErrMaybeDelivered)

			// The channel is asked for again after the backoff, as for a limit.
			m.send(now, 2, "b", "", now.Add(time.Hour), 0)
			require.Empty(t, kinds(aConnect), "within the backoff")
			now = now.Add(5 * time.Second)
			m.tick(now)
			m.send(now, 3, "b", "", now.Add(time.Hour), 0)
			require.NotEmpty(t, kinds(aConnect), "after the backoff")
		})
	}

	// Fallback on: the peer issued a token, so it serves over OOB meanwhile, as for a limit.
	m, kinds := directMachine(simCfg())
	now := time.Unix(1000, 0)
	m.send(now, 1, "b", "", now.Add(time.Hour), 0)
	c := kinds(aConnect)
	require.Len(t, c, 1)
	m.connected(now, "b", c[0].ch, hsResult{session: 20, token: 7, peerName: "b",
		refuse: refuseLimit, refuseCause: causeDevice})
	sent := kinds(aOOB)
	require.Len(t, sent, 1)
	require.EqualValues(t, 1, sent[0].req)
	p := m.peers[peerKey{session: 20}]
	require.True(t, errors.Is(p.lastErr, ErrNoCtrlChannel) && !errors.Is(p.lastErr, ErrLimit), "%v", p.lastErr)
}

// Engines on the soft provider, fallback off: the receiver's port is down, so its device
// cannot make the channel the sender's handshake asks for. The send fails with
// ErrNoCtrlChannel ("peer_device"), not ErrLimit; once the port is up a channel is made.
func TestPeerDeviceDownIsNoCtrlChannel(t *testing.T) {
	t.Setenv(soft.EnvDevices, "6")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts := []Option{WithProvider("soft"), WithTransport(TransportRDMATwoSided), WithKeepalive(0), WithOOBFallback(false)}
	recv, err := New(append(opts, WithDeviceFilters("soft3"))...)
	require.NoError(t, err)
	defer func() { _ = recv.Close(ctx) }()
	send, err := New(append(opts, WithDeviceFilters("soft2"))...)
	require.NoError(t, err)
	defer func() { _ = send.Close(ctx) }()

	require.NoError(t, soft.Default().SetPortState("soft3", false))
	require.Eventually(t, func() bool { return recv.DeviceEvents().PortDown }, bounded, 5*time.Millisecond)
	err = send.SendNotify(ctx, recv.Addr(), Notify{Name: "down"})
	require.ErrorIs(t, err, ErrNoCtrlChannel)
	require.NotErrorIs(t, err, ErrLimit)
	require.NotErrorIs(t, err, ErrMaybeDelivered)
	require.Equal(t, "peer_device", FailureReason(err))
	require.Contains(t, err.Error(), "notify: peer has no ctrl channel: the peer's device cannot make one: send to "+recv.Addr())
	require.Contains(t, err.Error(), "PORT_DOWN")
	require.EqualValues(t, 1, send.Stats().Failed["peer_device"])
	require.Zero(t, send.Stats().Failed["limit"])

	require.NoError(t, soft.Default().SetPortState("soft3", true))
	require.Eventually(t, func() bool {
		err := send.SendNotify(ctx, recv.Addr(), Notify{Name: "up"})
		return err == nil && send.Stats().ChannelsUp == 1
	}, bounded, 100*time.Millisecond, "a channel is made once the port is up")
}
