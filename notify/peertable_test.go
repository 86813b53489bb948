package notify

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Peer entries made by handshakes are unconfirmed until used: one address holds at most a
// quarter of max_peers of them (its oldest goes for a new one), a full table evicts its
// oldest unconfirmed entry, and confirmed entries are never evicted: with none to evict, a
// newcomer is refused for the limit, named.
func TestPeerTableUnconfirmedEviction(t *testing.T) {
	m, _ := directMachine(machineConfig{maxPeers: 8, channels: true})
	now := time.Unix(1000, 0)
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	hs := func(session uint64, from netip.Addr) inboundReply {
		now = now.Add(time.Millisecond) // each entry younger than the one before
		return m.inbound(now, inboundHS{session: session, token: session, from: from})
	}
	known := func(session uint64) bool { return m.peers[peerKey{session: session}] != nil }

	// One address: its share is 2; a third entry takes the place of its oldest.
	require.Empty(t, hs(1, a).refuse)
	require.Empty(t, hs(2, a).refuse)
	require.Empty(t, hs(3, a).refuse)
	require.False(t, known(1), "the address's oldest unconfirmed entry made room")
	require.True(t, known(2) && known(3))
	require.Equal(t, 2, m.unconfirmedBy[a])
	require.Equal(t, uint64(1), m.stats.PeersEvicted)

	// Confirmed entries (a notify with the pair's token) stay, whatever comes.
	for s := uint64(10); s < 16; s++ {
		require.Empty(t, hs(s, netip.Addr{}).refuse)
		m.confirmPeer(m.peers[peerKey{session: s}])
	}
	require.Len(t, m.peers, 8)
	require.Equal(t, 2, m.unconfirmedPeers)

	// Full: b's newcomer evicts the oldest unconfirmed entry (a's 2), then a's 3.
	require.Empty(t, hs(20, b).refuse)
	require.False(t, known(2))
	require.Empty(t, hs(21, b).refuse)
	require.False(t, known(3))
	// b's own share is reached: its oldest goes.
	require.Empty(t, hs(22, b).refuse)
	require.False(t, known(20))
	require.Len(t, m.peers, 8)

	// Everything confirmed: nothing to evict, the newcomer is refused, the limit named.
	m.confirmPeer(m.peers[peerKey{session: 21}])
	m.confirmPeer(m.peers[peerKey{session: 22}])
	r := hs(30, b)
	require.Equal(t, refuseLimit, r.refuse)
	require.ErrorIs(t, r.err, ErrLimit)
	require.ErrorContains(t, r.err, "max_peers")
	for s := uint64(10); s < 16; s++ {
		require.True(t, known(s), "confirmed entry %d kept", s)
	}
	require.Zero(t, m.unconfirmedPeers)
	require.Empty(t, m.unconfirmedBy)
}

// A handshake whose channel fails on our side (a verbs call, our resources) leaves no peer
// entry behind when it made one: the refusal carries a cookie instead, and the peer's first
// OOB notify with it makes the entry; an entry that existed keeps its token.
func TestInboundChannelFailureKeepsNothing(t *testing.T) {
	m, _ := directMachine(machineConfig{channels: true})
	now := time.Unix(1000, 0)
	hs := inboundHS{name: "peer:1", session: 77, token: 5, ctrl: true}
	rep := m.inbound(now, hs)
	require.NotZero(t, rep.ch)
	require.True(t, rep.fresh)
	tok := m.inboundFailed(now, rep.ch, rep.fresh, hs)
	require.Empty(t, m.peers, "nothing kept for a failed handshake")
	require.Empty(t, m.chans)
	require.Equal(t, m.cookie(77, "peer:1"), tok)
	code, err := m.oobArrive(now, oobArrival{session: 77, token: tok, seq: 1, from: "peer:1", n: Notify{Msg: []byte("x")}})
	require.Empty(t, code, "%v", err)
	require.Len(t, m.peers, 1, "the cookie made the entry")

	// A known pair keeps its entry and token.
	p := m.peers[peerKey{session: 77}]
	rep = m.inbound(now, inboundHS{name: "peer:1", session: 77, token: 5, proof: tok, ctrl: true})
	require.NotZero(t, rep.ch)
	require.False(t, rep.fresh)
	require.Equal(t, p.tokenIn[0], m.inboundFailed(now, rep.ch, rep.fresh, hs))
	require.Same(t, p, m.peers[peerKey{session: 77}])
}
