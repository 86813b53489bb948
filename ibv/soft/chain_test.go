package soft_test

import (
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// tcpPair is a connected TCP loopback pair with TCP_NODELAY.
func tcpPair(b *testing.B) (int, int) {
	lfd, _ := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
	defer unix.Close(lfd)
	require.NoError(b, unix.Bind(lfd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	unix.Listen(lfd, 1)
	sa, _ := unix.Getsockname(lfd)
	cfd, _ := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
	require.NoError(b, unix.Connect(cfd, sa))
	sfd, _, _ := unix.Accept(lfd)
	unix.SetsockoptInt(cfd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	unix.SetsockoptInt(sfd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	return cfd, sfd
}

// BenchmarkRawTCPEventfdChain is the floor of a design with a NIC thread between the wire
// and the consumer: a writes TCP, a relay thread blocked in read(2) wakes and writes an
// eventfd, b wakes in epoll_wait and answers the same way back. ns/op is one round trip.
func BenchmarkRawTCPEventfdChain(b *testing.B) {
	c1, s1 := tcpPair(b)
	c2, s2 := tcpPair(b)
	e1, _ := unix.Eventfd(0, unix.EFD_NONBLOCK)
	e2, _ := unix.Eventfd(0, unix.EFD_NONBLOCK)
	n := b.N
	var wg sync.WaitGroup
	relay := func(in, efd int) {
		defer wg.Done()
		runtime.LockOSThread()
		buf := make([]byte, 64)
		one := []byte{1, 0, 0, 0, 0, 0, 0, 0}
		for i := 0; i < n; i++ {
			unix.Read(in, buf)
			unix.Write(efd, one)
		}
	}
	waiter := func(efd int) func() {
		ep, _ := unix.EpollCreate1(0)
		unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, efd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(efd)})
		evs := make([]unix.EpollEvent, 1)
		buf := make([]byte, 8)
		return func() {
			for {
				k, _ := unix.EpollWait(ep, evs, 1000)
				if k > 0 {
					unix.Read(efd, buf)
					return
				}
			}
		}
	}
	wg.Add(3)
	go relay(s1, e1)
	go relay(s2, e2)
	go func() {
		defer wg.Done()
		runtime.LockOSThread()
		w := waiter(e1)
		buf := make([]byte, 64)
		for i := 0; i < n; i++ {
			w()
			unix.Write(c2, buf)
		}
	}()
	runtime.LockOSThread()
	w := waiter(e2)
	buf := make([]byte, 64)
	b.ResetTimer()
	for i := 0; i < n; i++ {
		unix.Write(c1, buf)
		w()
	}
	b.StopTimer()
	runtime.UnlockOSThread()
	wg.Wait()
}
