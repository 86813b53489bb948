package conformance

import (
	"encoding/binary"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv"
)

// testReliableInOrder: SENDs arrive complete and in order, each in the oldest posted RECV,
// with byte_len, imm, qp_num and opcode set; every SEND completes on the sender, in order.
func testReliableInOrder(t *testing.T, f Fixture) {
	const n = 200
	const slot = 128
	o := defaults()
	o.sendWR, o.recvWR, o.cqe = 256, 256, 512
	a, b := pair(t, f, o, o)
	for i := 0; i < n; i++ {
		b.postRecv(t, b.qp, uint64(1000+i), (i%200)*slot, slot)
	}
	for i := 0; i < n; i++ {
		size := 8 + i%(slot-8)
		off := (i % 200) * slot
		binary.LittleEndian.PutUint32(a.buf[off:], uint32(i))
		for j := 4; j < size; j++ {
			a.buf[off+j] = byte(i + j)
		}
		wr := &ibv.SendWR{WRID: uint64(i), Opcode: ibv.WRSend, SendFlags: ibv.SendSignaled,
			SGList: []ibv.SGE{a.sge(off, 4), a.sge(off+4, size-4)}}
		if i%3 == 0 {
			wr.Opcode, wr.ImmData = ibv.WRSendWithImm, 0xabc00000+uint32(i)
		}
		bad, err := a.qp.PostSend(wr)
		require.NoError(t, err)
		require.Nil(t, bad)
	}
	rwc := b.waitWCs(t, b.rcq, n)
	for i, wc := range rwc {
		size := 8 + i%(slot-8)
		require.Equal(t, ibv.WCSuccess, wc.Status, "recv %d: %s", i, wc.Status)
		require.Equal(t, uint64(1000+i), wc.WRID, "recv %d consumed out of order", i)
		require.Equal(t, ibv.WCRecv, wc.Opcode)
		require.Equal(t, uint32(size), wc.ByteLen)
		require.Equal(t, b.qp.QPNum(), wc.QPNum)
		if i%3 == 0 {
			require.Equal(t, ibv.WCWithImm, wc.WCFlags&ibv.WCWithImm, "recv %d: imm flag", i)
			require.Equal(t, 0xabc00000+uint32(i), wc.ImmData)
		} else {
			require.Zero(t, wc.WCFlags&ibv.WCWithImm, "recv %d: imm flag without imm", i)
		}
		got := b.buf[recvBase+i*slot : recvBase+i*slot+size]
		require.Equal(t, uint32(i), binary.LittleEndian.Uint32(got), "recv %d payload", i)
		for j := 4; j < size; j++ {
			require.Equal(t, byte(i+j), got[j], "recv %d byte %d", i, j)
		}
	}
	swc := a.waitWCs(t, a.scq, n)
	for i, wc := range swc {
		require.Equal(t, ibv.WCSuccess, wc.Status, "send %d: %s", i, wc.Status)
		require.Equal(t, uint64(i), wc.WRID, "send %d completed out of order", i)
		require.Equal(t, ibv.WCSend, wc.Opcode)
		require.Equal(t, a.qp.QPNum(), wc.QPNum)
	}
	requireEmpty(t, b.rcq)
	requireEmpty(t, a.scq)
}

// testSendCompletesAfterPlacement: a SEND that finds no RECV does not complete on the sender
// until a RECV is posted and the bytes are placed.
func testSendCompletesAfterPlacement(t *testing.T, f Fixture) {
	o := defaults()
	o.minRNRTimer = 8 // 0.16 ms
	a, b := pair(t, f, o, o)
	a.postSend(t, a.qp, 7, 0, 32)
	if f.Faults != nil {
		require.Eventually(t, func() bool { return counters(t, f, b.ctx).RNRNaksSent >= 2 }, waitFor, time.Millisecond,
			"the responder never answered RNR")
	} else {
		// No counters: watch the send CQ for a while instead; the SEND must not complete.
		// (Polled on this goroutine, 20 ms: the CQ is not for two at once, and Destroy follows.)
		wcs := make([]ibv.WC, 4)
		for end := time.Now().Add(20 * time.Millisecond); time.Now().Before(end); runtime.Gosched() {
			n, err := a.scq.Poll(wcs)
			require.NoError(t, err)
			require.Zero(t, n, "the SEND completed with no RECV posted")
		}
	}
	requireEmpty(t, a.scq)
	b.postRecv(t, b.qp, 70, 0, 64)
	require.Equal(t, ibv.WCSuccess, b.waitWC(t, b.rcq).Status)
	wc := a.waitWC(t, a.scq)
	require.Equal(t, ibv.WCSuccess, wc.Status)
	require.Equal(t, uint64(7), wc.WRID)
}

