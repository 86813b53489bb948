package tests

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ctrlchannel"
	"github.com/twosided/twosided/notify"
)

// The scenarios below pair a twosided engine (rdma_twosided over ibv/soft) with the
// Mooncake personality of mooncake_peer_test.go. Each counts, per direction, what the
// sender saw acknowledged, what the receiver got, and whether it came exactly once and in
// order. A wait ends when nothing new arrived for stallAfter: that is how "never stalls"
// is checked, not by timing.

const stallAfter = 10 * time.Second

// collect receives from e until want notifies arrived or none came for stallAfter.
func collect(e *notify.Engine, want int) []notify.Notify {
	var got []notify.Notify
	for len(got) < want {
		ctx, cancel := context.WithTimeout(context.Background(), stallAfter)
		n, err := e.Recv(ctx)
		cancel()
		if err != nil {
			break
		}
		got = append(got, n)
	}
	return got
}

// mcCollect waits until the Mooncake peer got want notifies or none came for stallAfter.
func (p *mooncakePeer) collect(want int) []mcNotify {
	for {
		got := p.received()
		if len(got) >= want {
			return got
		}
		select {
		case <-p.gotCh:
		case <-time.After(stallAfter):
			return p.received()
		}
	}
}

// tally checks msgs ("<prefix><i>", i from first) against want notifies: every one exactly
// once and in order. acked is what the sender saw succeed.
func tally(t *testing.T, what string, acked int, msgs []string, prefix string, first, want int) {
	t.Helper()
	seen := map[int]int{}
	inOrder, last := true, first-1
	for _, m := range msgs {
		i, err := strconv.Atoi(strings.TrimPrefix(m, prefix))
		if err != nil || !strings.HasPrefix(m, prefix) {
			continue
		}
		seen[i]++
		if i <= last {
			if inOrder {
				t.Logf("%s: %d after %d", what, i, last)
			}
			inOrder = false
		}
		last = i
	}
	dups, missing := 0, 0
	for i := first; i < first+want; i++ {
		switch c := seen[i]; {
		case c == 0:
			missing++
		case c > 1:
			dups += c - 1
		}
	}
	t.Logf("%s: acked %d, delivered %d (distinct %d), missing %d, duplicates %d, in order %v",
		what, acked, len(msgs), len(seen), missing, dups, inOrder)
	require.Equal(t, want, acked, "%s: every send acknowledged", what)
	require.Zero(t, missing, "%s: nothing acknowledged is lost", what)
	require.Zero(t, dups, "%s: nothing delivered twice", what)
	require.True(t, inOrder, "%s: in order", what)
}

func msgsOf(ns []notify.Notify) []string {
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = string(n.Msg)
	}
	return out
}

func mcMsgs(ns []mcNotify) []string {
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = n.msg
	}
	return out
}

// mcSend sends n notifies "<prefix><i>" from the Mooncake peer to addr and reports how
// many were queued on the ctrl channel and how many went over OOB.
func mcSend(t *testing.T, p *mooncakePeer, addr, name, prefix string, first, n int) (ctrl, oob int) {
	t.Helper()
	for i := first; i < first+n; i++ {
		viaCtrl, err := p.sendNotifyByName(addr, name, prefix+strconv.Itoa(i))
		require.NoError(t, err, "Mooncake send %d", i)
		if viaCtrl {
			ctrl++
		} else {
			oob++
		}
	}
	return ctrl, oob
}

