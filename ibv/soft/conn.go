package soft

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/twosided/twosided/ibv"
)

// Connection states.
const (
	connConnecting int32 = iota
	connUp
	connDead
)

const (
	readBufLen  = 256 << 10
	maxBacklog  = 64 << 20 // bytes queued on a connection before packets are dropped
	dialTimeout = 2000     // ms
)

// conn is one TCP connection between two devices; it multiplexes their QPs. Its reader is a
// goroutine locked to an OS thread that blocks in read(2) on the raw fd. Writers (PostSend, the
// readers' ACKs, timers) append packets to out under mu and write them with a non-blocking
// send; what the socket does not take waits for a flusher goroutine (backpressure only).
type conn struct {
	d        *device
	remote   ibv.GID
	outbound bool
	state    atomic.Int32

	mu       sync.Mutex
	fd       int
	out      []byte
	off      int
	flushing bool
	delay    time.Duration // link delay seen by the packet being built
	delayQ   []delayedPacket
	delayT   *time.Timer

	// An in-process pipe (the remote device lives in this provider) has no socket: whoever
	// wrote packets pumps them into rdev after releasing its locks; one pumper at a time, so
	// order holds. from stands for this device as rdev sees it.
	pipe    bool
	rdev    *device
	from    *conn
	pumping bool
	spare   []byte
	prx     *rxBatch

	// Receive side of a socket: whoever holds rxMu reads (the consumer's progress or the NIC
	// goroutine). rfd is -1 once the socket is closed.
	rxMu  sync.Mutex
	rfd   int
	rbuf  []byte
	rw    int
	rxb   *rxBatch
	reads atomic.Uint64 // receives done by a consumer's progress; the NIC goroutine watches it

	pending bool // in the device's list of connections owing a write at Flush (under d.pendMu)
}

func newPipe(d, rd *device) *conn {
	c := &conn{d: d, fd: -1, rfd: -1, remote: rd.gid, pipe: true, rdev: rd, from: &conn{d: rd, fd: -1, remote: d.gid},
		prx: &rxBatch{touched: make([]*qp, 0, 16), dirty: make([]*conn, 0, 4)}}
	c.state.Store(connUp)
	return c
}

// pump delivers a pipe's queued packets to the remote device, in the caller's goroutine.
// The caller holds no lock. A pump already running elsewhere picks the new bytes up.
func (c *conn) pump() {
	c.mu.Lock()
	if c.pumping {
		c.mu.Unlock()
		return
	}
	c.pumping = true
	var h header
	for c.off < len(c.out) && c.state.Load() == connUp {
		full, off := c.out, c.off
		c.out, c.off = c.spare[:0], 0
		c.mu.Unlock()
		if c.rdev.isDead() {
			c.mu.Lock()
			c.failLocked()
			break
		}
		b := full[off:]
		for len(b) >= hdrLen {
			if decodeHeader(b, &h) != nil || len(b) < hdrLen+int(h.length) {
				break // cannot happen: this process built the packets
			}
			c.rdev.onPacket(c.from, &h, b[hdrLen:hdrLen+int(h.length)], c.prx)
			b = b[hdrLen+int(h.length):]
		}
		c.prx.end()
		c.mu.Lock()
		c.spare = full[:0]
	}
	c.pumping = false
	c.mu.Unlock()
}

type delayedPacket struct {
	at time.Time
	b  []byte
}

// sendNB is send(2) with MSG_DONTWAIT, without allocating.
func sendNB(fd int, b []byte) (int, unix.Errno) {
	n, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)),
		unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL, 0, 0)
	return int(n), e
}

// startPacketLocked reports whether a packet may be appended now, and where it starts.
func (c *conn) startPacketLocked() (int, bool) {
	if c.state.Load() == connDead || len(c.out)-c.off > maxBacklog {
		return 0, false
	}
	if c.d.p.faultsOn.Load() != 0 {
		cut, delay := c.d.p.linkState(c.d.gid, c.remote)
		if cut || c.d.isDown() {
			c.d.ctr.cutDropped.Add(1)
			return 0, false
		}
		c.delay = delay
	} else {
		c.delay = 0
	}
	return len(c.out), true
}

// endPacketLocked accounts for the packet appended since start and holds it back when the
// link is delayed (or older packets still are: order is kept).
func (c *conn) endPacketLocked(start int) {
	c.d.ctr.packetsSent.Add(1)
	if c.delay == 0 && len(c.delayQ) == 0 {
		return
	}
	b := append([]byte(nil), c.out[start:]...)
	c.out = c.out[:start]
	c.delayQ = append(c.delayQ, delayedPacket{at: time.Now().Add(c.delay), b: b})
	if c.delayT == nil {
		c.delayT = time.AfterFunc(c.delay, c.releaseDelayed)
	} else if len(c.delayQ) == 1 {
		c.delayT.Reset(c.delay)
	}
}

