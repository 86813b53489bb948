package ctrlchannel

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The tests below wire two machines in memory, like etcd/raft's network tests: each
// PostSend puts the frame's bytes on a wire, and the test decides when a frame lands in
// one of the peer's posted RECV buffers, when a completion comes back and when the peer
// reposts. A frame that finds no posted RECV is an RNR: it stays on the wire and is
// counted.

var t0 = time.Unix(1_700_000_000, 0)

type wireFrame struct {
	data     []byte
	wrid     uint64
	signaled bool
	typ      FrameType
}

type delivered struct {
	session, epoch, seq uint64
	name, msg           string
	owned               bool
	id                  string
}

type node struct {
	t         testing.TB
	name      string
	m         *Machine
	p         Params
	recvBufs  [][]byte
	posted    []int // posted RECV slots, in post order
	isPosted  map[int]bool
	wire      []wireFrame // frames posted, not yet landed
	got       []delivered
	done      map[*SendReq]error
	doneOrder []*SendReq
	timer     time.Time
	closed    error
	sends     []wireFrame // every frame posted, for inspection
	fences    []fenceAt
	drops     []Action
	// drain: the ActDrain's error once one came; holdDrain keeps the node from closing
	// then (the driver's reaping is the test's), else it closes at once, as a driver
	// whose CQ held nothing more would.
	drain     error
	holdDrain bool
}

// fenceAt is an ActFence and the number of notifies delivered before it.
type fenceAt struct {
	after                 int
	session, first, count uint64
}

func newNode(t testing.TB, name string, p Params) *node {
	t.Helper()
	if p.BufSize == 0 {
		p.BufSize = 256
	}
	if p.SendSlots == 0 {
		p.SendSlots = 16
	}
	if p.MaxPendingSends == 0 {
		p.MaxPendingSends = 4096
	}
	if p.MaxNotifySize == 0 {
		p.MaxNotifySize = 1 << 20
	}
	p.SendRing = make([]byte, p.SendSlots*p.BufSize)
	m, err := NewMachine(p)
	require.NoError(t, err)
	n := &node{t: t, name: name, m: m, p: p, isPosted: map[int]bool{}, done: map[*SendReq]error{}}
	for i := 0; i < p.RecvCount; i++ {
		n.recvBufs = append(n.recvBufs, make([]byte, p.BufSize))
	}
	n.apply()
	require.Len(t, n.posted, p.RecvCount)
	return n
}

// apply performs the machine's actions the way a driver would.
func (n *node) apply() {
	var drain error
	for _, a := range n.m.Ready() {
		switch a.Kind {
		case ActDrain:
			require.Nil(n.t, n.drain, "%s: a second ActDrain", n.name)
			require.ErrorIs(n.t, a.Err, ErrClosed)
			n.drain, drain = a.Err, a.Err
		case ActPostRecv:
			require.False(n.t, n.isPosted[a.Slot], "%s: slot %d posted twice", n.name, a.Slot)
			n.isPosted[a.Slot] = true
			n.posted = append(n.posted, a.Slot)
		case ActPostSend:
			off := a.Slot * n.p.BufSize
			f := wireFrame{data: append([]byte(nil), n.p.SendRing[off:off+a.Len]...), wrid: a.WRID, signaled: a.Signaled, typ: a.Type}
			n.wire = append(n.wire, f)
			n.sends = append(n.sends, f)
		case ActDeliver:
			n.got = append(n.got, delivered{a.Session, a.Epoch, a.Seq, string(a.Name), string(a.Msg), a.Owned, string(a.ID)})
		case ActComplete:
			_, dup := n.done[a.Req]
			require.False(n.t, dup, "%s: seq %d completed twice", n.name, a.Req.Seq)
			n.done[a.Req] = a.Err
			n.doneOrder = append(n.doneOrder, a.Req)
		case ActSetTimer:
			n.timer = a.At
		case ActClose:
			n.closed = a.Err
		case ActFence:
			n.fences = append(n.fences, fenceAt{len(n.got), a.Session, a.Seq, a.Count})
		case ActDrop:
			require.NotZero(n.t, a.Reason)
			require.Error(n.t, a.Err)
			n.drops = append(n.drops, a)
		default:
			n.t.Fatalf("%s: unknown action %v", n.name, a.Kind)
		}
	}
	if drain != nil && !n.holdDrain {
		n.m.Close(drain)
		n.apply()
	}
}

