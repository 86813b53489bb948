package ctrlchannel

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMachineFenceInOrder: a fence travels in the send FIFO and reaches the peer's
// events between the notifies it was queued between; adjacent queued fences merge.
func TestMachineFenceInOrder(t *testing.T) {
	nw := connect(t, extParams(8), extParams(8))
	nw.a.submit(1, "n", "a")
	require.NoError(t, nw.a.m.Fence(2, 3))
	nw.a.apply()
	nw.a.submit(5, "n", "b")
	nw.pump(4)
	require.Equal(t, []uint64{1, 5}, seqs(nw.b.got))
	require.Equal(t, []fenceAt{{after: 1, session: 11, first: 2, count: 3}}, nw.b.fences)

	b := newNode(t, "B", Params{RecvCount: 4, SendSlots: 1, Extensions: true})
	require.NoError(t, b.m.Connected(t0, PeerParams{LocalSession: 1, PeerSession: 2, Epoch: 1, RQDepth: 8, Extensions: true}))
	b.apply()
	b.submit(1, "n", "a") // takes the only send slot: the fences below wait in the queue
	require.NoError(t, b.m.Fence(2, 1))
	require.NoError(t, b.m.Fence(3, 2))
	require.NoError(t, b.m.Fence(9, 1))
	b.apply()
	require.Equal(t, 2, b.m.qlen, "two fences queued: 2..4 merged, 9 apart")
	require.ErrorIs(t, b.m.Fence(0, 1), ErrConfig)
	require.ErrorIs(t, b.m.Fence(1, 0), ErrConfig)
	require.ErrorIs(t, b.m.Fence(^uint64(0), 2), ErrConfig)
}

// TestMachineFencePausedHeld: a paused receiver holds a fence with the notifies, in order.
func TestMachineFencePausedHeld(t *testing.T) {
	nw := connect(t, extParams(8), extParams(8))
	nw.b.m.SetPaused(t0, true)
	nw.b.apply()
	nw.a.submit(1, "n", "a")
	require.NoError(t, nw.a.m.Fence(2, 1))
	nw.a.apply()
	nw.a.submit(3, "n", "b")
	nw.pump(4)
	require.Empty(t, nw.b.got)
	require.Empty(t, nw.b.fences)
	nw.b.m.SetPaused(t0, false)
	nw.b.apply()
	require.Equal(t, []uint64{1, 3}, seqs(nw.b.got))
	require.Equal(t, []fenceAt{{after: 1, session: 11, first: 2, count: 1}}, nw.b.fences)
}

// TestMachineFenceNotToLegacy: a legacy peer's seqs are per channel; nothing is sent.
func TestMachineFenceNotToLegacy(t *testing.T) {
	a := legacyNode(t, extParams(4), 8)
	require.NoError(t, a.m.Fence(1, 5))
	a.apply()
	require.Empty(t, a.wire)
	require.Zero(t, a.m.Stats().FencesSent)
}

// TestMachineBye: the notifies queued before Bye go out first, then SESSION_CLOSE; its
// completion closes the sender, the peer delivers everything and closes with
// ErrPeerClosed. Nothing is accepted after Bye.
func TestMachineBye(t *testing.T) {
	nw := connect(t, extParams(8), extParams(8))
	var reqs []*SendReq
	for i := 1; i <= 20; i++ {
		reqs = append(reqs, nw.a.submit(uint64(i), "n", fmt.Sprintf("m%d", i)))
	}
	nw.a.m.Bye(t0, t0.Add(time.Second))
	nw.a.apply()
	late := nw.a.submit(21, "n", "late")
	require.ErrorIs(t, nw.a.done[late], ErrClosed)
	require.ErrorIs(t, nw.a.m.Fence(21, 1), ErrClosed)
	nw.pump(3)
	require.Len(t, nw.b.got, 20)
	for _, r := range reqs {
		require.NoError(t, nw.a.done[r])
	}
	require.ErrorIs(t, nw.b.closed, ErrPeerClosed)
	require.ErrorIs(t, nw.b.closed, ErrClosed)
	require.ErrorIs(t, nw.a.closed, ErrClosed)
	require.NotErrorIs(t, nw.a.closed, ErrPeerClosed)
	last := nw.a.sends[len(nw.a.sends)-1]
	require.Equal(t, TypeSessionClose, last.typ)
	require.True(t, last.signaled)
}

// TestMachineByePausedReceiver: a paused receiver keeps the SESSION_CLOSE behind its held
// notifies and closes only after delivering them.
func TestMachineByePausedReceiver(t *testing.T) {
	nw := connect(t, extParams(8), extParams(8))
	nw.b.m.SetPaused(t0, true)
	nw.b.apply()
	nw.a.submit(1, "n", "a")
	nw.a.submit(2, "n", "b")
	nw.a.m.Bye(t0, t0.Add(time.Second))
	nw.a.apply()
	nw.pump(4)
	require.NoError(t, nw.b.closed)
	require.Empty(t, nw.b.got)
	nw.b.m.SetPaused(t0, false)
	nw.b.apply()
	require.Equal(t, []uint64{1, 2}, seqs(nw.b.got))
	require.ErrorIs(t, nw.b.closed, ErrPeerClosed)
}

