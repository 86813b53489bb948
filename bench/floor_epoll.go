package bench

import (
	"context"
	"encoding/binary"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// floor-epoll: floor-block's exchange (a length-prefixed message, a one-byte ack) with the
// waits an engine's reactor makes and nothing else of the engine, so that the bench can tell
// what the reactor's shape costs from what its code costs. The receiver's thread blocks in
// epoll_wait on a set holding the connection, then reads what came with one non-blocking
// read (as a reactor turn does); the client writes, then waits as ExecWait does: it disarms
// its set in an outer set on which a second thread (the loop's) sleeps, blocks in
// epoll_wait on its set, reads the ack, and re-arms the set in the outer one. Latency only.

// epollWait bounds one wait of floor-epoll; a floor that waits longer failed.
const epollWait = 10 * time.Second

// epollConn serves one connection of a floor-epoll node.
func (n *floorNode) epollConn(fd int) {
	defer n.connWG.Done()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	ep, err := epollFor(fd)
	if err != nil {
		return
	}
	defer unix.Close(ep)
	buf := make([]byte, 2*(floorHdr+maxSize)) // a whole message always fits
	have := 0
	var evs [1]unix.EpollEvent
	ack := [1]byte{1}
	for {
		k, err := unix.EpollWait(ep, evs[:], int(epollWait/time.Millisecond))
		if err == unix.EINTR {
			continue
		}
		if err != nil || k == 0 {
			return // failed, or nothing for epollWait
		}
		m, err := unix.Read(fd, buf[have:])
		if err == unix.EAGAIN || err == unix.EINTR {
			continue
		}
		if err != nil || m == 0 {
			return // closed by the peer, or shut down by close
		}
		have += m
		off := 0
		for have-off >= floorHdr {
			size := int(binary.LittleEndian.Uint32(buf[off:]))
			if floorHdr+size > len(buf) {
				return // no bench message is this large: not a floor-epoll client
			}
			if have-off < floorHdr+size {
				break
			}
			n.sink.deliver(buf[off+floorHdr : off+floorHdr+size])
			if writeAll(fd, ack[:], false) != nil {
				return
			}
			off += floorHdr + size
		}
		have = copy(buf, buf[off:have])
	}
}

// epollFor makes fd non-blocking and returns an epoll set holding it.
func epollFor(fd int) (int, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		return -1, err
	}
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return -1, err
	}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}); err != nil {
		unix.Close(ep)
		return -1, err
	}
	return ep, nil
}

// epollClient is floor-epoll's client: one connection, its set, the outer set and the
// thread asleep on it (the loop's, which never has anything to do here).
type epollClient struct {
	peer               *unix.SockaddrInet4
	fd, ep, outer, stp int
	sleeper            chan struct{}
	buf                []byte
}

func newEpollClient(peers []string) (*epollClient, error) {
	sa, err := sockaddr(peers[0])
	if err != nil {
		return nil, err
	}
	return &epollClient{peer: sa, fd: -1, ep: -1, outer: -1, stp: -1}, nil
}

func (c *epollClient) lockThread() bool { return true }

func (c *epollClient) open() error {
	fd, err := tcpConnect(c.peer)
	if err != nil {
		return err
	}
	c.fd = fd
	if c.ep, err = epollFor(fd); err != nil {
		return err
	}
	if c.outer, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return err
	}
	if c.stp, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
		return err
	}
	for _, f := range []int{c.ep, c.stp} {
		if err := unix.EpollCtl(c.outer, unix.EPOLL_CTL_ADD, f, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(f)}); err != nil {
			return err
		}
	}
	c.sleeper = make(chan struct{})
	go func(outer, ep, stp int) {
		defer close(c.sleeper)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var evs [2]unix.EpollEvent
		var inner [1]unix.EpollEvent
		for {
			k, err := unix.EpollWait(outer, evs[:], int(epollWait/time.Millisecond))
			if err != nil && err != unix.EINTR {
				return
			}
			for _, ev := range evs[:max(k, 0)] {
				if int(ev.Fd) == stp {
					return
				}
				// The client's set was reported: an ack that came before the client
				// disarmed it, or a re-arm while the set still listed the connection just
				// read. Look into it, as a loop thread woken through its outer set does
				// (which clears a stale entry); what is there stays for the client
				// (level-triggered).
				_, _ = unix.EpollWait(ep, inner[:], 0)
			}
		}
	}(c.outer, c.ep, c.stp)
	return nil
}

// arm disarms (0) or re-arms (EPOLLIN) the client's set in the outer set.
func (c *epollClient) arm(events uint32) {
	_ = unix.EpollCtl(c.outer, unix.EPOLL_CTL_MOD, c.ep, &unix.EpollEvent{Events: events, Fd: int32(c.ep)})
}

func (c *epollClient) send(_ context.Context, _ int, msg []byte) error {
	if c.fd < 0 {
		if err := c.open(); err != nil {
			c.close()
			return err
		}
	}
	c.buf = binary.LittleEndian.AppendUint32(c.buf[:0], uint32(len(msg)))
	c.buf = append(c.buf, msg...)
	if err := writeAll(c.fd, c.buf, false); err != nil {
		return err
	}
	c.arm(0)
	defer c.arm(unix.EPOLLIN)
	var evs [1]unix.EpollEvent
	var ack [1]byte
	for {
		k, err := unix.EpollWait(c.ep, evs[:], int(epollWait/time.Millisecond))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if k == 0 {
			return errDeadline
		}
		m, err := unix.Read(c.fd, ack[:])
		switch {
		case err == unix.EAGAIN || err == unix.EINTR:
			continue
		case err != nil:
			return err
		case m == 0:
			return errEOF
		}
		return nil
	}
}

func (c *epollClient) close() {
	if c.sleeper != nil {
		one := [8]byte{1}
		_, _ = unix.Write(c.stp, one[:])
		<-c.sleeper
		c.sleeper = nil
	}
	for _, f := range []*int{&c.fd, &c.ep, &c.outer, &c.stp} {
		if *f >= 0 {
			_ = unix.Close(*f)
			*f = -1
		}
	}
}