// tsSend sends n notifies "<prefix><i>" from e to peer through SendNotifyAsync with at
// most window in flight, and returns how many succeeded. It never waits longer than
// stallAfter without a completion.
func tsSend(t *testing.T, e *notify.Engine, peer, name, prefix string, first, n, window int) int {
	t.Helper()
	var ok atomic.Int64
	var firstErr atomic.Value
	sem := make(chan struct{}, window)
	var wg sync.WaitGroup
	for i := first; i < first+n; i++ {
		select {
		case sem <- struct{}{}:
		case <-time.After(stallAfter):
			t.Fatalf("twosided send %d: no completion for %v (stalled), %d succeeded", i, stallAfter, ok.Load())
		}
		wg.Add(1)
		err := e.SendNotifyAsync(peer, notify.Notify{Name: name, Msg: []byte(prefix + strconv.Itoa(i))}, func(err error) {
			if err == nil {
				ok.Add(1)
			} else {
				firstErr.CompareAndSwap(nil, err)
			}
			<-sem
			wg.Done()
		})
		if err != nil {
			<-sem
			wg.Done()
			firstErr.CompareAndSwap(nil, err)
		}
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		t.Logf("first twosided send error: %v", err)
	}
	return int(ok.Load())
}

// onlyMooncakeFrames: twosided sent the Mooncake peer nothing it does not know and no
// credit frame.
func onlyMooncakeFrames(t *testing.T, p *mooncakePeer) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	require.Zero(t, p.malformed, "frames Mooncake's decoder rejects")
	for typ := range p.frames {
		require.Contains(t, []ctrlchannel.FrameType{ctrlchannel.TypeNotifyCompat, ctrlchannel.TypeCtrlAck,
			ctrlchannel.TypeSessionClose}, typ, "twosided sent Mooncake a %s frame", typ)
	}
}

// rdmaEngine is an rdma_twosided engine beside a Mooncake personality: on the soft
// provider, whose device the personality opens too (a QP connects only to a QP of its own
// provider; the engine's tests on the verbs provider cover its side of the channel).
func rdmaEngine(t *testing.T, opts ...notify.Option) *notify.Engine {
	e := newEngine(t, notify.TransportRDMATwoSided, append([]notify.Option{notify.WithProvider("soft")}, opts...)...)
	t.Cleanup(func() { logChannels(t, e) }) // runs before the engine closes
	return e
}

// logChannels logs what the engine's channels dropped, by reason: where a lost notify went.
func logChannels(t *testing.T, e *notify.Engine) {
	for _, p := range e.Stats().Peers {
		if c := p.Channel; c != nil {
			t.Logf("engine peer %s: state %s, delivered %d (legacy raw %d), dropped: stale-epoch %d, foreign-session %d, "+
				"duplicate %d, bad-magic %d, decode %d, unknown-type %d, extension %d, fragment %d; engine duplicates %d",
				p.Peer, p.State, c.Delivered, c.RawDelivered, c.DroppedStaleEpoch, c.DroppedForeignSession, c.DroppedDuplicate,
				c.DroppedBadMagic, c.DroppedDecode, c.DroppedUnknownType, c.DroppedExtension, c.DroppedFragment, p.Duplicates)
		} else {
			t.Logf("engine peer %s: state %s, no channel, last error %s", p.Peer, p.State, p.LastError)
		}
	}
}

// TestMooncakeNotifiesBothWays: 10 000 notifies each way over the ctrl channel, exactly
// once and in order, with Mooncake as the active side and as the passive side.
func TestMooncakeNotifiesBothWays(t *testing.T) {
	const n = 10_000
	for _, role := range []string{"mooncake-active", "twosided-active"} {
		t.Run(role, func(t *testing.T) {
			e := rdmaEngine(t)
			mc := newMooncakePeer(t, mcPR3440)
			if role == "twosided-active" {
				require.Equal(t, 1, tsSend(t, e, mc.name, "open", "o", 0, 1, 1))
				mc.collect(1)
			}
			var got []notify.Notify
			done := make(chan struct{})
			go func() { defer close(done); got = collect(e, n) }()
			ctrl, oob := mcSend(t, mc, e.Addr(), "mc", "m", 1, n)
			<-done
			t.Logf("Mooncake -> twosided: %d queued on the ctrl channel, %d over OOB", ctrl, oob)
			require.Equal(t, n, ctrl, "the ctrl channel connected (GID, handshake)")
			tally(t, "Mooncake -> twosided", ctrl+oob, msgsOf(got), "m", 1, n)

			before := len(mc.received())
			acked := tsSend(t, e, mc.name, "ts", "t", 1, n, 64)
			recv := mc.collect(before + n)[before:]
			tally(t, "twosided -> Mooncake", acked, mcMsgs(recv), "t", 1, n)
			for _, r := range recv {
				require.False(t, r.oob, "over the ctrl channel")
			}
			onlyMooncakeFrames(t, mc)
		})
	}
}