// TestMachineByeDeadline: a SESSION_CLOSE that cannot complete (no RECV at the peer)
// does not hold the channel open past the deadline; to a legacy peer it is sent too.
func TestMachineByeDeadline(t *testing.T) {
	a := legacyNode(t, extParams(4), 8)
	r := a.submit(1, "n", "a")
	a.m.Bye(t0, t0.Add(time.Second))
	a.apply()
	require.Equal(t, TypeSessionClose, a.wire[len(a.wire)-1].typ, "Mooncake knows type 6 and ignores it")
	require.Equal(t, t0.Add(time.Second), a.timer)
	a.m.Tick(t0.Add(999 * time.Millisecond))
	a.apply()
	require.NoError(t, a.closed)
	a.m.Tick(t0.Add(time.Second))
	a.apply()
	require.ErrorIs(t, a.closed, ErrClosed)
	require.ErrorIs(t, a.done[r], ErrClosed)
}

// TestMachineNotifyID: an id reaches a twosided peer, whole and fragmented; too long an id
// is refused.
func TestMachineNotifyID(t *testing.T) {
	nw := connect(t, extParams(8), extParams(8))
	big := strings.Repeat("y", 3*256)
	ids := []string{"", "id-1", strings.Repeat("i", MaxIDLen)}
	for i, id := range ids {
		nw.a.submitReq(&SendReq{Seq: uint64(2*i + 1), Name: "n", Msg: []byte("small"), ID: id})
		nw.a.submitReq(&SendReq{Seq: uint64(2*i + 2), Name: "n", Msg: []byte(big), ID: id})
	}
	tooLong := nw.a.submitReq(&SendReq{Seq: 99, Name: "n", ID: strings.Repeat("i", MaxIDLen+1)})
	require.ErrorIs(t, nw.a.done[tooLong], ErrTooLarge)
	nw.pump(4)
	require.Len(t, nw.b.got, 6)
	for i, d := range nw.b.got {
		require.Equal(t, ids[i/2], d.id, "seq %d", d.seq)
		require.Equal(t, "n", d.name)
	}
	require.Equal(t, big, nw.b.got[1].msg)
	require.Positive(t, nw.a.m.Stats().FragmentsSent)
	var types []FrameType
	for _, f := range nw.a.sends {
		types = append(types, f.typ)
	}
	require.Contains(t, types, TypeNotifyID)
	require.Contains(t, types, TypeNotifyIDFragment)
}

// TestMachineFenceQueuedBeforeLegacyConnect: a fence queued before the handshake named
// the peer legacy is never sent to it.
func TestMachineFenceQueuedBeforeLegacyConnect(t *testing.T) {
	a := newNode(t, "A", extParams(4))
	require.NoError(t, a.m.Fence(1, 2))
	r := a.submit(3, "n", "m")
	require.NoError(t, a.m.Connected(t0, PeerParams{LocalSession: 1, Epoch: 3, RQDepth: 8, Legacy: true}))
	a.apply()
	require.Len(t, a.wire, 1)
	require.Equal(t, TypeNotifyCompat, a.wire[0].typ)
	a.m.SendWC(a.wire[0].wrid)
	a.apply()
	require.NoError(t, a.done[r])
	require.Zero(t, a.m.Stats().FencesSent)
}

// landQuiet moves from's oldest frame into to's oldest posted RECV, as land does, but
// gives from no completion: the ACK has not come back (or the send was unsignaled and
// nothing later was reaped).
func (nw *network) landQuiet(from, to *node) {
	nw.t().Helper()
	require.NotEmpty(nw.t(), from.wire)
	require.NotEmpty(nw.t(), to.posted)
	f := from.wire[0]
	from.wire = from.wire[1:]
	slot := to.posted[0]
	to.posted = to.posted[1:]
	delete(to.isPosted, slot)
	n := copy(to.recvBufs[slot], f.data)
	to.m.RecvWC(t0, slot, to.recvBufs[slot][:n])
	to.apply()
}

func (nw *network) t() testing.TB { return nw.a.t }

