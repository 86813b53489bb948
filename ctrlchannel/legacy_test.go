package ctrlchannel

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// mooncakeRQ is the receive side of a Mooncake PR #3440 CtrlChannel as the machine tests
// see it: depth RECVs posted, each reposted after its WC is handled (never before), no
// credit frame ever sent back. A frame that finds no posted RECV waits on the wire (the
// sender's rnr_retry 7 retries for ever).
type mooncakeRQ struct {
	depth, posted int
	got           []Header
	names, msgs   []string
	rnr           int
}

// landOne lands the oldest frame of from on the Mooncake side and completes it when
// signaled; repost says whether the Mooncake worker reposts the RECV right away.
func (q *mooncakeRQ) landOne(t *testing.T, from *node, repost bool) bool {
	if len(from.wire) == 0 {
		return false
	}
	if q.posted == 0 {
		q.rnr++
		return false
	}
	f := from.wire[0]
	from.wire = from.wire[1:]
	q.posted--
	var h Header
	p, err := DecodeHeader(f.data, &h)
	require.NoError(t, err)
	require.True(t, h.Type.Mooncake(), "%s is no Mooncake type", h.Type)
	require.Zero(t, h.Flags)
	require.Zero(t, h.AckSeq, "no credit is piggybacked towards Mooncake")
	q.got = append(q.got, h)
	if h.Type == TypeNotifyCompat {
		var nc NotifyCompat
		require.NoError(t, DecodeNotifyCompat(p, &nc))
		q.names = append(q.names, string(nc.Name))
		q.msgs = append(q.msgs, string(nc.Msg))
	}
	if repost {
		q.posted++
	}
	if f.signaled {
		from.m.SendWC(f.wrid)
		from.apply()
	}
	return true
}

func legacyNode(t *testing.T, p Params, rq int) *node {
	n := newNode(t, "A", p)
	require.NoError(t, n.m.Connected(t0, PeerParams{LocalSession: 1, Epoch: 3, RQDepth: rq, Legacy: true, Extensions: true,
		DeliveredSeq: 1 << 40}))
	n.apply()
	return n
}

// TestMachineLegacyPeerNeverGrants is the proof asked of the sender towards a peer that
// never grants credit and never piggybacks ack_seq: it keeps at most
// min(notify_rq_depth, send slots) SENDs without a completion (Mooncake's own rule), so
// frames beyond the RECVs Mooncake has posted only meet RNR, which rnr_retry 7 retries
// for ever; every SEND completes once Mooncake reposts, none is lost, none stalls.
func TestMachineLegacyPeerNeverGrants(t *testing.T) {
	const n, rq = 30_000, 8
	a := legacyNode(t, Params{RecvCount: 16, Extensions: true, SendSlots: 32, MaxPendingSends: 64}, rq)
	q := &mooncakeRQ{depth: rq, posted: rq}
	rng := rand.New(rand.NewPCG(1, 2))
	var reqs []*SendReq
	next := uint64(1)
	for len(a.done) < n {
		for a.m.Stats().Pending < 64 && next <= n {
			reqs = append(reqs, a.submit(next, "n", fmt.Sprintf("m%d", next)))
			next++
		}
		inflight := a.m.Stats().InFlight
		require.LessOrEqual(t, inflight, rq, "never more SENDs without completion than the peer's notify_rq_depth")
		// A slow Mooncake worker: some WCs are handled late, so their RECVs come back late.
		moved := false
		for i := 0; i < 1+rng.IntN(rq); i++ {
			if q.landOne(t, a, rng.IntN(4) != 0) {
				moved = true
			}
		}
		if q.posted < rq && (rng.IntN(2) == 0 || !moved) {
			q.posted++ // the late reposts
		}
	}
	for i, r := range reqs {
		require.NoError(t, a.done[r], "seq %d", i+1)
	}
	require.Len(t, q.names, n)
	for i, h := range q.got {
		require.Equal(t, uint64(i+1), h.Seq, "in order, exactly once")
		require.Equal(t, TypeNotifyCompat, h.Type)
	}
	st := a.m.Stats()
	require.Zero(t, st.GrantsSent)
	require.Zero(t, st.FragmentsSent)
	require.Positive(t, q.rnr, "the schedule did make the sender meet RNR")
	t.Logf("%d notifies, %d RNR waits, %d credit waits", n, q.rnr, st.CreditWaits)
}

