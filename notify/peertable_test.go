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

// unusedCounts checks the counts of channels peers have not used against the channels,
// and their caps: per pool and address, and per pool in all.
func unusedCounts(t *testing.T, m *peerMachine) {
	t.Helper()
	by, in, n := map[unusedKey]int{}, [2]int{}, 0
	for _, ce := range m.chans {
		if unused(ce) {
			by[unusedKey{ce.from, ce.pool}]++
			in[ce.pool]++
			n++
		}
	}
	require.Equal(t, n, m.unconfirmed, "unused channels counted")
	require.Equal(t, in, m.unusedIn, "unused channels counted per pool")
	require.Equal(t, by, m.unusedBy, "unused channels counted per pool and address")
	for k, c := range by {
		if k.from.IsValid() {
			require.LessOrEqual(t, c, m.unusedShare(), "unused channels of %v", k)
		}
	}
	for _, c := range in {
		require.LessOrEqual(t, c, m.unusedCap())
	}
}

// unusedTable drives a peer machine's inbound handshakes: hs sends one asking for a
// channel (proof: the cookie of a busy refusal, or 0) and makes the channel when accepted.
type unusedTable struct {
	t    *testing.T
	m    *peerMachine
	acts func(mActKind) []mAction
	now  time.Time
	next uint64
}

func newUnusedTable(t *testing.T, cfg machineConfig) *unusedTable {
	m, acts := directMachine(cfg)
	return &unusedTable{t: t, m: m, acts: acts, now: time.Unix(1000, 0), next: 1000}
}

func (u *unusedTable) hs(session uint64, from netip.Addr, proof uint64) inboundReply {
	u.now = u.now.Add(time.Millisecond)
	r := u.m.inbound(u.now, inboundHS{name: fmt.Sprint("peer", session), session: session, token: session, proof: proof, ctrl: true, from: from})
	if r.refuse == "" {
		require.NotZero(u.t, r.ch)
		u.m.inboundUp(u.now, r.ch, nil)
	}
	return r
}

// ghost is a handshake that never reads its reply nor uses its channel; it reports
// whether it got one.
func (u *unusedTable) ghost(from netip.Addr) bool {
	u.next++
	return u.hs(u.next, from, 0).refuse == ""
}

// newcomer is a real engine: it handshakes, asks again with the cookie when answered busy,
// and uses its channel (its first notify). It returns its session and how many handshakes
// it took.
func (u *unusedTable) newcomer(from netip.Addr) (uint64, int) {
	u.next++
	s := u.next
	var proof uint64
	for try := 1; try <= 3; try++ {
		r := u.hs(s, from, proof)
		switch r.refuse {
		case "":
			u.m.confirm(u.m.chans[r.ch])
			require.True(u.t, u.m.peers[peerKey{session: s}].confirmed)
			return s, try
		case refuseBusy:
			require.NotZero(u.t, r.token, "a busy refusal carries the cookie: %v", r.err)
			require.ErrorIs(u.t, r.err, ErrBackpressure)
			proof = r.token
		default:
			u.t.Fatalf("newcomer %d refused %s: %v", s, r.refuse, r.err)
		}
	}
	u.t.Fatalf("newcomer %d refused busy with its cookie", s)
	return 0, 0
}

