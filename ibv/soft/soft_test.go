package soft_test

import (
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/ibv/soft"
)

func pairEnds(t *testing.T, p *soft.Provider, depth uint32) (*end, *end) {
	A, B := newEnd(t, p, "soft0", depth), newEnd(t, p, "soft1", depth)
	A.connect(t, B)
	B.connect(t, A)
	t.Cleanup(func() { A.close(t); B.close(t) })
	return A, B
}

func pollOne(t *testing.T, cq ibv.CQ) ibv.WC {
	wcs := make([]ibv.WC, 1)
	require.Eventually(t, func() bool {
		n, err := cq.Poll(wcs)
		require.NoError(t, err)
		return n == 1
	}, 5*time.Second, 50*time.Microsecond)
	return wcs[0]
}

// TestHotPathAllocs: a SEND→RECV round of post, poll and repost allocates nothing.
func TestHotPathAllocs(t *testing.T) {
	for _, inproc := range []bool{true, false} {
		p := soft.New(soft.WithDevices(2), soft.WithInProcess(inproc))
		A, B := pairEnds(t, p, 16)
		rwr := &ibv.RecvWR{WRID: 1, SGList: []ibv.SGE{B.sge(4096, 64)}}
		swr := &ibv.SendWR{WRID: 2, Opcode: ibv.WRSendWithImm, SendFlags: ibv.SendSignaled, SGList: []ibv.SGE{A.sge(0, 64)}}
		iwr := &ibv.SendWR{WRID: 3, Opcode: ibv.WRSend, SendFlags: ibv.SendSignaled | ibv.SendInline, SGList: []ibv.SGE{A.sge(0, 32)}}
		wcs := make([]ibv.WC, 4)
		round := func(wr *ibv.SendWR) {
			if _, err := B.qp.PostRecv(rwr); err != nil {
				panic(err)
			}
			if _, err := A.qp.PostSend(wr); err != nil {
				panic(err)
			}
			for got := 0; got < 1; runtime.Gosched() {
				n, _ := B.rcq.Poll(wcs)
				got += n
			}
			for got := 0; got < 1; runtime.Gosched() {
				n, _ := A.scq.Poll(wcs)
				got += n
			}
		}
		for i := 0; i < 50; i++ { // warm up: connections, buffers
			round(swr)
			round(iwr)
		}
		allocs := testing.AllocsPerRun(200, func() { round(swr); round(iwr) })
		require.Zero(t, allocs, "inproc=%v: allocations per round", inproc)
	}
}

// TestEventPathAllocs: the event-driven round a reactor makes — a chain of SENDs in one
// PostSend (one doorbell), the receiver armed and asleep on its channel, GetEvent doing the
// receive work (manual progress over TCP), one Poll taking every WC, the RECVs reposted in
// one chain — allocates nothing.
func TestEventPathAllocs(t *testing.T) {
	for _, inproc := range []bool{true, false} {
		p := soft.New(soft.WithDevices(2), soft.WithInProcess(inproc))
		A, B := pairEnds(t, p, 16)
		const k = 4
		rwrs := make([]ibv.RecvWR, k)
		swrs := make([]ibv.SendWR, k)
		for i := range k {
			rwrs[i] = ibv.RecvWR{WRID: uint64(i), SGList: []ibv.SGE{B.sge(4096+i*64, 64)}}
			swrs[i] = ibv.SendWR{WRID: uint64(i), Opcode: ibv.WRSend, SGList: []ibv.SGE{A.sge(i*64, 64)}}
			if i > 0 {
				rwrs[i-1].Next, swrs[i-1].Next = &rwrs[i], &swrs[i]
			}
		}
		swrs[k-1].SendFlags = ibv.SendSignaled
		wcs := make([]ibv.WC, 2*k)
		evs := make([]unix.EpollEvent, 1)
		waitCQ := func(e *end, cq ibv.CQ, want int) {
			for got := 0; got < want; {
				n, err := cq.Poll(wcs)
				if err != nil {
					panic(err)
				}
				if got += n; got == want || n > 0 {
					continue
				}
				if err := cq.ReqNotify(false); err != nil {
					panic(err)
				}
				if n, _ = cq.Poll(wcs); n > 0 {
					got += n
					continue
				}
				if _, err := unix.EpollWait(e.ep, evs, 1000); err != nil && err != unix.EINTR {
					panic(err)
				}
				for {
					c, err := e.ch.GetEvent()
					if err != nil {
						break
					}
					c.AckEvents(1)
				}
			}
		}
		// Flush ends a consumer's turn (reactor.Flusher); once called, the device defers
		// its doorbells to it.
		flushA, flushB := A.scq.(interface{ Flush() }), B.rcq.(interface{ Flush() })
		flush := false
		round := func() {
			if _, err := B.qp.PostRecv(&rwrs[0]); err != nil {
				panic(err)
			}
			if _, err := A.qp.PostSend(&swrs[0]); err != nil {
				panic(err)
			}
			if flush {
				flushA.Flush()
			}
			waitCQ(B, B.rcq, k)
			if flush {
				flushB.Flush()
			}
			waitCQ(A, A.scq, 1)
		}
		for _, flush = range []bool{false, true} {
			for i := 0; i < 50; i++ {
				round()
			}
			allocs := testing.AllocsPerRun(200, round)
			require.Zero(t, allocs, "inproc=%v flush=%v: allocations per round of %d notifies", inproc, flush, k)
		}
	}
}