func (n *node) submit(seq uint64, name, msg string) *SendReq {
	r := &SendReq{Seq: seq, Name: name, Msg: []byte(msg)}
	n.m.Submit(t0, r)
	n.apply()
	return r
}

func (n *node) repost() {
	n.m.Repost()
	n.apply()
}

type network struct {
	a, b *node
	rnr  int
}

func connect(t testing.TB, pa, pb Params) *network {
	a := newNode(t, "A", pa)
	b := newNode(t, "B", pb)
	require.NoError(t, a.m.Connected(t0, PeerParams{LocalSession: 11, PeerSession: 22, Epoch: 1,
		RQDepth: pb.RecvCount, BufSize: b.p.BufSize, Extensions: pb.Extensions}))
	a.apply()
	require.NoError(t, b.m.Connected(t0, PeerParams{LocalSession: 22, PeerSession: 11, Epoch: 1,
		RQDepth: pa.RecvCount, BufSize: a.p.BufSize, Extensions: pa.Extensions}))
	b.apply()
	return &network{a: a, b: b}
}

// land moves the oldest frame on from's wire into to's oldest posted RECV, then gives
// from its completion when the frame was signaled. It reports false on an empty wire or
// an RNR.
func (nw *network) land(from, to *node) bool {
	if len(from.wire) == 0 {
		return false
	}
	if len(to.posted) == 0 {
		nw.rnr++
		return false
	}
	f := from.wire[0]
	from.wire = from.wire[1:]
	slot := to.posted[0]
	to.posted = to.posted[1:]
	delete(to.isPosted, slot)
	buf := to.recvBufs[slot]
	require.LessOrEqual(to.t, len(f.data), len(buf), "frame larger than the RECV buffer")
	n := copy(buf, f.data)
	to.m.RecvWC(t0, slot, buf[:n])
	to.apply()
	if f.signaled {
		from.m.SendWC(f.wrid)
		from.apply()
	}
	return true
}

// pump runs the network until nothing moves: each side lands up to batch frames from the
// other, then reposts (the completion rule: reap, then repost).
func (nw *network) pump(batch int) {
	for moved := true; moved; {
		moved = false
		for _, dir := range [][2]*node{{nw.a, nw.b}, {nw.b, nw.a}} {
			for i := 0; i < batch && nw.land(dir[0], dir[1]); i++ {
				moved = true
			}
			before := len(dir[1].posted)
			dir[1].repost()
			if len(dir[1].posted) != before || len(dir[1].wire) > 0 {
				moved = moved || len(dir[1].posted) != before
			}
		}
	}
}

func extParams(recv int) Params { return Params{RecvCount: recv, Extensions: true} }

func seqs(ds []delivered) []uint64 {
	out := make([]uint64, len(ds))
	for i, d := range ds {
		out[i] = d.seq
	}
	return out
}

func TestMachineInOrder(t *testing.T) {
	nw := connect(t, extParams(8), extParams(8))
	var reqs []*SendReq
	for i := 1; i <= 300; i++ {
		reqs = append(reqs, nw.a.submit(uint64(i), "n", fmt.Sprintf("m%d", i)))
	}
	nw.pump(3)
	require.Len(t, nw.b.got, 300)
	for i, d := range nw.b.got {
		require.Equal(t, uint64(i+1), d.seq)
		require.Equal(t, fmt.Sprintf("m%d", i+1), d.msg)
		require.Equal(t, uint64(11), d.session)
		require.Equal(t, uint64(1), d.epoch)
	}
	for _, r := range reqs {
		err, ok := nw.a.done[r]
		require.True(t, ok, "seq %d not completed", r.Seq)
		require.NoError(t, err)
	}
	require.Zero(t, nw.rnr)
	require.Zero(t, nw.b.m.Stats().CreditOverruns)
	require.Zero(t, nw.a.m.Stats().Pending)
}

// TestMachineDeliversResentSeqs: the channel delivers every frame in arrival order, a
// lower seq after a higher one included (a send of a replaced channel resent on this one);
// ordering and dedup across channels are the engine's receive window's.
func TestMachineDeliversResentSeqs(t *testing.T) {
	nw := connect(t, extParams(8), extParams(8))
	for _, s := range []uint64{1, 2, 2, 3, 1, 5, 0, 4, 6, 0} {
		nw.a.submit(s, "n", "m")
	}
	nw.pump(8)
	require.Equal(t, []uint64{1, 2, 2, 3, 1, 5, 0, 4, 6, 0}, seqs(nw.b.got))
	require.Zero(t, nw.b.m.Stats().DroppedDuplicate)
	for _, err := range nw.a.done {
		require.NoError(t, err)
	}
}