func (c *conn) releaseDelayed() {
	c.mu.Lock()
	now := time.Now()
	i := 0
	for ; i < len(c.delayQ) && !c.delayQ[i].at.After(now); i++ {
		if c.state.Load() != connDead {
			c.out = append(c.out, c.delayQ[i].b...)
		}
	}
	c.delayQ = append(c.delayQ[:0], c.delayQ[i:]...)
	if len(c.delayQ) > 0 {
		c.delayT.Reset(c.delayQ[0].at.Sub(now))
	}
	c.flushLocked()
	c.mu.Unlock()
	if c.pipe {
		c.pump()
	}
}

// flushLocked writes what it can of out without blocking (a pipe is pumped by the caller
// once it holds no lock).
func (c *conn) flushLocked() {
	if c.pipe || c.state.Load() != connUp || c.flushing || c.off == len(c.out) {
		return
	}
	if !c.writeOutLocked() {
		c.flushing = true
		c.d.wg.Add(1)
		go c.flusher()
	}
}

// writeOutLocked sends out until it is drained (true) or the socket is full (false).
func (c *conn) writeOutLocked() bool {
	for c.off < len(c.out) {
		n, e := sendNB(c.fd, c.out[c.off:])
		switch e {
		case 0:
			c.off += n
		case unix.EINTR:
		case unix.EAGAIN:
			if c.off > len(c.out)/2 {
				c.out = c.out[:copy(c.out, c.out[c.off:])]
				c.off = 0
			}
			return false
		default:
			c.failLocked()
			return true
		}
	}
	c.out, c.off = c.out[:0], 0
	return true
}

// flusher waits for the socket to drain while out holds bytes the socket refused.
func (c *conn) flusher() {
	defer c.d.wg.Done()
	for {
		c.mu.Lock()
		if c.state.Load() != connUp {
			c.flushing = false
			c.mu.Unlock()
			return
		}
		fd := c.fd
		c.mu.Unlock()
		pfd := [2]unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}, {Fd: int32(c.d.stopfd), Events: unix.POLLIN}}
		_, _ = unix.Poll(pfd[:], 50)
		c.mu.Lock()
		if c.state.Load() != connUp || c.writeOutLocked() {
			c.flushing = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
	}
}

// failLocked marks the connection dead and wakes its reader, which closes the fd.
func (c *conn) failLocked() {
	c.state.Store(connDead)
	if c.fd >= 0 {
		_ = unix.Shutdown(c.fd, unix.SHUT_RDWR)
	}
	c.out, c.off = nil, 0
}

func (c *conn) shutdown() {
	c.mu.Lock()
	c.failLocked()
	c.mu.Unlock()
}

// dial connects to the remote device, sends HELLO and what was queued meanwhile, then reads.
func (c *conn) dial() {
	defer c.d.wg.Done()
	fd, err := c.connect()
	if err != nil {
		c.d.ctr.dialFailures.Add(1)
		c.mu.Lock()
		c.failLocked()
		c.mu.Unlock()
		c.d.forget(c)
		return
	}
	c.d.ctr.connsDialed.Add(1)
	var hello [hdrLen + 16]byte
	h := header{op: opHello, dstQPN: helloMagic, srcQPN: helloVersion, length: 16}
	h.put(hello[:])
	copy(hello[hdrLen:], c.d.gid[:])
	c.mu.Lock()
	if c.state.Load() == connDead {
		c.mu.Unlock()
		unix.Close(fd)
		c.d.forget(c)
		return
	}
	c.fd = fd
	pending := c.out[c.off:]
	c.out = append(hello[:], pending...)
	c.off = 0
	c.state.Store(connUp)
	c.flushLocked()
	c.mu.Unlock()
	c.serve(false)
}