// TestBackstopAcksForBusyConsumer: with manual progress the consumer's GetEvent and Poll
// read the sockets; a consumer that armed its CQ (so it attends the device) but is busy
// elsewhere and never calls them still has its SENDs acknowledged, by the NIC goroutine's
// backstop, well within the requester's retry budget (4 ms ACK timeout, 7 retries). Without
// the backstop's timed read the requester ends in RETRY_EXC_ERR.
func TestBackstopAcksForBusyConsumer(t *testing.T) {
	p := soft.New(soft.WithDevices(2), soft.WithInProcess(false))
	A, B := newEnd(t, p, "soft0", 16), newEnd(t, p, "soft1", 16)
	A.connectTimeout(t, B, 10)
	B.connectTimeout(t, A, 10)
	t.Cleanup(func() { A.close(t); B.close(t) })
	// Warm up: the connections are up and idle, B's NIC goroutine asleep on its socket.
	_, err := B.qp.PostRecv(&ibv.RecvWR{WRID: 100, SGList: []ibv.SGE{B.sge(4096, 64)}})
	require.NoError(t, err)
	_, err = A.qp.PostSend(&ibv.SendWR{WRID: 100, Opcode: ibv.WRSend, SendFlags: ibv.SendSignaled, SGList: []ibv.SGE{A.sge(0, 8)}})
	require.NoError(t, err)
	require.Equal(t, ibv.WCSuccess, pollOne(t, B.rcq).Status)
	require.Equal(t, ibv.WCSuccess, pollOne(t, A.scq).Status)
	time.Sleep(10 * time.Millisecond) // past B's attendance by polling: only the arm attends

	_, err = B.qp.PostRecv(&ibv.RecvWR{WRID: 1, SGList: []ibv.SGE{B.sge(4096, 64)}})
	require.NoError(t, err)
	require.NoError(t, B.rcq.ReqNotify(false)) // B attends, then never polls nor gets events
	for i := 0; i < 3; i++ {
		_, err = A.qp.PostSend(&ibv.SendWR{WRID: uint64(i), Opcode: ibv.WRSend, SendFlags: ibv.SendSignaled, SGList: []ibv.SGE{A.sge(0, 8)}})
		require.NoError(t, err)
		wc := pollOne(t, A.scq)
		require.Equal(t, ibv.WCSuccess, wc.Status, "send %d: %s", i, wc.Status)
		if i < 2 {
			_, err = B.qp.PostRecv(&ibv.RecvWR{WRID: uint64(i + 2), SGList: []ibv.SGE{B.sge(4096, 64)}})
			require.NoError(t, err)
		}
	}
}

// TestPortStateEvents: a port going DOWN raises EventPortErr and drops traffic; back ACTIVE
// raises EventPortActive and retransmission delivers.
func TestPortStateEvents(t *testing.T) {
	p := soft.New(soft.WithDevices(2), soft.WithInProcess(false))
	A, B := pairEnds(t, p, 16)
	require.NoError(t, p.SetPortState("soft1", false))
	require.True(t, waitFd(B.ctx.AsyncFd(), time.Second))
	ev, err := B.ctx.GetAsyncEvent()
	require.NoError(t, err)
	require.Equal(t, ibv.EventPortErr, ev.Type)
	B.ctx.AckAsyncEvent(ev)
	_, err = B.ctx.GetAsyncEvent()
	require.ErrorIs(t, err, ibv.ErrWouldBlock)
	pa, err := B.ctx.QueryPort(1)
	require.NoError(t, err)
	require.Equal(t, ibv.PortDown, pa.State)

	_, err = B.qp.PostRecv(&ibv.RecvWR{WRID: 1, SGList: []ibv.SGE{B.sge(4096, 64)}})
	require.NoError(t, err)
	_, err = A.qp.PostSend(&ibv.SendWR{WRID: 1, Opcode: ibv.WRSend, SendFlags: ibv.SendSignaled, SGList: []ibv.SGE{A.sge(0, 8)}})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		c, _ := soft.DeviceCounters(A.ctx)
		return c.Retransmits > 0 || c.RetryTimeouts > 0
	}, 5*time.Second, time.Millisecond)
	require.NoError(t, p.SetPortState("soft1", true))
	require.True(t, waitFd(B.ctx.AsyncFd(), time.Second))
	ev, err = B.ctx.GetAsyncEvent()
	require.NoError(t, err)
	require.Equal(t, ibv.EventPortActive, ev.Type)
	require.Equal(t, ibv.WCSuccess, pollOne(t, B.rcq).Status)
	require.Equal(t, ibv.WCSuccess, pollOne(t, A.scq).Status)
}

