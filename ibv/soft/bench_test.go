package soft_test

import (
	"encoding/binary"
	"errors"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/ibv/soft"
)

// end is one side of a benchmark connection.
type end struct {
	ctx ibv.Context
	pd  ibv.PD
	mr  ibv.MR
	buf []byte
	ch  ibv.CompChannel
	scq ibv.CQ
	rcq ibv.CQ
	qp  ibv.QP
	ep  int // epoll fd watching ch
}

func newEnd(tb testing.TB, p ibv.Provider, dev string, depth uint32) *end {
	e := &end{buf: make([]byte, 1<<20)}
	var err error
	e.ctx, err = p.Open(dev)
	require.NoError(tb, err)
	e.pd, err = e.ctx.AllocPD()
	require.NoError(tb, err)
	e.mr, err = e.pd.RegMR(e.buf, ibv.AccessLocalWrite)
	require.NoError(tb, err)
	e.ch, err = e.ctx.CreateCompChannel()
	require.NoError(tb, err)
	e.scq, err = e.ctx.CreateCQ(int(2*depth), e.ch)
	require.NoError(tb, err)
	e.rcq, err = e.ctx.CreateCQ(int(2*depth), e.ch)
	require.NoError(tb, err)
	e.qp, err = e.pd.CreateQP(ibv.QPInitAttr{SendCQ: e.scq, RecvCQ: e.rcq, Type: ibv.QPTypeRC,
		Cap: ibv.QPCap{MaxSendWR: depth, MaxRecvWR: depth, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 256}})
	require.NoError(tb, err)
	require.NoError(tb, e.qp.Modify(&ibv.QPAttr{QPState: ibv.QPSInit, PortNum: 1, QPAccessFlags: ibv.AccessLocalWrite},
		ibv.AttrState|ibv.AttrPKeyIndex|ibv.AttrPort|ibv.AttrAccessFlags))
	e.ep, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	require.NoError(tb, err)
	require.NoError(tb, unix.EpollCtl(e.ep, unix.EPOLL_CTL_ADD, e.ch.Fd(), &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(e.ch.Fd())}))
	return e
}

func (e *end) connect(tb testing.TB, r *end) { e.connectTimeout(tb, r, benchTimeout) }

// connectTimeout takes e to RTS towards r with the local ACK timeout given (IB encoding).
func (e *end) connectTimeout(tb testing.TB, r *end, timeout uint8) {
	pa, err := r.ctx.QueryPort(1)
	require.NoError(tb, err)
	require.NoError(tb, e.qp.Modify(&ibv.QPAttr{QPState: ibv.QPSRTR, PathMTU: ibv.MTU4096, DestQPNum: r.qp.QPNum(),
		MinRNRTimer: 1, AHAttr: ibv.AHAttr{IsGlobal: true, DGID: pa.GID, PortNum: 1}},
		ibv.AttrState|ibv.AttrAV|ibv.AttrPathMTU|ibv.AttrDestQPN|ibv.AttrRqPSN|ibv.AttrMaxDestRdAtomic|ibv.AttrMinRNRTimer))
	require.NoError(tb, e.qp.Modify(&ibv.QPAttr{QPState: ibv.QPSRTS, Timeout: timeout, RetryCnt: 7, RnrRetry: 7},
		ibv.AttrState|ibv.AttrSqPSN|ibv.AttrTimeout|ibv.AttrRetryCnt|ibv.AttrRnrRetry|ibv.AttrMaxQPRdAtomic))
}

func (e *end) close(tb testing.TB) {
	require.NoError(tb, e.qp.Destroy())
	require.NoError(tb, e.scq.Destroy())
	require.NoError(tb, e.rcq.Destroy())
	require.NoError(tb, e.ch.Close())
	require.NoError(tb, e.mr.Dereg())
	require.NoError(tb, e.pd.Dealloc())
	require.NoError(tb, e.ctx.Close())
	unix.Close(e.ep)
}

func (e *end) sge(off, n int) ibv.SGE {
	return ibv.SGE{Addr: e.mr.Addr() + uint64(off), Length: uint32(n), LKey: e.mr.LKey()}
}

// spinBudget is how long a spinning consumer polls before it sleeps on the channel.
const spinBudget = 50 * time.Microsecond

// wait blocks until cq yields at least one WC into wcs: poll, arm, poll, epoll_wait on the
// channel; with spin it first polls for up to spinBudget. It gives up (0) when stop is set.
func (e *end) wait(cq ibv.CQ, wcs []ibv.WC, spin bool, stop *atomic.Bool) int {
	var evs [4]unix.EpollEvent
	if spin {
		for t0 := mono(); mono()-t0 < int64(spinBudget); {
			if n, _ := cq.Poll(wcs); n > 0 {
				return n
			}
		}
	}
	for !stop.Load() {
		if n, _ := cq.Poll(wcs); n > 0 {
			return n
		}
		_ = cq.ReqNotify(false)
		if n, _ := cq.Poll(wcs); n > 0 {
			return n
		}
		_, _ = unix.EpollWait(e.ep, evs[:], 100)
		for {
			c, err := e.ch.GetEvent()
			if errors.Is(err, ibv.ErrWouldBlock) || err != nil {
				break
			}
			c.AckEvents(1)
		}
	}
	return 0
}