func TestMachineDeliveredSeqFromEngine(t *testing.T) {
	a := newNode(t, "A", extParams(4))
	b := newNode(t, "B", extParams(4))
	require.NoError(t, a.m.Connected(t0, PeerParams{LocalSession: 1, PeerSession: 2, Epoch: 2, RQDepth: 4, Extensions: true}))
	require.NoError(t, b.m.Connected(t0, PeerParams{LocalSession: 2, PeerSession: 1, Epoch: 2, RQDepth: 4, Extensions: true, DeliveredSeq: 7}))
	a.apply()
	b.apply()
	nw := &network{a: a, b: b}
	for _, s := range []uint64{6, 7, 8} { // 6 and 7 went over OOB before the reconnect
		a.submit(s, "n", "m")
	}
	nw.pump(4)
	require.Equal(t, []uint64{8}, seqs(b.got))
}

// frameBytes encodes a NOTIFY_COMPAT frame by hand for injection.
func frameBytes(t *testing.T, session, epoch, seq, ack uint64, name, msg string) []byte {
	buf := make([]byte, HeaderLen+NotifyCompatLen(name, []byte(msg)))
	n, err := EncodeNotifyCompat(buf, &Header{Session: session, Epoch: epoch, Seq: seq, AckSeq: ack}, name, []byte(msg))
	require.NoError(t, err)
	return buf[:n]
}

func inject(n *node, data []byte) {
	slot := n.posted[0]
	n.posted = n.posted[1:]
	delete(n.isPosted, slot)
	buf := n.recvBufs[slot]
	c := copy(buf, data)
	n.m.RecvWC(t0, slot, buf[:c])
	n.apply()
	n.repost()
}

func TestMachineStaleEpochAndForeignSessionDropped(t *testing.T) {
	a := newNode(t, "A", extParams(4))
	require.NoError(t, a.m.Connected(t0, PeerParams{LocalSession: 1, PeerSession: 2, Epoch: 5, RQDepth: 4, Extensions: true}))
	a.apply()
	inject(a, frameBytes(t, 2, 4, 10, 0, "old", "epoch")) // stale epoch
	inject(a, frameBytes(t, 3, 5, 11, 0, "other", "session"))
	inject(a, frameBytes(t, 2, 5, 12, 0, "ok", "now"))
	inject(a, frameBytes(t, 2, 6, 13, 0, "future", "epoch"))
	require.Equal(t, []uint64{12}, seqs(a.got))
	st := a.m.Stats()
	require.Equal(t, uint64(2), st.DroppedStaleEpoch)
	require.Equal(t, uint64(1), st.DroppedForeignSession)
	require.Equal(t, uint64(3), st.Dropped())
	require.Len(t, a.posted, 4, "dropped frames' buffers are posted again")
}

func TestMachineMalformedFrameDroppedChannelStays(t *testing.T) {
	a := newNode(t, "A", extParams(4))
	require.NoError(t, a.m.Connected(t0, PeerParams{LocalSession: 1, PeerSession: 2, Epoch: 1, RQDepth: 4, Extensions: true}))
	a.apply()
	r := a.submit(0, "pending", "x") // on the wire, not completed
	b := frameBytes(t, 2, 1, 1, 0, "x", "y")
	b[0] = 0
	inject(a, b)
	require.NoError(t, a.closed)
	require.NotContains(t, a.done, r)
	require.Equal(t, uint64(1), a.m.Stats().DroppedBadMagic)
	require.Len(t, a.drops, 1)
	require.Equal(t, DropBadMagic, a.drops[0].Reason)
	require.ErrorContains(t, a.drops[0].Err, "magic")
	inject(a, frameBytes(t, 2, 1, 2, 0, "x", "y"))
	require.Equal(t, []uint64{2}, seqs(a.got), "the channel still delivers")
	require.Len(t, a.posted, 4, "the dropped frame's buffer is posted again")
}