// TestDelayLink: a delayed link still delivers, in order.
func TestDelayLink(t *testing.T) {
	for _, inproc := range []bool{true, false} {
		p := soft.New(soft.WithDevices(2), soft.WithInProcess(inproc))
		A, B := pairEnds(t, p, 16)
		require.NoError(t, p.DelayLink("soft0", "soft1", 2*time.Millisecond))
		for i := 0; i < 8; i++ {
			_, err := B.qp.PostRecv(&ibv.RecvWR{WRID: uint64(i), SGList: []ibv.SGE{B.sge(4096+64*i, 64)}})
			require.NoError(t, err)
		}
		for i := 0; i < 8; i++ {
			A.buf[i] = byte(i)
			_, err := A.qp.PostSend(&ibv.SendWR{WRID: uint64(i), Opcode: ibv.WRSend, SendFlags: ibv.SendSignaled,
				SGList: []ibv.SGE{A.sge(i, 1)}})
			require.NoError(t, err)
		}
		for i := 0; i < 8; i++ {
			wc := pollOne(t, B.rcq)
			require.Equal(t, ibv.WCSuccess, wc.Status)
			require.Equal(t, uint64(i), wc.WRID)
			require.Equal(t, byte(i), B.buf[4096+64*i])
		}
		require.NoError(t, p.RestoreLink("soft0", "soft1"))
		for i := 0; i < 8; i++ {
			require.Equal(t, ibv.WCSuccess, pollOne(t, A.scq).Status)
		}
	}
	require.ErrorIs(t, soft.New().DelayLink("soft0", "soft1", 0), ibv.ErrInvalid)
}

// TestFaultsNeedOpenDevices: fault hooks name open devices.
func TestFaultsNeedOpenDevices(t *testing.T) {
	p := soft.New()
	require.ErrorIs(t, p.CutLink("soft0", "soft1"), ibv.ErrNoDevice)
	require.ErrorIs(t, p.KillDevice("soft0"), ibv.ErrNoDevice)
	_, err := soft.DeviceCounters(nil)
	require.ErrorIs(t, err, ibv.ErrInvalid)
	require.ErrorIs(t, soft.InjectWC(nil, ibv.WC{}), ibv.ErrInvalid)
}

func waitFd(fd int, d time.Duration) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(p, int(d/time.Millisecond))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err == nil && n > 0
	}
}

// TestDuplicateNotPlacedTwice: when ACKs are lost the requester retransmits a SEND the
// responder already placed; the responder ACKs it again and does not consume a second RECV.
func TestDuplicateNotPlacedTwice(t *testing.T) {
	for _, inproc := range []bool{true, false} {
		p := soft.New(soft.WithDevices(2), soft.WithInProcess(inproc))
		A, B := pairEnds(t, p, 16)
		for i := 0; i < 2; i++ {
			_, err := B.qp.PostRecv(&ibv.RecvWR{WRID: uint64(i), SGList: []ibv.SGE{B.sge(4096+64*i, 64)}})
			require.NoError(t, err)
		}
		require.NoError(t, p.CutPath("soft1", "soft0")) // ACKs lost
		c0, _ := soft.DeviceCounters(B.ctx)
		_, err := A.qp.PostSend(&ibv.SendWR{WRID: 1, Opcode: ibv.WRSend, SendFlags: ibv.SendSignaled, SGList: []ibv.SGE{A.sge(0, 8)}})
		require.NoError(t, err)
		require.Equal(t, uint64(0), pollOne(t, B.rcq).WRID)
		require.Eventually(t, func() bool {
			c, _ := soft.DeviceCounters(B.ctx)
			return c.DupPackets > c0.DupPackets
		}, 5*time.Second, time.Millisecond, "no retransmission reached the responder")
		require.NoError(t, p.RestoreLink("soft0", "soft1"))
		require.Equal(t, ibv.WCSuccess, pollOne(t, A.scq).Status)
		wcs := make([]ibv.WC, 2)
		n, err := B.rcq.Poll(wcs)
		require.NoError(t, err)
		require.Zero(t, n, "the duplicate was placed: %+v", wcs[:n])
		_, err = A.qp.PostSend(&ibv.SendWR{WRID: 2, Opcode: ibv.WRSend, SendFlags: ibv.SendSignaled, SGList: []ibv.SGE{A.sge(0, 8)}})
		require.NoError(t, err)
		require.Equal(t, uint64(1), pollOne(t, B.rcq).WRID)
		require.Equal(t, ibv.WCSuccess, pollOne(t, A.scq).Status)
	}
}

