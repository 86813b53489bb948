package bench

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// floor-uring: floor-block's exchange (a length-prefixed message, a one-byte ack) waited
// for as a reactor on io_uring would wait, with none of the engine. The receiver's thread
// waits in io_uring_enter for its RECV, then submits its ack's SEND (no completion on
// success) with its next RECV and waits again: one system call per message where
// floor-epoll makes an epoll_wait, a read and a write. The client waits as ExecWait would
// on a ring: a second thread (the loop's) sleeps on an outer epoll set holding the ring,
// and the client's one io_uring_enter disarms the ring there (IORING_OP_EPOLL_CTL), sends
// the message and waits for the RECV of its ack; it then re-arms the ring (epoll_ctl).
// The rings are ones any thread may enter (a borrowed turn's caller would), not
// single-issuer. Latency only.
const (
	uringTagRecv = 1
	uringTagSend = 2
	uringTagCtl  = 3
)

// newURingFloorNode starts a floor-uring receiver, after checking that this kernel sets up
// a ring.
func newURingFloorNode(host string, s *sink) (*floorNode, error) {
	if err := probeURing(); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrConfig, FloorURing, err)
	}
	lfd, addr, err := tcpListen(host)
	if err != nil {
		return nil, err
	}
	n := &floorNode{uring: true, lfd: lfd, address: addr, sink: s}
	n.acceptWG.Add(1)
	go n.acceptLoop()
	return n, nil
}

func probeURing() error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r, err := newURing(8, false)
	if err != nil {
		return err
	}
	r.close()
	return nil
}

// uringConn serves one connection of a floor-uring node.
func (n *floorNode) uringConn(fd int) {
	defer n.connWG.Done()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r, err := newURing(8, false)
	if err != nil {
		return
	}
	defer r.close()
	buf := make([]byte, 2*(floorHdr+maxSize)) // a whole message always fits
	acks := bytes.Repeat([]byte{1}, len(buf)/floorHdr)
	have := 0
	r.queue(uringOpRecv, 0, fd, buf, 0, uringTagRecv)
	for {
		if r.enter(epollWait) != nil {
			return // failed, or nothing for epollWait
		}
		got, failed := 0, false
		r.reap(func(tag uint64, res int32) {
			if tag != uringTagRecv || res <= 0 {
				failed = true // an ack that failed, or the peer closed (or close shut it down)
				return
			}
			got = int(res)
		})
		if failed {
			return
		}
		if got == 0 {
			continue
		}
		have += got
		off, k := 0, 0
		for have-off >= floorHdr {
			size := int(binary.LittleEndian.Uint32(buf[off:]))
			if floorHdr+size > len(buf) {
				return // no bench message is this large: not a floor-uring client
			}
			if have-off < floorHdr+size {
				break
			}
			n.sink.deliver(buf[off+floorHdr : off+floorHdr+size])
			k++
			off += floorHdr + size
		}
		have = copy(buf, buf[off:have])
		if k > 0 {
			r.queue(uringOpSend, uringSkipSuccess, fd, acks[:k], unix.MSG_WAITALL|unix.MSG_NOSIGNAL, uringTagSend)
		}
		r.queue(uringOpRecv, 0, fd, buf[have:], 0, uringTagRecv)
	}
}

// uringClient is floor-uring's client: one connection, the ring, the outer set and the
// thread asleep on it (the loop's, which never has anything to do here), set up on the
// first send.
type uringClient struct {
	peer       *unix.SockaddrInet4
	fd, outer  int
	stp        int
	r          *uring
	sleeper    chan struct{}
	armed, off unix.EpollEvent // the ring's entry in the outer set: watched, disarmed
	buf        []byte          // the message; the kernel may read it until the ack comes
	ack        []byte
}

func newURingClient(peers []string) (*uringClient, error) {
	sa, err := sockaddr(peers[0])
	if err != nil {
		return nil, err
	}
	return &uringClient{peer: sa, fd: -1, outer: -1, stp: -1, ack: make([]byte, 1)}, nil
}

func (c *uringClient) lockThread() bool { return true }

