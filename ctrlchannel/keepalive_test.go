package ctrlchannel

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/ibv/soft"
)

func decodeSent(t *testing.T, f wireFrame) Header {
	t.Helper()
	var h Header
	p, err := DecodeHeader(f.data, &h)
	require.NoError(t, err)
	require.Empty(t, p)
	return h
}

func TestMachineKeepaliveSentAndConsumed(t *testing.T) {
	const rq = 8
	nw := connect(t, extParams(rq), extParams(rq))
	require.True(t, nw.a.m.Keepalive())
	nw.a.apply()
	require.Len(t, nw.a.wire, 1)
	f := nw.a.wire[0]
	require.Equal(t, TypeCtrlAck, f.typ)
	require.True(t, f.signaled, "a keepalive is always signaled: its completion or failure is the answer")
	require.Len(t, f.data, HeaderLen)
	h := decodeSent(t, f)
	require.Equal(t, Header{Type: TypeCtrlAck, Session: 11, Epoch: 1, AckSeq: rq}, h,
		"seq 0, no payload, ack_seq piggybacks the credit total")
	require.Equal(t, uint64(rq-1), nw.a.m.Stats().CreditAvail, "the keepalive took one credit")

	require.False(t, nw.a.m.Keepalive(), "a keepalive is in flight")
	nw.a.apply()
	require.Len(t, nw.a.wire, 1)

	require.True(t, nw.land(nw.a, nw.b))
	require.Empty(t, nw.b.got, "a keepalive delivers nothing")
	require.Zero(t, nw.a.m.Stats().InFlight)
	nw.b.repost()
	require.Len(t, nw.b.posted, rq, "its RECV is posted again")
	sb := nw.b.m.Stats()
	require.Equal(t, uint64(1), sb.KeepalivesReceived)
	require.Zero(t, sb.Ignored)
	require.Zero(t, sb.Delivered)
	sa := nw.a.m.Stats()
	require.Equal(t, uint64(1), sa.KeepalivesSent)
	require.Equal(t, uint64(1), sa.FramesSent)
}

func TestMachineKeepaliveCreditReturns(t *testing.T) {
	for _, rq := range []int{3, 4, 8, 64} {
		nw := connect(t, extParams(rq), extParams(rq))
		for i := 0; i < 20*rq; i++ {
			nw.a.m.Keepalive()
			nw.a.apply()
			nw.pump(rq)
			require.Positive(t, nw.a.m.Stats().CreditAvail, "rq %d round %d: keepalives never leave the sender without credit", rq, i)
		}
		sa, sb := nw.a.m.Stats(), nw.b.m.Stats()
		require.Greater(t, sa.KeepalivesSent, uint64(rq), "rq %d: more keepalives than the peer's RECVs: credit came back", rq)
		require.Equal(t, sa.KeepalivesSent, sb.KeepalivesReceived)
		require.Positive(t, sb.GrantsSent, "rq %d: the idle peer returned the keepalives' RECVs", rq)
		require.Zero(t, sa.KeepalivesNoCredit)
		require.Zero(t, nw.rnr)
		require.Zero(t, sb.CreditOverruns)
		require.Empty(t, nw.b.got)
		require.Empty(t, nw.a.got)

		// The channel still carries notifies at full window afterwards.
		for i := 1; i <= 10*rq; i++ {
			nw.a.submit(uint64(i), "n", "m")
		}
		nw.pump(rq)
		require.Len(t, nw.b.got, 10*rq)
		require.Zero(t, nw.rnr)
	}
}

func TestMachineKeepaliveBothSidesGoQuiet(t *testing.T) {
	nw := connect(t, extParams(3), extParams(3))
	for i := 0; i < 200; i++ {
		for _, x := range []*node{nw.a, nw.b} {
			x.m.Keepalive()
			x.apply()
		}
		nw.pump(1)
	}
	for _, x := range []*node{nw.a, nw.b} {
		s := x.m.Stats()
		require.Positive(t, s.KeepalivesSent, x.name)
		require.Zero(t, s.KeepalivesNoCredit, x.name)
		require.Zero(t, s.CreditOverruns, x.name)
		require.Empty(t, x.got, x.name)
	}
	require.Zero(t, nw.rnr)
	// Grants answer keepalives but are never answered one for one: the traffic stays
	// within a few frames per round.
	total := nw.a.m.Stats().FramesSent + nw.b.m.Stats().FramesSent
	require.LessOrEqual(t, total, uint64(2*200+10))
}

