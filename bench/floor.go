package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// The floors: the least a TCP notify can cost on this machine. A message is a u32
// little-endian length and the payload; the receiver answers every message with one byte,
// so a send returns once the receiver has the message, as SendNotify does. Every socket
// is driven by x/sys/unix from a goroutine locked to its OS thread. floor-block reads with
// blocking calls (one kernel wake-up per message); floor-spin reads non-blocking sockets in
// a loop that never sleeps.

const floorHdr = 4

// floorNode is a floor receiver: a listener and its connections. In blocking mode an
// accept thread and one thread per connection block in the kernel; in spin mode the
// process's one spinning thread (spinGroup) serves the listener and every connection.
type floorNode struct {
	stream      bool // floor-stream: connections read in bulk, one ack per message
	epoll       bool // floor-epoll: connections wait in epoll_wait, clients as ExecWait does
	uring       bool // floor-uring: connections and clients wait through io_uring
	spin        bool
	spinClients bool
	lfd         int
	address     string
	sink        *sink

	mu  sync.Mutex
	fds []int // every accepted connection, closed by close

	acceptWG sync.WaitGroup
	connWG   sync.WaitGroup
}

// newFloorNode starts a floor receiver. spinClients: its clients spin on the ack too (runs
// with one client, where both sides of the reference spin); with a window of clients they
// block, so that spinning stays one thread per node, as the reactor's busy poll does.
func newFloorNode(spin, spinClients, stream bool, host string, s *sink) (*floorNode, error) {
	lfd, addr, err := tcpListen(host)
	if err != nil {
		return nil, err
	}
	n := &floorNode{stream: stream, spin: spin, spinClients: spin && spinClients, lfd: lfd, address: addr, sink: s}
	if spin {
		// The spinning thread accepts too: a separate accept thread would compete with it
		// for the CPU and wait a scheduler time slice.
		if err := unix.SetNonblock(lfd, true); err != nil {
			unix.Close(lfd)
			return nil, err
		}
		spinners.add(n)
	} else {
		n.acceptWG.Add(1)
		go n.acceptLoop()
	}
	return n, nil
}

// newEpollFloorNode starts a floor-epoll receiver (floor_epoll.go).
func newEpollFloorNode(host string, s *sink) (*floorNode, error) {
	lfd, addr, err := tcpListen(host)
	if err != nil {
		return nil, err
	}
	n := &floorNode{epoll: true, lfd: lfd, address: addr, sink: s}
	n.acceptWG.Add(1)
	go n.acceptLoop()
	return n, nil
}

func (n *floorNode) addr() string { return n.address }

func (n *floorNode) wakeups() uint64 { return 0 }

func (n *floorNode) acceptLoop() {
	defer n.acceptWG.Done()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for {
		fd, err := tcpAccept(n.lfd)
		if err != nil {
			return // the listener was shut down
		}
		n.mu.Lock()
		n.fds = append(n.fds, fd)
		n.mu.Unlock()
		n.connWG.Add(1)
		if n.stream {
			go n.streamConn(fd)
			continue
		}
		if n.epoll {
			go n.epollConn(fd)
			continue
		}
		if n.uring {
			go n.uringConn(fd)
			continue
		}
		go n.blockConn(fd)
	}
}

// blockConn serves one connection with blocking reads.
func (n *floorNode) blockConn(fd int) {
	defer n.connWG.Done()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	buf := make([]byte, 1<<17)
	var hdr [floorHdr]byte
	for {
		if err := readFull(fd, hdr[:], false); err != nil {
			return // closed by the peer, or shut down by close
		}
		if err := n.serveFrame(fd, hdr[:], buf, false); err != nil {
			return
		}
	}
}

// serveFrame reads the payload announced by hdr, delivers it and acknowledges it.
func (n *floorNode) serveFrame(fd int, hdr, buf []byte, spin bool) error {
	size := int(binary.LittleEndian.Uint32(hdr))
	first := buf[:0]
	for left := size; left > 0; {
		k := min(left, len(buf))
		if err := readFull(fd, buf[:k], spin); err != nil {
			return err
		}
		if len(first) == 0 {
			first = buf[:k]
		}
		left -= k
	}
	n.sink.deliver(first)
	var ack = [1]byte{1}
	return writeAll(fd, ack[:], spin)
}

// spinGroup is the one spinning thread of this process: it serves the listeners and
// connections of every spinning floor node, so a spinning floor costs one core per process
// however many nodes it has (as one busy-polling reactor per engine would, not one per
// peer). It runs while at least one node is registered.
type spinGroup struct {
	mu      sync.Mutex
	nodes   []*floorNode
	acks    []chan struct{} // removals waiting for the loop to let go of a node's fds
	gen     atomic.Uint64   // bumped on every change of nodes
	running bool
}

var spinners spinGroup

func (g *spinGroup) add(n *floorNode) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.nodes = append(g.nodes, n)
	g.gen.Add(1)
	if !g.running {
		g.running = true
		go g.loop()
	}
}