// TestMooncakeReconnect: the Mooncake side loses its channel and builds a new one (new
// QP, seq from 1 again, the same session): everything after is delivered, once, in order.
func TestMooncakeReconnect(t *testing.T) {
	const n = 200
	e := rdmaEngine(t)
	mc := newMooncakePeer(t, mcPR3440)
	var got []notify.Notify
	done := make(chan struct{})
	go func() { defer close(done); got = collect(e, 3*n) }()
	total := 0
	for round := 0; round < 3; round++ {
		ctrl, _ := mcSend(t, mc, e.Addr(), "mc", "m", 1+round*n, n)
		total += ctrl
		require.Eventually(t, func() bool { return mc.acked() == uint64(n) }, stallAfter, time.Millisecond)
		mc.reconnect()
	}
	<-done
	require.Equal(t, 3*n, total, "every round on a ctrl channel")
	tally(t, "Mooncake -> twosided across reconnects", total, msgsOf(got), "m", 1, 3*n)
	acked := tsSend(t, e, mc.name, "ts", "t", 1, 100, 16)
	tally(t, "twosided -> Mooncake after the reconnects", acked, mcMsgs(mc.collect(100)), "t", 1, 100)
}

// TestMooncakeTwosidedSends100k: twosided towards a peer that never grants credit and
// never piggybacks ack_seq never stalls and loses nothing.
func TestMooncakeTwosidedSends100k(t *testing.T) {
	n := 100_000
	if testing.Short() {
		n = 20_000
	}
	e := rdmaEngine(t)
	mc := newMooncakePeer(t, mcPR3440)
	acked := tsSend(t, e, mc.name, "ts", "t", 1, n, 64) // the engine's MaxPendingSends
	recv := mc.collect(n)
	tally(t, "twosided -> Mooncake", acked, mcMsgs(recv), "t", 1, n)
	onlyMooncakeFrames(t, mc)
}

// TestMooncakeEmptyName: Mooncake sends and accepts an empty notify name.
func TestMooncakeEmptyName(t *testing.T) {
	e := rdmaEngine(t)
	mc := newMooncakePeer(t, mcPR3440)
	ctrl, _ := mcSend(t, mc, e.Addr(), "", "m", 1, 10)
	require.Equal(t, 10, ctrl)
	got := collect(e, 10)
	tally(t, "Mooncake -> twosided, empty name", ctrl, msgsOf(got), "m", 1, 10)
	for _, n := range got {
		require.Equal(t, "", n.Name)
	}
	acked := tsSend(t, e, mc.name, "", "t", 1, 10, 4)
	recv := mc.collect(10)
	tally(t, "twosided -> Mooncake, empty name", acked, mcMsgs(recv), "t", 1, 10)
	for _, r := range recv {
		require.Equal(t, "", r.name)
		require.False(t, r.oob)
	}
}