func p50(v []int64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return float64(v[len(v)/2])
}

func p99(v []int64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return float64(v[len(v)*99/100])
}

var benchEpoch = time.Now()

func mono() int64 { return int64(time.Since(benchEpoch)) }

// BenchmarkSendRecvLatency measures one-way SEND→RECV completion latency between two soft
// devices: a stamps the SEND with the time, b's consumer reads its RECV WC and records the
// difference, then answers so that messages never overlap. Consumers run on locked OS
// threads and either wait on the completion channel with epoll or spin on the CQ for up to
// spinBudget first. inproc: both devices in this provider (the default); tcp: the packets
// go through the devices' TCP connection, as between processes.
func BenchmarkSendRecvLatency(b *testing.B) {
	for _, mode := range []struct {
		name   string
		spin   bool
		inproc bool
	}{{"inproc-epoll", false, true}, {"inproc-spin", true, true}, {"tcp-epoll", false, false}, {"tcp-spin", true, false}} {
		b.Run(mode.name, func(b *testing.B) {
			p := soft.New(soft.WithDevices(2), soft.WithInProcess(mode.inproc))
			A, B := newEnd(b, p, "soft0", 64), newEnd(b, p, "soft1", 64)
			A.connect(b, B)
			B.connect(b, A)
			defer A.close(b)
			defer B.close(b)
			for i := 0; i < 64; i++ {
				_, err := A.qp.PostRecv(&ibv.RecvWR{WRID: uint64(i), SGList: []ibv.SGE{A.sge(4096+i*64, 64)}})
				require.NoError(b, err)
				_, err = B.qp.PostRecv(&ibv.RecvWR{WRID: uint64(i), SGList: []ibv.SGE{B.sge(4096+i*64, 64)}})
				require.NoError(b, err)
			}
			oneway := make([]int64, 0, b.N)
			var stop atomic.Bool
			var wg sync.WaitGroup
			wg.Add(1)
			n := b.N
			go func() { // b: echo
				defer wg.Done()
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				wcs := make([]ibv.WC, 4)
				swcs := make([]ibv.WC, 16)
				wr := &ibv.SendWR{Opcode: ibv.WRSend, SendFlags: ibv.SendInline | ibv.SendSignaled, SGList: []ibv.SGE{B.sge(0, 8)}}
				rwr := &ibv.RecvWR{SGList: []ibv.SGE{{}}}
				for got := 0; got < n; {
					k := B.wait(B.rcq, wcs, mode.spin, &stop)
					if k == 0 {
						return
					}
					now := mono()
					for _, wc := range wcs[:k] {
						off := 4096 + int(wc.WRID)*64
						oneway = append(oneway, now-int64(binary.LittleEndian.Uint64(B.buf[off:])))
						rwr.WRID, rwr.SGList[0] = wc.WRID, B.sge(off, 64)
						_, _ = B.qp.PostRecv(rwr)
						_, _ = B.qp.PostSend(wr)
						got++
					}
					_, _ = B.scq.Poll(swcs)
				}
			}()
			runtime.LockOSThread()
			wcs := make([]ibv.WC, 4)
			swcs := make([]ibv.WC, 16)
			wr := &ibv.SendWR{Opcode: ibv.WRSend, SendFlags: ibv.SendInline | ibv.SendSignaled, SGList: []ibv.SGE{A.sge(0, 8)}}
			rwr := &ibv.RecvWR{SGList: []ibv.SGE{{}}}
			b.ResetTimer()
			for i := 0; i < n; i++ {
				binary.LittleEndian.PutUint64(A.buf[0:], uint64(mono()))
				if _, err := A.qp.PostSend(wr); err != nil {
					b.Fatal(err)
				}
				k := A.wait(A.rcq, wcs, mode.spin, &stop)
				if k == 0 {
					b.Fatal("no reply")
				}
				for _, wc := range wcs[:k] {
					rwr.WRID, rwr.SGList[0] = wc.WRID, A.sge(4096+int(wc.WRID)*64, 64)
					_, _ = A.qp.PostRecv(rwr)
				}
				_, _ = A.scq.Poll(swcs)
			}
			b.StopTimer()
			runtime.UnlockOSThread()
			stop.Store(true)
			wg.Wait()
			b.ReportMetric(p50(oneway), "p50-ns")
			b.ReportMetric(p99(oneway), "p99-ns")
		})
	}
}

