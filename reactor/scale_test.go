package reactor

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/ibv/soft"
)

// The scale tests hold the nesting of the sets a loop waits on (doc.go, "Nesting") below the
// kernel's limits on nested epoll (fs/eventpoll.c): at most 4 levels of epoll inside epoll
// (EP_MAX_NESTS), and for every file (a socket, an eventfd) a cap on its wake-up paths to the
// outermost sets that shrinks with depth (path_limits: unlimited directly in an outermost set,
// then 500, 100, 50, 10). Adding an fd past a limit fails with EINVAL (or ELOOP). The files
// that meet the limits first are the soft devices' connection sockets, shared by every
// completion channel of the device in the process: so each test has a TCP connection up
// (in-process delivery off) before it watches, and sends over it afterwards.
//
// Before the progress set of a soft device was held by one channel at a time, every channel's
// fd nested it: with the loop's outer set the 51st channel of a process failed (checked).

// scaleChannels and scaleLoops are what the tests watch: 20 times the old limit of channels
// on one loop, and as many loops (one context and channel each) on one device.
const (
	scaleChannels = 1000
	scaleLoops    = 1000
)

// needFds raises RLIMIT_NOFILE's soft limit to its hard limit when below n (the Go runtime
// already does so at start on Linux) and skips the test when the hard limit is below n: the
// fd count is a limit of the machine, not of the nesting these tests hold.
func needFds(t *testing.T, n uint64) {
	t.Helper()
	var rl unix.Rlimit
	require.NoError(t, unix.Getrlimit(unix.RLIMIT_NOFILE, &rl))
	if rl.Cur >= n {
		return
	}
	if rl.Max < n {
		t.Skipf("RLIMIT_NOFILE hard limit %d is below the %d fds this test opens", rl.Max, n)
	}
	rl.Cur = rl.Max
	require.NoError(t, unix.Setrlimit(unix.RLIMIT_NOFILE, &rl))
}

// softSide is a context of one soft device with a PD and an MR for the test's QPs.
type softSide struct {
	ctx ibv.Context
	pd  ibv.PD
	mr  ibv.MR
	gid ibv.GID
}

func openSide(t *testing.T, p *soft.Provider, dev string) *softSide {
	t.Helper()
	ctx, err := p.Open(dev)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ctx.Close()) }) // destroys what the test left
	s := &softSide{ctx: ctx}
	s.pd, err = ctx.AllocPD()
	require.NoError(t, err)
	s.mr, err = s.pd.RegMR(make([]byte, 4096), ibv.AccessLocalWrite)
	require.NoError(t, err)
	pa, err := ctx.QueryPort(1)
	require.NoError(t, err)
	s.gid = pa.GID
	return s
}

func (s *softSide) sge() []ibv.SGE {
	return []ibv.SGE{{Addr: s.mr.Addr(), Length: 64, LKey: s.mr.LKey()}}
}

// newQP makes an RC QP on s, both queues on cq, in INIT.
func (s *softSide) newQP(t *testing.T, cq ibv.CQ) ibv.QP {
	t.Helper()
	qp, err := s.pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, Type: ibv.QPTypeRC,
		Cap: ibv.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	require.NoError(t, qp.Modify(&ibv.QPAttr{QPState: ibv.QPSInit, PortNum: 1, QPAccessFlags: ibv.AccessLocalWrite},
		ibv.AttrState|ibv.AttrPKeyIndex|ibv.AttrPort|ibv.AttrAccessFlags))
	return qp
}

// toRTS takes qp (in INIT) to RTS towards the QP rqpn of the device of rgid.
func toRTS(t *testing.T, qp ibv.QP, rgid ibv.GID, rqpn uint32) {
	t.Helper()
	require.NoError(t, qp.Modify(&ibv.QPAttr{QPState: ibv.QPSRTR, PathMTU: ibv.MTU4096, DestQPNum: rqpn,
		MinRNRTimer: 1, AHAttr: ibv.AHAttr{IsGlobal: true, DGID: rgid, PortNum: 1}},
		ibv.AttrState|ibv.AttrAV|ibv.AttrPathMTU|ibv.AttrDestQPN|ibv.AttrRqPSN|ibv.AttrMaxDestRdAtomic|ibv.AttrMinRNRTimer))
	require.NoError(t, qp.Modify(&ibv.QPAttr{QPState: ibv.QPSRTS, Timeout: 14, RetryCnt: 7, RnrRetry: 7},
		ibv.AttrState|ibv.AttrSqPSN|ibv.AttrTimeout|ibv.AttrRetryCnt|ibv.AttrRnrRetry|ibv.AttrMaxQPRdAtomic))
}