// TestMachineLegacyFrames: epoch 0 and per-channel seqs are accepted from a legacy peer;
// a twosided peer's epoch-0 frame is stale. The engine's delivered seq does not apply to
// a legacy peer, whose seqs restart on every channel.
func TestMachineLegacyFrames(t *testing.T) {
	for ch := 0; ch < 2; ch++ { // a Mooncake reconnect: a new channel, seq from 1 again
		a := legacyNode(t, extParams(4), 64)
		for seq := uint64(1); seq <= 3; seq++ {
			inject(a, frameBytes(t, 0xabc, 0, seq, 0, "", fmt.Sprintf("c%d-%d", ch, seq)))
		}
		inject(a, frameBytes(t, 0xabc, 3, 4, 0, "n", "own epoch")) // what twosided itself would send
		inject(a, frameBytes(t, 0xabc, 9, 5, 0, "n", "another epoch"))
		require.Equal(t, []uint64{1, 2, 3, 4}, seqs(a.got))
		require.Equal(t, "", a.got[0].name, "an empty name is a name")
		require.Equal(t, uint64(1), a.m.Stats().DroppedStaleEpoch)
		require.NoError(t, a.closed)
	}
	b := newNode(t, "B", extParams(4))
	require.NoError(t, b.m.Connected(t0, PeerParams{LocalSession: 1, PeerSession: 2, Epoch: 3, RQDepth: 4, Extensions: true}))
	b.apply()
	inject(b, frameBytes(t, 2, 0, 1, 0, "n", "epoch 0"))
	require.Empty(t, b.got)
	require.Equal(t, uint64(1), b.m.Stats().DroppedStaleEpoch)
}

// TestMachineLegacyBufferBoundary: towards a legacy peer a frame of exactly its buffer
// size goes out whole; one byte more fails with ErrTooLarge, never truncated, never cut
// into fragments Mooncake cannot read. An id is left out, not sent.
func TestMachineLegacyBufferBoundary(t *testing.T) {
	a := newNode(t, "A", Params{RecvCount: 4, Extensions: true, BufSize: 4096})
	require.NoError(t, a.m.Connected(t0, PeerParams{LocalSession: 1, Epoch: 3, RQDepth: 64, BufSize: 4096, Legacy: true, Extensions: true}))
	a.apply()
	fits := a.submitReq(&SendReq{Seq: 1, Name: "n", Msg: []byte(strings.Repeat("x", 4096-HeaderLen-8-1)), ID: "id-1"})
	over := a.submitReq(&SendReq{Seq: 2, Name: "n", Msg: []byte(strings.Repeat("x", 4096-HeaderLen-8))})
	require.ErrorIs(t, a.done[over], ErrTooLarge)
	require.Len(t, a.wire, 1)
	require.Len(t, a.wire[0].data, 4096)
	require.Equal(t, TypeNotifyCompat, a.wire[0].typ, "no NOTIFY_ID towards Mooncake")
	a.m.SendWC(a.wire[0].wrid)
	a.apply()
	require.NoError(t, a.done[fits])
	require.Zero(t, a.m.Stats().FragmentsSent)
}

func (n *node) submitReq(r *SendReq) *SendReq {
	n.m.Submit(t0, r)
	n.apply()
	return r
}

// TestMachineLegacyRawNotify: a RECV without the magic from a legacy peer is Mooncake's
// phase-1 raw notify and is delivered; from a twosided peer it is dropped and counted.
func TestMachineLegacyRawNotify(t *testing.T) {
	raw := frameBytes(t, 0, 0, 0, 0, "legacy", "raw")[HeaderLen:]
	a := legacyNode(t, extParams(4), 8)
	inject(a, raw)
	require.Len(t, a.got, 1)
	require.Equal(t, delivered{name: "legacy", msg: "raw"}, a.got[0])
	require.Equal(t, uint64(1), a.m.Stats().LegacyDelivered)

	b := newNode(t, "B", extParams(4))
	require.NoError(t, b.m.Connected(t0, PeerParams{LocalSession: 1, PeerSession: 2, Epoch: 3, RQDepth: 4, Extensions: true}))
	b.apply()
	inject(b, raw)
	require.Empty(t, b.got)
	require.Equal(t, uint64(1), b.m.Stats().DroppedBadMagic)
}