// testRNRRetryExceeded: with no RECV, rnr_retry retries, then RNR_RETRY_EXC_ERR, QP to ERR,
// the next WR flushed, and a WR posted in ERR flushed at once.
func testRNRRetryExceeded(t *testing.T, f Fixture) {
	oa, ob := defaults(), defaults()
	oa.rnrRetry = 2
	ob.minRNRTimer = 1 // 0.01 ms
	a, _ := pair(t, f, oa, ob)
	a.postSend(t, a.qp, 1, 0, 16)
	a.postSend(t, a.qp, 2, 16, 16)
	wcs := a.waitWCs(t, a.scq, 2)
	require.Equal(t, ibv.WCRNRRetryExcErr, wcs[0].Status, "%s", wcs[0].Status)
	require.Equal(t, uint64(1), wcs[0].WRID)
	require.Equal(t, a.qp.QPNum(), wcs[0].QPNum)
	require.Equal(t, ibv.WCWRFlushErr, wcs[1].Status, "%s", wcs[1].Status)
	require.Equal(t, uint64(2), wcs[1].WRID)
	require.Equal(t, ibv.QPSErr, a.qp.State())
	a.postSend(t, a.qp, 3, 0, 16)
	wc := a.waitWC(t, a.scq)
	require.Equal(t, ibv.WCWRFlushErr, wc.Status)
	require.Equal(t, uint64(3), wc.WRID)
}

// testRNRCounted: the device counts RNR NAKs: the requester fails one SEND at its
// 1 + rnr_retry-th. The responder answers every copy it gets: exactly as many unless the
// requester's ACK timer also sent the SEND again (a loaded host can delay an RNR NAK past
// it), then more.
func testRNRCounted(t *testing.T, f Fixture) {
	needFaults(t, f)
	oa, ob := defaults(), defaults()
	oa.rnrRetry = 3
	ob.minRNRTimer = 1
	a, b := pair(t, f, oa, ob)
	ca0, cb0 := counters(t, f, a.ctx), counters(t, f, b.ctx)
	a.postSend(t, a.qp, 1, 0, 16)
	require.Equal(t, ibv.WCRNRRetryExcErr, a.waitWC(t, a.scq).Status)
	ca, cb := counters(t, f, a.ctx), counters(t, f, b.ctx)
	require.Equal(t, uint64(4), ca.RNRNaksRecv-ca0.RNRNaksRecv, "RNR NAKs received")
	if ca.RetryTimeouts == ca0.RetryTimeouts {
		require.Equal(t, uint64(4), cb.RNRNaksSent-cb0.RNRNaksSent, "RNR NAKs answered")
	} else {
		require.GreaterOrEqual(t, cb.RNRNaksSent-cb0.RNRNaksSent, uint64(4), "RNR NAKs answered")
	}
}

// testRNRRetryForever: rnr_retry 7 retries without limit; a RECV posted late still lands.
func testRNRRetryForever(t *testing.T, f Fixture) {
	needFaults(t, f)
	oa, ob := defaults(), defaults()
	oa.rnrRetry = 7
	ob.minRNRTimer = 1
	a, b := pair(t, f, oa, ob)
	c0 := counters(t, f, b.ctx)
	a.postSend(t, a.qp, 1, 0, 16)
	require.Eventually(t, func() bool { return counters(t, f, b.ctx).RNRNaksSent-c0.RNRNaksSent > 10 },
		waitFor, time.Millisecond)
	requireEmpty(t, a.scq)
	b.postRecv(t, b.qp, 9, 0, 16)
	require.Equal(t, ibv.WCSuccess, b.waitWC(t, b.rcq).Status)
	require.Equal(t, ibv.WCSuccess, a.waitWC(t, a.scq).Status)
}

// fastRetry is a QP that gives up quickly on a dead peer or a cut link (13 ms). A SEND that
// must succeed goes on a QP of defaults() (a retry budget of about half a second): on a
// loaded machine an ACK can come later than the fast budget.
func fastRetry() opts {
	o := defaults()
	o.timeout, o.retryCnt = 10, 2 // 4 ms, two retries
	return o
}

// testRetryExceededCutLink: no ACK within the timeout → retransmit; after retry_cnt retries
// RETRY_EXC_ERR, QP to ERR, the rest flushed.
func testRetryExceededCutLink(t *testing.T, f Fixture) {
	needFaults(t, f)
	a, b := pair(t, f, fastRetry(), defaults())
	b.postRecv(t, b.qp, 1, 0, 64)
	require.NoError(t, f.Faults.CutLink(f.DevA, f.DevB))
	t.Cleanup(func() { require.NoError(t, f.Faults.RestoreLink(f.DevA, f.DevB)) })
	c0 := counters(t, f, a.ctx)
	a.postSend(t, a.qp, 1, 0, 16)
	a.postSend(t, a.qp, 2, 0, 16)
	wcs := a.waitWCs(t, a.scq, 2)
	require.Equal(t, ibv.WCRetryExcErr, wcs[0].Status, "%s", wcs[0].Status)
	require.Equal(t, ibv.WCWRFlushErr, wcs[1].Status, "%s", wcs[1].Status)
	require.Equal(t, ibv.QPSErr, a.qp.State())
	require.Equal(t, uint64(3), counters(t, f, a.ctx).RetryTimeouts-c0.RetryTimeouts, "1 + retry_cnt timeouts")
	requireEmpty(t, b.rcq)
}