// remove returns once the loop no longer touches n's sockets (within one round).
func (g *spinGroup) remove(n *floorNode) {
	ack := make(chan struct{})
	g.mu.Lock()
	g.nodes = slices.DeleteFunc(g.nodes, func(m *floorNode) bool { return m == n })
	g.acks = append(g.acks, ack)
	g.gen.Add(1)
	g.mu.Unlock()
	<-ack
}

type spinConn struct {
	fd int
	n  *floorNode
}

func (g *spinGroup) loop() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	buf := make([]byte, 1<<17)
	var hdr [floorHdr]byte
	var (
		nodes []*floorNode
		conns []spinConn
		seen  uint64
	)
	for {
		if gen := g.gen.Load(); gen != seen {
			g.mu.Lock()
			seen = g.gen.Load()
			nodes = append(nodes[:0], g.nodes...)
			acks := g.acks
			g.acks = nil
			conns = slices.DeleteFunc(conns, func(c spinConn) bool { return !slices.Contains(nodes, c.n) })
			exit := len(nodes) == 0
			if exit {
				g.running = false
			}
			g.mu.Unlock()
			for _, a := range acks {
				close(a)
			}
			if exit {
				return
			}
		}
		busy := false
		for _, n := range nodes {
			fd, err := acceptRaw(n.lfd)
			if err != nil {
				continue
			}
			_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
			n.mu.Lock()
			n.fds = append(n.fds, fd)
			n.mu.Unlock()
			conns = append(conns, spinConn{fd: fd, n: n})
			busy = true
		}
		for i := 0; i < len(conns); i++ {
			c := conns[i]
			k, err := unix.Read(c.fd, hdr[:])
			if err == unix.EAGAIN || err == unix.EINTR {
				continue
			}
			if err == nil && k > 0 && k < floorHdr {
				err = readFull(c.fd, hdr[k:], true)
			}
			if err == nil && k > 0 {
				err = c.n.serveFrame(c.fd, hdr[:], buf, true)
			}
			if err != nil || k == 0 {
				conns = slices.Delete(conns, i, i+1) // closed: the node closes the fd
				i--
				continue
			}
			busy = true
		}
		if !busy {
			_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
		}
	}
}

func (n *floorNode) close(context.Context) error {
	if n.spin {
		spinners.remove(n)
	}
	_ = unix.Shutdown(n.lfd, unix.SHUT_RDWR)
	n.acceptWG.Wait()
	n.mu.Lock()
	for _, fd := range n.fds {
		_ = unix.Shutdown(fd, unix.SHUT_RDWR)
	}
	n.mu.Unlock()
	n.connWG.Wait()
	n.mu.Lock()
	for _, fd := range n.fds {
		_ = unix.Close(fd)
	}
	n.fds = nil
	n.mu.Unlock()
	return unix.Close(n.lfd)
}

func (n *floorNode) newClient(peers []string) (client, error) {
	if n.epoll {
		if len(peers) != 1 {
			return nil, fmt.Errorf("%w: %s: one peer (latency), not %d", ErrConfig, FloorEpoll, len(peers))
		}
		return newEpollClient(peers)
	}
	if n.uring {
		if len(peers) != 1 {
			return nil, fmt.Errorf("%w: %s: one peer (latency), not %d", ErrConfig, FloorURing, len(peers))
		}
		return newURingClient(peers)
	}
	return newFloorClient(n.spinClients, peers)
}

// floorClient sends to floor receivers over its own connections, made on first use. Use
// it from one goroutine locked to its OS thread.
type floorClient struct {
	spin  bool
	peers []*unix.SockaddrInet4
	fds   []int
	buf   []byte
}

func newFloorClient(spin bool, peers []string) (*floorClient, error) {
	c := &floorClient{spin: spin, fds: make([]int, len(peers))}
	for i, p := range peers {
		sa, err := sockaddr(p)
		if err != nil {
			return nil, err
		}
		c.peers = append(c.peers, sa)
		c.fds[i] = -1
	}
	return c, nil
}

func (c *floorClient) lockThread() bool { return true }

func (c *floorClient) send(_ context.Context, p int, msg []byte) error {
	fd := c.fds[p]
	if fd < 0 {
		var err error
		if fd, err = tcpConnect(c.peers[p]); err != nil {
			return err
		}
		if c.spin {
			_ = unix.SetNonblock(fd, true)
		}
		c.fds[p] = fd
	}
	c.buf = binary.LittleEndian.AppendUint32(c.buf[:0], uint32(len(msg)))
	c.buf = append(c.buf, msg...)
	if err := writeAll(fd, c.buf, c.spin); err != nil {
		return err
	}
	var ack [1]byte
	return readFull(fd, ack[:], c.spin)
}

func (c *floorClient) close() {
	for i, fd := range c.fds {
		if fd >= 0 {
			_ = unix.Close(fd)
			c.fds[i] = -1
		}
	}
}

// acceptRaw is a non-blocking accept4 that asks for no peer address, so polling an idle
// listener allocates nothing (unix.Accept4 allocates the address every call).
func acceptRaw(lfd int) (int, error) {
	fd, _, errno := unix.Syscall6(unix.SYS_ACCEPT4, uintptr(lfd), 0, 0,
		unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0, 0)
	if errno != 0 {
		return -1, errno
	}
	return int(fd), nil
}