// TestMooncakeBufferBoundary: frames of 4095 and 4096 bytes (Mooncake's default buffer)
// pass the ctrl channel both ways; a 4097-byte one does not fit: Mooncake sends it over
// OOB, twosided fails it or sends it whole over OOB, never truncated.
func TestMooncakeBufferBoundary(t *testing.T) {
	const name = "n"
	msgOf := func(frame int) string {
		return strings.Repeat("x", frame-ctrlchannel.HeaderLen-8-len(name))
	}
	e := rdmaEngine(t)
	mc := newMooncakePeer(t, mcPR3440)
	for _, size := range []int{4095, 4096, 4097} {
		viaCtrl, err := mc.sendNotifyByName(e.Addr(), name, msgOf(size))
		require.NoError(t, err)
		require.Equal(t, size <= 4096, viaCtrl, "%d-byte frame", size)
	}
	got := collect(e, 3)
	require.Equal(t, 3, len(got), "Mooncake -> twosided: delivered")
	// A Mooncake sender numbers nothing, so its channel and OOB notifies are not ordered
	// against each other: each is found by its size.
	whole := map[int]bool{}
	for _, n := range got {
		size := len(n.Msg) + ctrlchannel.HeaderLen + 8 + len(name)
		whole[size] = msgOf(size) == string(n.Msg)
	}
	for _, size := range []int{4095, 4096, 4097} {
		require.True(t, whole[size], "%d-byte frame whole", size)
	}
	ctx := ctxFor(t, 30*time.Second)
	for _, size := range []int{4095, 4096} {
		require.NoError(t, e.SendNotify(ctx, mc.name, notify.Notify{Name: name, Msg: []byte(msgOf(size))}))
	}
	errBig := e.SendNotify(ctx, mc.name, notify.Notify{Name: name, Msg: []byte(msgOf(4097))})
	want := 2
	if errBig == nil {
		want = 3
	}
	recv := mc.collect(want)
	require.Equal(t, want, len(recv))
	// A Mooncake engine orders nothing across its paths: what came over OOB may be taken
	// before what its channel's poller has yet to read, so each is found by its size.
	seen := map[int]bool{}
	for _, r := range recv {
		size := len(r.msg) + ctrlchannel.HeaderLen + 8 + len(name)
		require.Contains(t, []int{4095, 4096, 4097}, size, "a frame of a size that was sent")
		require.False(t, seen[size], "%d-byte frame received twice", size)
		seen[size] = true
		require.True(t, msgOf(size) == r.msg, "never truncated")
		require.Equal(t, size == 4097, r.oob, "only the 4097-byte one over OOB")
	}
	t.Logf("twosided 4097-byte frame to Mooncake: %v", errBig)
}

// TestMooncakeQueueFullReceiver: a receiver whose queue is full keeps its RECVs; the
// sender waits (Mooncake on RNR retry, twosided too) and loses nothing once the receiver
// takes again.
func TestMooncakeQueueFullReceiver(t *testing.T) {
	t.Run("twosided-full", func(t *testing.T) {
		const n = 500
		e := rdmaEngine(t, notify.WithRecvQueue(16))
		mc := newMooncakePeer(t, mcPR3440)
		sent := make(chan int, 1)
		go func() {
			ctrl := 0
			for i := 1; i <= n; i++ {
				if viaCtrl, err := mc.sendNotifyByName(e.Addr(), "mc", "m"+strconv.Itoa(i)); err == nil && viaCtrl {
					ctrl++
				}
			}
			sent <- ctrl
		}()
		// Nobody reads until the queue is full and the engine holds its RECVs (paused):
		// Mooncake's SENDs then wait on RNR.
		require.Eventually(t, func() bool { return e.Stats().Paused }, stallAfter, time.Millisecond, "the receive queue filled")
		got := collect(e, n)
		ctrl := <-sent
		if len(got) < n {
			st := e.Stats()
			t.Logf("receiver when short: paused=%v queued=%d heldOOB=%d peers=%+v", st.Paused, st.Queued, st.HeldOOB, st.Peers)
		}
		tally(t, "Mooncake -> full twosided", ctrl, msgsOf(got), "m", 1, n)
	})
	t.Run("mooncake-full", func(t *testing.T) {
		const n = 300
		e := rdmaEngine(t)
		mc := newMooncakePeer(t, mcPR3440)
		require.Equal(t, 1, tsSend(t, e, mc.name, "open", "o", 0, 1, 1))
		mc.collect(1)
		mc.setHold(true)
		acked := make(chan int, 1)
		go func() {
			defer close(acked) // tsSend's t.Fatalf ends this goroutine: the test then fails, not hangs
			acked <- tsSend(t, e, mc.name, "ts", "t", 1, n, 64)
		}()
		// Mooncake's worker stops reposting: after its 64 RECVs twosided meets RNR.
		rnr := counters(t, e).RNRNaksSent
		require.Eventually(t, func() bool { return counters(t, e).RNRNaksSent > rnr }, stallAfter, time.Millisecond)
		mc.setHold(false)
		a, sent := <-acked
		require.True(t, sent, "the twosided sender stalled (its error is above)")
		recv := mc.collect(1 + n)[1:]
		tally(t, "twosided -> full Mooncake", a, mcMsgs(recv), "t", 1, n)
	})
}

