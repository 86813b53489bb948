package conformance

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/twosided/twosided/ibv"
)

const (
	bufLen   = 1 << 16
	recvBase = bufLen / 2 // receive buffers live in the upper half of a side's MR
	waitFor  = 10 * time.Second
)

// opts shape a side's QP and its connection.
type opts struct {
	sendWR, recvWR uint32
	cqe            int
	sigAll         bool
	inline         uint32
	timeout        uint8 // local ACK timeout (IB encoding)
	retryCnt       uint8
	rnrRetry       uint8
	minRNRTimer    uint8
}

func defaults() opts {
	return opts{sendWR: 64, recvWR: 64, cqe: 256, timeout: 14, retryCnt: 7, rnrRetry: 7, minRNRTimer: 12}
}

// side is one end: a context with a PD, one MR over buf, a channel, send and recv CQs, a QP.
type side struct {
	f    Fixture
	dev  string
	ctx  ibv.Context
	pd   ibv.PD
	mr   ibv.MR
	buf  []byte
	ch   ibv.CompChannel
	scq  ibv.CQ
	rcq  ibv.CQ
	qp   ibv.QP
	port ibv.PortAttr
	gid  ibv.GIDEntry // this side's source GID (ibv.SelectGID of its own port)
	o    opts
}

func openCtx(t *testing.T, f Fixture, dev string) ibv.Context {
	t.Helper()
	ctx, err := f.Provider.Open(dev)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ctx.Close()) })
	return ctx
}

// newSide builds a side on dev; its QP is in INIT. Everything is destroyed at cleanup.
func newSide(t *testing.T, f Fixture, dev string, o opts) *side {
	t.Helper()
	s := &side{f: f, dev: dev, o: o}
	s.ctx = openCtx(t, f, dev)
	var err error
	s.port, err = s.ctx.QueryPort(1)
	require.NoError(t, err)
	require.Equal(t, ibv.PortActive, s.port.State, "device %s port 1", dev)
	s.gid, err = ibv.SelectGID(s.port, -1)
	require.NoError(t, err, "device %s port 1: a source GID", dev)
	s.pd, err = s.ctx.AllocPD()
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.pd.Dealloc()) })
	s.buf = make([]byte, bufLen)
	s.mr, err = s.pd.RegMR(s.buf, ibv.AccessLocalWrite)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.mr.Dereg()) })
	s.ch, err = s.ctx.CreateCompChannel()
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.ch.Close()) })
	s.scq, err = s.ctx.CreateCQ(o.cqe, s.ch)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.scq.Destroy()) })
	s.rcq, err = s.ctx.CreateCQ(o.cqe, s.ch)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.rcq.Destroy()) })
	s.qp = s.newQP(t, o)
	return s
}

// newQP makes another QP on the side's CQs, in INIT.
func (s *side) newQP(t *testing.T, o opts) ibv.QP {
	t.Helper()
	qp, err := s.pd.CreateQP(ibv.QPInitAttr{SendCQ: s.scq, RecvCQ: s.rcq, Type: ibv.QPTypeRC, SqSigAll: o.sigAll,
		Cap: ibv.QPCap{MaxSendWR: o.sendWR, MaxRecvWR: o.recvWR, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInlineData: o.inline}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, qp.Destroy()) })
	require.Equal(t, ibv.QPSReset, qp.State())
	require.NoError(t, toInit(qp))
	return qp
}

func toInit(qp ibv.QP) error {
	return qp.Modify(&ibv.QPAttr{QPState: ibv.QPSInit, PortNum: 1, QPAccessFlags: ibv.AccessLocalWrite},
		ibv.AttrState|ibv.AttrPKeyIndex|ibv.AttrPort|ibv.AttrAccessFlags)
}

const rtrMask = ibv.AttrState | ibv.AttrAV | ibv.AttrPathMTU | ibv.AttrDestQPN | ibv.AttrRqPSN |
	ibv.AttrMaxDestRdAtomic | ibv.AttrMinRNRTimer