// testCutLinkRestored: packets lost while the link is cut are retransmitted after it is
// restored, and delivered exactly once.
func testCutLinkRestored(t *testing.T, f Fixture) {
	needFaults(t, f)
	o := defaults()
	// 268 ms a try, 8 tries: the link is restored after the first timeout, and a loaded
	// machine has two seconds to do so before the retries run out.
	o.timeout = 16
	a, b := pair(t, f, o, o)
	b.postRecv(t, b.qp, 1, 0, 64)
	b.postRecv(t, b.qp, 2, 64, 64)
	require.NoError(t, f.Faults.CutLink(f.DevA, f.DevB))
	c0 := counters(t, f, a.ctx)
	a.buf[0] = 0x5a
	a.postSend(t, a.qp, 1, 0, 16)
	require.Eventually(t, func() bool { return counters(t, f, a.ctx).RetryTimeouts > c0.RetryTimeouts },
		waitFor, time.Millisecond)
	require.NoError(t, f.Faults.RestoreLink(f.DevA, f.DevB))
	wc := b.waitWC(t, b.rcq)
	require.Equal(t, ibv.WCSuccess, wc.Status)
	require.Equal(t, uint64(1), wc.WRID)
	require.Equal(t, byte(0x5a), b.buf[recvBase])
	require.Equal(t, ibv.WCSuccess, a.waitWC(t, a.scq).Status)
	// A second SEND lands in the second RECV: the retransmission was not placed twice.
	a.postSend(t, a.qp, 2, 0, 16)
	wc = b.waitWC(t, b.rcq)
	require.Equal(t, uint64(2), wc.WRID)
	require.Equal(t, ibv.WCSuccess, a.waitWC(t, a.scq).Status)
}

// testRetryExceededDeadPeer: the peer device dies; the sender retries, then RETRY_EXC_ERR.
func testRetryExceededDeadPeer(t *testing.T, f Fixture) {
	needFaults(t, f)
	if f.DevA == f.DevB {
		t.Skip("needs two devices")
	}
	// The case starts from a connection that carried a SEND. Its fast retry budget (13 ms)
	// can run out on a loaded machine before the ACK comes: then that connection was not
	// made, and another pair is tried.
	var a *side
	for try := 1; ; try++ {
		var b *side
		a, b = pair(t, f, fastRetry(), defaults())
		b.postRecv(t, b.qp, 1, 0, 64)
		a.postSend(t, a.qp, 1, 0, 16)
		wc := a.waitWC(t, a.scq)
		if wc.Status == ibv.WCSuccess {
			break
		}
		require.Equal(t, ibv.WCRetryExcErr, wc.Status, "%s", wc.Status)
		require.Less(t, try, 5, "no SEND acknowledged within the fast retry budget in %d pairs", try)
	}
	require.NoError(t, f.Faults.KillDevice(f.DevB))
	a.postSend(t, a.qp, 2, 0, 16)
	a.postSend(t, a.qp, 3, 0, 16)
	wcs := a.waitWCs(t, a.scq, 2)
	require.Equal(t, ibv.WCRetryExcErr, wcs[0].Status, "%s", wcs[0].Status)
	require.Equal(t, uint64(2), wcs[0].WRID)
	require.Equal(t, ibv.WCWRFlushErr, wcs[1].Status)
	require.Equal(t, ibv.QPSErr, a.qp.State())
}

// testLenErr: a SEND larger than the RECV: LOC_LEN_ERR at the receiver, REM_INV_REQ_ERR at
// the sender, both QPs in ERR.
func testLenErr(t *testing.T, f Fixture) {
	a, b := pair(t, f, defaults(), defaults())
	b.postRecv(t, b.qp, 1, 0, 16)
	b.postRecv(t, b.qp, 2, 16, 16)
	a.postSend(t, a.qp, 1, 0, 64)
	rw := b.waitWCs(t, b.rcq, 2)
	require.Equal(t, ibv.WCLocLenErr, rw[0].Status, "%s", rw[0].Status)
	require.Equal(t, uint64(1), rw[0].WRID)
	require.Equal(t, ibv.WCWRFlushErr, rw[1].Status)
	sw := a.waitWC(t, a.scq)
	require.Equal(t, ibv.WCRemInvReqErr, sw.Status, "%s", sw.Status)
	require.Equal(t, ibv.QPSErr, b.qp.State())
	waitState(t, a.qp, ibv.QPSErr)
}

