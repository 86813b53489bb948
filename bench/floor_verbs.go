package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/twosided/twosided/ibv"
)

// The verbs floors: what an RC SEND/RECV exchange costs on the device an rdma_twosided
// engine would use (the NIC, its provider library and, for the verbs provider, cgo), with
// no engine, reactor or protocol. Written directly on package ibv, the way rdma-core's
// ibv_rc_pingpong is written on libibverbs: one RC QP per connection, a locked thread per
// end, the QP numbers exchanged over a TCP connection.
//
// floor-verbs waits for completions with a completion channel (ibv_rc_pingpong -e);
// floor-verbs-spin polls the CQ without sleeping (ibv_rc_pingpong's default). A message is
// one SEND; the receiver answers each with a one-byte SEND, so a send returns once the
// receiver's thread has the message, as floor-block's does: the latency scenario's rtt/2 is
// ibv_rc_pingpong's µs/iter halved. In the burst scenario the sender keeps the window of
// messages in flight on the one QP and counts the answers.

// verbsWait bounds one wait for a completion; a floor that waits longer failed.
const verbsWait = 10 * time.Second

// verbsDevice is an open device, its PD and the port and GID a QP uses: the device an
// engine of this process takes (real providers before the soft one), restricted to
// provider when it is set.
type verbsDevice struct {
	ctx      ibv.Context
	pd       ibv.PD
	port     ibv.PortAttr
	gid      ibv.GIDEntry
	name     string
	provider string
}