func TestMachineKeepaliveNotWhenTrafficFlowed(t *testing.T) {
	nw := connect(t, extParams(8), extParams(8))
	require.True(t, nw.a.m.Keepalive(), "idle since connect")
	nw.a.apply()
	nw.pump(8)

	nw.b.submit(1, "n", "m")
	nw.pump(8)
	require.Len(t, nw.a.got, 1)
	require.False(t, nw.a.m.Keepalive(), "a frame arrived since the previous Keepalive")
	nw.a.apply()
	require.Empty(t, nw.a.wire)
	require.True(t, nw.a.m.Keepalive(), "nothing arrived since the previous Keepalive")
	nw.a.apply()
	nw.pump(8)

	r := nw.a.submit(2, "n", "m") // on the wire, not completed
	require.False(t, nw.a.m.Keepalive(), "a SEND is in flight")
	nw.a.apply()
	require.Len(t, nw.a.wire, 1)
	nw.pump(8)
	require.NoError(t, nw.a.done[r])
	require.Equal(t, uint64(2), nw.a.m.Stats().KeepalivesSent)
}

func TestMachineKeepaliveNeedsCredit(t *testing.T) {
	const rq = 3
	a := newNode(t, "A", extParams(8))
	require.NoError(t, a.m.Connected(t0, PeerParams{LocalSession: 1, PeerSession: 2, Epoch: 1, RQDepth: rq, Extensions: true}))
	a.apply()
	// The peer takes the frames and ACKs them but returns no credit.
	for i := 0; i < rq-1; i++ {
		require.True(t, a.m.Keepalive(), "keepalive %d", i)
		a.apply()
		a.m.SendWC(a.wire[0].wrid)
		a.wire = a.wire[1:]
		a.apply()
	}
	require.False(t, a.m.Keepalive(), "only the reserve is left, and the keepalive would return nothing")
	a.apply()
	require.Empty(t, a.wire)
	s := a.m.Stats()
	require.Equal(t, uint64(rq-1), s.KeepalivesSent)
	require.Equal(t, uint64(1), s.KeepalivesNoCredit)
	require.Equal(t, uint64(1), s.CreditAvail)

	// Two of the peer's keepalives arrive: a keepalive may now take the reserve, since
	// it returns two RECVs, as much as a grant would.
	var buf [HeaderLen]byte
	require.NoError(t, EncodeHeader(buf[:], &Header{Type: TypeCtrlAck, Session: 2, Epoch: 1}))
	inject(a, buf[:])
	inject(a, buf[:])
	require.Empty(t, a.wire, "not worth a grant yet")
	require.False(t, a.m.Keepalive(), "frames arrived since the previous Keepalive")
	a.apply()
	require.True(t, a.m.Keepalive())
	a.apply()
	require.Len(t, a.wire, 1)
	require.Equal(t, uint64(10), decodeSent(t, a.wire[0]).AckSeq, "it carries the two reposted RECVs")
	require.Zero(t, a.m.Stats().CreditAvail)
	require.Equal(t, uint64(2), a.m.Stats().KeepalivesReceived)
	require.Empty(t, a.got)
}

func TestMachineKeepaliveMooncakePeer(t *testing.T) {
	nw := connect(t, extParams(8), Params{RecvCount: 8}) // B: a peer without extensions
	for i := 0; i < 50; i++ {
		require.True(t, nw.a.m.Keepalive(), "round %d", i)
		nw.a.apply()
		nw.pump(8)
	}
	require.Equal(t, uint64(50), nw.a.m.Stats().KeepalivesSent)
	require.Equal(t, uint64(50), nw.b.m.Stats().KeepalivesReceived)
	require.Empty(t, nw.b.got)
	require.Empty(t, nw.b.sends, "nothing to answer")
	for _, f := range nw.a.sends {
		require.Equal(t, TypeCtrlAck, f.typ, "CTRL_ACK, which Mooncake ignores, never a CREDIT_GRANT")
		require.Zero(t, decodeSent(t, f).AckSeq, "no piggybacked credit towards a Mooncake peer")
	}
	require.Zero(t, nw.rnr)
}