// testProtErr: an SGE with a wrong lkey or outside its MR fails with LOC_PROT_ERR, on the
// send side and on the receive side.
func testProtErr(t *testing.T, f Fixture) {
	t.Run("send bad lkey", func(t *testing.T) {
		a, _ := pair(t, f, defaults(), defaults())
		sg := a.sge(0, 16)
		sg.LKey ^= 0x5a5a00
		_, err := a.qp.PostSend(&ibv.SendWR{WRID: 1, Opcode: ibv.WRSend, SendFlags: ibv.SendSignaled, SGList: []ibv.SGE{sg}})
		require.NoError(t, err)
		wc := a.waitWC(t, a.scq)
		require.Equal(t, ibv.WCLocProtErr, wc.Status, "%s", wc.Status)
		require.Equal(t, ibv.QPSErr, a.qp.State())
	})
	t.Run("send outside mr", func(t *testing.T) {
		a, _ := pair(t, f, defaults(), defaults())
		_, err := a.qp.PostSend(&ibv.SendWR{WRID: 1, Opcode: ibv.WRSend, SendFlags: ibv.SendSignaled,
			SGList: []ibv.SGE{a.sge(bufLen-8, 16)}})
		require.NoError(t, err)
		wc := a.waitWC(t, a.scq)
		require.Equal(t, ibv.WCLocProtErr, wc.Status, "%s", wc.Status)
	})
	t.Run("recv bad lkey", func(t *testing.T) {
		a, b := pair(t, f, defaults(), defaults())
		sg := b.sge(recvBase, 64)
		sg.LKey ^= 0x5a5a00
		_, err := b.qp.PostRecv(&ibv.RecvWR{WRID: 5, SGList: []ibv.SGE{sg}})
		require.NoError(t, err)
		a.postSend(t, a.qp, 1, 0, 16)
		wc := b.waitWC(t, b.rcq)
		require.Equal(t, ibv.WCLocProtErr, wc.Status, "%s", wc.Status)
		require.Equal(t, uint64(5), wc.WRID)
		sw := a.waitWC(t, a.scq)
		require.NotEqual(t, ibv.WCSuccess, sw.Status, "the sender must not succeed")
	})
	t.Run("recv outside mr", func(t *testing.T) {
		a, b := pair(t, f, defaults(), defaults())
		_, err := b.qp.PostRecv(&ibv.RecvWR{WRID: 5, SGList: []ibv.SGE{b.sge(bufLen-8, 64)}})
		require.NoError(t, err)
		a.postSend(t, a.qp, 1, 0, 16)
		wc := b.waitWC(t, b.rcq)
		require.Equal(t, ibv.WCLocProtErr, wc.Status, "%s", wc.Status)
	})
}

// testStateMachine: RESET→INIT→RTR→RTS with required attributes checked, no state skipped,
// a RECV posted in INIT kept, →ERR flushing it and →RESET from anywhere. Posting in a
// state that cannot send is testPostStateChecked's.
func testStateMachine(t *testing.T, f Fixture) {
	a := newSide(t, f, f.DevA, defaults())
	b := newSide(t, f, f.DevB, defaults())
	qp, err := a.pd.CreateQP(ibv.QPInitAttr{SendCQ: a.scq, RecvCQ: a.rcq, Type: ibv.QPTypeRC,
		Cap: ibv.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, qp.Destroy()) })
	o := defaults()
	recv := &ibv.RecvWR{WRID: 1, SGList: []ibv.SGE{a.sge(recvBase, 16)}}

	// RESET: no skipping states, INIT needs its attributes.
	require.Equal(t, ibv.QPSReset, qp.State())
	require.ErrorIs(t, qp.Modify(rtrAttr(a, b, b.qp.QPNum(), o), rtrMask), ibv.ErrInvalid, "RESET→RTR")
	require.ErrorIs(t, qp.Modify(&ibv.QPAttr{QPState: ibv.QPSInit, PortNum: 1}, ibv.AttrState|ibv.AttrPort|ibv.AttrAccessFlags),
		ibv.ErrInvalid, "RESET→INIT without PKEY_INDEX")
	require.Equal(t, ibv.QPSReset, qp.State())
	require.NoError(t, toInit(qp))
	require.Equal(t, ibv.QPSInit, qp.State())

	// INIT: a RECV may be posted; RTR needs all its attributes and no RTS ones.
	rbad, err := qp.PostRecv(recv)
	require.NoError(t, err, "PostRecv in INIT")
	require.Nil(t, rbad)
	require.ErrorIs(t, qp.Modify(rtsAttr(o), rtsMask), ibv.ErrInvalid, "INIT→RTS")
	for _, drop := range []ibv.QPAttrMask{ibv.AttrAV, ibv.AttrPathMTU, ibv.AttrDestQPN, ibv.AttrRqPSN,
		ibv.AttrMaxDestRdAtomic, ibv.AttrMinRNRTimer} {
		require.ErrorIs(t, qp.Modify(rtrAttr(a, b, b.qp.QPNum(), o), rtrMask&^drop), ibv.ErrInvalid,
			"INIT→RTR without %#x", uint32(drop))
	}
	require.ErrorIs(t, qp.Modify(rtrAttr(a, b, b.qp.QPNum(), o), rtrMask|ibv.AttrSqPSN), ibv.ErrInvalid,
		"INIT→RTR with SQ_PSN")
	require.Equal(t, ibv.QPSInit, qp.State())
	require.NoError(t, qp.Modify(rtrAttr(a, b, b.qp.QPNum(), o), rtrMask))
	require.Equal(t, ibv.QPSRTR, qp.State())

	// RTR: RTS needs its attributes.
	for _, drop := range []ibv.QPAttrMask{ibv.AttrSqPSN, ibv.AttrTimeout, ibv.AttrRetryCnt, ibv.AttrRnrRetry,
		ibv.AttrMaxQPRdAtomic} {
		require.ErrorIs(t, qp.Modify(rtsAttr(o), rtsMask&^drop), ibv.ErrInvalid, "RTR→RTS without %#x", uint32(drop))
	}
	require.NoError(t, qp.Modify(rtsAttr(o), rtsMask))
	require.Equal(t, ibv.QPSRTS, qp.State())
	attr, qcap, err := qp.Query()
	require.NoError(t, err)
	require.Equal(t, ibv.QPSRTS, attr.QPState)
	require.Equal(t, b.qp.QPNum(), attr.DestQPNum)
	require.Equal(t, o.timeout, attr.Timeout)
	require.GreaterOrEqual(t, qcap.MaxSendWR, uint32(4))
	require.Equal(t, qcap, qp.Cap(), "Cap is what create granted")

	// ERR flushes the RECV posted in INIT; RESET clears; INIT again.
	require.NoError(t, qp.Modify(&ibv.QPAttr{QPState: ibv.QPSErr}, ibv.AttrState))
	require.Equal(t, ibv.QPSErr, qp.State())
	wc := a.waitWC(t, a.rcq)
	require.Equal(t, ibv.WCWRFlushErr, wc.Status)
	require.Equal(t, qp.QPNum(), wc.QPNum)
	require.NoError(t, qp.Modify(&ibv.QPAttr{QPState: ibv.QPSReset}, ibv.AttrState))
	require.Equal(t, ibv.QPSReset, qp.State())
	require.NoError(t, toInit(qp))
	require.Equal(t, ibv.QPSInit, qp.State())
}