func TestMachineOneWayCreditReturn(t *testing.T) {
	const n, rq = 2000, 16
	nw := connect(t, extParams(rq), extParams(rq))
	for i := 1; i <= n; i++ {
		nw.a.submit(uint64(i), "n", "payload")
	}
	nw.pump(1)
	require.Len(t, nw.b.got, n)
	require.Zero(t, nw.rnr, "a sender never outruns the posted RECVs")
	sb := nw.b.m.Stats()
	require.Zero(t, sb.CreditOverruns)
	// B never sends data: credit goes back in explicit grants, one per quarter window.
	threshold := (rq - 1) / 4
	require.Positive(t, sb.GrantsSent)
	require.LessOrEqual(t, sb.GrantsSent, uint64(n/threshold+2))
	require.Equal(t, sb.FramesSent, sb.GrantsSent)
	// A's grants back (for the RECVs B's grants used) are rare: data piggybacks them.
	require.Less(t, nw.a.m.Stats().GrantsSent, uint64(n/threshold/4))
	for _, f := range nw.a.sends {
		require.Equal(t, TypeNotifyCompat, f.typ)
		var h Header
		_, err := DecodeHeader(f.data, &h)
		require.NoError(t, err)
		require.GreaterOrEqual(t, h.AckSeq, uint64(rq), "ack_seq piggybacks A's credit total")
	}
}

func TestMachineCreditReturnsWithinQuarterWindow(t *testing.T) {
	const rq = 16
	nw := connect(t, extParams(rq), extParams(rq))
	for i := 1; i <= 500; i++ {
		nw.a.submit(uint64(i), "n", "m")
		require.True(t, nw.land(nw.a, nw.b))
		nw.b.repost()
		for nw.land(nw.b, nw.a) {
		}
		nw.a.repost()
	}
	require.Len(t, nw.b.got, 500)
	require.Zero(t, nw.a.m.Stats().CreditWaits, "a grant comes back every quarter window, before the window runs out")
	require.Equal(t, uint64(500/((rq-1)/4)), nw.b.m.Stats().GrantsSent)
}

func TestMachineBidirectionalSmallWindowNoDeadlock(t *testing.T) {
	for _, rq := range []int{3, 4, 5, 64} {
		t.Run(fmt.Sprint(rq), func(t *testing.T) {
			nw := connect(t, extParams(rq), extParams(rq))
			for i := 1; i <= 300; i++ {
				nw.a.submit(uint64(i), "ab", "x")
				nw.b.submit(uint64(i), "ba", "y")
			}
			nw.pump(1)
			require.Len(t, nw.b.got, 300)
			require.Len(t, nw.a.got, 300)
			require.Zero(t, nw.rnr)
			require.Empty(t, nw.a.wire)
			require.Empty(t, nw.b.wire, "no endless credit ping-pong")
		})
	}
}

func TestMachinePausedReceiverBackpressure(t *testing.T) {
	const rq = 8
	nw := connect(t, extParams(rq), extParams(rq))
	nw.b.m.SetPaused(t0, true)
	nw.b.apply()
	var reqs []*SendReq
	for i := 1; i <= 100; i++ {
		reqs = append(reqs, nw.a.submit(uint64(i), "n", "m"))
	}
	nw.pump(rq)
	require.Empty(t, nw.b.got, "paused: nothing delivered")
	require.Zero(t, nw.rnr, "paused: the sender ran out of credit instead of into RNR")
	require.Equal(t, rq-1, nw.b.m.Stats().Held, "the data window is held; one RECV stays for credit frames")
	require.Positive(t, nw.a.m.Stats().CreditWaits)
	require.LessOrEqual(t, len(nw.a.done), rq-1)
	require.Equal(t, 100-len(nw.a.done), nw.a.m.Stats().Pending, "nothing dropped")

	resumeAll(t, nw, rq, 100)
	for _, r := range reqs {
		require.NoError(t, nw.a.done[r])
	}
}

// resumeAll resumes b's paused receiver and checks that the n notifies a sent all arrive,
// in order, without RNR.
func resumeAll(t *testing.T, nw *network, rq, n int) {
	t.Helper()
	nw.b.m.SetPaused(t0, false)
	nw.b.apply()
	nw.pump(rq)
	require.Len(t, nw.b.got, n)
	for i, d := range nw.b.got {
		require.Equal(t, uint64(i+1), d.seq)
	}
	require.Zero(t, nw.rnr)
}

