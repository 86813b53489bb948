package soft

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/twosided/twosided/ibv"
)

// counters are a device's statistics, updated by its NIC goroutines.
type counters struct {
	packetsSent, packetsRecv, bytesSent, bytesRecv atomic.Uint64
	rnrNaksSent, rnrNaksRecv, seqNaksSent          atomic.Uint64
	retryTimeouts, retransmits                     atomic.Uint64
	retryExceeded, rnrRetryExceeded                atomic.Uint64
	forgedDropped, unknownQPDropped, stateDropped  atomic.Uint64
	cutDropped, dupPackets, connsDialed            atomic.Uint64
	connsAccepted, dialFailures, cqOverruns        atomic.Uint64
	pathsLost                                      atomic.Uint64
}

// Counters is a snapshot of a soft device's statistics.
type Counters struct {
	PacketsSent, PacketsRecv uint64 // every packet, ACK/NAK included
	BytesSent, BytesRecv     uint64 // SEND payload bytes
	RNRNaksSent              uint64 // RNR NAKs this device answered (no RECV posted)
	RNRNaksRecv              uint64 // RNR NAKs this device's requesters received
	SeqNaksSent              uint64 // PSN sequence error NAKs sent
	RetryTimeouts            uint64 // local ACK timer expiries
	Retransmits              uint64 // packets sent again (timeout, RNR or sequence NAK)
	RetryExceeded            uint64 // WRs completed with WCRetryExcErr
	RNRRetryExceeded         uint64 // WRs completed with WCRNRRetryExcErr
	ForgedDropped            uint64 // packets from a GID/QPN the QP is not connected to
	UnknownQPDropped         uint64 // packets for a QPN that does not exist
	StateDropped             uint64 // packets for a QP not in RTR/RTS
	CutDropped               uint64 // packets dropped by CutLink
	DupPackets               uint64 // duplicate SENDs (already placed), ACKed again
	ConnsDialed              uint64
	ConnsAccepted            uint64
	DialFailures             uint64
	CQOverruns               uint64
	PathsLost                uint64 // idle QPs failed because their remote device went away (see qp.pathLost)
}

func (c *counters) snapshot() Counters {
	return Counters{
		PacketsSent: c.packetsSent.Load(), PacketsRecv: c.packetsRecv.Load(),
		BytesSent: c.bytesSent.Load(), BytesRecv: c.bytesRecv.Load(),
		RNRNaksSent: c.rnrNaksSent.Load(), RNRNaksRecv: c.rnrNaksRecv.Load(),
		SeqNaksSent: c.seqNaksSent.Load(), RetryTimeouts: c.retryTimeouts.Load(),
		Retransmits: c.retransmits.Load(), RetryExceeded: c.retryExceeded.Load(),
		RNRRetryExceeded: c.rnrRetryExceeded.Load(), ForgedDropped: c.forgedDropped.Load(),
		UnknownQPDropped: c.unknownQPDropped.Load(), StateDropped: c.stateDropped.Load(),
		CutDropped: c.cutDropped.Load(), DupPackets: c.dupPackets.Load(),
		ConnsDialed: c.connsDialed.Load(), ConnsAccepted: c.connsAccepted.Load(),
		DialFailures: c.dialFailures.Load(), CQOverruns: c.cqOverruns.Load(), PathsLost: c.pathsLost.Load(),
	}
}

