package notify

import (
	"fmt"
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

// Entries made by handshakes that asked for a channel their peer never used (a QPN nobody
// owns) are as evictable as any unconfirmed entry, and their channels close with them:
// with max_peers 16, 8 such handshakes from the newcomers' own address, or 40 from four
// others, leave room for every newcomer; confirmed entries are never evicted; the channels
// nobody used stay within their caps, per address (a quarter) and in all, and a newer one
// closes the oldest of the address holding most.
func TestPeerTableUnusedChannelsEvicted(t *testing.T) {
	m, acts := directMachine(machineConfig{maxPeers: 16, maxUnconfirmed: 32, channels: true})
	now := time.Unix(1000, 0)
	own := netip.MustParseAddr("127.0.0.1")
	session := uint64(100)
	// hs is a handshake asking for a channel; up: its channel gets made (the driver's
	// inboundUp). It returns the new session, or 0 when refused.
	hs := func(from netip.Addr, up bool) uint64 {
		now = now.Add(time.Millisecond)
		session++
		r := m.inbound(now, inboundHS{name: fmt.Sprint("ghost", session), session: session, token: session, ctrl: true, from: from})
		if r.refuse != "" {
			return 0
		}
		require.NotZero(t, r.ch)
		if up {
			m.inboundUp(now, r.ch, nil)
		}
		return session
	}
	known := func(s uint64) bool { return m.peers[peerKey{session: s}] != nil }
	counts := func() {
		t.Helper()
		byAddr, n := map[netip.Addr]int{}, 0
		for _, ce := range m.chans {
			if unused(ce) {
				byAddr[ce.from]++
				n++
			}
		}
		require.Equal(t, n, m.unconfirmed, "unused channels counted")
		require.Equal(t, byAddr, m.unusedBy, "unused channels counted per address")
		require.LessOrEqual(t, n, m.cfg.maxUnconfirmed)
		for a, k := range byAddr {
			require.LessOrEqual(t, k, m.unusedPerAddr(), "unused channels of %s", a)
		}
	}

	// A good peer, confirmed (it used its channel).
	good := hs(own, true)
	m.confirm(m.chans[m.peers[peerKey{session: good}].ch])
	acts(aClose)

	// 8 ghosts from the good peers' own address: its share is 4; each beyond it evicts the
	// oldest, whose channel closes.
	var ghosts []uint64
	for i := 0; i < 8; i++ {
		s := hs(own, true)
		require.NotZero(t, s, "ghost %d refused", i)
		ghosts = append(ghosts, s)
	}
	require.Len(t, acts(aClose), 4, "each evicted entry's channel closes")
	require.Equal(t, uint64(4), m.stats.PeersEvicted)
	require.True(t, known(good))
	counts()

	// A newcomer from the same address is served (it evicts the oldest ghost left), and
	// once it used its channel it is confirmed: 10 of them, one after another.
	for k := 0; k < 10; k++ {
		s := hs(own, true)
		require.NotZero(t, s, "newcomer %d refused: %v", k, m.stats)
		m.confirm(m.chans[m.peers[peerKey{session: s}].ch])
	}
	left := 0 // ghosts left: while the table has room, they may stay
	for _, g := range ghosts {
		if known(g) {
			left++
		}
	}
	require.Less(t, left, 4, "the newcomers took ghosts' places")
	require.True(t, known(good))
	require.Len(t, m.peers, 11+left)
	counts()

	// 40 ghosts from four other addresses fill the table (16) and each other's shares.
	others := []netip.Addr{netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.3"),
		netip.MustParseAddr("127.0.0.4"), netip.MustParseAddr("127.0.0.5")}
	for i := 0; i < 40; i++ {
		require.NotZero(t, hs(others[i%4], true), "ghost %d refused", i)
	}
	require.Len(t, m.peers, 16)
	counts()
	// Confirmed entries stay; a newcomer from yet another address gets a ghost's place,
	// and one from the ghosts' addresses too; a handshake whose channel is still being
	// made can be evicted as well (the driver finds it gone: no double count).
	for k := 0; k < 5; k++ {
		s := hs(netip.MustParseAddr("127.0.0.9"), k != 2)
		require.NotZero(t, s, "newcomer %d refused", k)
		if k != 2 {
			m.confirm(m.chans[m.peers[peerKey{session: s}].ch])
		}
	}
	require.NotZero(t, hs(others[0], true))
	require.Len(t, m.peers, 16)
	confirmed := 0
	for _, p := range m.peers {
		if p.confirmed {
			confirmed++
		}
	}
	require.Equal(t, 1+10+4, confirmed, "every confirmed entry kept")
	counts()

	// Everything confirmed: a newcomer is refused for the limit, named; nothing is evicted.
	for _, p := range m.peers {
		m.confirmPeer(p)
	}
	evicted := m.stats.PeersEvicted
	require.Zero(t, hs(others[1], true))
	require.Equal(t, evicted, m.stats.PeersEvicted)
}

// The channels handshakes ask for and their peers never use are capped per source address
// (a quarter of the cap) and in all, whatever max_peers allows: a newer one closes the
// oldest of its address at its share, else the oldest of the address holding most, so
// a newcomer from a quiet address keeps its channel during a flood from a few others.
func TestPeerTableUnusedChannelCaps(t *testing.T) {
	m, acts := directMachine(machineConfig{maxPeers: 1024, maxUnconfirmed: 16, channels: true})
	now := time.Unix(1000, 0)
	session := uint64(100)
	hs := func(from netip.Addr) chanID {
		now = now.Add(time.Millisecond)
		session++
		r := m.inbound(now, inboundHS{session: session, token: session, ctrl: true, from: from})
		require.Empty(t, r.refuse, "%v", r.err)
		m.inboundUp(now, r.ch, nil)
		return r.ch
	}
	a, b, c := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3")
	for i := 0; i < 100; i++ {
		hs(a)
	}
	require.Equal(t, 4, m.unusedBy[a], "one address holds a quarter")
	require.Equal(t, uint64(96), m.stats.UnconfirmedEvicted)
	require.Len(t, acts(aClose), 96)
	newcomer := hs(c)
	for i := 0; i < 100; i++ {
		hs(a)
		hs(b)
	}
	require.Equal(t, map[netip.Addr]int{a: 4, b: 4, c: 1}, m.unusedBy)
	require.True(t, unused(m.chans[newcomer]), "a newcomer from a quiet address keeps its channel")
	require.Len(t, m.peers, 9, "the evicted channels' entries went with them")

	// Full in all: the address holding most gives up its oldest.
	m.cfg.maxUnconfirmed = 9
	d := netip.MustParseAddr("10.0.0.4")
	hs(d)
	require.Equal(t, 7, m.unusedBy[a]+m.unusedBy[b], "a or b, the heaviest, gave one up")
	require.True(t, unused(m.chans[newcomer]))
	require.Equal(t, 9, m.unconfirmed)
}