// TestMachinePausedMidBatch: the receiver pauses while it handles a batch (its queue filled
// on one of the batch's notifies), before the batch's RECVs are reposted. The buffers of the
// notifies it delivered in that batch go back only when it resumes: until then the sender
// can have acknowledged no more than one RECV ring in all, what was delivered included.
func TestMachinePausedMidBatch(t *testing.T) {
	const rq, batch = 8, 5
	nw := connect(t, extParams(rq), extParams(rq))
	for i := 1; i <= 100; i++ {
		nw.a.submit(uint64(i), "n", "m")
	}
	posted := len(nw.b.posted)
	for i := 0; i < batch; i++ {
		require.True(t, nw.land(nw.a, nw.b))
	}
	require.Len(t, nw.b.got, batch)
	nw.b.m.SetPaused(t0, true) // the engine's queue filled on this batch's deliveries
	nw.b.apply()
	nw.b.repost()
	require.Equal(t, posted-batch, len(nw.b.posted), "paused: the batch's data RECVs wait")
	nw.pump(rq)
	require.LessOrEqual(t, len(nw.a.done), rq-1, "acknowledged: at most one ring, delivered included")
	require.Zero(t, nw.rnr)

	resumeAll(t, nw, rq, 100)
	require.Len(t, nw.a.done, 100)
}

func TestMachineDisableCreditsHitsRNR(t *testing.T) {
	pa, pb := extParams(8), extParams(8)
	pa.DisableCredits, pb.DisableCredits = true, true
	pa.SendSlots = 64
	nw := connect(t, pa, pb)
	for i := 1; i <= 200; i++ {
		nw.a.submit(uint64(i), "n", "m")
	}
	nw.pump(16)
	require.Len(t, nw.b.got, 200, "RNR is retried, so everything still lands")
	require.Positive(t, nw.rnr, "without credit the sender outruns the receiver's RECVs")
}

func TestMachineFragmentation(t *testing.T) {
	nw := connect(t, extParams(8), extParams(8)) // 256-byte buffers
	msg := make([]byte, 10_000)
	for i := range msg {
		msg[i] = byte(i * 7)
	}
	name := "large-notify"
	r := nw.a.submit(1, name, string(msg))
	small := nw.a.submit(2, "small", "after")
	nw.pump(2)
	require.Len(t, nw.b.got, 2)
	require.Equal(t, name, nw.b.got[0].name)
	require.Equal(t, string(msg), nw.b.got[0].msg)
	require.True(t, nw.b.got[0].owned)
	require.Equal(t, "after", nw.b.got[1].msg)
	require.NoError(t, nw.a.done[r])
	require.NoError(t, nw.a.done[small])
	require.Equal(t, []*SendReq{r, small}, nw.a.doneOrder)
	st := nw.a.m.Stats()
	require.Greater(t, st.FragmentsSent, uint64(40))
	require.Zero(t, nw.rnr)
	for _, f := range nw.a.sends {
		require.LessOrEqual(t, len(f.data), 256)
	}
}

func TestMachineFragmentationPausedMidway(t *testing.T) {
	nw := connect(t, extParams(4), extParams(4))
	nw.b.m.SetPaused(t0, true)
	nw.b.apply()
	msg := string(make([]byte, 3000))
	r := nw.a.submit(1, "big", msg)
	nw.pump(4)
	require.Empty(t, nw.b.got)
	require.NotContains(t, nw.a.done, r)
	nw.b.m.SetPaused(t0, false)
	nw.b.apply()
	nw.pump(4)
	require.Len(t, nw.b.got, 1)
	require.Equal(t, msg, nw.b.got[0].msg)
	require.NoError(t, nw.a.done[r])
	require.Zero(t, nw.rnr)
}

func TestMachineTooLarge(t *testing.T) {
	pa := extParams(4)
	pa.MaxNotifySize = 1000
	nw := connect(t, pa, extParams(4))
	r := nw.a.submit(1, "n", string(make([]byte, 1000)))
	require.ErrorIs(t, nw.a.done[r], ErrTooLarge)
	r = nw.a.submit(2, "", string(make([]byte, 1000)))
	nw.pump(4)
	require.NoError(t, nw.a.done[r], "exactly MaxNotifySize goes")

	// A Mooncake peer cannot reassemble: a notify above one buffer fails, never truncated.
	mooncake := Params{RecvCount: 4}
	nw = connect(t, extParams(4), mooncake)
	big := nw.a.submit(1, "n", string(make([]byte, 300)))
	ok := nw.a.submit(2, "n", "fits")
	nw.pump(4)
	require.ErrorIs(t, nw.a.done[big], ErrTooLarge)
	require.ErrorContains(t, nw.a.done[big], "cannot reassemble")
	require.NoError(t, nw.a.done[ok])
	require.Equal(t, []uint64{2}, seqs(nw.b.got))
}

