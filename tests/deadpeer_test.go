package tests

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv/soft"
	"github.com/twosided/twosided/notify"
)

// TestDeadPeerKeepalive: an idle channel's peer vanishes (its device dies as with a crash);
// with keepalive on, the survivor declares it dead without any traffic, and the next notify
// reconnects once the peer is back.
func TestDeadPeerKeepalive(t *testing.T) {
	a := newEngine(t, notify.TransportRDMATwoSided, twoSidedOn("soft0", notify.WithKeepalive(100*time.Millisecond))...)
	b := newEngine(t, notify.TransportRDMATwoSided, twoSidedOn("soft1")...)
	ctx := ctxFor(t, 30*time.Second)
	require.NoError(t, a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "hello"}))
	require.Equal(t, "up", peerStats(t, a, b.Addr()).State)
	killed := time.Now()
	require.NoError(t, soft.Default().KillDevice("soft1"))
	require.Eventually(t, func() bool { return peerStats(t, a, b.Addr()).State != "up" }, 20*time.Second, time.Millisecond,
		"the dead peer was never detected")
	st := peerStats(t, a, b.Addr())
	require.NotEmpty(t, st.LastError)
	t.Logf("dead peer declared after %v (keepalive 100ms, Mooncake QP timers): %s", time.Since(killed).Round(time.Millisecond), st.LastError)
}

// TestKeepaliveOneEndProbes: of the two ends of an idle channel, only the one with the
// lower session probes it; the other hears those probes and sends none of its own (at most
// one, at its first round, before it heard anything).
func TestKeepaliveOneEndProbes(t *testing.T) {
	a := newEngine(t, notify.TransportRDMATwoSided, notify.WithKeepalive(200*time.Millisecond))
	b := newEngine(t, notify.TransportRDMATwoSided, notify.WithKeepalive(200*time.Millisecond))
	ctx := ctxFor(t, 30*time.Second)
	require.NoError(t, a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "hello"}))
	lo, hi := a, b
	if a.Stats().Session > b.Stats().Session {
		lo, hi = b, a
	}
	require.Eventually(t, func() bool { return lo.Stats().Channels.KeepalivesSent >= 5 }, 20*time.Second, 10*time.Millisecond,
		"the lower session's end does not probe")
	sent := hi.Stats().Channels.KeepalivesSent
	require.LessOrEqual(t, sent, uint64(1), "the higher session's end probes too")
	require.Equal(t, "up", peerStats(t, a, b.Addr()).State)
	t.Logf("keepalives sent: lower session %d, higher %d", lo.Stats().Channels.KeepalivesSent, sent)
}