// TestMooncakeOOBFallbackWhenRefused: a refused ctrl channel falls back to OOB both ways.
func TestMooncakeOOBFallbackWhenRefused(t *testing.T) {
	e := rdmaEngine(t)
	mc := newMooncakePeer(t, mcRefuse)
	acked := tsSend(t, e, mc.name, "ts", "t", 1, 20, 1)
	recv := mc.collect(20)
	tally(t, "twosided -> refusing Mooncake", acked, mcMsgs(recv), "t", 1, 20)
	for _, r := range recv {
		require.True(t, r.oob)
	}

	oobEngine := newEngine(t, notify.TransportOOB) // refuses the ctrl handshake
	mc2 := newMooncakePeer(t, mcPR3440)
	ctrl, oob := mcSend(t, mc2, oobEngine.Addr(), "mc", "m", 1, 20)
	require.Zero(t, ctrl)
	tally(t, "Mooncake -> refusing twosided", oob, msgsOf(collect(oobEngine, 20)), "m", 1, 20)
}

// TestMooncakeMainOOBOnly: Mooncake main answers the ctrl handshake without ctrl fields;
// twosided then uses OOB at once, without a handshake per notify.
func TestMooncakeMainOOBOnly(t *testing.T) {
	const n = 50
	e := rdmaEngine(t)
	mc := newMooncakePeer(t, mcMain)
	acked := tsSend(t, e, mc.name, "ts", "t", 1, n, 1)
	recv := mc.collect(n)
	tally(t, "twosided -> Mooncake main", acked, mcMsgs(recv), "t", 1, n)
	for _, r := range recv {
		require.True(t, r.oob)
	}
	mc.mu.Lock()
	conns := mc.connections
	mc.mu.Unlock()
	require.Equal(t, 1, conns, "one handshake, then OOB without asking again")
	_, oob := mcSend(t, mc, e.Addr(), "mc", "m", 1, n)
	tally(t, "Mooncake main -> twosided", oob, msgsOf(collect(e, n)), "m", 1, n)
}

