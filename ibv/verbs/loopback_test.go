//go:build rdma

package verbs

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/twosided/twosided/ibv"
)

// waitCQ gathers want WCs from cq, following the completion rule: poll until empty, arm,
// poll again, then wait (bounded) for the channel fd and drain its events.
func waitCQ(t *testing.T, ch ibv.CompChannel, cq ibv.CQ, want int) []ibv.WC {
	t.Helper()
	var got []ibv.WC
	buf := make([]ibv.WC, 8)
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < want {
		n, err := cq.Poll(buf)
		require.NoError(t, err)
		if n > 0 {
			got = append(got, buf[:n]...)
			continue
		}
		require.NoError(t, cq.ReqNotify(false))
		if n, err = cq.Poll(buf); n > 0 {
			got = append(got, buf[:n]...)
			continue
		}
		require.NoError(t, err)
		left := time.Until(deadline)
		require.Positive(t, left, "timed out waiting for %d WCs, got %d", want, len(got))
		fds := []unix.PollFd{{Fd: int32(ch.Fd()), Events: unix.POLLIN}}
		_, err = unix.Poll(fds, int(left.Milliseconds())+1)
		if err == unix.EINTR {
			continue
		}
		require.NoError(t, err)
		events := 0
		for {
			ev, err := ch.GetEvent()
			if err == ibv.ErrWouldBlock {
				break
			}
			require.NoError(t, err)
			require.Same(t, cq, ev)
			events++
		}
		cq.AckEvents(events)
	}
	return got
}