func openVerbsDevice(provider string) (*verbsDevice, error) {
	devs, err := ibv.GetDeviceList()
	if err != nil && len(devs) == 0 {
		return nil, fmt.Errorf("bench: verbs floor: %w", err)
	}
	slices.SortStableFunc(devs, func(a, b ibv.DeviceInfo) int {
		sa, sb := a.Provider == "soft", b.Provider == "soft"
		switch {
		case sa == sb:
			return 0
		case sb:
			return -1
		}
		return 1
	})
	var errs []error
	for _, d := range devs {
		if provider != "" && d.Provider != provider {
			continue
		}
		port, ok := d.ActivePort()
		if !ok {
			continue
		}
		ctx, err := ibv.OpenDevice(d.Provider, d.Name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if pa, err := ctx.QueryPort(port.Num); err == nil {
			port = pa
		}
		gid, err := ibv.SelectGID(port, -1)
		if err != nil {
			_ = ctx.Close()
			errs = append(errs, err)
			continue
		}
		pd, err := ctx.AllocPD()
		if err != nil {
			_ = ctx.Close()
			errs = append(errs, err)
			continue
		}
		return &verbsDevice{ctx: ctx, pd: pd, port: port, gid: gid, name: d.Provider + ":" + d.Name, provider: d.Provider}, nil
	}
	what := "any provider"
	if provider != "" {
		what = "provider " + provider
	}
	return nil, fmt.Errorf("bench: verbs floor: no device with an active port on %s: %w", what, errors.Join(append([]error{ibv.ErrNoDevice}, errs...)...))
}

func (d *verbsDevice) close() {
	_ = d.pd.Dealloc()
	_ = d.ctx.Close()
}

// qpInfo is what the two ends of a verbs floor connection exchange: rc_pingpong's
// LID:QPN:PSN:GID, and the MTU.
type qpInfo struct {
	QPN uint32
	PSN uint32
	LID uint16
	MTU ibv.MTU
	GID ibv.GID
}

const qpInfoLen = 4 + 4 + 2 + 1 + 16

func (q qpInfo) encode() []byte {
	b := make([]byte, 0, qpInfoLen)
	b = binary.LittleEndian.AppendUint32(b, q.QPN)
	b = binary.LittleEndian.AppendUint32(b, q.PSN)
	b = binary.LittleEndian.AppendUint16(b, q.LID)
	b = append(b, byte(q.MTU))
	return append(b, q.GID[:]...)
}

func decodeQPInfo(b []byte) qpInfo {
	q := qpInfo{QPN: binary.LittleEndian.Uint32(b), PSN: binary.LittleEndian.Uint32(b[4:]),
		LID: binary.LittleEndian.Uint16(b[8:]), MTU: ibv.MTU(b[10])}
	copy(q.GID[:], b[11:])
	return q
}

// verbsEnd is one end of a verbs floor connection: a QP, its CQ (and completion channel
// unless it spins), a send ring and a receive ring of nRecv buffers of slot bytes.
type verbsEnd struct {
	dev      *verbsDevice
	spin     bool
	cc       ibv.CompChannel
	cq       ibv.CQ
	qp       ibv.QP
	slot     int
	nSend    int
	nRecv    int
	sendBuf  []byte
	recvBuf  []byte
	sendMR   ibv.MR
	recvMR   ibv.MR
	inline   bool
	psn      uint32
	wcs      []ibv.WC
	swr      ibv.SendWR
	ssge     [1]ibv.SGE
	rwr      ibv.RecvWR
	rsge     [1]ibv.SGE
	armed    bool
	pollFds  [1]unix.PollFd
	recvSeen int64 // RECV completions so far
	sendSeen int64 // SEND completions so far
}

func newVerbsEnd(dev *verbsDevice, spin bool, slot, nSend, nRecv int) (*verbsEnd, error) {
	e := &verbsEnd{dev: dev, spin: spin, slot: slot, nSend: nSend, nRecv: nRecv, wcs: make([]ibv.WC, 64)}
	ok := false
	defer func() {
		if !ok {
			e.close()
		}
	}()
	if !spin {
		cc, err := dev.ctx.CreateCompChannel()
		if err != nil {
			return nil, fmt.Errorf("bench: verbs floor: completion channel: %w", err)
		}
		e.cc = cc
	}
	cq, err := dev.ctx.CreateCQ(nSend+nRecv, e.cc)
	if err != nil {
		return nil, fmt.Errorf("bench: verbs floor: cq: %w", err)
	}
	e.cq = cq
	// Inline sends for small messages, as a NIC's driver would take them; a device that
	// refuses the inline size gets a QP without.
	attr := ibv.QPInitAttr{SendCQ: e.cq, RecvCQ: e.cq, Type: ibv.QPTypeRC,
		Cap: ibv.QPCap{MaxSendWR: uint32(nSend), MaxRecvWR: uint32(nRecv), MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: uint32(min(slot, 256))}}
	qp, err := dev.pd.CreateQP(attr)
	if err != nil {
		attr.Cap.MaxInlineData = 0
		if qp, err = dev.pd.CreateQP(attr); err != nil {
			return nil, fmt.Errorf("bench: verbs floor: qp: %w", err)
		}
	}
	e.qp = qp
	e.inline = int(e.qp.Cap().MaxInlineData) >= slot
	if err := e.qp.Modify(&ibv.QPAttr{QPState: ibv.QPSInit, PortNum: dev.port.Num, QPAccessFlags: ibv.AccessLocalWrite},
		ibv.AttrState|ibv.AttrPKeyIndex|ibv.AttrPort|ibv.AttrAccessFlags); err != nil {
		return nil, fmt.Errorf("bench: verbs floor: qp to INIT: %w", err)
	}
	e.sendBuf, e.recvBuf = make([]byte, nSend*slot), make([]byte, nRecv*slot)
	smr, err := dev.pd.RegMR(e.sendBuf, ibv.AccessLocalWrite)
	if err != nil {
		return nil, fmt.Errorf("bench: verbs floor: send mr: %w", err)
	}
	e.sendMR = smr
	rmr, err := dev.pd.RegMR(e.recvBuf, ibv.AccessLocalWrite)
	if err != nil {
		return nil, fmt.Errorf("bench: verbs floor: recv mr: %w", err)
	}
	e.recvMR = rmr
	e.swr.SGList, e.rwr.SGList = e.ssge[:], e.rsge[:]
	for i := range nRecv {
		if err := e.postRecv(i); err != nil {
			return nil, err
		}
	}
	e.psn = uint32(nanotime()) & 0xffffff
	if !spin {
		if err := e.cq.ReqNotify(false); err != nil {
			return nil, fmt.Errorf("bench: verbs floor: arm cq: %w", err)
		}
		e.armed = true
		e.pollFds[0] = unix.PollFd{Fd: int32(e.cc.Fd()), Events: unix.POLLIN}
	}
	ok = true
	return e, nil
}

func (e *verbsEnd) local() qpInfo {
	return qpInfo{QPN: e.qp.QPNum(), PSN: e.psn, LID: e.dev.port.LID, MTU: e.dev.port.ActiveMTU, GID: e.dev.gid.GID}
}

// connect moves the QP to RTR and RTS towards peer (rc_pingpong's pp_connect_ctx).
func (e *verbsEnd) connect(peer qpInfo) error {
	mtu := e.dev.port.ActiveMTU
	if peer.MTU.Valid() {
		mtu = ibv.MinMTU(mtu, peer.MTU)
	}
	ah := ibv.AHAttr{DLID: peer.LID, PortNum: e.dev.port.Num}
	if !peer.GID.IsZero() {
		ah.IsGlobal, ah.DGID, ah.SGIDIndex, ah.HopLimit = true, peer.GID, uint8(e.dev.gid.Index), 1
	}
	if err := e.qp.Modify(&ibv.QPAttr{QPState: ibv.QPSRTR, PathMTU: mtu, AHAttr: ah, DestQPNum: peer.QPN,
		RqPSN: peer.PSN, MaxDestRdAtomic: 1, MinRNRTimer: 12},
		ibv.AttrState|ibv.AttrAV|ibv.AttrPathMTU|ibv.AttrDestQPN|ibv.AttrRqPSN|ibv.AttrMaxDestRdAtomic|ibv.AttrMinRNRTimer); err != nil {
		return fmt.Errorf("bench: verbs floor: qp to RTR: %w", err)
	}
	if err := e.qp.Modify(&ibv.QPAttr{QPState: ibv.QPSRTS, SqPSN: e.psn, Timeout: 14, RetryCnt: 7, RnrRetry: 7, MaxRdAtomic: 1},
		ibv.AttrState|ibv.AttrSqPSN|ibv.AttrTimeout|ibv.AttrRetryCnt|ibv.AttrRnrRetry|ibv.AttrMaxQPRdAtomic); err != nil {
		return fmt.Errorf("bench: verbs floor: qp to RTS: %w", err)
	}
	return nil
}

func (e *verbsEnd) postRecv(i int) error {
	e.rwr.WRID = uint64(i)
	e.rsge[0] = ibv.SGE{Addr: e.recvMR.Addr() + uint64(i*e.slot), Length: uint32(e.slot), LKey: e.recvMR.LKey()}
	if _, err := e.qp.PostRecv(&e.rwr); err != nil {
		return fmt.Errorf("bench: verbs floor: post recv: %w", err)
	}
	return nil
}

// postSend sends the first n bytes of send slot i, signaled.
func (e *verbsEnd) postSend(i, n int) error {
	e.swr.WRID, e.swr.Opcode, e.swr.SendFlags = uint64(i), ibv.WRSend, ibv.SendSignaled
	if e.inline {
		e.swr.SendFlags |= ibv.SendInline
	}
	e.ssge[0] = ibv.SGE{Addr: e.sendMR.Addr() + uint64(i*e.slot), Length: uint32(n), LKey: e.sendMR.LKey()}
	if _, err := e.qp.PostSend(&e.swr); err != nil {
		return fmt.Errorf("bench: verbs floor: post send: %w", err)
	}
	return nil
}

// poll reaps completions into e.wcs, waiting (bounded) until there is at least one, or
// until stop reports true (checked between bounded waits). It returns the completions.
func (e *verbsEnd) poll(stop func() bool) ([]ibv.WC, error) {
	deadline := nanotime() + int64(verbsWait)
	for {
		n, err := e.cq.Poll(e.wcs)
		if err != nil {
			return nil, fmt.Errorf("bench: verbs floor: poll cq: %w", err)
		}
		if n > 0 {
			for _, wc := range e.wcs[:n] {
				if wc.Status != ibv.WCSuccess {
					return nil, fmt.Errorf("bench: verbs floor: completion of wr %d: %w", wc.WRID, wc.Err())
				}
			}
			return e.wcs[:n], nil
		}
		if stop != nil && stop() {
			return nil, nil
		}
		if nanotime() > deadline {
			return nil, errDeadline
		}
		if e.spin {
			continue
		}
		if !e.armed {
			if err := e.cq.ReqNotify(false); err != nil {
				return nil, fmt.Errorf("bench: verbs floor: arm cq: %w", err)
			}
			e.armed = true
			continue // a completion that came before the arming is polled now
		}
		k, err := unix.Poll(e.pollFds[:], 100)
		if err != nil && err != unix.EINTR {
			return nil, fmt.Errorf("bench: verbs floor: wait for an event: %w", err)
		}
		if k <= 0 {
			continue
		}
		if _, err := e.cc.GetEvent(); err != nil {
			if errors.Is(err, ibv.ErrWouldBlock) {
				continue
			}
			return nil, fmt.Errorf("bench: verbs floor: get cq event: %w", err)
		}
		e.cq.AckEvents(1)
		e.armed = false
	}
}

func (e *verbsEnd) close() {
	if e.qp != nil {
		_ = e.qp.Destroy()
	}
	if e.cq != nil {
		_ = e.cq.Destroy()
	}
	if e.cc != nil {
		_ = e.cc.Close()
	}
	if e.sendMR != nil {
		_ = e.sendMR.Dereg()
	}
	if e.recvMR != nil {
		_ = e.recvMR.Dereg()
	}
}

// exchange sends ours on the TCP connection fd and reads the peer's.
func exchange(fd int, ours qpInfo) (qpInfo, error) {
	if err := writeAll(fd, ours.encode(), false); err != nil {
		return qpInfo{}, err
	}
	var b [qpInfoLen]byte
	if err := readFull(fd, b[:], false); err != nil {
		return qpInfo{}, err
	}
	return decodeQPInfo(b[:]), nil
}

// verbsNode is a verbs floor receiver: a TCP listener for the QP exchange and one locked
// thread per connection that delivers every message and answers it.
type verbsNode struct {
	dev     *verbsDevice
	spin    bool
	opts    nodeOpts
	lfd     int
	address string
	sink    *sink

	stop  atomic.Bool
	mu    sync.Mutex
	fds   []int
	wg    sync.WaitGroup
	errMu sync.Mutex
	err   error
}

func newVerbsNode(spin bool, o nodeOpts, s *sink) (*verbsNode, error) {
	dev, err := openVerbsDevice(o.provider)
	if err != nil {
		return nil, err
	}
	lfd, addr, err := tcpListen(o.host)
	if err != nil {
		dev.close()
		return nil, err
	}
	n := &verbsNode{dev: dev, spin: spin, opts: o, lfd: lfd, address: addr, sink: s}
	n.wg.Add(1)
	go n.acceptLoop()
	return n, nil
}

func (n *verbsNode) addr() string    { return n.address }
func (n *verbsNode) wakeups() uint64 { return 0 }

// slotFor is the buffer size of a run's messages.
func slotFor(o nodeOpts) int { return max(o.size, minSize, 64) }

// ringFor is the receive ring of a connection: the window and some, as a receiver that
// never lets the sender meet an RNR NAK.
func ringFor(o nodeOpts) int { return max(16, 2*o.window) }

func (n *verbsNode) acceptLoop() {
	defer n.wg.Done()
	for {
		fd, err := tcpAccept(n.lfd)
		if err != nil {
			return
		}
		n.mu.Lock()
		if n.stop.Load() {
			n.mu.Unlock()
			_ = unix.Close(fd)
			return
		}
		n.fds = append(n.fds, fd)
		n.wg.Add(1)
		n.mu.Unlock()
		go n.serve(fd)
	}
}

func (n *verbsNode) stopped() bool { return n.stop.Load() }

func (n *verbsNode) fail(err error) {
	n.errMu.Lock()
	defer n.errMu.Unlock()
	if n.err == nil {
		n.err = err
	}
}

// serve sets one connection's QP up and answers every message on it, on a locked thread.
func (n *verbsNode) serve(fd int) {
	defer n.wg.Done()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	ring := ringFor(n.opts)
	e, err := newVerbsEnd(n.dev, n.spin, slotFor(n.opts), ring, ring)
	if err != nil {
		n.fail(err)
		return
	}
	defer e.close()
	peer, err := exchange(fd, e.local())
	if err == nil {
		err = e.connect(peer)
	}
	var ready [1]byte
	if err == nil {
		err = readFull(fd, ready[:], false) // the client's QP is at RTR too
	}
	if err == nil {
		err = writeAll(fd, ready[:], false)
	}
	if err != nil {
		n.fail(err)
		return
	}
	outstanding := 0 // answers posted and not completed
	next := 0
	for {
		wcs, err := e.poll(n.stopped)
		if err != nil {
			if !n.stopped() {
				n.fail(err)
			}
			return
		}
		if wcs == nil {
			return
		}
		for _, wc := range wcs {
			if wc.Opcode != ibv.WCRecv {
				outstanding--
				continue
			}
			slot := int(wc.WRID)
			off := slot * e.slot
			n.sink.deliver(e.recvBuf[off : off+int(wc.ByteLen)])
			if err := e.postRecv(slot); err != nil {
				n.fail(err)
				return
			}
			for outstanding >= e.nSend {
				// The answer ring is full: reap before posting (bounded by poll).
				more, err := e.poll(n.stopped)
				if err != nil || more == nil {
					n.fail(err)
					return
				}
				for _, w := range more {
					if w.Opcode != ibv.WCRecv {
						outstanding--
					}
				}
			}
			if err := e.postSend(next, 1); err != nil {
				n.fail(err)
				return
			}
			next = (next + 1) % e.nSend
			outstanding++
		}
	}
}

func (n *verbsNode) close(context.Context) error {
	n.stop.Store(true)
	n.mu.Lock()
	for _, fd := range n.fds {
		_ = unix.Shutdown(fd, unix.SHUT_RDWR)
	}
	n.mu.Unlock()
	_ = unix.Shutdown(n.lfd, unix.SHUT_RDWR)
	n.wg.Wait()
	n.mu.Lock()
	for _, fd := range n.fds {
		_ = unix.Close(fd)
	}
	n.fds = nil
	n.mu.Unlock()
	_ = unix.Close(n.lfd)
	n.dev.close()
	n.errMu.Lock()
	defer n.errMu.Unlock()
	return n.err
}

func (n *verbsNode) newClient(peers []string) (client, error) {
	return &verbsClient{node: n, peers: peers, ends: make([]*verbsEnd, len(peers)), fds: make([]int, len(peers))}, nil
}

// verbsClient sends to verbs floor receivers, a QP per peer made on first use. Use it from
// one goroutine locked to its OS thread.
type verbsClient struct {
	node  *verbsNode
	peers []string
	ends  []*verbsEnd
	fds   []int
}

func (c *verbsClient) lockThread() bool { return true }

func (c *verbsClient) end(p int) (*verbsEnd, error) {
	if e := c.ends[p]; e != nil {
		return e, nil
	}
	sa, err := sockaddr(c.peers[p])
	if err != nil {
		return nil, err
	}
	fd, err := tcpConnect(sa)
	if err != nil {
		return nil, err
	}
	ring := ringFor(c.node.opts)
	e, err := newVerbsEnd(c.node.dev, c.node.spin, slotFor(c.node.opts), ring, ring)
	if err != nil {
		_ = unix.Close(fd)
		return nil, err
	}
	peer, err := exchange(fd, e.local())
	if err == nil {
		err = e.connect(peer)
	}
	var ready [1]byte
	if err == nil {
		err = writeAll(fd, ready[:], false)
	}
	if err == nil {
		err = readFull(fd, ready[:], false) // the receiver's QP is at RTR
	}
	if err != nil {
		e.close()
		_ = unix.Close(fd)
		return nil, err
	}
	c.ends[p], c.fds[p] = e, fd
	return e, nil
}

// send sends msg to peer p and returns once the peer's answer came.
func (c *verbsClient) send(_ context.Context, p int, msg []byte) error {
	e, err := c.end(p)
	if err != nil {
		return err
	}
	copy(e.sendBuf[:e.slot], msg)
	if err := e.postSend(0, len(msg)); err != nil {
		return err
	}
	sent, answered := false, false
	for !sent || !answered {
		wcs, err := e.poll(nil)
		if err != nil {
			return err
		}
		for _, wc := range wcs {
			if wc.Opcode != ibv.WCRecv {
				sent = true
				continue
			}
			answered = true
			if err := e.postRecv(int(wc.WRID)); err != nil {
				return err
			}
		}
	}
	return nil
}

// stream sends count messages of size bytes to peer 0 with up to window unanswered, on
// the caller's locked goroutine. Nothing is allocated per message.
func (c *verbsClient) stream(ctx context.Context, count int64, size, window int, deadline int64) *pumpResult {
	res := &pumpResult{call: NewHist()}
	e, err := c.end(0)
	if err != nil {
		res.firstErr, res.errors = err, 1
		return res
	}
	window = min(window, e.nSend, e.nRecv)
	msg := newMsg(size)
	var next int64
	inflight, sendsOut := 0, 0
	stop := false
	slot := 0
	for {
		if !stop && (ctx.Err() != nil || (deadline > 0 && nanotime() > deadline)) {
			stop = true
		}
		for !stop && inflight < window && sendsOut < e.nSend && next < count {
			putSeq(msg, uint64(next))
			copy(e.sendBuf[slot*e.slot:], msg)
			if err := e.postSend(slot, len(msg)); err != nil {
				res.firstErr, res.errors = err, 1
				return res
			}
			slot = (slot + 1) % e.nSend
			inflight++
			sendsOut++
			next++
		}
		if inflight == 0 && sendsOut == 0 {
			return res
		}
		wcs, err := e.poll(nil)
		if err != nil {
			res.firstErr, res.errors = err, 1
			return res
		}
		for _, wc := range wcs {
			if wc.Opcode != ibv.WCRecv {
				sendsOut--
				continue
			}
			inflight--
			res.sent++
			res.bytes += int64(len(msg))
			if err := e.postRecv(int(wc.WRID)); err != nil {
				res.firstErr, res.errors = err, 1
				return res
			}
		}
	}
}

func (c *verbsClient) close() {
	for i, e := range c.ends {
		if e != nil {
			e.close()
			c.ends[i] = nil
		}
		if c.fds[i] > 0 {
			_ = unix.Close(c.fds[i])
			c.fds[i] = 0
		}
	}
}

// verbsStream is the burst scenario over a verbs floor: one client, the window on one QP.
func (r *run) verbsStream() (*Result, error) {
	if err := r.setup(1, 1, childSpec{}); err != nil {
		return nil, err
	}
	c, err := r.senders[0].newClient(r.peers[:1])
	if err != nil {
		return nil, err
	}
	return r.runStream(c.(*verbsClient))
}