func (c *conn) connect() (int, error) {
	ap, err := addrFromGID(c.remote)
	if err != nil {
		return -1, err
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return -1, err
	}
	sa := &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	err = unix.Connect(fd, sa)
	if err == unix.EINPROGRESS {
		pfd := [2]unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}, {Fd: int32(c.d.stopfd), Events: unix.POLLIN}}
		deadline := time.Now().Add(dialTimeout * time.Millisecond)
		for {
			left := time.Until(deadline)
			if left <= 0 {
				err = unix.ETIMEDOUT
				break
			}
			n, perr := unix.Poll(pfd[:], int(left/time.Millisecond)+1)
			if perr == unix.EINTR {
				continue
			}
			if perr != nil {
				err = perr
				break
			}
			if n > 0 && pfd[1].Revents != 0 {
				err = ibv.ErrClosed
				break
			}
			if n > 0 && pfd[0].Revents != 0 {
				soerr, gerr := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
				err = gerr
				if gerr == nil && soerr != 0 {
					err = unix.Errno(soerr)
				}
				break
			}
		}
	}
	if err == nil {
		err = unix.SetNonblock(fd, false)
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	return fd, nil
}

// rxBatch is what a reader gathers while handling the packets of one read: QPs owing a
// response (one cumulative ACK or NAK each) and connections holding unsent packets.
type rxBatch struct {
	touched  []*qp
	dirty    []*conn
	consumer bool // the consumer's progress reads: its flush may wait for the turn's doorbell
}

func (rx *rxBatch) markDirty(c *conn) {
	for _, x := range rx.dirty {
		if x == c {
			return
		}
	}
	rx.dirty = append(rx.dirty, c)
}

func (rx *rxBatch) end() {
	for i, q := range rx.touched {
		q.respond(rx)
		rx.touched[i] = nil
	}
	rx.touched = rx.touched[:0]
	for len(rx.dirty) > 0 {
		c := rx.dirty[len(rx.dirty)-1]
		rx.dirty[len(rx.dirty)-1] = nil
		rx.dirty = rx.dirty[:len(rx.dirty)-1]
		if c.pipe {
			c.pump()
			continue
		}
		if rx.consumer && c.d.deferOut.Load() {
			c.d.addPending(c) // the ACKs leave with the turn's SENDs, at Flush
			continue
		}
		c.mu.Lock()
		c.flushLocked()
		c.mu.Unlock()
	}
}

// recvNB is recv(2) with MSG_DONTWAIT, without allocating.
func recvNB(fd int, b []byte) (int, unix.Errno) {
	n, _, e := unix.Syscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)),
		unix.MSG_DONTWAIT, 0, 0)
	return int(n), e
}

// serve runs the connection's NIC goroutine: it reads the inbound HELLO, puts the socket in
// the device's progress set, then watches the socket as the backstop (see backstop).
func (c *conn) serve(needHello bool) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer c.closeFd()
	c.rxMu.Lock()
	c.rfd = c.fd
	c.rbuf = make([]byte, readBufLen)
	c.rxb = &rxBatch{touched: make([]*qp, 0, 16), dirty: make([]*conn, 0, 4)}
	ok := !needHello || c.readHelloLocked()
	if ok && c.rw > 0 { // packets that came with the HELLO
		ok = c.parseLocked()
		c.rxb.end()
	}
	c.rxMu.Unlock()
	if !ok {
		return
	}
	c.d.addRx(c)
	c.backstop()
}

// readHelloLocked reads until the HELLO packet is complete; bytes after it stay in rbuf.
func (c *conn) readHelloLocked() bool {
	var h header
	for {
		if c.rw >= hdrLen {
			if decodeHeader(c.rbuf[:c.rw], &h) != nil || h.op != opHello || h.length != 16 {
				return false
			}
			if total := hdrLen + int(h.length); c.rw >= total {
				copy(c.remote[:], c.rbuf[hdrLen:total])
				c.rw = copy(c.rbuf, c.rbuf[total:c.rw])
				c.d.registerInbound(c)
				return true
			}
		}
		n, err := unix.Read(c.rfd, c.rbuf[c.rw:])
		if err == unix.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			return false
		}
		c.rw += n
	}
}

// The NIC goroutine leaves a socket to an attending consumer for a period before it checks
// that the consumer did read: backstopMinMs at first, doubling up to backstopMaxMs while the
// consumer keeps reading, so that a busy connection costs its NIC goroutine ~125 wake-ups/s,
// not 500; back to the minimum once it had to step in or traffic stopped.
const (
	backstopMinMs = 2
	backstopMaxMs = 8
)