// testPostStateChecked: posting is refused with EINVAL in a state that cannot take the WR:
// RECV in RESET, SEND in RESET, INIT and RTR (the IB spec's immediate errors; ibv/soft,
// softverbs, and mlx5 since rdma-core 40).
func testPostStateChecked(t *testing.T, f Fixture) {
	a := newSide(t, f, f.DevA, defaults())
	b := newSide(t, f, f.DevB, defaults())
	qp, err := a.pd.CreateQP(ibv.QPInitAttr{SendCQ: a.scq, RecvCQ: a.rcq, Type: ibv.QPTypeRC,
		Cap: ibv.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, qp.Destroy()) })
	o := defaults()
	recv := &ibv.RecvWR{WRID: 1, SGList: []ibv.SGE{a.sge(recvBase, 16)}}
	send := &ibv.SendWR{WRID: 1, Opcode: ibv.WRSend, SGList: []ibv.SGE{a.sge(0, 16)}}
	_, err = qp.PostRecv(recv)
	require.ErrorIs(t, err, ibv.ErrInvalid, "PostRecv in RESET")
	bad, err := qp.PostSend(send)
	require.ErrorIs(t, err, ibv.ErrInvalid, "PostSend in RESET")
	require.Same(t, send, bad)
	require.NoError(t, toInit(qp))
	_, err = qp.PostSend(send)
	require.ErrorIs(t, err, ibv.ErrInvalid, "PostSend in INIT")
	require.NoError(t, qp.Modify(rtrAttr(a, b, b.qp.QPNum(), o), rtrMask))
	_, err = qp.PostSend(send)
	require.ErrorIs(t, err, ibv.ErrInvalid, "PostSend in RTR")
	require.NoError(t, qp.Modify(&ibv.QPAttr{QPState: ibv.QPSReset}, ibv.AttrState))
	_, err = qp.PostRecv(recv)
	require.ErrorIs(t, err, ibv.ErrInvalid, "PostRecv after RESET")
}

// testFlushOnErr: entering ERR flushes every outstanding WR (in order, WR_FLUSH_ERR) of both
// queues; posting in ERR completes at once with WR_FLUSH_ERR.
func testFlushOnErr(t *testing.T, f Fixture) {
	oa, ob := defaults(), defaults()
	ob.minRNRTimer = 14
	a, b := pair(t, f, oa, ob)
	for i := 0; i < 5; i++ {
		a.postRecv(t, a.qp, uint64(10+i), i*64, 64)
	}
	for i := 0; i < 3; i++ { // b has no RECV: these stay outstanding (RNR, retried forever)
		a.postSend(t, a.qp, uint64(20+i), 0, 16)
	}
	require.NoError(t, a.qp.Modify(&ibv.QPAttr{QPState: ibv.QPSErr}, ibv.AttrState))
	rw := a.waitWCs(t, a.rcq, 5)
	for i, wc := range rw {
		require.Equal(t, ibv.WCWRFlushErr, wc.Status)
		require.Equal(t, uint64(10+i), wc.WRID)
	}
	sw := a.waitWCs(t, a.scq, 3)
	for i, wc := range sw {
		require.Equal(t, ibv.WCWRFlushErr, wc.Status)
		require.Equal(t, uint64(20+i), wc.WRID)
	}
	a.postRecv(t, a.qp, 99, 0, 64)
	wc := a.waitWC(t, a.rcq)
	require.Equal(t, ibv.WCWRFlushErr, wc.Status)
	require.Equal(t, uint64(99), wc.WRID)
	_ = b
}

// testSendQueueFull: posting beyond max_send_wr is ENOMEM, and bad names the first WR left out.
func testSendQueueFull(t *testing.T, f Fixture) {
	oa := defaults()
	oa.sendWR = 4
	a, _ := pair(t, f, oa, defaults())
	_, qcap, err := a.qp.Query()
	require.NoError(t, err)
	depth := int(qcap.MaxSendWR) // hardware may grant more than asked
	for i := 0; i < depth-2; i++ {
		a.postSend(t, a.qp, uint64(i), 0, 16) // no RECV at b: all stay outstanding
	}
	var chain [3]ibv.SendWR
	for i := range chain {
		chain[i] = ibv.SendWR{WRID: uint64(100 + i), Opcode: ibv.WRSend, SendFlags: ibv.SendSignaled,
			SGList: []ibv.SGE{a.sge(0, 16)}}
		if i > 0 {
			chain[i-1].Next = &chain[i]
		}
	}
	bad, err := a.qp.PostSend(&chain[0])
	require.ErrorIs(t, err, ibv.ErrNoMem)
	require.Same(t, &chain[2], bad)
	_, err = a.qp.PostSend(&ibv.SendWR{WRID: 200, Opcode: ibv.WRSend, SGList: []ibv.SGE{a.sge(0, 16)}})
	require.ErrorIs(t, err, ibv.ErrNoMem)
}

