package bench

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// floor-uring: floor-block's exchange (a length-prefixed message, a one-byte ack) waited
// for through io_uring, the shape a reactor on io_uring would have. The client submits its
// message's SEND (no completion on success) and the RECV of the ack in one io_uring_enter,
// which waits for the RECV's completion: one system call per message where floor-epoll
// makes a write, an epoll_wait and a read, and no set to disarm. The receiver's thread
// waits the same way for its RECV, then submits the ack's SEND with the next RECV. Latency
// only; a reference for what the reactor's waits would cost on io_uring, with no engine.

const (
	uringTagRecv = 1
	uringTagSend = 2
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
	r, err := newURing(8)
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
	r, err := newURing(8)
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

// uringClient is floor-uring's client: one connection and the ring of the client's locked
// thread, set up on its first send.
type uringClient struct {
	peer *unix.SockaddrInet4
	fd   int
	r    *uring
	buf  []byte // the message; the kernel may read it until the ack comes
	ack  []byte
}

func newURingClient(peers []string) (*uringClient, error) {
	sa, err := sockaddr(peers[0])
	if err != nil {
		return nil, err
	}
	return &uringClient{peer: sa, fd: -1, ack: make([]byte, 1)}, nil
}

func (c *uringClient) lockThread() bool { return true }

func (c *uringClient) send(_ context.Context, _ int, msg []byte) error {
	if c.fd < 0 {
		fd, err := tcpConnect(c.peer)
		if err != nil {
			return err
		}
		c.fd = fd
		if c.r, err = newURing(8); err != nil {
			c.close()
			return err
		}
	}
	c.buf = binary.LittleEndian.AppendUint32(c.buf[:0], uint32(len(msg)))
	c.buf = append(c.buf, msg...)
	// The SEND completes silently (MSG_WAITALL: the kernel sends it whole); the ack's
	// arrival says it did, so c.buf is free again when send returns.
	c.r.queue(uringOpSend, uringSkipSuccess, c.fd, c.buf, unix.MSG_WAITALL|unix.MSG_NOSIGNAL, uringTagSend)
	c.r.queue(uringOpRecv, 0, c.fd, c.ack, 0, uringTagRecv)
	for {
		if err := c.r.enter(epollWait); err != nil {
			c.close() // the next send starts over on a new connection and ring
			return err
		}
		var res int32
		done := false
		c.r.reap(func(tag uint64, v int32) {
			if !done || tag == uringTagSend {
				res, done = v, true
				if tag == uringTagSend && v >= 0 {
					res = -int32(unix.EIO) // a send's completion comes only when it failed
				}
			}
		})
		switch {
		case !done:
			continue
		case res == 0:
			c.close()
			return errEOF
		case res < 0:
			c.close()
			return fmt.Errorf("bench: floor-uring: %w", unix.Errno(-res))
		}
		return nil
	}
}

func (c *uringClient) close() {
	if c.r != nil {
		c.r.close()
		c.r = nil
	}
	if c.fd >= 0 {
		_ = unix.Close(c.fd)
		c.fd = -1
	}
}