// TestMooncakeLargerBuffer (finding 9): Mooncake announces neither its buffer size nor its
// MTU, and twosided receives into its own MC_RDMA_NOTIFY_BUFFER_SIZE buffers, as two
// Mooncake engines do. A Mooncake engine configured with a larger buffer that sends a
// frame longer than twosided's kills the QP (a local length error here, a remote invalid
// request at Mooncake, whose SEND fails rather than completing), exactly as between two
// Mooncake engines of different sizes. twosided says why (the peer's last error names
// MC_RDMA_NOTIFY_BUFFER_SIZE; counted under WCErrors), keeps serving, and Mooncake's next
// notify arrives on a new channel. With the same size on both sides the frame passes.
func TestMooncakeLargerBuffer(t *testing.T) {
	big := strings.Repeat("b", 5000)
	t.Run("mismatch", func(t *testing.T) {
		e := rdmaEngine(t)
		mc := newMooncakePeer(t, mcPR3440)
		mc.bufSize = 8192 // MC_RDMA_NOTIFY_BUFFER_SIZE=8192 on the Mooncake side only
		viaCtrl, err := mc.sendNotifyByName(e.Addr(), "n", "before")
		require.NoError(t, err)
		require.True(t, viaCtrl)
		require.Equal(t, "before", string(collect(e, 1)[0].Msg))
		mc.mu.Lock()
		first := mc.ch
		mc.mu.Unlock()
		viaCtrl, err = mc.sendNotifyByName(e.Addr(), "n", big)
		require.NoError(t, err)
		require.True(t, viaCtrl, "Mooncake queues it on its channel")
		var lastErr string
		require.Eventually(t, func() bool {
			st := e.Stats()
			for _, p := range st.Peers {
				if strings.Contains(p.LastError, "MC_RDMA_NOTIFY_BUFFER_SIZE") {
					lastErr = p.LastError
				}
			}
			return lastErr != "" && st.Channels.WCErrors > 0
		}, stallAfter, time.Millisecond, "no channel failure naming the buffer size")
		t.Logf("twosided: %s", lastErr)
		// Mooncake saw its SEND fail: the big frame was never acknowledged to it.
		require.Eventually(t, func() bool { return !first.isConnected() }, stallAfter, time.Millisecond)
		require.Equal(t, uint64(1), first.ackedSends(), "Mooncake's SEND of the big frame completed")
		// twosided still serves this Mooncake engine: its next notify comes through.
		viaCtrl, err = mc.sendNotifyByName(e.Addr(), "n", "after")
		require.NoError(t, err)
		got := collect(e, 1)
		require.Len(t, got, 1)
		require.Equal(t, "after", string(got[0].Msg), "via ctrl channel: %v", viaCtrl)
	})
	t.Run("same size", func(t *testing.T) {
		e := rdmaEngine(t, notify.WithBufferSize(8192))
		mc := newMooncakePeer(t, mcPR3440)
		mc.bufSize = 8192
		viaCtrl, err := mc.sendNotifyByName(e.Addr(), "n", big)
		require.NoError(t, err)
		require.True(t, viaCtrl)
		got := collect(e, 1)
		require.Len(t, got, 1)
		require.True(t, big == string(got[0].Msg), "whole")
		require.Eventually(t, func() bool { return mc.acked() == 1 }, stallAfter, time.Millisecond, "Mooncake's SEND did not complete")
	})
}

// TestMooncakeAbandonedChannel (finding 1, the half-open case): Mooncake, the active side,
// abandons the channel after twosided's handshake reply and sends over OOB; twosided has a
// channel to it that nobody serves. Nothing is lost either way: Mooncake's notifies arrive
// over OOB, and twosided's sends to it, failing on that channel, go over OOB and then on a
// channel twosided opens itself, each once and in order.
func TestMooncakeAbandonedChannel(t *testing.T) {
	e := rdmaEngine(t)
	mc := newMooncakePeer(t, mcAbandon)
	ctrl, oob := mcSend(t, mc, e.Addr(), "mc", "m", 1, 5)
	require.Zero(t, ctrl, "Mooncake abandoned its channel")
	tally(t, "Mooncake (abandoning) -> twosided", oob, msgsOf(collect(e, 5)), "m", 1, 5)
	acked := tsSend(t, e, mc.name, "ts", "t", 1, 20, 1)
	recv := mc.collect(20)
	tally(t, "twosided -> abandoning Mooncake", acked, mcMsgs(recv), "t", 1, 20)
	viaOOB := 0
	for _, r := range recv {
		if r.oob {
			viaOOB++
		}
	}
	// The half-open channel fails twosided's first SEND; then twosided handshakes as the
	// active side, which Mooncake accepts (its passive path is not the broken one).
	t.Logf("twosided -> Mooncake: %d over OOB, %d on a channel twosided opened", viaOOB, len(recv)-viaOOB)
}