// Entries made by handshakes that asked for a channel their peer never used (a QPN nobody
// owns) lock nobody out, at max_peers 16: 8 from the newcomers' own address, or 40 from
// four others. Within the ghosts' grace a newcomer is answered busy with a cookie, and with
// it takes a ghost's place; past the grace a first handshake does. Confirmed entries are
// never evicted, and the unused channels stay within their caps.
func TestPeerTableUnusedChannelsEvicted(t *testing.T) {
	u := newUnusedTable(t, machineConfig{maxPeers: 16, channels: true, connectTimeout: 60 * time.Second})
	m := u.m
	own := netip.MustParseAddr("127.0.0.1")
	good, _ := u.newcomer(own)

	accepted := 0
	for i := 0; i < 8; i++ {
		if u.ghost(own) {
			accepted++
		}
	}
	require.Equal(t, 4, accepted, "the address's share of unconfirmed entries (a quarter of 16)")
	unusedCounts(t, m)
	u.acts(aClose)

	// 10 newcomers from that address, one after another, within the ghosts' grace.
	var confirmed []uint64
	cookied := 0
	for k := 0; k < 10; k++ {
		s, tries := u.newcomer(own)
		if tries > 1 {
			cookied++
		}
		confirmed = append(confirmed, s)
		unusedCounts(t, m)
	}
	require.Positive(t, cookied, "newcomers answered busy took ghosts' places with their cookies")
	require.Equal(t, uint64(cookied), m.stats.PeersEvicted)
	require.Len(t, u.acts(aClose), cookied, "each evicted ghost's channel closes")
	require.NotNil(t, m.peers[peerKey{session: good}])

	// 40 ghosts from four other addresses fill the table (16).
	others := []netip.Addr{netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.3"),
		netip.MustParseAddr("127.0.0.4"), netip.MustParseAddr("127.0.0.5")}
	for i := 0; i < 40; i++ {
		u.ghost(others[i%4])
	}
	require.Len(t, m.peers, 16)
	unusedCounts(t, m)
	// Newcomers from their own address and from a ghost's: served, within the grace.
	for k := 0; k < 4; k++ {
		s, _ := u.newcomer([]netip.Addr{own, others[0]}[k%2])
		confirmed = append(confirmed, s)
	}
	// Past the grace a first handshake takes a ghost's place at once.
	u.now = u.now.Add(m.unusedGrace())
	s, tries := u.newcomer(own)
	require.Equal(t, 1, tries, "past their grace, ghosts give way to a first handshake")
	confirmed = append(confirmed, s)
	require.Len(t, m.peers, 16)
	unusedCounts(t, m)
	require.NotNil(t, m.peers[peerKey{session: good}])
	for _, s := range confirmed {
		if len(m.peers) == 16 && m.peers[peerKey{session: s}] == nil {
			t.Fatalf("confirmed entry %d evicted", s)
		}
	}

	// A table of confirmed entries only: the limit, named, not busy.
	for _, p := range m.peers {
		m.confirmPeer(p)
		if ce := m.chans[p.ch]; ce != nil {
			m.confirm(ce)
		}
	}
	u.next++
	r := u.hs(u.next, own, 0)
	require.Equal(t, refuseLimit, r.refuse)
	require.ErrorIs(t, r.err, ErrLimit)
	require.ErrorContains(t, r.err, "max_peers")
}

// A cookie is the reply's: a made-up proof, or one for another session or name, counts for
// nothing, and a flood that never reads replies stays in the first pool.
func TestPeerTableCookieIsTheReplys(t *testing.T) {
	u := newUnusedTable(t, machineConfig{maxUnconfirmed: 8, channels: true})
	m := u.m
	a := netip.MustParseAddr("10.0.0.1")
	for i := 0; i < 20; i++ {
		u.ghost(a)
	}
	require.Equal(t, 2, m.unusedIn[poolFirst], "the share of one address: a quarter of 8")
	r := u.hs(5000, a, 0)
	require.Equal(t, refuseBusy, r.refuse)
	require.Equal(t, m.cookie(5000, "peer5000"), r.token)
	require.Empty(t, m.peers[peerKey{session: 5000}], "a busy refusal keeps nothing")
	require.Equal(t, refuseBusy, u.hs(5001, a, r.token).refuse, "another session's cookie")
	require.Equal(t, refuseBusy, u.hs(5000, a, r.token+1).refuse, "a made-up cookie")
	require.Empty(t, u.hs(5000, a, r.token).refuse, "the reply's cookie")
	require.Equal(t, 1, m.unusedIn[poolCookie])
	unusedCounts(t, m)
}

