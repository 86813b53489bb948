package soft

import (
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/twosided/twosided/ibv"
)

// progressSocket puts one end of a socket pair in ctx's device's progress set, as a
// connection's socket is, and returns the other end to write to. Progress finds no
// connection for it and leaves its bytes alone, so it stays readable.
func progressSocket(t *testing.T, x *context) int {
	t.Helper()
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	require.NoError(t, unix.EpollCtl(x.d.pfd, unix.EPOLL_CTL_ADD, sp[0], &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(sp[0])}))
	t.Cleanup(func() {
		_ = unix.Close(sp[0])
		_ = unix.Close(sp[1])
	})
	return sp[1]
}

func openCtx(t *testing.T, p *Provider) *context {
	t.Helper()
	c, err := p.Open("soft0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c.(*context)
}

func readableNow(t *testing.T, fd int) bool {
	t.Helper()
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(pfd, 0)
	require.NoError(t, err)
	return n == 1
}

// TestProgressSetHeldByOneChannel: the device's progress set sits in one channel's fd at a
// time, so a readable socket makes that channel readable and no other; a channel whose
// consumer waits (GetEvent) takes it from one whose consumer never did, or from a holder the
// backstop had to stand in for; a closing holder hands it to a waited channel.
func TestProgressSetHeldByOneChannel(t *testing.T) {
	p := New(WithDevices(1))
	x := openCtx(t, p)
	d := x.d
	peer := progressSocket(t, x)
	var chs [3]*channel
	for i := range chs {
		c, err := x.CreateCompChannel()
		require.NoError(t, err)
		chs[i] = c.(*channel)
	}
	holder := func() *channel {
		d.holdMu.Lock()
		defer d.holdMu.Unlock()
		return d.holder
	}
	_, err := unix.Write(peer, []byte{1})
	require.NoError(t, err)
	shows := func(want *channel) {
		t.Helper()
		require.Same(t, want, holder())
		for i, c := range chs {
			if c.enrolled {
				require.Equal(t, c == want, readableNow(t, c.Fd()), "channel %d", i)
			}
		}
	}
	shows(chs[0]) // the first channel

	_, err = chs[1].GetEvent() // a consumer waits on chs[1]: it takes the set
	require.ErrorIs(t, err, ibv.ErrWouldBlock)
	shows(chs[1])
	_, err = chs[2].GetEvent() // the holder is waited on already
	require.ErrorIs(t, err, ibv.ErrWouldBlock)
	shows(chs[1])

	require.NoError(t, chs[1].Close()) // to the other waited channel
	shows(chs[2])

	d.holderNotServed() // the backstop read for the consumers: the next waiting one takes it
	_, err = chs[0].GetEvent()
	require.ErrorIs(t, err, ibv.ErrWouldBlock)
	shows(chs[0])

	require.NoError(t, chs[0].Close())
	shows(chs[2])
	require.NoError(t, chs[2].Close())
	require.Nil(t, holder())
	c, err := x.CreateCompChannel() // a new first channel holds it again
	require.NoError(t, err)
	chs[0] = c.(*channel)
	shows(chs[0])
}

// TestProgressSetNestsOnceAtScale: 1000 channels of one device, each watched by its own
// consumer set nested in an outer set (a reactor loop's outer set, its own set, the
// channel's fd, the progress set: the deepest nesting a loop makes), while the progress set
// holds a socket. Every EPOLL_CTL_ADD succeeds: the socket has one wake-up path, not one per
// channel. With the progress set nested in every channel's fd, the 51st add failed with
// EINVAL (the kernel's cap of 50 paths at that depth; checked).
func TestProgressSetNestsOnceAtScale(t *testing.T) {
	const n = 1000
	var rl unix.Rlimit
	require.NoError(t, unix.Getrlimit(unix.RLIMIT_NOFILE, &rl))
	if rl.Cur < 4*n+128 {
		t.Skipf("RLIMIT_NOFILE %d is below the %d fds this test opens", rl.Cur, 4*n+128)
	}
	p := New(WithDevices(1))
	x := openCtx(t, p)
	progressSocket(t, x)
	add := func(set, fd int) error {
		return unix.EpollCtl(set, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)})
	}
	for i := 0; i < n; i++ {
		c, err := x.CreateCompChannel()
		require.NoError(t, err, "channel %d", i+1)
		outer, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		require.NoError(t, err)
		set, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		require.NoError(t, err)
		t.Cleanup(func() {
			_ = unix.Close(outer)
			_ = unix.Close(set)
		})
		require.NoError(t, add(outer, set))
		require.NoError(t, add(set, c.Fd()), "channel %d", i+1)
	}
}