const rtsMask = ibv.AttrState | ibv.AttrSqPSN | ibv.AttrTimeout | ibv.AttrRetryCnt | ibv.AttrRnrRetry |
	ibv.AttrMaxQPRdAtomic

// rtrAttr is local's QP to RTR towards QPN destQPN of remote: the destination is remote's
// source GID, and the address vector's sgid_index local's own (each side picks its own
// index; the two need not be equal, and are not on a NIC whose ports differ).
func rtrAttr(local, remote *side, destQPN uint32, o opts) *ibv.QPAttr {
	return &ibv.QPAttr{QPState: ibv.QPSRTR, PathMTU: ibv.MTU1024, DestQPNum: destQPN, RqPSN: 0,
		MaxDestRdAtomic: 1, MinRNRTimer: o.minRNRTimer,
		AHAttr: ibv.AHAttr{IsGlobal: true, DGID: remote.gid.GID, DLID: remote.port.LID, HopLimit: 1, PortNum: 1,
			SGIDIndex: uint8(local.gid.Index)}}
}

func rtsAttr(o opts) *ibv.QPAttr {
	return &ibv.QPAttr{QPState: ibv.QPSRTS, SqPSN: 0, Timeout: o.timeout, RetryCnt: o.retryCnt,
		RnrRetry: o.rnrRetry, MaxRdAtomic: 1}
}

// connectQP takes qp (of side s, in INIT) to RTS towards QPN dest on remote's device.
func connectQP(t *testing.T, s *side, qp ibv.QP, remote *side, dest uint32) {
	t.Helper()
	require.NoError(t, qp.Modify(rtrAttr(s, remote, dest, s.o), rtrMask))
	require.NoError(t, qp.Modify(rtsAttr(s.o), rtsMask))
	require.Equal(t, ibv.QPSRTS, qp.State())
}

// pair makes two connected sides, a on DevA and b on DevB.
func pair(t *testing.T, f Fixture, oa, ob opts) (a, b *side) {
	t.Helper()
	a = newSide(t, f, f.DevA, oa)
	b = newSide(t, f, f.DevB, ob)
	connectQP(t, a, a.qp, b, b.qp.QPNum())
	connectQP(t, b, b.qp, a, a.qp.QPNum())
	return a, b
}

func (s *side) sge(off, n int) ibv.SGE {
	return ibv.SGE{Addr: s.mr.Addr() + uint64(off), Length: uint32(n), LKey: s.mr.LKey()}
}

// postRecv posts RECV wrid over [recvBase+off, +n).
func (s *side) postRecv(t *testing.T, qp ibv.QP, wrid uint64, off, n int) {
	t.Helper()
	bad, err := qp.PostRecv(&ibv.RecvWR{WRID: wrid, SGList: []ibv.SGE{s.sge(recvBase+off, n)}})
	require.NoError(t, err)
	require.Nil(t, bad)
}

// postSend posts a signaled SEND of [off, off+n).
func (s *side) postSend(t *testing.T, qp ibv.QP, wrid uint64, off, n int) {
	t.Helper()
	bad, err := qp.PostSend(&ibv.SendWR{WRID: wrid, Opcode: ibv.WRSend, SendFlags: ibv.SendSignaled,
		SGList: []ibv.SGE{s.sge(off, n)}})
	require.NoError(t, err)
	require.Nil(t, bad)
}

// waitWCs collects n WCs from cq, sleeping on the side's completion channel between polls
// (poll, arm, poll again, then wait on the fd), within waitFor.
func (s *side) waitWCs(t *testing.T, cq ibv.CQ, n int) []ibv.WC {
	t.Helper()
	out := make([]ibv.WC, 0, n)
	wcs := make([]ibv.WC, 16)
	deadline := time.Now().Add(waitFor)
	for len(out) < n {
		k, err := cq.Poll(wcs[:min(len(wcs), n-len(out))])
		require.NoError(t, err)
		if k > 0 {
			out = append(out, wcs[:k]...)
			continue
		}
		require.NoError(t, cq.ReqNotify(false))
		k, err = cq.Poll(wcs[:min(len(wcs), n-len(out))])
		require.NoError(t, err)
		if k > 0 {
			out = append(out, wcs[:k]...)
			continue
		}
		left := time.Until(deadline)
		require.Greater(t, left, time.Duration(0), "timed out waiting for %d WCs, got %d: %+v", n, len(out), out)
		s.waitChannel(t, min(left, 100*time.Millisecond))
	}
	return out
}