func TestMachineKeepaliveOnlyWhenConnected(t *testing.T) {
	a := newNode(t, "A", extParams(4))
	require.False(t, a.m.Keepalive(), "not connected yet")
	a.apply()
	require.NoError(t, a.m.Connected(t0, PeerParams{LocalSession: 1, PeerSession: 2, Epoch: 1, RQDepth: 4, Extensions: true}))
	a.apply()
	require.True(t, a.m.Keepalive())
	a.apply()
	a.m.FailWC(&ibv.WCError{Status: ibv.WCRetryExcErr, WRID: a.wire[0].wrid})
	a.apply()
	require.ErrorIs(t, a.closed, ErrPeerError)
	require.False(t, a.m.Keepalive(), "closed")
	a.apply()
	require.Len(t, a.sends, 1)
}

// TestChannelKeepaliveDetectsDeadPeer: two idle channels; the peer dies (its device is
// killed, or the link is cut); a Keepalive on the survivor ends in OnClosed with a peer
// error once the QP's retries ran out.
func TestChannelKeepaliveDetectsDeadPeer(t *testing.T) {
	// 268 ms per try, 3 tries: the healthy round before the fault must survive a loaded
	// machine (1 ms tries, as here before, let it die of RETRY_EXC_ERR beside CPU hogs).
	short := extConfig()
	short.Timeout, short.RetryCnt = 16, 2
	for _, tc := range []struct {
		name  string
		fault func(p *soft.Provider) error
	}{
		{"KillDevice", func(p *soft.Provider) error { return p.KillDevice("soft1") }},
		{"CutLink", func(p *soft.Provider) error { return p.CutLink("soft0", "soft1") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b, p := pair(t, short, short, 0, 0)
			keepaliveRound(t, a, b) // healthy: answered
			require.NoError(t, tc.fault(p))

			var start time.Time
			onLoop(t, a.loop, func() {
				start = time.Now()
				a.ch.Keepalive()
			})
			err := wait(t, a.rec.closed, "OnClosed after the keepalive")
			t.Logf("%s: dead peer detected %v after Keepalive (timeout %d, retry_cnt %d)", tc.name, time.Since(start), short.Timeout, short.RetryCnt)
			require.ErrorIs(t, err, ErrPeerError)
			require.ErrorIs(t, err, ErrClosed)
			var wcErr *ibv.WCError
			require.ErrorAs(t, err, &wcErr)
			require.Equal(t, ibv.WCRetryExcErr, wcErr.Status)
			var st ChannelStats
			onLoop(t, a.loop, func() { st = a.ch.Stats() })
			require.Equal(t, uint64(2), st.KeepalivesSent)
			require.Equal(t, uint64(1), st.WCErrors)
			require.Zero(t, a.rec.count(), "a keepalive delivers nothing")
		})
	}
}

// keepaliveRound calls Keepalive on both sides and waits until neither has a SEND in flight
// and each received the other's keepalives.
func keepaliveRound(t *testing.T, a, b *side) {
	t.Helper()
	var sentA, sentB uint64
	onLoop(t, a.loop, func() { a.ch.Keepalive(); sentA = a.ch.Stats().KeepalivesSent })
	onLoop(t, b.loop, func() { b.ch.Keepalive(); sentB = b.ch.Stats().KeepalivesSent })
	settled := func(s *side, peerSent uint64) bool {
		var st ChannelStats
		onLoop(t, s.loop, func() { st = s.ch.Stats() })
		return st.InFlight == 0 && st.KeepalivesReceived == peerSent
	}
	require.Eventually(t, func() bool { return settled(a, sentB) && settled(b, sentA) }, waitBound, time.Millisecond)
}