// testRecvQueueFull: posting beyond max_recv_wr is ENOMEM.
func testRecvQueueFull(t *testing.T, f Fixture) {
	o := defaults()
	o.recvWR = 4
	a := newSide(t, f, f.DevA, o)
	_, qcap, err := a.qp.Query()
	require.NoError(t, err)
	for i := 0; i < int(qcap.MaxRecvWR); i++ {
		a.postRecv(t, a.qp, uint64(i), i*16, 16)
	}
	wr := &ibv.RecvWR{WRID: 99, SGList: []ibv.SGE{a.sge(recvBase, 16)}}
	bad, err := a.qp.PostRecv(wr)
	require.ErrorIs(t, err, ibv.ErrNoMem)
	require.Same(t, wr, bad)
}

// testUnsignaledHoldSlot: unsignaled WRs keep their send queue slots after they are done,
// until a later signaled WR completes.
func testUnsignaledHoldSlot(t *testing.T, f Fixture) {
	oa := defaults()
	oa.sendWR = 4
	a, b := pair(t, f, oa, defaults())
	_, qcap, err := a.qp.Query()
	require.NoError(t, err)
	depth := int(qcap.MaxSendWR)
	for i := 0; i < 2*depth+1; i++ {
		b.postRecv(t, b.qp, uint64(i), 0, 64)
	}
	unsignaled := func(id uint64) error {
		_, err := a.qp.PostSend(&ibv.SendWR{WRID: id, Opcode: ibv.WRSend, SGList: []ibv.SGE{a.sge(0, 16)}})
		return err
	}
	for i := 0; i < depth-1; i++ {
		require.NoError(t, unsignaled(uint64(i)))
	}
	a.postSend(t, a.qp, 50, 0, 16) // signaled: frees the slots of the ones before it
	b.waitWCs(t, b.rcq, depth)
	wc := a.waitWC(t, a.scq)
	require.Equal(t, uint64(50), wc.WRID)
	require.Equal(t, ibv.WCSuccess, wc.Status)
	requireEmpty(t, a.scq)
	for i := 0; i < depth; i++ {
		require.NoError(t, unsignaled(uint64(100+i)), "slot %d must be free after the signaled completion", i)
	}
	b.waitWCs(t, b.rcq, depth) // all delivered and acknowledged by the peer…
	require.ErrorIs(t, unsignaled(200), ibv.ErrNoMem, "…yet unsignaled WRs hold their slots")
	requireEmpty(t, a.scq)
}

// testSqSigAll: with SqSigAll every send WR completes with a WC.
func testSqSigAll(t *testing.T, f Fixture) {
	oa := defaults()
	oa.sigAll = true
	a, b := pair(t, f, oa, defaults())
	for i := 0; i < 4; i++ {
		b.postRecv(t, b.qp, uint64(i), i*64, 64)
		_, err := a.qp.PostSend(&ibv.SendWR{WRID: uint64(i), Opcode: ibv.WRSend, SGList: []ibv.SGE{a.sge(0, 16)}})
		require.NoError(t, err)
	}
	for i, wc := range a.waitWCs(t, a.scq, 4) {
		require.Equal(t, uint64(i), wc.WRID)
		require.Equal(t, ibv.WCSuccess, wc.Status)
	}
}

// testCompChannelArmOnce: the channel gives an event only for an armed CQ's new CQE, once
// per arm; GetEvent does not block. (The fd may turn readable spuriously: see waitEvent.)
func testCompChannelArmOnce(t *testing.T, f Fixture) {
	a, b := pair(t, f, defaults(), defaults())
	for i := 0; i < 4; i++ {
		b.postRecv(t, b.qp, uint64(i), i*64, 64)
	}
	_, err := b.ch.GetEvent()
	require.ErrorIs(t, err, ibv.ErrWouldBlock)

	// Not armed: a CQE makes nothing readable.
	a.postSend(t, a.qp, 1, 0, 8)
	pollCQE(t, b.rcq)
	requireNoEvent(t, b.ch, 20*time.Millisecond, "event for an unarmed CQ")

	// Armed: the next CQE fires exactly one event, then the CQ is disarmed.
	require.NoError(t, b.rcq.ReqNotify(false))
	a.postSend(t, a.qp, 2, 0, 8)
	got := waitEvent(t, b.ch, waitFor)
	require.Equal(t, b.rcq, got)
	got.AckEvents(1)
	_, err = b.ch.GetEvent()
	require.ErrorIs(t, err, ibv.ErrWouldBlock, "one arm, one event")
	requireNoEvent(t, b.ch, 0, "an event left after the only one was got")
	pollCQE(t, b.rcq)
	a.postSend(t, a.qp, 3, 0, 8)
	pollCQE(t, b.rcq)
	requireNoEvent(t, b.ch, 20*time.Millisecond, "fired again without a new arm")
	a.waitWCs(t, a.scq, 3)
}