// BenchmarkMessageRate measures pipelined 64-byte SENDs per second on one QP pair: a keeps
// up to depth SENDs in flight (bounded by the RECVs b has posted), b reaps and reposts.
func BenchmarkMessageRate(b *testing.B) {
	for _, mode := range []struct {
		name     string
		inproc   bool
		coalesce bool
	}{{"inproc", true, true}, {"tcp-coalesce", false, true}, {"tcp-nocoalesce", false, false}} {
		b.Run(mode.name, func(b *testing.B) {
			const depth = 512
			p := soft.New(soft.WithDevices(2), soft.WithCoalesce(mode.coalesce), soft.WithInProcess(mode.inproc))
			A, B := newEnd(b, p, "soft0", depth), newEnd(b, p, "soft1", depth)
			A.connect(b, B)
			B.connect(b, A)
			defer A.close(b)
			defer B.close(b)
			for i := 0; i < depth; i++ {
				_, err := B.qp.PostRecv(&ibv.RecvWR{WRID: uint64(i), SGList: []ibv.SGE{B.sge(i*64, 64)}})
				require.NoError(b, err)
			}
			var received atomic.Int64
			credit := make(chan struct{}, 1)
			var stop atomic.Bool
			var wg sync.WaitGroup
			wg.Add(1)
			n := b.N
			go func() {
				defer wg.Done()
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				wcs := make([]ibv.WC, 64)
				rwrs := make([]ibv.RecvWR, 64)
				for got := 0; got < n; {
					k := B.wait(B.rcq, wcs, false, &stop)
					if k == 0 {
						return
					}
					for j, wc := range wcs[:k] {
						rwrs[j] = ibv.RecvWR{WRID: wc.WRID, SGList: rwrs[j].SGList[:0]}
						rwrs[j].SGList = append(rwrs[j].SGList, B.sge(int(wc.WRID)*64, 64))
						if j > 0 {
							rwrs[j-1].Next = &rwrs[j]
						}
					}
					rwrs[k-1].Next = nil
					if _, err := B.qp.PostRecv(&rwrs[0]); err != nil {
						panic(err)
					}
					got += k
					received.Add(int64(k))
					select {
					case credit <- struct{}{}:
					default:
					}
				}
			}()
			runtime.LockOSThread()
			wcs := make([]ibv.WC, 64)
			wr := &ibv.SendWR{Opcode: ibv.WRSend, SGList: []ibv.SGE{A.sge(0, 64)}}
			const sigEvery = 16
			inflight := 0 // send slots held (released 16 at a time by signaled WCs)
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < n; i++ {
				for i%sigEvery == 0 && inflight+sigEvery > depth {
					k := A.wait(A.scq, wcs, false, &stop)
					inflight -= k * sigEvery
				}
				for int64(i)-received.Load() >= depth { // b has no RECV left: wait for its reposts
					select {
					case <-credit:
					case <-time.After(time.Second):
						b.Fatal("receiver stalled")
					}
				}
				wr.WRID = uint64(i)
				wr.SendFlags = 0
				if i%sigEvery == sigEvery-1 {
					wr.SendFlags = ibv.SendSignaled
				}
				if _, err := A.qp.PostSend(wr); err != nil {
					b.Fatal(err)
				}
				if i%sigEvery == 0 {
					inflight += sigEvery
				}
			}
			for received.Load() < int64(n) {
				runtime.Gosched()
				if k, _ := A.scq.Poll(wcs); k > 0 {
					inflight -= k * sigEvery
				}
			}
			el := time.Since(start)
			b.StopTimer()
			runtime.UnlockOSThread()
			stop.Store(true)
			wg.Wait()
			b.ReportMetric(float64(n)/el.Seconds(), "msgs/s")
		})
	}
}

// BenchmarkRawTCPPingPong is the floor: TCP loopback ping-pong of 64 bytes between two
// locked OS threads doing blocking read/write with x/sys/unix. It reports half the round
// trip (p50), the figure a soft one-way latency is compared with.
func BenchmarkRawTCPPingPong(b *testing.B) {
	lfd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(b, err)
	defer unix.Close(lfd)
	require.NoError(b, unix.Bind(lfd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	require.NoError(b, unix.Listen(lfd, 1))
	sa, err := unix.Getsockname(lfd)
	require.NoError(b, err)
	cfd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(b, err)
	defer unix.Close(cfd)
	require.NoError(b, unix.Connect(cfd, sa))
	sfd, _, err := unix.Accept(lfd)
	require.NoError(b, err)
	defer unix.Close(sfd)
	for _, fd := range []int{cfd, sfd} {
		require.NoError(b, unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1))
	}
	readFull := func(fd int, p []byte) bool {
		for len(p) > 0 {
			n, err := unix.Read(fd, p)
			if err == unix.EINTR {
				continue
			}
			if err != nil || n <= 0 {
				return false
			}
			p = p[n:]
		}
		return true
	}
	n := b.N
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		buf := make([]byte, 64)
		for i := 0; i < n; i++ {
			if !readFull(sfd, buf) {
				return
			}
			_, _ = unix.Write(sfd, buf)
		}
	}()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	buf := make([]byte, 64)
	half := make([]int64, 0, n)
	b.ResetTimer()
	for i := 0; i < n; i++ {
		t0 := mono()
		_, _ = unix.Write(cfd, buf)
		if !readFull(cfd, buf) {
			b.Fatal("short read")
		}
		half = append(half, (mono()-t0)/2)
	}
	b.StopTimer()
	wg.Wait()
	b.ReportMetric(p50(half), "p50-ns")
}

var benchTimeout uint8 = 14