// TestIdleQPFailsWhenPeerDeviceGone: over TCP, a remote device that dies (its process
// killed: listener and connections closed) fails the idle QPs connected to it — their
// RECVs flush and they enter ERR — where hardware would notice only at the next SEND. A
// SEND posted right after the death still meets the retry rule (RETRY_EXC_ERR, not a
// flush): conformance's RetryExceededDeadPeer, run over TCP, holds that.
func TestIdleQPFailsWhenPeerDeviceGone(t *testing.T) {
	p := soft.New(soft.WithDevices(2), soft.WithInProcess(false))
	A, B := pairEnds(t, p, 16)
	for i := 0; i < 2; i++ {
		_, err := A.qp.PostRecv(&ibv.RecvWR{WRID: uint64(10 + i), SGList: []ibv.SGE{A.sge(4096+64*i, 64)}})
		require.NoError(t, err)
		_, err = B.qp.PostRecv(&ibv.RecvWR{WRID: uint64(i), SGList: []ibv.SGE{B.sge(4096+64*i, 64)}})
		require.NoError(t, err)
	}
	_, err := A.qp.PostSend(&ibv.SendWR{WRID: 1, Opcode: ibv.WRSend, SendFlags: ibv.SendSignaled, SGList: []ibv.SGE{A.sge(0, 8)}})
	require.NoError(t, err)
	require.Equal(t, ibv.WCSuccess, pollOne(t, A.scq).Status, "the connection is up")
	require.Equal(t, uint64(0), pollOne(t, B.rcq).WRID)
	require.NoError(t, p.KillDevice("soft1"))
	// Bounded by the path wait (1 s at least) plus the probe dial; pollOne allows 5 s.
	for i := 0; i < 2; i++ {
		wc := pollOne(t, A.rcq)
		require.Equal(t, ibv.WCWRFlushErr, wc.Status, "%s", wc.Status)
		require.Equal(t, uint64(10+i), wc.WRID)
	}
	require.Equal(t, ibv.QPSErr, A.qp.State())
	c, err := soft.DeviceCounters(A.ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(1), c.PathsLost)
	require.Zero(t, c.RetryExceeded, "no SEND was in flight")
}

// TestArmMakesGetEventProgress: with manual progress a GetEvent that returned an event skips
// progress on the next call (a consumer draining to ErrWouldBlock pays one socket read per
// wake-up), but only until a CQ of the channel is armed again: a consumer that reads its
// armed CQ's one event and arms (the reactor), then wakes for the next packet, gets the
// event from that wake-up's first GetEvent, not ErrWouldBlock and a second wake-up. Without
// the arm clearing the mark, rounds after the first fail here.
func TestArmMakesGetEventProgress(t *testing.T) {
	p := soft.New(soft.WithDevices(2), soft.WithInProcess(false))
	A, B := pairEnds(t, p, 16)
	wcs := make([]ibv.WC, 4)
	evs := make([]unix.EpollEvent, 1)
	for i := range 10 {
		_, err := B.qp.PostRecv(&ibv.RecvWR{WRID: uint64(i), SGList: []ibv.SGE{B.sge(4096, 64)}})
		require.NoError(t, err)
		require.NoError(t, B.rcq.ReqNotify(false))
		_, err = A.qp.PostSend(&ibv.SendWR{WRID: uint64(i), Opcode: ibv.WRSend, SGList: []ibv.SGE{A.sge(0, 64)}})
		require.NoError(t, err)
		n := 0
		for deadline := time.Now().Add(30 * time.Second); n == 0 && time.Now().Before(deadline); {
			if n, err = unix.EpollWait(B.ep, evs, 1000); err == unix.EINTR {
				n = 0
			} else {
				require.NoError(t, err)
			}
		}
		require.Equal(t, 1, n, "round %d: the channel never became readable", i)
		c, err := B.ch.GetEvent()
		require.NoError(t, err, "round %d: the wake-up's first GetEvent", i)
		require.Equal(t, B.rcq, c)
		c.AckEvents(1)
		got, err := B.rcq.Poll(wcs)
		require.NoError(t, err)
		require.Equal(t, 1, got)
		require.Equal(t, uint64(i), wcs[0].WRID)
	}
}