// device is one soft NIC: a listener, its connections to other devices, its QPs and MRs.
type device struct {
	p        *Provider
	name     string
	idx      uint64
	phantom  bool
	coalesce bool
	inproc   bool
	gid      ibv.GID
	lfd      int // listening socket, -1 for the phantom
	stopfd   int // eventfd, readable once the device stops; wakes dialers and flushers
	// pfd is the progress set: an epoll fd holding every connection's socket, nested in the
	// fd of one completion channel of the device at a time (the holder), so that the holder
	// is readable when a socket is. -1 without manual progress (WithNICThread, the phantom).
	pfd int

	// The holder. A socket nested in the fd of every channel had one wake-up path per
	// channel of the process to the sets its consumers block on, and the kernel caps those
	// paths (fs/eventpoll.c path_limits: 500, 100, 50, 10 at depths 1-4 below an outermost
	// set): under a reactor's outer set the 51st channel of a process failed with EINVAL.
	// Held by one channel, each socket has one path whatever the number of channels, CQs,
	// contexts and consumers; a packet wakes the holder's consumer alone, whose progress
	// places every QP's completions and fires their channels (as a NIC raises events).
	holdMu sync.Mutex
	chans  []*channel // the open channels with an epoll fd, in no order (holdMu)
	holder *channel   // the one whose fd holds pfd; nil with no channel (holdMu)
	// holderWaited: the holder's consumer waits on its fd (its GetEvent ran since it
	// became the holder). While false, the next channel whose GetEvent runs takes the set
	// over (claim): a consumer that waits, rather than one that never looks at its fd. The
	// backstop clears it when it had to read for a consumer that did not.
	holderWaited atomic.Bool

	rtrHook atomic.Pointer[func()] // SetRTRHook: runs before every modify to RTR (tests)

	armed    atomic.Int32 // CQs with a channel armed by ReqNotify: a consumer waits on the channel
	lastPoll atomic.Int64 // nanotime of the latest consumer progress (GetEvent, Poll)
	rxMu     sync.RWMutex
	rx       map[int32]*conn // by socket fd, the connections in pfd

	// Doorbell batching: once a consumer calls Flush (a CQ's, once per turn of its loop),
	// the writes its PostSends and progress make wait for that Flush, so that what one turn
	// sends leaves in one write per connection.
	deferOut atomic.Bool
	npend    atomic.Int32
	pendMu   sync.Mutex
	pend     []*conn

	mu       sync.Mutex
	refs     int
	dead     bool
	portDown bool
	probing  map[ibv.GID]bool  // remote devices being checked after a connection to them ended (checkRemote)
	conns    map[ibv.GID]*conn // the connection used to send to each remote device
	all      map[*conn]struct{}
	qpMu     sync.RWMutex
	qps      map[uint32]*qp
	ctxs     map[*context]struct{}
	nextQPN  uint32
	nextMR   uint32
	mrs      atomic.Pointer[[]*mr] // indexed by lkey>>8; copied on write

	wg  sync.WaitGroup
	ctr counters

	gidTable GIDTable // guarded by mu (SetGIDTable changes it)
}

func newDevice(p *Provider, name string, idx uint64, phantom bool, ap netip.AddrPort, c config) (*device, error) {
	d := &device{
		p: p, name: name, idx: idx, phantom: phantom, coalesce: c.coalesce, inproc: c.inproc, lfd: -1, pfd: -1,
		conns: make(map[ibv.GID]*conn), all: make(map[*conn]struct{}), rx: make(map[int32]*conn),
		qps: make(map[uint32]*qp), ctxs: make(map[*context]struct{}),
		nextQPN: 0x10 + uint32(idx&0xff)<<16, gidTable: c.gidTable,
	}
	empty := []*mr{nil}
	d.mrs.Store(&empty)
	sfd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("soft: %s: eventfd: %w", name, err)
	}
	d.stopfd = sfd
	if phantom {
		return d, nil
	}
	lfd, gid, err := listen(ap)
	if err != nil {
		unix.Close(sfd)
		return nil, fmt.Errorf("soft: %s: listen %s: %w", name, ap, err)
	}
	d.lfd, d.gid = lfd, gid
	if !c.nicThread {
		if d.pfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
			unix.Close(lfd)
			unix.Close(sfd)
			return nil, fmt.Errorf("soft: %s: epoll_create1: %w", name, err)
		}
	}
	d.wg.Add(1)
	go d.acceptLoop()
	return d, nil
}

func listen(ap netip.AddrPort) (int, ibv.GID, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, ibv.GID{}, err
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	sa := &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().Unmap().As4()}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return -1, ibv.GID{}, err
	}
	if err := unix.Listen(fd, 128); err != nil {
		unix.Close(fd)
		return -1, ibv.GID{}, err
	}
	got, err := unix.Getsockname(fd)
	if err != nil {
		unix.Close(fd)
		return -1, ibv.GID{}, err
	}
	in4, ok := got.(*unix.SockaddrInet4)
	if !ok {
		unix.Close(fd)
		return -1, ibv.GID{}, errors.New("not an IPv4 socket")
	}
	gid, err := gidFromAddr(netip.AddrPortFrom(netip.AddrFrom4(in4.Addr), uint16(in4.Port)))
	if err != nil {
		unix.Close(fd)
		return -1, ibv.GID{}, err
	}
	return fd, gid, nil
}