// backstop is the NIC goroutine's watch over an established connection. Unattended (no
// consumer waits on a completion channel of the device, none polled lately, or
// WithNICThread) it sleeps on the socket and reads each packet itself. Attended, it leaves
// the socket to the consumer's progress (GetEvent, Poll) and wakes once a period while
// traffic flows, to read what the consumer left for a whole period (a consumer busy
// elsewhere): RC peers still get their ACKs. With no traffic for a period it sleeps on the
// socket again, so an idle connection costs no wake-ups.
func (c *conn) backstop() {
	pfd := [2]unix.PollFd{{Fd: int32(c.rfd)}, {Fd: int32(c.d.stopfd), Events: unix.POLLIN}}
	timed := false
	period := backstopMinMs
	for {
		timeout := -1
		pfd[0].Events = unix.POLLIN
		var seen uint64
		if timed {
			timeout = period
			pfd[0].Events = unix.POLLRDHUP // the peer's close or an error, not data
			seen = c.reads.Load()
		}
		pfd[0].Revents, pfd[1].Revents = 0, 0
		n, err := unix.Poll(pfd[:], timeout)
		if err == unix.EINTR {
			continue
		}
		if err != nil || pfd[1].Revents != 0 {
			return
		}
		if n > 0 && pfd[0].Revents != 0 {
			if !timed && pfd[0].Revents == unix.POLLIN && c.d.attended() {
				timed = true // the consumer reads it
				continue
			}
			if !c.receive(false) {
				return
			}
			continue
		}
		c.d.flushPending() // doorbells a consumer left deferred (it stopped calling Flush)
		if c.reads.Load() != seen {
			period = min(2*period, backstopMaxMs)
			continue // the consumer read this period: keep leaving it the socket
		}
		// Nobody read for a whole period: take what waits, then sleep on the socket.
		c.d.holderNotServed()
		if !c.receive(false) {
			return
		}
		timed, period = false, backstopMinMs
	}
}

// maxReadsPerReceive bounds one receive, so that a flood on one connection cannot hold a
// consumer: a level-triggered progress set brings it back for the rest.
const maxReadsPerReceive = 8

// receive reads what the socket holds, without blocking, handles every complete packet and
// answers them in one batch (one cumulative ACK per QP). Any thread may call it: the
// consumer's progress or the NIC goroutine, one at a time. False: the connection is dead.
func (c *conn) receive(consumer bool) bool {
	c.rxMu.Lock()
	defer c.rxMu.Unlock()
	if c.rfd < 0 {
		return false
	}
	c.rxb.consumer = consumer
	ok := true
	for i := 0; i < maxReadsPerReceive; i++ {
		if c.rw == len(c.rbuf) {
			ok = false // a packet larger than any buffer: cannot happen, decodeHeader bounds length
			break
		}
		room := len(c.rbuf) - c.rw
		n, e := recvNB(c.rfd, c.rbuf[c.rw:])
		if e == unix.EINTR {
			continue
		}
		if e == unix.EAGAIN {
			break
		}
		if e != 0 || n <= 0 {
			ok = false
			break
		}
		c.rw += n
		if !c.parseLocked() {
			ok = false
			break
		}
		if n < room {
			break // a short read: the socket is empty
		}
	}
	c.rxb.end()
	if !ok {
		c.d.dropRx(c, c.rfd)
		c.shutdown()
	}
	return ok
}

// parseLocked handles the complete packets of rbuf and keeps the tail of a partial one.
func (c *conn) parseLocked() bool {
	var h header
	r := 0
	for c.rw-r >= hdrLen {
		if decodeHeader(c.rbuf[r:c.rw], &h) != nil || h.op == opHello {
			return false
		}
		total := hdrLen + int(h.length)
		if c.rw-r < total {
			if total > len(c.rbuf) {
				nb := make([]byte, total+readBufLen)
				c.rw = copy(nb, c.rbuf[r:c.rw])
				c.rbuf, r = nb, 0
			}
			break
		}
		c.d.onPacket(c, &h, c.rbuf[r+hdrLen:r+total], c.rxb)
		r += total
	}
	if r > 0 {
		c.rw = copy(c.rbuf, c.rbuf[r:c.rw])
	}
	return true
}

func (c *conn) closeFd() {
	c.rxMu.Lock()
	if c.rfd >= 0 {
		c.d.dropRx(c, c.rfd)
		c.rfd = -1
	}
	c.rxMu.Unlock()
	c.mu.Lock()
	c.state.Store(connDead)
	if c.fd >= 0 {
		unix.Close(c.fd)
		c.fd = -1
	}
	c.out, c.off = nil, 0
	if c.delayT != nil {
		c.delayT.Stop()
	}
	c.delayQ = nil
	c.mu.Unlock()
	c.d.forget(c)
	if c.remote != (ibv.GID{}) {
		c.d.checkRemote(c.remote)
	}
}