// pollWC polls cq (no channel needed) until it yields one WC, bounded by waitBound. The
// sleep between polls only paces an idle wait; nothing asserts how long it took.
func pollWC(t *testing.T, cq ibv.CQ) ibv.WC {
	t.Helper()
	wcs := make([]ibv.WC, 1)
	for end := time.Now().Add(waitBound); time.Now().Before(end); time.Sleep(100 * time.Microsecond) {
		n, err := cq.Poll(wcs)
		require.NoError(t, err)
		if n == 1 {
			return wcs[0]
		}
	}
	t.Fatal("no completion")
	return ibv.WC{}
}

// sender is the far end of the tests' traffic: a context of soft1 whose QPs the test drives
// on its own goroutine, their CQ polled directly.
type sender struct {
	side *softSide
	cq   ibv.CQ
}

func newSender(t *testing.T, p *soft.Provider) *sender {
	t.Helper()
	side := openSide(t, p, "soft1")
	cq, err := side.ctx.CreateCQ(64, nil)
	require.NoError(t, err)
	return &sender{side: side, cq: cq}
}

// pairTo connects a QP of the sender with rqp, a QP in INIT on the device of rgid.
func (s *sender) pairTo(t *testing.T, rqp ibv.QP, rgid ibv.GID) ibv.QP {
	t.Helper()
	qp := s.side.newQP(t, s.cq)
	toRTS(t, qp, rgid, rqp.QPNum())
	toRTS(t, rqp, s.side.gid, qp.QPNum())
	return qp
}

// send posts one signaled SEND on qp and waits for its completion.
func (s *sender) send(t *testing.T, qp ibv.QP, wrid uint64) {
	t.Helper()
	_, err := qp.PostSend(&ibv.SendWR{WRID: wrid, Opcode: ibv.WRSend, SendFlags: ibv.SendSignaled, SGList: s.side.sge()})
	require.NoError(t, err)
	wc := pollWC(t, s.cq)
	require.Equal(t, ibv.WCSuccess, wc.Status, "send %d: %s", wrid, wc.Status)
	require.Equal(t, wrid, wc.WRID)
}

// tcpLink is soft0 and soft1 of a provider whose traffic goes through TCP, with their
// connection up: soft0's progress set holds its socket, whose wake-up paths the kernel counts
// whenever a set above it changes.
type tcpLink struct {
	p    *soft.Provider
	recv *softSide // soft0: the side the loops watch
	send *sender   // soft1
}

func newTCPLink(t *testing.T) *tcpLink {
	t.Helper()
	p := soft.New(soft.WithDevices(2), soft.WithInProcess(false))
	k := &tcpLink{p: p, recv: openSide(t, p, "soft0")}
	k.send = newSender(t, p)
	cq, err := k.recv.ctx.CreateCQ(64, nil)
	require.NoError(t, err)
	rqp := k.recv.newQP(t, cq)
	sqp := k.send.pairTo(t, rqp, k.recv.gid)
	// Two SENDs, the second after the first's ACK: soft0 reads the first with the HELLO, and
	// the second only from its progress set or its NIC goroutine, both of which begin once
	// the socket is in the set.
	for i := uint64(1); i <= 2; i++ {
		_, err := rqp.PostRecv(&ibv.RecvWR{WRID: i, SGList: k.recv.sge()})
		require.NoError(t, err)
		k.send.send(t, sqp, i)
		require.Equal(t, i, pollWC(t, cq).WRID)
	}
	return k
}

// wcSink hands every WRID it handles to a channel (the loop never blocks on it: the tests
// size it for all they send).
type wcSink chan uint64

func (s wcSink) HandleWC(wcs []ibv.WC) {
	for _, wc := range wcs {
		s <- wc.WRID
	}
}

func (wcSink) Repost() {}

// recvTraffic sends one message from the link's far end to a new QP of side (a soft0
// context) on cq, watched by l, and checks that the loop handled its RECV.
func (k *tcpLink) recvTraffic(t *testing.T, l *Loop, side *softSide, cq ibv.CQ, sink wcSink, wrid uint64) {
	t.Helper()
	qp := side.newQP(t, cq)
	sqp := k.send.pairTo(t, qp, k.recv.gid)
	var err error
	onLoop(t, l, func() { _, err = qp.PostRecv(&ibv.RecvWR{WRID: wrid, SGList: side.sge()}) })
	require.NoError(t, err)
	k.send.send(t, sqp, wrid)
	require.Equal(t, wrid, recv(t, sink))
}