func (d *device) info() ibv.DeviceInfo {
	st := ibv.PortActive
	d.mu.Lock()
	down, table := d.portDown, d.gidTable
	d.mu.Unlock()
	if d.phantom || down {
		st = ibv.PortDown
	}
	return deviceInfo(d.name, d.idx, st, d.gid, table)
}

func (d *device) open() *context {
	ctx := newContext(d)
	d.mu.Lock()
	d.refs++
	d.ctxs[ctx] = struct{}{}
	d.mu.Unlock()
	return ctx
}

// closeContext drops a context; the last one stops the device.
func (d *device) closeContext(ctx *context) error {
	d.mu.Lock()
	delete(d.ctxs, ctx)
	d.refs--
	last := d.refs == 0
	d.mu.Unlock()
	if !last {
		return nil
	}
	d.p.release(d)
	d.kill()
	done := make(chan struct{})
	go func() { d.wg.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		err = fmt.Errorf("soft: %s: close: NIC goroutines did not stop within 5s: %w", d.name, ibv.ErrBusy)
	}
	if d.lfd >= 0 {
		unix.Close(d.lfd)
	}
	if d.pfd >= 0 {
		unix.Close(d.pfd)
	}
	unix.Close(d.stopfd)
	return err
}

// kill stops all traffic: no more accepts, every connection shut down, no new dials.
func (d *device) kill() {
	d.mu.Lock()
	if d.dead {
		d.mu.Unlock()
		return
	}
	d.dead = true
	conns := make([]*conn, 0, len(d.all))
	for c := range d.all {
		conns = append(conns, c)
	}
	clear(d.conns)
	d.mu.Unlock()
	var one = [8]byte{1}
	_, _ = unix.Write(d.stopfd, one[:])
	if d.lfd >= 0 {
		_ = unix.Shutdown(d.lfd, unix.SHUT_RDWR)
	}
	for _, c := range conns {
		c.shutdown()
	}
}

// isDown reports whether the port is DOWN (SetPortState): every packet is dropped.
func (d *device) isDown() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.portDown
}

func (d *device) isDead() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dead
}