// TestChannelKeepaliveHealthyIdle: rounds of keepalives both ways over an idle channel with
// a short receive ring close nothing and deliver nothing. The ACK timeout is extConfig's: a
// 1 ms one with 2 retries (as here before) let the healthy QP die of RETRY_EXC_ERR on a
// loaded machine, and the round then waited for its bound.
func TestChannelKeepaliveHealthyIdle(t *testing.T) {
	short := extConfig()
	short.RecvCount = 4
	a, b, _ := pair(t, short, short, 0, 1)
	const rounds = 40
	for i := 0; i < rounds; i++ {
		keepaliveRound(t, a, b)
	}
	for _, s := range []*side{a, b} {
		select {
		case err := <-s.rec.closed:
			t.Fatalf("a healthy idle channel closed: %v", err)
		default:
		}
		require.Zero(t, s.rec.count(), "keepalives deliver nothing")
		var st ChannelStats
		onLoop(t, s.loop, func() { st = s.ch.Stats() })
		require.Positive(t, st.KeepalivesSent)
		require.Greater(t, st.KeepalivesSent+st.KeepalivesReceived, uint64(rounds/2), "every round one side at least probes")
		require.Zero(t, st.KeepalivesNoCredit)
		require.Zero(t, st.WCErrors)
		require.Zero(t, st.CreditOverruns)
		require.Zero(t, rnrNaks(t, s))
	}
	// And the channel still works.
	done := make(chan error, 1)
	onLoop(t, a.loop, func() {
		a.ch.Send(&SendReq{Seq: 1, Name: "after", Msg: []byte("keepalives"), Done: func(err error) { done <- err }})
	})
	require.NoError(t, wait(t, done, "send after keepalives"))
	wait(t, b.rec.all, "delivery")
}

func TestMachineKeepaliveAllocatesNothing(t *testing.T) {
	a := newNode(t, "A", Params{RecvCount: 8, Extensions: true})
	require.NoError(t, a.m.Connected(t0, PeerParams{LocalSession: 1, PeerSession: 2, Epoch: 1, RQDepth: 8}))
	a.m.Ready()
	allocs := testing.AllocsPerRun(1000, func() {
		if !a.m.Keepalive() {
			panic("no keepalive")
		}
		acts := a.m.Ready()
		a.m.SendWC(acts[len(acts)-1].WRID)
		a.m.Ready()
	})
	require.Zero(t, allocs)
}

func TestChannelKeepaliveMooncakePeer(t *testing.T) {
	short := extConfig()
	// A dead peer is found after 3 tries of 537 ms; a starved soft device keeps that (8,
	// 1 ms a try, did not: the healthy rounds failed beside two CPU hogs and two soaks).
	short.Timeout, short.RetryCnt = 17, 2
	mooncake := Config{Timeout: 17, RetryCnt: 2} // no Extensions: Mooncake's view of the channel
	a, b, p := pair(t, short, mooncake, 0, 0)
	for i := 0; i < 10; i++ {
		keepaliveRound(t, a, b)
	}
	var sa, sb ChannelStats
	onLoop(t, a.loop, func() { sa = a.ch.Stats() })
	onLoop(t, b.loop, func() { sb = b.ch.Stats() })
	require.Positive(t, sa.KeepalivesSent)
	require.Equal(t, sa.KeepalivesSent, sb.KeepalivesReceived)
	require.Zero(t, sa.GrantsSent, "towards a Mooncake peer: CTRL_ACK keepalives, no grants")
	require.Zero(t, b.rec.count())
	require.Zero(t, rnrNaks(t, b))

	require.NoError(t, p.KillDevice("soft1"))
	start := time.Now()
	onLoop(t, a.loop, func() { a.ch.Keepalive() })
	err := wait(t, a.rec.closed, "OnClosed after the keepalive")
	t.Logf("Mooncake peer: dead peer detected %v after Keepalive", time.Since(start))
	require.ErrorIs(t, err, ErrPeerError)
}