// TestMachineDropsCountedByReason: every frame that cannot be used is dropped under its
// reason, with an ActDrop naming it; the channel keeps delivering.
func TestMachineDropsCountedByReason(t *testing.T) {
	a := newNode(t, "A", Params{RecvCount: 4}) // no extensions
	require.NoError(t, a.m.Connected(t0, PeerParams{LocalSession: 1, PeerSession: 2, Epoch: 3, RQDepth: 4}))
	a.apply()
	good := func(seq uint64) []byte { return frameBytes(t, 2, 3, seq, 0, "n", "m") }
	mut := func(at int, v byte) []byte { b := good(9); b[at] = v; return b }
	frag := good(9)
	frag[5] = byte(TypeNotifyFragment)
	badPayload := good(9)
	copy(badPayload[HeaderLen:], []byte{0xff, 0xff, 0, 0})
	for _, c := range []struct {
		in     []byte
		reason DropReason
	}{
		{mut(0, 'X'), DropBadMagic},
		{[]byte{1, 2}, DropBadMagic},
		{mut(4, 2), DropDecode},
		{mut(6, 2), DropDecode},
		{good(9)[:50], DropDecode},
		{badPayload, DropDecode},
		{mut(5, 11), DropUnknownType},
		{frag, DropExtension},
		{frameBytes(t, 2, 2, 9, 0, "n", "m"), DropStaleEpoch},
		{frameBytes(t, 7, 3, 9, 0, "n", "m"), DropForeignSession},
	} {
		inject(a, c.in)
		require.Equal(t, c.reason, a.drops[len(a.drops)-1].Reason, "%x", c.in)
	}
	// A resent seq is not the channel's to drop: the engine's receive window orders and
	// dedups across channels (a send of a replaced channel comes again on this one).
	drops := len(a.drops)
	inject(a, good(1))
	inject(a, good(1))
	require.Len(t, a.drops, drops)
	st := a.m.Stats()
	require.Equal(t, MachineStats{DroppedBadMagic: 2, DroppedDecode: 4, DroppedUnknownType: 1, DroppedExtension: 1,
		DroppedStaleEpoch: 1, DroppedForeignSession: 1},
		MachineStats{DroppedBadMagic: st.DroppedBadMagic, DroppedDecode: st.DroppedDecode, DroppedUnknownType: st.DroppedUnknownType,
			DroppedExtension: st.DroppedExtension, DroppedStaleEpoch: st.DroppedStaleEpoch,
			DroppedForeignSession: st.DroppedForeignSession, DroppedDuplicate: st.DroppedDuplicate})
	require.Equal(t, uint64(10), st.Dropped())
	require.Equal(t, []uint64{1, 1}, seqs(a.got))
	require.NoError(t, a.closed)
	require.Len(t, a.posted, 4)
}

// TestMachineCompletedIsDeliveredOrCounted: whatever a sender's SEND completed for is,
// at the receiver, either delivered or counted (and reported) as dropped, never neither.
func TestMachineCompletedIsDeliveredOrCounted(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	nw := connect(t, extParams(8), extParams(8))
	var reqs []*SendReq
	corrupt := 0
	for i := 1; i <= 2000; i++ {
		reqs = append(reqs, nw.a.submit(uint64(i), "n", fmt.Sprintf("m%d", i)))
		for len(nw.a.wire) > 0 && len(nw.b.posted) > 0 {
			if rng.IntN(10) == 0 && nw.a.wire[0].typ == TypeNotifyCompat {
				f := &nw.a.wire[0]
				f.data = append([]byte(nil), f.data...)
				f.data[rng.IntN(8)] ^= 0x5a // magic, version, type or flags
				corrupt++
			}
			nw.land(nw.a, nw.b)
		}
		nw.b.repost()
		nw.pump(4)
	}
	nw.pump(8)
	completed := 0
	for _, r := range reqs {
		if nw.a.done[r] == nil {
			completed++
		}
	}
	st := nw.b.m.Stats()
	require.Equal(t, len(reqs), completed, "every SEND completed")
	require.Equal(t, uint64(completed), st.Delivered+st.Dropped(), "delivered or counted as dropped")
	require.Equal(t, uint64(corrupt), st.Dropped())
	require.Len(t, nw.b.drops, corrupt, "each drop reported for the log")
	require.NoError(t, nw.b.closed)
}

// TestMachineGrantNamingResourceTwice: accepted, and its largest total applies.
func TestMachineGrantNamingResourceTwice(t *testing.T) {
	a := newNode(t, "A", extParams(4))
	require.NoError(t, a.m.Connected(t0, PeerParams{LocalSession: 1, PeerSession: 2, Epoch: 3, RQDepth: 4, Extensions: true}))
	a.apply()
	before := a.m.Stats().CreditAvail
	g := CreditGrant{N: 2, Entries: [4]GrantEntry{{RequestSlots, 20}, {RequestSlots, 10}}}
	buf := make([]byte, HeaderLen+g.Len())
	h := Header{Type: TypeCreditGrant, Session: 2, Epoch: 3, PayloadLen: uint32(g.Len())}
	require.NoError(t, EncodeHeader(buf, &h))
	_, err := EncodeCreditGrant(buf[HeaderLen:], &g)
	require.NoError(t, err)
	inject(a, buf)
	require.NoError(t, a.closed)
	require.Zero(t, a.m.Stats().Dropped())
	require.Equal(t, before+16, a.m.Stats().CreditAvail, "granted total 20, 4 before")
}