// waitChannel sleeps until the channel fd is readable (or d passes), then gets and acks every
// queued event.
func (s *side) waitChannel(t *testing.T, d time.Duration) bool {
	t.Helper()
	if !pollFd(t, s.ch.Fd(), d) {
		return false
	}
	for {
		c, err := s.ch.GetEvent()
		if errors.Is(err, ibv.ErrWouldBlock) {
			return true
		}
		require.NoError(t, err)
		c.AckEvents(1)
	}
}

// waitEvent waits up to d for the channel's next event. A channel fd may turn readable with
// no event (a provider whose receive work runs in GetEvent, as soft's manual progress, lets
// its sockets wake the channel); GetEvent then answers ErrWouldBlock and the wait goes on.
func waitEvent(t *testing.T, ch ibv.CompChannel, d time.Duration) ibv.CQ {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		require.Greater(t, left, time.Duration(0), "no channel event within %v", d)
		if !pollFd(t, ch.Fd(), left) {
			continue
		}
		cq, err := ch.GetEvent()
		if errors.Is(err, ibv.ErrWouldBlock) {
			continue
		}
		require.NoError(t, err)
		return cq
	}
}

// requireNoEvent checks that the channel gives no event within d. Its fd may turn readable
// without one (see waitEvent), but GetEvent must then answer ErrWouldBlock.
func requireNoEvent(t *testing.T, ch ibv.CompChannel, d time.Duration, msg string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		left := max(time.Until(deadline), 0)
		if !pollFd(t, ch.Fd(), left) {
			return
		}
		_, err := ch.GetEvent()
		require.ErrorIs(t, err, ibv.ErrWouldBlock, msg)
		if left == 0 {
			return
		}
	}
}

func pollFd(t *testing.T, fd int, d time.Duration) bool {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ms := int(time.Until(deadline) / time.Millisecond)
		if ms < 0 {
			ms = 0
		}
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(p, ms)
		if err == unix.EINTR {
			continue
		}
		require.NoError(t, err)
		return n > 0
	}
}

// waitWC waits for one WC.
func (s *side) waitWC(t *testing.T, cq ibv.CQ) ibv.WC { return s.waitWCs(t, cq, 1)[0] }

// requireEmpty checks that cq holds no WC now.
func requireEmpty(t *testing.T, cq ibv.CQ) {
	t.Helper()
	wcs := make([]ibv.WC, 4)
	n, err := cq.Poll(wcs)
	require.NoError(t, err)
	require.Zero(t, n, "unexpected WCs: %+v", wcs[:n])
}

func needFaults(t *testing.T, f Fixture) {
	t.Helper()
	if f.Faults == nil {
		t.Skip("provider offers no fault injection")
	}
}

func counters(t *testing.T, f Fixture, ctx ibv.Context) Counters {
	t.Helper()
	c, err := f.Faults.Counters(ctx)
	skipUnsupported(t, err)
	require.NoError(t, err)
	return c
}

// skipUnsupported skips the test when a Faults method says the provider cannot do it.
func skipUnsupported(t *testing.T, err error) {
	t.Helper()
	if errors.Is(err, errors.ErrUnsupported) {
		t.Skipf("provider: %v", err)
	}
}

// waitState waits until qp reaches st (a NIC-driven transition).
func waitState(t *testing.T, qp ibv.QP, st ibv.QPState) {
	t.Helper()
	require.Eventually(t, func() bool { return qp.State() == st }, waitFor, time.Millisecond,
		"qp %d never reached %s (now %s)", qp.QPNum(), st, qp.State())
}