func TestMachineMooncakePeerGetsOnlyCompatFrames(t *testing.T) {
	nw := connect(t, extParams(8), Params{RecvCount: 8})
	for i := 1; i <= 100; i++ {
		nw.a.submit(uint64(i), "n", "m")
		nw.b.submit(uint64(i), "n", "m")
	}
	nw.pump(8)
	require.Len(t, nw.b.got, 100)
	require.Len(t, nw.a.got, 100)
	for _, f := range nw.a.sends {
		require.Equal(t, TypeNotifyCompat, f.typ)
		var h Header
		_, err := DecodeHeader(f.data, &h)
		require.NoError(t, err)
		require.Zero(t, h.AckSeq, "no piggybacked credit towards a Mooncake peer")
	}
	require.Zero(t, nw.a.m.Stats().GrantsSent)
}

func TestMachineDeadline(t *testing.T) {
	a := newNode(t, "A", extParams(4))
	// Not connected: the request waits in the queue.
	r := &SendReq{Seq: 1, Name: "n", Deadline: t0.Add(10 * time.Millisecond)}
	late := &SendReq{Seq: 2, Name: "n", Deadline: t0.Add(20 * time.Millisecond)}
	none := &SendReq{Seq: 3, Name: "n"}
	for _, q := range []*SendReq{late, r, none} {
		a.m.Submit(t0, q)
	}
	a.apply()
	require.Equal(t, t0.Add(10*time.Millisecond), a.timer)
	a.m.Tick(t0.Add(5 * time.Millisecond))
	a.apply()
	require.Empty(t, a.done)
	a.m.Tick(t0.Add(10 * time.Millisecond))
	a.apply()
	require.ErrorIs(t, a.done[r], context.DeadlineExceeded)
	require.NotContains(t, a.done, late)
	require.Equal(t, t0.Add(20*time.Millisecond), a.timer, "re-armed for the next deadline")

	past := &SendReq{Seq: 4, Deadline: t0}
	a.m.Submit(t0, past)
	a.apply()
	require.ErrorIs(t, a.done[past], context.DeadlineExceeded)

	// Once connected, late goes out before its deadline and is not expired after.
	b := newNode(t, "B", extParams(4))
	require.NoError(t, a.m.Connected(t0, PeerParams{LocalSession: 1, PeerSession: 2, Epoch: 1, RQDepth: 4, Extensions: true}))
	require.NoError(t, b.m.Connected(t0, PeerParams{LocalSession: 2, PeerSession: 1, Epoch: 1, RQDepth: 4, Extensions: true}))
	a.apply()
	b.apply()
	(&network{a: a, b: b}).pump(4)
	a.m.Tick(t0.Add(time.Second))
	a.apply()
	require.NoError(t, a.done[late])
	require.NoError(t, a.done[none])
	require.Equal(t, []uint64{2, 3}, seqs(b.got))
}

func TestMachineBackpressure(t *testing.T) {
	p := extParams(4)
	p.MaxPendingSends = 3
	a := newNode(t, "A", p)
	var rs []*SendReq
	for i := 1; i <= 4; i++ {
		rs = append(rs, a.submit(uint64(i), "n", "m"))
	}
	require.ErrorIs(t, a.done[rs[3]], ErrBackpressure)
	require.Len(t, a.done, 1)
}

func TestMachineCloseFailsPending(t *testing.T) {
	nw := connect(t, extParams(4), extParams(4))
	var rs []*SendReq
	for i := 1; i <= 10; i++ {
		rs = append(rs, nw.a.submit(uint64(i), "n", "m"))
	}
	require.NotEmpty(t, nw.a.wire) // some in flight, some queued for lack of credit
	cause := errors.New("peer went away")
	nw.a.m.Close(cause)
	nw.a.apply()
	require.ErrorIs(t, nw.a.closed, ErrClosed)
	require.ErrorIs(t, nw.a.closed, cause)
	require.Len(t, nw.a.done, 10)
	for i, r := range rs {
		require.ErrorIs(t, nw.a.done[r], ErrClosed)
		require.ErrorIs(t, nw.a.done[r], cause)
		require.Same(t, r, nw.a.doneOrder[i], "failed in order")
	}
	after := nw.a.submit(11, "n", "m")
	require.ErrorIs(t, nw.a.done[after], ErrClosed)
}

