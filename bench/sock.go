package bench

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// Plain TCP sockets through x/sys/unix, used by the floors and the classic client. The
// caller's goroutine blocks in the kernel (blocking sockets) or spins (non-blocking sockets,
// EAGAIN); Go's netpoller is not involved, so one message costs one kernel wake-up at most.

// errDeadline: a floor or classic wait ran past its deadline.
var errDeadline = errors.New("bench: deadline exceeded")

// ioTimeout bounds every blocking socket call (SO_RCVTIMEO / SO_SNDTIMEO).
const ioTimeout = 10 * time.Second

func sockaddr(addr string) (*unix.SockaddrInet4, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, fmt.Errorf("bench: address %q: %w", addr, err)
	}
	if !ap.Addr().Is4() {
		return nil, fmt.Errorf("bench: address %q: want IPv4", addr)
	}
	return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}, nil
}

func setTimeouts(fd int, d time.Duration) {
	tv := unix.NsecToTimeval(d.Nanoseconds())
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
}

// tcpListen opens a blocking listener on host (an IPv4 address; "": 127.0.0.1) with an
// ephemeral port.
func tcpListen(host string) (int, string, error) {
	ip := [4]byte{127, 0, 0, 1}
	if host != "" {
		a, err := netip.ParseAddr(host)
		if err != nil || !a.Is4() {
			return -1, "", fmt.Errorf("bench: listen address %q: want an IPv4 address", host)
		}
		ip = a.As4()
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, "", fmt.Errorf("bench: socket: %w", err)
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: ip}); err != nil {
		unix.Close(fd)
		return -1, "", fmt.Errorf("bench: bind: %w", err)
	}
	if err := unix.Listen(fd, 1024); err != nil {
		unix.Close(fd)
		return -1, "", fmt.Errorf("bench: listen: %w", err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		unix.Close(fd)
		return -1, "", fmt.Errorf("bench: getsockname: %w", err)
	}
	in4 := sa.(*unix.SockaddrInet4)
	return fd, netip.AddrPortFrom(netip.AddrFrom4(in4.Addr), uint16(in4.Port)).String(), nil
}

// tcpConnect makes a blocking connection with TCP_NODELAY and I/O timeouts.
func tcpConnect(sa *unix.SockaddrInet4) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("bench: socket: %w", err)
	}
	setTimeouts(fd, ioTimeout)
	_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	for {
		err = unix.Connect(fd, sa)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bench: connect %d: %w", sa.Port, err)
	}
	return fd, nil
}

// tcpAccept accepts one connection; it fails once the listener is shut down. Accepted
// sockets have no I/O timeout: their reads end when the node shuts them down.
func tcpAccept(lfd int) (int, error) {
	for {
		fd, _, err := unix.Accept4(lfd, unix.SOCK_CLOEXEC)
		if err == unix.EINTR || err == unix.ECONNABORTED {
			continue
		}
		if err != nil {
			return -1, err
		}
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		return fd, nil
	}
}

// spinner bounds a spin loop by a deadline, reading the clock every 256 rounds.
type spinner struct {
	deadline int64
	n        uint32
}

func newSpinner() spinner { return spinner{deadline: nanotime() + int64(ioTimeout)} }

// again is called after EAGAIN: it yields the CPU to any other runnable thread (the loop
// keeps spinning, it never sleeps) and reports whether the deadline passed.
func (s *spinner) again() bool {
	_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
	s.n++
	return s.n&255 == 0 && nanotime() > s.deadline
}

// readFull and writeAll are written out twice on purpose: one helper taking unix.Read or
// unix.Write as a func value makes the callers' buffers escape (2 allocations per floor
// notify, caught by TestFloorSendAllocatesNothing).
//
// readFull fills b from fd. With spin (a non-blocking fd) it spins through EAGAIN; on a
// blocking fd EAGAIN is SO_RCVTIMEO expiring.
func readFull(fd int, b []byte, spin bool) error {
	sp := spinner{}
	started := false
	for len(b) > 0 {
		n, err := unix.Read(fd, b)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			if !spin {
				return errDeadline
			}
			if !started {
				sp, started = newSpinner(), true
			}
			if sp.again() {
				return errDeadline
			}
			continue
		case err != nil:
			return err
		case n == 0:
			return errEOF
		}
		b = b[n:]
	}
	return nil
}

var errEOF = errors.New("bench: connection closed")

// writeAll writes b to fd. With spin (a non-blocking fd) it spins through EAGAIN.
func writeAll(fd int, b []byte, spin bool) error {
	sp := spinner{}
	started := false
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			if !spin {
				return errDeadline
			}
			if !started {
				sp, started = newSpinner(), true
			}
			if sp.again() {
				return errDeadline
			}
			continue
		case err != nil:
			return err
		}
		b = b[n:]
	}
	return nil
}