// TestMachineByeAcknowledges: the peer's SESSION_CLOSE counts the frames it received
// first; the sends among them complete as sent though no completion was reaped for
// them, and only those the peer never got fail with ErrPeerClosed.
func TestMachineByeAcknowledges(t *testing.T) {
	for _, landed := range []int{0, 1, 2, 3} {
		t.Run(fmt.Sprintf("landed=%d", landed), func(t *testing.T) {
			nw := connect(t, extParams(8), extParams(8))
			var reqs []*SendReq
			for i := 1; i <= 3; i++ {
				reqs = append(reqs, nw.a.submit(uint64(i), "n", fmt.Sprintf("m%d", i)))
			}
			for i := 0; i < landed; i++ {
				nw.landQuiet(nw.a, nw.b)
			}
			require.Empty(t, nw.a.done, "no completion was reaped")
			nw.b.m.Bye(t0, t0.Add(time.Second))
			nw.b.apply()
			bye := nw.b.wire[len(nw.b.wire)-1]
			require.Equal(t, TypeSessionClose, bye.typ)
			for len(nw.b.wire) > 0 {
				nw.landQuiet(nw.b, nw.a)
			}
			require.ErrorIs(t, nw.a.closed, ErrPeerClosed)
			require.Len(t, nw.b.got, landed)
			for i, r := range reqs {
				if i < landed {
					require.NoError(t, nw.a.done[r], "seq %d reached the peer before its goodbye", r.Seq)
				} else {
					require.ErrorIs(t, nw.a.done[r], ErrPeerClosed, "seq %d never reached the peer", r.Seq)
				}
			}
			require.Equal(t, uint64(landed), nw.a.m.Stats().ByeAcked)
		})
	}
}

// TestMachineByeCountNotTrustedFromLegacy: a legacy peer's SESSION_CLOSE seq means
// nothing here (Mooncake's seqs are its own), so it completes no send.
func TestMachineByeCountNotTrustedFromLegacy(t *testing.T) {
	a := legacyNode(t, extParams(4), 8)
	r := a.submit(1, "n", "a")
	h := Header{Type: TypeSessionClose, Seq: 5}
	buf := a.recvBufs[a.posted[0]]
	require.NoError(t, EncodeHeader(buf, &h))
	a.m.RecvWC(t0, a.posted[0], buf[:HeaderLen])
	a.apply()
	require.ErrorIs(t, a.closed, ErrPeerClosed)
	require.ErrorIs(t, a.done[r], ErrPeerClosed)
	require.Zero(t, a.m.Stats().ByeAcked)
}

// TestMachineSendRingLater: a machine made without its send ring (the driver allocates
// rings once the peer answered) refuses Connected until SetSendRing gave one of the
// right size, and SetSendRing is refused once connected.
func TestMachineSendRingLater(t *testing.T) {
	p := Params{RecvCount: 8, BufSize: 256, SendSlots: 4, MaxPendingSends: 16, Extensions: true}
	m, err := NewMachine(p)
	require.NoError(t, err)
	pp := PeerParams{LocalSession: 1, PeerSession: 2, Epoch: 1, RQDepth: 8, Extensions: true}
	require.ErrorIs(t, m.Connected(t0, pp), ErrConfig)
	require.ErrorIs(t, m.SetSendRing(make([]byte, 4*256-1)), ErrConfig)
	require.NoError(t, m.SetSendRing(make([]byte, 4*256)))
	require.NoError(t, m.Connected(t0, pp))
	require.ErrorIs(t, m.SetSendRing(make([]byte, 4*256)), ErrConfig)
}

// TestMachineByeDrainDelivers: a notify the peer sends across our goodbye lands (its
// SEND completes at the peer) after our SESSION_CLOSE completed, or after the goodbye's
// deadline: the machine asks the driver to drain (ActDrain) instead of closing at once,
// and what the driver reaps meanwhile is delivered. Closing at once dropped it, while its
// sender had it acknowledged (the soak on softverbs: `lost`, a reopened receiver).
func TestMachineByeDrainDelivers(t *testing.T) {
	for _, deadline := range []bool{false, true} {
		nw := connect(t, extParams(8), extParams(8))
		nw.a.holdDrain = true
		nw.a.m.Bye(t0, t0.Add(time.Second))
		nw.a.apply()
		r := nw.b.submit(1, "n", "across the goodbye")
		if deadline {
			nw.a.m.Tick(t0.Add(time.Second))
			nw.a.apply()
		} else {
			require.True(t, nw.land(nw.a, nw.b), "a's SESSION_CLOSE reaches b and completes at a")
		}
		require.ErrorIs(t, nw.a.drain, ErrClosed, "deadline %v", deadline)
		require.NoError(t, nw.a.closed, "deadline %v: closed before the drain", deadline)
		require.True(t, nw.land(nw.b, nw.a), "b's notify, reaped while a drains")
		require.Equal(t, []uint64{1}, seqs(nw.a.got), "deadline %v", deadline)
		sent := len(nw.a.sends)
		nw.a.repost()
		require.Len(t, nw.a.sends, sent, "no frame is sent while draining (no credit grant)")
		nw.a.m.Close(nw.a.drain)
		nw.a.apply()
		require.ErrorIs(t, nw.a.closed, ErrClosed)
		if deadline {
			require.NoError(t, nw.b.done[r])
		}
	}
}
