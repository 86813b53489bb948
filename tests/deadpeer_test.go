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

// TestKeepaliveOneEndProbes: the two ends of an idle channel probe it at opposite
// half-steps of the interval, so each hears the other's probe before its own round and
// skips it: about one probe per interval crosses the channel, not one from each end.
// (Normally the lower session's end probes; a round that comes late can hand the task to
// the other end, which is as cheap.)
func TestKeepaliveOneEndProbes(t *testing.T) {
	const interval = 200 * time.Millisecond
	a := newEngine(t, notify.TransportRDMATwoSided, notify.WithKeepalive(interval))
	b := newEngine(t, notify.TransportRDMATwoSided, notify.WithKeepalive(interval))
	ctx := ctxFor(t, 60*time.Second)
	require.NoError(t, a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "hello"}))
	sent := func() (uint64, uint64) {
		return a.Stats().Channels.KeepalivesSent, b.Stats().Channels.KeepalivesSent
	}
	t0 := time.Now()
	require.Eventually(t, func() bool { x, y := sent(); return x+y >= 8 }, 45*time.Second, 10*time.Millisecond,
		"no keepalives")
	x, y := sent()
	rounds := uint64(time.Since(t0) / interval)
	// Both ends probing every interval would send 2 per interval; one end, 1 (late rounds
	// only make it fewer). Half an interval's worth spare for rounds where a late timer hands
	// the task from one end to the other, and 2 for the first rounds.
	require.LessOrEqual(t, x+y, rounds+rounds/2+2, "both ends probe: a %d, b %d in %d intervals", x, y, rounds)
	require.Equal(t, "up", peerStats(t, a, b.Addr()).State)
	t.Logf("keepalives in %d intervals: a %d, b %d (sessions %x, %x)", rounds, x, y, a.Stats().Session, b.Stats().Session)
}