// A burst of legitimate engines from one address, more than the caps, each using its
// channel a few handshakes after it got it (a loaded host): none loses a channel it was
// given (nothing is evicted within the grace), every one gets a channel (a busy one asks
// again), and the unused channels never pass their caps. Row1's eviction, without a
// grace, closed the oldest unused channel for each newer handshake.
func TestPeerTableLegitBurstNotChurned(t *testing.T) {
	u := newUnusedTable(t, machineConfig{channels: true})
	m := u.m
	from := netip.MustParseAddr("127.0.0.1")
	const engines, lag = 1000, 20
	type eng struct {
		s, proof uint64
		ch       chanID
		tries    int
	}
	es := make([]*eng, engines)
	for i := range es {
		es[i] = &eng{s: uint64(10_000 + i)}
	}
	type use struct {
		e  *eng
		at int
	}
	var using []use // got a channel, not used yet: each uses it lag handshakes later
	step := 0
	pending := es
	for round := 0; len(pending) > 0; round++ {
		require.Less(t, round, 20, "engines still without a channel: %d", len(pending))
		var again []*eng
		for _, e := range pending {
			e.tries++
			step++
			r := u.hs(e.s, from, e.proof)
			switch r.refuse {
			case "":
				e.ch = r.ch
				using = append(using, use{e, step})
			case refuseBusy:
				e.proof = r.token
				again = append(again, e)
			default:
				t.Fatalf("engine %d refused %s: %v", e.s, r.refuse, r.err)
			}
			for len(using) > 0 && using[0].at+lag <= step {
				require.NotNil(t, m.chans[using[0].e.ch], "engine %d's channel was closed before it used it", using[0].e.s)
				m.confirm(m.chans[using[0].e.ch])
				using = using[1:]
			}
			unusedCounts(t, m)
		}
		pending = again
		u.now = u.now.Add(150 * time.Millisecond) // the busy pause
	}
	for _, x := range using {
		m.confirm(m.chans[x.e.ch])
	}
	require.Zero(t, m.stats.UnconfirmedEvicted, "no channel closed for another")
	require.Zero(t, m.stats.PeersEvicted)
	require.Len(t, m.peers, engines)
	tries := 0
	for _, e := range es {
		tries = max(tries, e.tries)
	}
	t.Logf("%d engines: at most %d handshakes each, %d answered busy", engines, tries, m.stats.UnconfirmedRefused)
}

// An endless flood from one address (at default limits) and from four (at max_peers 16),
// with newcomers arriving throughout (and leaving, at max_peers 16), from the flood's
// address and another: every newcomer is served within two handshakes, confirmed entries stay, and the flood's channels stay
// within their caps (per address and in all), counted.
func TestPeerTableEndlessFlood(t *testing.T) {
	for _, c := range []struct {
		name     string
		maxPeers int
		srcs     []string
	}{
		{"default", 0, []string{"127.0.0.1"}},
		{"maxPeers16", 16, []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			u := newUnusedTable(t, machineConfig{maxPeers: c.maxPeers, channels: true})
			m := u.m
			var confirmed []uint64
			for k := 0; k < 200; k++ {
				for i := 0; i < 50; i++ {
					u.ghost(netip.MustParseAddr(c.srcs[i%len(c.srcs)]))
					u.now = u.now.Add(10 * time.Millisecond) // 5 s per newcomer: ghosts pass their grace
				}
				s, tries := u.newcomer(netip.MustParseAddr([]string{"127.0.0.1", "127.0.0.9"}[k%2]))
				require.LessOrEqual(t, tries, 2)
				confirmed = append(confirmed, s)
				if c.maxPeers != 0 {
					m.peerGone(u.now, fmt.Sprint("peer", s), 0) // it leaves: room for the next
				}
				unusedCounts(t, m)
				require.LessOrEqual(t, len(m.peers), m.cfg.maxPeers)
				u.acts(aClose)
			}
			if c.maxPeers == 0 {
				for _, s := range confirmed {
					require.NotNil(t, m.peers[peerKey{session: s}], "confirmed entry %d evicted", s)
				}
			}
			require.Positive(t, m.stats.UnconfirmedEvicted+m.stats.PeersEvicted)
		})
	}
}
