package soak

import (
	"fmt"
	"os"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"
)

// cutConns shuts down, both ways, every connected TCP socket of this process with one of
// ports at either end: the OOB connections of its engines (to and from their peers), cut
// as a reset path would cut them. The engines see their reads end and their writes fail;
// what happens next is theirs. It returns how many it cut.
func cutConns(ports []int) (int, error) {
	if len(ports) == 0 {
		return 0, nil
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0, fmt.Errorf("list fds: %w", err)
	}
	n := 0
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd <= 2 {
			continue
		}
		if oobConn(fd, ports) && unix.Shutdown(fd, unix.SHUT_RDWR) == nil {
			n++
		}
	}
	return n, nil
}

// oobConn says whether fd is a connected TCP socket with a port of ports at either end.
func oobConn(fd int, ports []int) bool {
	if t, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE); err != nil || t != unix.SOCK_STREAM {
		return false // not a socket (ENOTSOCK), or not a stream one
	}
	if p, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL); err != nil || p != unix.IPPROTO_TCP {
		return false
	}
	peer, err := unix.Getpeername(fd)
	if err != nil {
		return false // a listener, or not connected
	}
	local, err := unix.Getsockname(fd)
	if err != nil {
		return false
	}
	return slices.Contains(ports, port(peer)) || slices.Contains(ports, port(local))
}

func port(sa unix.Sockaddr) int {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return a.Port
	case *unix.SockaddrInet6:
		return a.Port
	}
	return -1
}