// TestLoopbackSendRecv connects two RC QPs of one device to each other, rc_pingpong style,
// and sends one message with immediate data. It needs a device with an active port.
func TestLoopbackSendRecv(t *testing.T) {
	dev := activeDevice(t)
	port, _ := dev.ActivePort()
	ctx, err := Provider{}.Open(dev.Name)
	require.NoError(t, err)
	defer func() { require.NoError(t, ctx.Close()) }()
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	defer func() { require.NoError(t, pd.Dealloc()) }()
	ch, err := ctx.CreateCompChannel()
	require.NoError(t, err)
	defer func() { require.NoError(t, ch.Close()) }()
	cq, err := ctx.CreateCQ(64, ch)
	require.NoError(t, err)
	defer func() { require.NoError(t, cq.Destroy()) }()
	require.Same(t, ch, cq.Channel())

	buf := make([]byte, 8192)
	mr, err := pd.RegMR(buf, ibv.AccessLocalWrite)
	require.NoError(t, err)
	defer func() { require.NoError(t, mr.Dereg()) }()

	init := ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, Type: ibv.QPTypeRC,
		Cap: ibv.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}}
	a, err := pd.CreateQP(init)
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Destroy()) }()
	b, err := pd.CreateQP(init)
	require.NoError(t, err)
	defer func() { require.NoError(t, b.Destroy()) }()

	connect := func(q, peer ibv.QP) {
		require.NoError(t, q.Modify(&ibv.QPAttr{QPState: ibv.QPSInit, PortNum: port.Num, QPAccessFlags: ibv.AccessLocalWrite},
			ibv.AttrState|ibv.AttrPKeyIndex|ibv.AttrPort|ibv.AttrAccessFlags))
		rtr := ibv.QPAttr{QPState: ibv.QPSRTR, PathMTU: port.ActiveMTU, DestQPNum: peer.QPNum(),
			MaxDestRdAtomic: 1, MinRNRTimer: 12,
			AHAttr: ibv.AHAttr{DLID: port.LID, PortNum: port.Num}}
		if port.LinkLayer == "Ethernet" || port.LID == 0 {
			rtr.AHAttr.IsGlobal, rtr.AHAttr.DGID = true, port.GID
			rtr.AHAttr.SGIDIndex, rtr.AHAttr.HopLimit = uint8(port.GIDIndex), 1
		}
		require.NoError(t, q.Modify(&rtr, ibv.AttrState|ibv.AttrAV|ibv.AttrPathMTU|ibv.AttrDestQPN|
			ibv.AttrRqPSN|ibv.AttrMaxDestRdAtomic|ibv.AttrMinRNRTimer))
		require.NoError(t, q.Modify(&ibv.QPAttr{QPState: ibv.QPSRTS, Timeout: 14, RetryCnt: 7, RnrRetry: 7, MaxRdAtomic: 1},
			ibv.AttrState|ibv.AttrTimeout|ibv.AttrRetryCnt|ibv.AttrRnrRetry|ibv.AttrSqPSN|ibv.AttrMaxQPRdAtomic))
		require.Equal(t, ibv.QPSRTS, q.State())
	}
	connect(a, b)
	connect(b, a)
	attr, qcap, err := a.Query()
	require.NoError(t, err)
	require.Equal(t, b.QPNum(), attr.DestQPNum)
	require.GreaterOrEqual(t, qcap.MaxSendWR, uint32(16))

	msg := []byte("twosided over verbs")
	copy(buf, msg)
	recv := &ibv.RecvWR{WRID: 2, SGList: []ibv.SGE{{Addr: mr.Addr() + 4096, Length: 4096, LKey: mr.LKey()}}}
	_, err = b.PostRecv(recv)
	require.NoError(t, err)
	send := &ibv.SendWR{WRID: 1, Opcode: ibv.WRSendWithImm, SendFlags: ibv.SendSignaled, ImmData: 0xdeadbeef,
		SGList: []ibv.SGE{{Addr: mr.Addr(), Length: uint32(len(msg)), LKey: mr.LKey()}}}
	_, err = a.PostSend(send)
	require.NoError(t, err)

	wcs := waitCQ(t, ch, cq, 2)
	byID := map[uint64]ibv.WC{}
	for _, wc := range wcs {
		require.NoError(t, wc.Err())
		byID[wc.WRID] = wc
	}
	require.Equal(t, ibv.WCSend, byID[1].Opcode)
	r := byID[2]
	require.Equal(t, ibv.WCRecv, r.Opcode)
	require.Equal(t, uint32(len(msg)), r.ByteLen)
	require.Equal(t, uint32(0xdeadbeef), r.ImmData)
	require.NotZero(t, r.WCFlags&ibv.WCWithImm)
	require.Equal(t, b.QPNum(), r.QPNum)
	require.Equal(t, msg, buf[4096:4096+len(msg)])

	// The posting hot path allocates nothing.
	recv.Next, send.Next = nil, nil
	allocs := testing.AllocsPerRun(4, func() {
		if _, err := b.PostRecv(recv); err != nil {
			t.Fatal(err)
		}
		if _, err := a.PostSend(send); err != nil {
			t.Fatal(err)
		}
	})
	require.Zero(t, allocs)
	waitCQ(t, ch, cq, 2*5) // AllocsPerRun runs the function once more to warm up

	// PostSend stops at the first WR it cannot post and returns it; those before it are posted.
	_, err = b.PostRecv(recv)
	require.NoError(t, err)
	tooMany := make([]ibv.SGE, qcap.MaxSendSGE+1)
	for i := range tooMany {
		tooMany[i] = send.SGList[0]
	}
	w3 := &ibv.SendWR{WRID: 13, Opcode: ibv.WRSend, SendFlags: ibv.SendSignaled, SGList: send.SGList}
	w2 := &ibv.SendWR{WRID: 12, Opcode: ibv.WRSend, SendFlags: ibv.SendSignaled, SGList: tooMany, Next: w3}
	w1 := &ibv.SendWR{WRID: 11, Opcode: ibv.WRSend, SendFlags: ibv.SendSignaled, SGList: send.SGList, Next: w2}
	bad, err := a.PostSend(w1)
	require.ErrorIs(t, err, ibv.ErrInvalid)
	require.Same(t, w2, bad)
	wcs = waitCQ(t, ch, cq, 2)
	ids := []uint64{wcs[0].WRID, wcs[1].WRID}
	require.ElementsMatch(t, []uint64{11, 2}, ids)
}