// pollCQE polls one CQE without touching the channel.
func pollCQE(t *testing.T, cq ibv.CQ) ibv.WC {
	t.Helper()
	wcs := make([]ibv.WC, 1)
	require.Eventually(t, func() bool {
		n, err := cq.Poll(wcs)
		require.NoError(t, err)
		return n == 1
	}, waitFor, 100*time.Microsecond)
	return wcs[0]
}

// testCQDestroyBusy: a CQ with unacknowledged events cannot be destroyed (EBUSY), nor a
// channel with a CQ.
func testCQDestroyBusy(t *testing.T, f Fixture) {
	ctx := openCtx(t, f, f.DevA)
	ch, err := ctx.CreateCompChannel()
	require.NoError(t, err)
	defer func() { require.NoError(t, ch.Close()) }()
	a, b := pair(t, f, defaults(), defaults())
	cq, err := ctx.CreateCQ(4, ch)
	require.NoError(t, err)
	require.ErrorIs(t, ch.Close(), ibv.ErrBusy, "channel closed while a CQ uses it")
	require.NoError(t, cq.Destroy())

	// A CQ on b's channel gets an event; until it is acked, Destroy is EBUSY.
	require.NoError(t, b.rcq.ReqNotify(false))
	b.postRecv(t, b.qp, 1, 0, 64)
	a.postSend(t, a.qp, 1, 0, 8)
	got := waitEvent(t, b.ch, waitFor)
	pollCQE(t, b.rcq)
	require.ErrorIs(t, got.Destroy(), ibv.ErrBusy) // (its QP holds it too)
	got.AckEvents(1)
	a.waitWC(t, a.scq)

	// The ack rule alone: a CQ whose only QP took one SEND and was destroyed is still busy
	// until the event of that SEND is acked.
	cq2, err := b.ctx.CreateCQ(4, b.ch)
	require.NoError(t, err)
	cq2Live := true
	t.Cleanup(func() {
		if cq2Live {
			cq2.Destroy()
		}
	})
	qp2, err := b.pd.CreateQP(ibv.QPInitAttr{SendCQ: cq2, RecvCQ: cq2, Type: ibv.QPTypeRC,
		Cap: ibv.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	qp2Live := true
	t.Cleanup(func() {
		if qp2Live {
			qp2.Destroy()
		}
	})
	require.NoError(t, toInit(qp2))
	peer := a.newQP(t, a.o)
	connectQP(t, a, peer, b, qp2.QPNum())
	connectQP(t, b, qp2, a, peer.QPNum())
	b.postRecv(t, qp2, 2, 0, 64)
	require.NoError(t, cq2.ReqNotify(false))
	a.postSend(t, peer, 2, 0, 8)
	ev := waitEvent(t, b.ch, waitFor)
	require.Equal(t, cq2, ev)
	require.Equal(t, ibv.WCSuccess, pollCQE(t, cq2).Status)
	require.Equal(t, ibv.WCSuccess, a.waitWC(t, a.scq).Status, "the SEND is acknowledged before its peer goes")
	qp2Live = false
	require.NoError(t, qp2.Destroy())
	require.ErrorIs(t, cq2.Destroy(), ibv.ErrBusy, "destroyed with an unacked event")
	ev.AckEvents(1)
	cq2Live = false
	require.NoError(t, cq2.Destroy())
}

// testInjectWC (ibv/soft): an injected CQE is polled and wakes an armed CQ.
func testInjectWC(t *testing.T, f Fixture) {
	needFaults(t, f)
	a := newSide(t, f, f.DevA, defaults())
	require.NoError(t, a.rcq.ReqNotify(false))
	err := f.Faults.InjectWC(a.rcq, ibv.WC{WRID: 77, Status: ibv.WCSuccess, Opcode: ibv.WCRecv, ByteLen: 3})
	skipUnsupported(t, err)
	require.NoError(t, err)
	got := waitEvent(t, a.ch, waitFor)
	require.Equal(t, a.rcq, got)
	got.AckEvents(1)
	wc := pollCQE(t, a.rcq)
	require.Equal(t, uint64(77), wc.WRID)
	require.Equal(t, uint32(3), wc.ByteLen)
}

// testCQOverrun: more CQEs than the CQ holds raise EventCQErr, and the QP that overran it
// goes to ERR.
func testCQOverrun(t *testing.T, f Fixture) {
	ob := defaults()
	ob.cqe = 4
	a, b := pair(t, f, defaults(), ob)
	n := b.rcq.CQE() + 2
	for i := 0; i < n; i++ {
		b.postRecv(t, b.qp, uint64(i), 0, 64)
	}
	for i := 0; i < n; i++ {
		_, err := a.qp.PostSend(&ibv.SendWR{WRID: uint64(i), Opcode: ibv.WRSend, SGList: []ibv.SGE{a.sge(0, 8)}})
		require.NoError(t, err)
	}
	deadline := time.Now().Add(waitFor)
	for {
		require.True(t, time.Now().Before(deadline), "no EventCQErr")
		if !pollFd(t, b.ctx.AsyncFd(), time.Until(deadline)) {
			continue
		}
		ev, err := b.ctx.GetAsyncEvent()
		if errors.Is(err, ibv.ErrWouldBlock) {
			continue
		}
		require.NoError(t, err)
		b.ctx.AckAsyncEvent(ev)
		if ev.Type == ibv.EventCQErr {
			require.Equal(t, b.rcq, ev.CQ)
			break
		}
	}
	waitState(t, b.qp, ibv.QPSErr)
}

// testForeignSourceNotAcked: a SEND from a QP other than the one b's QP is connected to is
// never acknowledged to its sender: b's QP answers its connected peer only, so the stranger
// retries, then fails with RETRY_EXC_ERR. (Whether b places it is up to the NIC:
// testForgedPacketDropped.)
func testForeignSourceNotAcked(t *testing.T, f Fixture) {
	o := fastRetry()
	a, b := pair(t, f, o, o)
	b.postRecv(t, b.qp, 1, 0, 64)
	stranger := a.newQP(t, o)
	connectQP(t, a, stranger, b, b.qp.QPNum())
	_, err := stranger.PostSend(&ibv.SendWR{WRID: 66, Opcode: ibv.WRSend, SendFlags: ibv.SendSignaled,
		SGList: []ibv.SGE{a.sge(0, 16)}})
	require.NoError(t, err)
	wc := a.waitWC(t, a.scq)
	require.Equal(t, uint64(66), wc.WRID)
	require.Equal(t, stranger.QPNum(), wc.QPNum)
	require.Equal(t, ibv.WCRetryExcErr, wc.Status, "the stranger's SEND must never be acknowledged to it: %s", wc.Status)
}

// testForgedPacketDropped (ibv/soft): a QP takes packets only from the GID/QPN it was
// connected to; the stranger's SEND is dropped, counted, and the genuine one lands.
func testForgedPacketDropped(t *testing.T, f Fixture) {
	a, b := pair(t, f, defaults(), defaults()) // the genuine SEND below must succeed
	b.postRecv(t, b.qp, 1, 0, 64)
	// A stranger QP on a's device points at b's QP, which is connected to a.qp only.
	stranger := a.newQP(t, fastRetry())
	connectQP(t, a, stranger, b, b.qp.QPNum())
	var c0 Counters
	if f.Faults != nil {
		c0 = counters(t, f, b.ctx)
	}
	a.buf[0] = 0xee
	_, err := stranger.PostSend(&ibv.SendWR{WRID: 66, Opcode: ibv.WRSend, SendFlags: ibv.SendSignaled,
		SGList: []ibv.SGE{a.sge(0, 16)}})
	require.NoError(t, err)
	wc := a.waitWC(t, a.scq)
	require.Equal(t, uint64(66), wc.WRID)
	require.Equal(t, ibv.WCRetryExcErr, wc.Status, "the forged SEND must never be acknowledged: %s", wc.Status)
	if f.Faults != nil {
		require.Greater(t, counters(t, f, b.ctx).ForgedDropped, c0.ForgedDropped)
	}
	requireEmpty(t, b.rcq)
	a.buf[0] = 0x11
	a.postSend(t, a.qp, 1, 0, 16)
	rw := b.waitWC(t, b.rcq)
	require.Equal(t, ibv.WCSuccess, rw.Status)
	require.Equal(t, byte(0x11), b.buf[recvBase], "the RECV holds the genuine SEND")
	require.Equal(t, ibv.WCSuccess, a.waitWC(t, a.scq).Status)
}

// testPhantomDeviceDown: the phantom device is listed with its port DOWN.
func testPhantomDeviceDown(t *testing.T, f Fixture) {
	if f.Phantom == "" {
		t.Skip("no phantom device")
	}
	devs, err := f.Provider.GetDeviceList()
	require.NoError(t, err)
	found := false
	for _, d := range devs {
		if d.Name != f.Phantom {
			continue
		}
		found = true
		_, active := d.ActivePort()
		require.False(t, active, "phantom %s has an active port", d.Name)
		require.NotEmpty(t, d.Ports)
		require.Equal(t, ibv.PortDown, d.Ports[0].State)
	}
	require.True(t, found, "phantom %s not listed", f.Phantom)
	for _, name := range []string{f.DevA, f.DevB} {
		for _, d := range devs {
			if d.Name == name {
				_, active := d.ActivePort()
				require.True(t, active, "%s must be active", name)
			}
		}
	}
}

// testMR: an MR describes its memory.
func testMR(t *testing.T, f Fixture) {
	ctx := openCtx(t, f, f.DevA)
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	buf := make([]byte, 4096)
	mr, err := pd.RegMR(buf, ibv.AccessLocalWrite)
	require.NoError(t, err)
	require.Equal(t, 4096, mr.Len())
	require.Equal(t, ibv.AccessLocalWrite, mr.Access())
	require.NotZero(t, mr.Addr())
	require.Same(t, &buf[0], &mr.Buf()[0])
	require.ErrorIs(t, pd.Dealloc(), ibv.ErrBusy, "PD with an MR")
	require.NoError(t, mr.Dereg())
	require.NoError(t, pd.Dealloc())
}
