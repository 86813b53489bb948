package bench

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// The ring moves bytes both ways on a socket pair; a SEND that succeeds leaves no
// completion, one that fails leaves its error; a wait with nothing coming ends at its bound.
// Both kinds of ring: single-issuer (locked thread) and shared.
func TestURing(t *testing.T) {
	for _, single := range []bool{true, false} {
		t.Run(fmt.Sprintf("single=%v", single), func(t *testing.T) { testURing(t, single) })
	}
}

func testURing(t *testing.T, single bool) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r, err := newURing(8, single)
	if err != nil {
		t.Skipf("no io_uring here: %v", err)
	}
	defer r.close()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(fds[1])

	type cqe struct {
		tag uint64
		res int32
	}
	reap := func() []cqe {
		var out []cqe
		r.reap(func(tag uint64, res int32) { out = append(out, cqe{tag, res}) })
		return out
	}
	msg, in := []byte("notify"), make([]byte, 16)
	r.queue(uringOpSend, uringSkipSuccess, fds[0], msg, unix.MSG_WAITALL|unix.MSG_NOSIGNAL, uringTagSend)
	r.queue(uringOpRecv, 0, fds[1], in, 0, uringTagRecv)
	require.NoError(t, r.enter(epollWait))
	require.Equal(t, []cqe{{uringTagRecv, int32(len(msg))}}, reap(), "the send completed silently")
	require.Equal(t, "notify", string(in[:len(msg)]))

	// Nothing to receive: the wait ends at its bound, and the RECV stays queued.
	r.queue(uringOpRecv, 0, fds[0], in, 0, uringTagRecv)
	require.ErrorIs(t, r.enter(10*time.Millisecond), errDeadline)
	require.Empty(t, reap())
	_, err = unix.Write(fds[1], []byte("ack"))
	require.NoError(t, err)
	require.NoError(t, r.enter(epollWait))
	require.Equal(t, []cqe{{uringTagRecv, 3}}, reap())

	// An epoll_ctl through the ring: one that succeeds leaves no completion, one that
	// fails (an fd not in the set) leaves its error.
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	require.NoError(t, err)
	defer unix.Close(ep)
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fds[1])}
	r.queueEpollCtl(uringSkipSuccess, ep, unix.EPOLL_CTL_ADD, fds[1], &ev, uringTagCtl)
	r.queueEpollCtl(uringSkipSuccess, ep, unix.EPOLL_CTL_MOD, fds[0], &ev, uringTagCtl)
	require.NoError(t, r.enter(epollWait))
	require.Equal(t, []cqe{{uringTagCtl, -int32(unix.ENOENT)}}, reap())
	require.ErrorIs(t, unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fds[1], &ev), unix.EEXIST, "the ring's ADD took")

	// A SEND to a closed peer fails, and its completion says so.
	require.NoError(t, unix.Close(fds[0]))
	r.queue(uringOpSend, uringSkipSuccess, fds[1], msg, unix.MSG_WAITALL|unix.MSG_NOSIGNAL, uringTagSend)
	require.NoError(t, r.enter(epollWait))
	require.Equal(t, []cqe{{uringTagSend, -int32(unix.EPIPE)}}, reap())
}