func TestMachineFailWC(t *testing.T) {
	nw := connect(t, extParams(4), extParams(4))
	r := nw.a.submit(1, "n", "m")
	wcErr := errors.New("IBV_WC_RETRY_EXC_ERR")
	nw.a.m.FailWC(wcErr)
	nw.a.apply()
	require.ErrorIs(t, nw.a.done[r], ErrPeerError)
	require.ErrorIs(t, nw.a.done[r], wcErr)
	require.ErrorIs(t, nw.a.closed, ErrPeerError)
}

func TestMachineSignaledBatching(t *testing.T) {
	p := extParams(64)
	p.SendSlots = 32
	a := newNode(t, "A", p)
	b := newNode(t, "B", extParams(64))
	for i := 1; i <= 40; i++ { // queued before the connection is up
		a.m.Submit(t0, &SendReq{Seq: uint64(i), Name: "n"})
	}
	require.NoError(t, a.m.Connected(t0, PeerParams{LocalSession: 1, PeerSession: 2, Epoch: 1, RQDepth: 64, Extensions: true}))
	require.NoError(t, b.m.Connected(t0, PeerParams{LocalSession: 2, PeerSession: 1, Epoch: 1, RQDepth: 64, Extensions: true}))
	a.apply()
	b.apply()
	signaled := 0
	for _, f := range a.wire {
		if f.signaled {
			signaled++
		}
	}
	require.Len(t, a.wire, 32, "the send ring bounds frames in flight")
	require.True(t, a.wire[len(a.wire)-1].signaled, "the newest frame is signaled")
	require.Equal(t, 32/8, signaled, "one signaled SEND every SendSlots/4")
	(&network{a: a, b: b}).pump(64)
	require.Len(t, b.got, 40)
	require.Len(t, a.done, 40)
}

func TestMachineParamsRejected(t *testing.T) {
	good := Params{RecvCount: 4, BufSize: 256, SendSlots: 4, SendRing: make([]byte, 1024), MaxPendingSends: 4, MaxNotifySize: 10}
	tests := []struct {
		field string
		mut   func(p *Params)
	}{
		{"RecvCount", func(p *Params) { p.RecvCount = 0 }},
		{"RecvCount", func(p *Params) { p.RecvCount = 2; p.Extensions = true }},
		{"BufSize", func(p *Params) { p.BufSize = 10 }},
		{"SendSlots", func(p *Params) { p.SendSlots = 0 }},
		{"SendRing", func(p *Params) { p.SendRing = p.SendRing[:100] }},
		{"MaxPendingSends", func(p *Params) { p.MaxPendingSends = 0 }},
	}
	for _, tc := range tests {
		p := good
		tc.mut(&p)
		_, err := NewMachine(p)
		require.ErrorIs(t, err, ErrConfig)
		require.ErrorContains(t, err, tc.field)
	}
	m, err := NewMachine(good)
	require.NoError(t, err)
	require.ErrorIs(t, m.Connected(t0, PeerParams{RQDepth: 4}), ErrBadEpoch)
	require.ErrorContains(t, m.Connected(t0, PeerParams{Epoch: 1}), "RQDepth")
}

// lean wires two machines with preallocated state only, to count the machine's own
// allocations per notify.
type lean struct {
	m       *Machine
	peer    *lean
	scratch []byte
	wcs     []uint64
	got     int
}

func (x *lean) step() bool {
	acts := x.m.Ready()
	for i := range acts {
		a := &acts[i]
		switch a.Kind {
		case ActPostSend:
			n := copy(x.peer.scratch, x.m.p.SendRing[a.Slot*x.m.p.BufSize:][:a.Len])
			x.peer.m.RecvWC(t0, a.Slot, x.peer.scratch[:n])
			if a.Signaled {
				x.wcs = append(x.wcs, a.WRID)
			}
		case ActDeliver:
			x.got++
		}
	}
	return len(acts) > 0
}