// TestScaleThousandChannelsOnOneLoop: one loop watches scaleChannels CQs of one soft
// device, each on its own completion channel, while the device's progress set holds a
// connection socket; then traffic over that socket reaches CQs across the range. Before the
// progress set was held by one channel, WatchCQ failed at the 51st channel with "epoll_ctl
// add fd N: invalid argument" (checked).
func TestScaleThousandChannelsOnOneLoop(t *testing.T) {
	needFds(t, 2*scaleChannels+256)
	k := newTCPLink(t)
	l := newLoop(t)
	sink := make(wcSink, 16)
	cqs := make([]ibv.CQ, scaleChannels)
	for i := range cqs {
		ch, err := k.recv.ctx.CreateCompChannel()
		require.NoError(t, err)
		cqs[i], err = k.recv.ctx.CreateCQ(8, ch)
		require.NoError(t, err)
	}
	watches := make([]*CQWatch, 0, scaleChannels)
	for lo := 0; lo < scaleChannels; lo += 100 {
		var err error
		onLoop(t, l, func() {
			for i := lo; i < min(lo+100, scaleChannels) && err == nil; i++ {
				var w *CQWatch
				if w, err = l.WatchCQ(cqs[i], sink); err == nil {
					watches = append(watches, w)
				} else {
					err = fmt.Errorf("channel %d of %d: %w", i+1, scaleChannels, err)
				}
			}
		})
		require.NoError(t, err)
	}
	for _, i := range []int{0, scaleChannels / 3, 2 * scaleChannels / 3, scaleChannels - 1} {
		k.recvTraffic(t, l, k.recv, cqs[i], sink, uint64(i))
	}
	var errs []error
	onLoop(t, l, func() {
		for _, w := range watches {
			if err := w.Close(); err != nil {
				errs = append(errs, err)
			}
		}
	})
	require.Empty(t, errs)
}

// TestScaleThousandLoopsOnOneDevice: scaleLoops loops in one process, each with its own
// context of one soft device and a CQ on its own channel (as many engines would have), while
// the device's progress set holds a connection socket; every loop handles a completion, and
// traffic over the socket reaches loops across the range. Before the progress set was held
// by one channel, the 51st loop's WatchCQ failed with "invalid argument" (checked).
func TestScaleThousandLoopsOnOneDevice(t *testing.T) {
	needFds(t, 7*scaleLoops+256)
	k := newTCPLink(t)
	type loopEnd struct {
		l    *Loop
		side *softSide
		cq   ibv.CQ
		w    *CQWatch
	}
	ends := make([]loopEnd, scaleLoops)
	sink := make(wcSink, scaleLoops+16)
	stopAll := func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitBound)
		defer cancel()
		for _, e := range ends {
			if e.l != nil {
				_ = e.l.Stop(ctx)
			}
		}
	}
	t.Cleanup(stopAll) // after a failure: no loop outlives the test
	for i := range ends {
		e := &ends[i]
		var err error
		e.l, err = New(quiet)
		require.NoError(t, err)
		e.side = openSide(t, k.p, "soft0")
		ch, err := e.side.ctx.CreateCompChannel()
		require.NoError(t, err)
		e.cq, err = e.side.ctx.CreateCQ(8, ch)
		require.NoError(t, err)
		onLoop(t, e.l, func() { e.w, err = e.l.WatchCQ(e.cq, sink) })
		require.NoError(t, err, "loop %d of %d", i+1, scaleLoops)
	}
	for i := range ends {
		require.NoError(t, soft.InjectWC(ends[i].cq, ibv.WC{WRID: uint64(i)}))
	}
	seen := make([]bool, scaleLoops)
	for range ends {
		seen[recv(t, sink)] = true
	}
	require.NotContains(t, seen, false)
	for _, i := range []int{0, scaleLoops / 2, scaleLoops - 1} {
		e := &ends[i]
		k.recvTraffic(t, e.l, e.side, e.cq, sink, uint64(i))
	}
	for _, e := range ends {
		var err error
		onLoop(t, e.l, func() { err = e.w.Close() })
		require.NoError(t, err)
	}
	stopAll()
}