func (c *uringClient) open() error {
	fd, err := tcpConnect(c.peer)
	if err != nil {
		return err
	}
	c.fd = fd
	if c.r, err = newURing(8, false); err != nil {
		return err
	}
	if c.outer, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return err
	}
	if c.stp, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		return err
	}
	// Edge-triggered: a completion that comes while the ring is watched wakes the stand-in
	// once; the loop would take the turn and reap it, the stand-in leaves it to the client.
	c.armed = unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET, Fd: int32(c.r.fd)}
	c.off = unix.EpollEvent{Fd: int32(c.r.fd)}
	if err := unix.EpollCtl(c.outer, unix.EPOLL_CTL_ADD, c.r.fd, &c.armed); err != nil {
		return err
	}
	if err := unix.EpollCtl(c.outer, unix.EPOLL_CTL_ADD, c.stp, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(c.stp)}); err != nil {
		return err
	}
	c.sleeper = make(chan struct{})
	go func(outer, stp int) {
		defer close(c.sleeper)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var evs [2]unix.EpollEvent
		for {
			k, err := unix.EpollWait(outer, evs[:], int(epollWait/time.Millisecond))
			if err != nil && err != unix.EINTR {
				return
			}
			for _, ev := range evs[:max(k, 0)] {
				if int(ev.Fd) == stp {
					return
				}
			}
		}
	}(c.outer, c.stp)
	return nil
}

func (c *uringClient) send(_ context.Context, _ int, msg []byte) error {
	if c.fd < 0 {
		if err := c.open(); err != nil {
			c.close()
			return err
		}
	}
	c.buf = binary.LittleEndian.AppendUint32(c.buf[:0], uint32(len(msg)))
	c.buf = append(c.buf, msg...)
	// One system call: the ring leaves the outer set's watch, the SEND completes silently
	// (MSG_WAITALL: the kernel sends it whole; the ack's arrival says it did, so c.buf is
	// free again when send returns), and the wait is for the ack's RECV.
	c.r.queueEpollCtl(uringSkipSuccess, c.outer, unix.EPOLL_CTL_MOD, c.r.fd, &c.off, uringTagCtl)
	c.r.queue(uringOpSend, uringSkipSuccess, c.fd, c.buf, unix.MSG_WAITALL|unix.MSG_NOSIGNAL, uringTagSend)
	c.r.queue(uringOpRecv, 0, c.fd, c.ack, 0, uringTagRecv)
	err := c.await()
	if err != nil {
		c.close() // the next send starts over on a new connection and ring
		return err
	}
	_ = unix.EpollCtl(c.outer, unix.EPOLL_CTL_MOD, c.r.fd, &c.armed)
	return nil
}

// await waits for the ack's RECV; a failed disarm or SEND (their only completions) fails it.
func (c *uringClient) await() error {
	for {
		if err := c.r.enter(epollWait); err != nil {
			return err
		}
		var res int32
		var tag uint64
		c.r.reap(func(t uint64, v int32) {
			if tag == 0 || t != uringTagRecv {
				tag, res = t, v
				if t != uringTagRecv && v >= 0 {
					res = -int32(unix.EIO) // not expected: only failures complete
				}
			}
		})
		switch {
		case tag == 0:
			continue
		case res < 0:
			return fmt.Errorf("bench: floor-uring (%s): %w", uringOpName(tag), unix.Errno(-res))
		case res == 0:
			return errEOF
		}
		return nil
	}
}

func (c *uringClient) close() {
	if c.sleeper != nil {
		one := [8]byte{1}
		_, _ = unix.Write(c.stp, one[:])
		<-c.sleeper
		c.sleeper = nil
	}
	if c.r != nil {
		c.r.close()
		c.r = nil
	}
	for _, f := range []*int{&c.fd, &c.outer, &c.stp} {
		if *f >= 0 {
			_ = unix.Close(*f)
			*f = -1
		}
	}
}

// uringOpName names the operation behind a completion's tag, for errors.
func uringOpName(tag uint64) string {
	switch tag {
	case uringTagRecv:
		return "recv"
	case uringTagSend:
		return "send"
	case uringTagCtl:
		return "disarm"
	}
	return fmt.Sprintf("tag %d", tag)
}