func (x *lean) run() {
	for moved := true; moved; {
		moved = x.step()
		moved = x.peer.step() || moved
		x.m.Repost()
		x.peer.m.Repost()
		for _, w := range x.wcs {
			x.m.SendWC(w)
		}
		for _, w := range x.peer.wcs {
			x.peer.m.SendWC(w)
		}
		x.wcs, x.peer.wcs = x.wcs[:0], x.peer.wcs[:0]
	}
}

func TestMachineHotPathAllocs(t *testing.T) {
	nw := connect(t, extParams(8), extParams(8))
	a := &lean{m: nw.a.m, scratch: make([]byte, 256), wcs: make([]uint64, 0, 64)}
	b := &lean{m: nw.b.m, scratch: make([]byte, 256), wcs: make([]uint64, 0, 64), peer: a}
	a.peer = b
	req := &SendReq{Name: "n", Msg: []byte("payload")}
	seq := uint64(0)
	allocs := testing.AllocsPerRun(1000, func() {
		seq++
		req.Seq = seq
		a.m.Submit(t0, req)
		a.run()
	})
	require.Zero(t, allocs)
	require.Equal(t, int(seq), b.got)
	require.Positive(t, b.m.Stats().GrantsSent)
}

// A paused receiver's held notifies sat in RECVs the NIC acknowledged: their senders were
// told they landed. A close from any cause (here a WC error, as when the sender tears down
// its QP after its goodbye) hands them over, in order, before the channel ends.
func TestMachineCloseDeliversHeld(t *testing.T) {
	const rq = 8
	for _, how := range []string{"FailWC", "Close"} {
		t.Run(how, func(t *testing.T) {
			nw := connect(t, extParams(rq), extParams(rq))
			nw.b.m.SetPaused(t0, true)
			nw.b.apply()
			for i := 1; i <= rq-1; i++ {
				nw.a.submit(uint64(i), "n", "m")
			}
			nw.pump(rq)
			require.Empty(t, nw.b.got)
			require.Equal(t, rq-1, nw.b.m.Stats().Held)
			acked := len(nw.a.done)
			require.Positive(t, acked)
			if how == "FailWC" {
				nw.b.m.FailWC(errors.New("IBV_WC_WR_FLUSH_ERR"))
			} else {
				nw.b.m.Close(nil)
			}
			nw.b.apply()
			require.Len(t, nw.b.got, rq-1, "every held notify is delivered, none dropped")
			for i, d := range nw.b.got {
				require.Equal(t, uint64(i+1), d.seq)
			}
			require.NotNil(t, nw.b.closed)
		})
	}
}

// A peer that announced its limit (PeerParams.MaxNotifySize) gets no notify above it: the
// sender refuses it with ErrTooLarge naming both limits, before anything is posted.
func TestMachinePeerLimit(t *testing.T) {
	a := newNode(t, "A", extParams(8))
	require.NoError(t, a.m.Connected(t0, PeerParams{LocalSession: 11, PeerSession: 22, Epoch: 1, RQDepth: 8,
		BufSize: 256, Extensions: true, MaxNotifySize: 1000}))
	a.apply()
	require.Equal(t, 1000, a.m.MaxNotify())
	r := a.submit(1, "n", string(make([]byte, 1000)))
	require.ErrorIs(t, a.done[r], ErrTooLarge)
	require.ErrorContains(t, a.done[r], "above the peer's max_notify_size 1000 (this side's is 1048576)")
	require.Empty(t, a.wire, "nothing posted")
	ok := a.submit(2, "n", string(make([]byte, 999)))
	require.NotContains(t, a.done, ok, "exactly the peer's limit goes")
	require.NotEmpty(t, a.wire)
}

// A notify above this side's limit from a sender that did not check it (it never learned
// the limit) is not delivered, and its seq is fenced so the window does not wait for it.
func TestMachineReceiverEnforcesLimit(t *testing.T) {
	pb := extParams(8)
	pb.MaxNotifySize = 100
	nw := connect(t, extParams(8), pb)
	nw.a.submit(1, "n", string(make([]byte, 200)))
	nw.a.submit(2, "n", "small")
	nw.pump(8)
	require.Equal(t, []uint64{2}, seqs(nw.b.got))
	require.Len(t, nw.b.fences, 1)
	require.Equal(t, uint64(1), nw.b.fences[0].first)
	require.Equal(t, uint64(1), nw.b.fences[0].count)
	require.Equal(t, uint64(1), nw.b.m.Stats().DroppedTooLarge)
}