func (d *device) acceptLoop() {
	defer d.wg.Done()
	for {
		nfd, _, err := unix.Accept4(d.lfd, unix.SOCK_CLOEXEC)
		if err != nil {
			if err == unix.EINTR || err == unix.ECONNABORTED {
				continue
			}
			if d.isDead() {
				return
			}
			if err == unix.EMFILE || err == unix.ENFILE || err == unix.ENOBUFS || err == unix.ENOMEM {
				continue
			}
			return
		}
		_ = unix.SetsockoptInt(nfd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		c := &conn{d: d, fd: nfd, rfd: -1}
		c.state.Store(connUp)
		d.mu.Lock()
		if d.dead {
			d.mu.Unlock()
			unix.Close(nfd)
			return
		}
		d.all[c] = struct{}{}
		d.wg.Add(1)
		d.mu.Unlock()
		d.ctr.connsAccepted.Add(1)
		go func() {
			defer d.wg.Done()
			c.serve(true)
		}()
	}
}

// connTo is the connection that carries packets to the device of gid, dialing it when there is
// none. It returns nil when the device is dead.
func (d *device) connTo(gid ibv.GID) *conn {
	d.mu.Lock()
	if d.dead {
		d.mu.Unlock()
		return nil
	}
	if c := d.conns[gid]; c != nil && c.state.Load() != connDead {
		d.mu.Unlock()
		return c
	}
	d.mu.Unlock()
	var rd *device
	if d.inproc {
		rd = d.p.deviceByGID(gid) // outside d.mu: the provider's lock comes first
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dead {
		return nil
	}
	if c := d.conns[gid]; c != nil && c.state.Load() != connDead {
		return c
	}
	if rd != nil {
		c := newPipe(d, rd)
		d.conns[gid] = c
		d.all[c] = struct{}{}
		return c
	}
	c := &conn{d: d, fd: -1, rfd: -1, remote: gid, outbound: true}
	c.state.Store(connConnecting)
	d.conns[gid] = c
	d.all[c] = struct{}{}
	d.wg.Add(1)
	go c.dial()
	return c
}

// registerInbound makes an accepted connection the one to send on, unless one exists.
func (d *device) registerInbound(c *conn) {
	d.mu.Lock()
	if !d.dead {
		if old := d.conns[c.remote]; old == nil || old.state.Load() == connDead {
			d.conns[c.remote] = c
		}
	}
	d.mu.Unlock()
}

// checkRemote runs when a connection to gid ended (its reader closed it). It dials gid once,
// in the background: a refused or failed dial means nothing listens there any more — the
// remote device is gone, as a killed process's is — and every QP connected to it is told
// (pathLost). A dial that succeeds means the remote is alive and the end was the
// connection's alone; packets find a new one as usual. One check per gid at a time.
func (d *device) checkRemote(gid ibv.GID) {
	d.mu.Lock()
	if d.dead || d.probing[gid] {
		d.mu.Unlock()
		return
	}
	if d.probing == nil {
		d.probing = make(map[ibv.GID]bool)
	}
	d.probing[gid] = true // bounded: one entry per remote device this one had a connection to
	d.wg.Add(1)
	d.mu.Unlock()
	go func() {
		defer d.wg.Done()
		gone := d.probeGone(gid)
		d.mu.Lock()
		delete(d.probing, gid)
		dead := d.dead
		d.mu.Unlock()
		if !gone || dead {
			return
		}
		d.qpMu.Lock()
		qps := make([]*qp, 0, 8)
		for _, q := range d.qps {
			qps = append(qps, q)
		}
		d.qpMu.Unlock()
		for _, q := range qps {
			q.pathLost(gid)
		}
	}()
}

// probeDelays are when probeGone dials, after the end of the connection: a process being
// killed closes its sockets one by one, and its listener may still complete a handshake
// (in the kernel) just after the connection ended; a dial a moment later is refused.
var probeDelays = [...]time.Duration{0, 200 * time.Millisecond, time.Second}

// probeGone reports whether the remote device of gid refused (or failed) a dial at any of
// probeDelays; false once the device here is dying.
func (d *device) probeGone(gid ibv.GID) bool {
	prev := time.Duration(0)
	for _, at := range probeDelays {
		if at > prev {
			pfd := [1]unix.PollFd{{Fd: int32(d.stopfd), Events: unix.POLLIN}}
			if n, _ := unix.Poll(pfd[:], int((at-prev)/time.Millisecond)); n > 0 {
				return false // the device is being killed or closed
			}
			prev = at
		}
		probe := &conn{d: d, fd: -1, rfd: -1, remote: gid}
		fd, err := probe.connect()
		if err != nil {
			return true
		}
		unix.Close(fd) // the remote's accept sees an end before any HELLO and lets it go
	}
	return false
}

func (d *device) forget(c *conn) {
	d.mu.Lock()
	if d.conns[c.remote] == c {
		delete(d.conns, c.remote)
	}
	delete(d.all, c)
	d.mu.Unlock()
}

// attendWindow is how long after a consumer's poll the device counts as attended.
const attendWindow = 200 * time.Microsecond

// attended reports whether a consumer makes progress on the device: it waits on a completion
// channel (an armed CQ) or polled a moment ago. Then the NIC goroutines leave the sockets to it.
func (d *device) attended() bool {
	if d.pfd < 0 {
		return false
	}
	return d.armed.Load() > 0 || nanotime()-d.lastPoll.Load() < int64(attendWindow)
}

// progress is the receive work done on the consumer's thread: every connection whose socket
// is readable has its packets read and answered (manual progress).
func (d *device) progress() {
	if d.pfd < 0 {
		return
	}
	d.lastPoll.Store(nanotime())
	var ev [8]unix.EpollEvent
	n, err := unix.EpollWait(d.pfd, ev[:], 0)
	if err != nil {
		return
	}
	for i := 0; i < n; i++ {
		d.rxMu.RLock()
		c := d.rx[ev[i].Fd]
		d.rxMu.RUnlock()
		if c != nil {
			c.reads.Add(1)
			c.receive(true)
		}
	}
}

// enrol makes ch (a new channel with an epoll fd) a candidate for holding the progress set;
// the first one holds it.
func (d *device) enrol(ch *channel) {
	d.holdMu.Lock()
	defer d.holdMu.Unlock()
	ch.enrolled, ch.slot = true, len(d.chans)
	d.chans = append(d.chans, ch)
	if d.holder == nil {
		d.moveHolderLocked(ch)
	}
}

// unenrol takes ch (closing) out of the candidates; when it held the progress set, the set
// moves to a channel whose consumer waits on it, or else to any open channel.
func (d *device) unenrol(ch *channel) {
	d.holdMu.Lock()
	defer d.holdMu.Unlock()
	if !ch.enrolled {
		return
	}
	last := len(d.chans) - 1
	d.chans[ch.slot] = d.chans[last]
	d.chans[ch.slot].slot = ch.slot
	d.chans[last] = nil
	d.chans = d.chans[:last]
	ch.enrolled = false
	if d.holder != ch {
		return
	}
	var next *channel
	for _, c := range d.chans {
		if c.waited.Load() {
			next = c
			break
		}
		if next == nil {
			next = c
		}
	}
	if next == nil || !d.moveHolderLocked(next) {
		_ = unix.EpollCtl(ch.efd, unix.EPOLL_CTL_DEL, d.pfd, nil)
		ch.holding = false
		d.holder = nil
		d.holderWaited.Store(false)
	}
}

// claim makes ch, whose consumer waits on it (GetEvent), the holder, unless a consumer
// waits on the holder already.
func (d *device) claim(ch *channel) {
	d.holdMu.Lock()
	defer d.holdMu.Unlock()
	if d.holderWaited.Load() || !ch.enrolled {
		return
	}
	if d.moveHolderLocked(ch) {
		d.holderWaited.Store(true)
	}
}

// moveHolderLocked nests the progress set in ch's epoll fd and takes it out of the former
// holder's: added first, so that a failure leaves the former holder as it was.
func (d *device) moveHolderLocked(ch *channel) bool {
	if d.holder == ch {
		return true
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(d.pfd)}
	if err := unix.EpollCtl(ch.efd, unix.EPOLL_CTL_ADD, d.pfd, &ev); err != nil {
		return false
	}
	if old := d.holder; old != nil {
		_ = unix.EpollCtl(old.efd, unix.EPOLL_CTL_DEL, d.pfd, nil)
		old.holding = false
	}
	ch.holding = true
	d.holder = ch
	d.holderWaited.Store(ch.waited.Load())
	return true
}

// holderNotServed is the backstop's report that it read packets the consumers left for a
// whole period: the holder's consumer may have stopped waiting (a loop stopped before it
// closed its channels), so the next channel whose consumer waits takes the set over.
func (d *device) holderNotServed() {
	if d.holderWaited.Load() {
		d.holderWaited.Store(false)
	}
}

// addPending queues c's unsent bytes for the next flush.
func (d *device) addPending(c *conn) {
	d.pendMu.Lock()
	if !c.pending {
		c.pending = true
		d.pend = append(d.pend, c)
		d.npend.Add(1)
	}
	d.pendMu.Unlock()
}

// flush is a consumer's end of turn: it turns the deferral on for the device's consumers
// and rings the doorbell.
func (d *device) flush() {
	if !d.deferOut.Load() {
		d.deferOut.Store(true)
	}
	d.flushPending()
}

// flushPending writes what the consumer's turn left queued.
func (d *device) flushPending() {
	for d.npend.Load() > 0 {
		var batch [16]*conn
		d.pendMu.Lock()
		n := copy(batch[:], d.pend)
		k := copy(d.pend, d.pend[n:])
		clear(d.pend[k:])
		d.pend = d.pend[:k]
		for _, c := range batch[:n] {
			c.pending = false
		}
		d.npend.Store(int32(k))
		d.pendMu.Unlock()
		for _, c := range batch[:n] {
			c.mu.Lock()
			c.flushLocked()
			c.mu.Unlock()
		}
	}
}

// addRx puts a connection's socket in the progress set.
func (d *device) addRx(c *conn) {
	if d.pfd < 0 {
		return
	}
	d.rxMu.Lock()
	d.rx[int32(c.rfd)] = c
	d.rxMu.Unlock()
	_ = unix.EpollCtl(d.pfd, unix.EPOLL_CTL_ADD, c.rfd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(c.rfd)})
}

// dropRx takes a connection's socket out of the progress set (before it is closed).
func (d *device) dropRx(c *conn, fd int) {
	if d.pfd < 0 {
		return
	}
	_ = unix.EpollCtl(d.pfd, unix.EPOLL_CTL_DEL, fd, nil)
	d.rxMu.Lock()
	if d.rx[int32(fd)] == c {
		delete(d.rx, int32(fd))
	}
	d.rxMu.Unlock()
}

func (d *device) qpByNum(n uint32) *qp {
	d.qpMu.RLock()
	q := d.qps[n]
	d.qpMu.RUnlock()
	return q
}

// translate maps an SGE to the bytes of its MR: the lkey must name a live MR of pd and the
// range must lie inside it; write needs AccessLocalWrite.
func (d *device) translate(s *ibv.SGE, pd *pd, write bool) ([]byte, bool) {
	t := *d.mrs.Load()
	i := s.LKey >> 8
	if int(i) >= len(t) {
		return nil, false
	}
	m := t[i]
	if m == nil || m.lkey != s.LKey || m.pd != pd || (write && m.access&ibv.AccessLocalWrite == 0) {
		return nil, false
	}
	if s.Addr < m.addr || s.Addr-m.addr > uint64(len(m.buf)) || uint64(s.Length) > uint64(len(m.buf))-(s.Addr-m.addr) {
		return nil, false
	}
	off := s.Addr - m.addr
	return m.buf[off : off+uint64(s.Length)], true
}

// findByAddr finds the MR of pd that holds [addr, addr+n), for inline data whose lkey
// hardware ignores.
func (d *device) findByAddr(addr uint64, n uint32, pd *pd) ([]byte, bool) {
	for _, m := range *d.mrs.Load() {
		if m == nil || m.pd != pd || addr < m.addr || addr-m.addr > uint64(len(m.buf)) ||
			uint64(n) > uint64(len(m.buf))-(addr-m.addr) {
			continue
		}
		off := addr - m.addr
		return m.buf[off : off+uint64(n)], true
	}
	return nil, false
}

func (d *device) addMR(m *mr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	old := *d.mrs.Load()
	idx := -1
	for i := 1; i < len(old); i++ {
		if old[i] == nil {
			idx = i
			break
		}
	}
	t := make([]*mr, len(old), len(old)+1)
	copy(t, old)
	if idx < 0 {
		idx = len(t)
		t = append(t, nil)
	}
	d.nextMR++
	m.lkey = uint32(idx)<<8 | (d.nextMR & 0xff)
	t[idx] = m
	d.mrs.Store(&t)
}

func (d *device) removeMR(m *mr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	old := *d.mrs.Load()
	t := make([]*mr, len(old))
	copy(t, old)
	if i := int(m.lkey >> 8); i < len(t) && t[i] == m {
		t[i] = nil
	}
	d.mrs.Store(&t)
}

func (d *device) addQP(q *qp) {
	d.qpMu.Lock()
	for {
		d.nextQPN = (d.nextQPN + 1) & psnMask
		if d.nextQPN < 2 {
			continue
		}
		if _, used := d.qps[d.nextQPN]; !used {
			break
		}
	}
	q.qpn = d.nextQPN
	d.qps[q.qpn] = q
	d.qpMu.Unlock()
}

func (d *device) removeQP(q *qp) {
	d.qpMu.Lock()
	if d.qps[q.qpn] == q {
		delete(d.qps, q.qpn)
	}
	d.qpMu.Unlock()
}

// raisePort sends a port event to every context of the device.
func (d *device) contexts() []*context {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]*context, 0, len(d.ctxs))
	for c := range d.ctxs {
		out = append(out, c)
	}
	return out
}
