package reactor

import (
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// byteReader registers one end of a socket pair with add (Add or AddDrained) and a handler
// that reads what comes (a short read: it drains) and records the thread it ran on; it
// returns the other end, to write to.
func byteReader(t *testing.T, l *Loop, drained bool) (fd, peer int, handledOn *atomic.Int64, handled <-chan struct{}) {
	t.Helper()
	a, b := socketpair(t)
	t.Cleanup(func() { closeFd(b) })
	handledOn = new(atomic.Int64)
	ch := make(chan struct{}, 4)
	h := func(Events) {
		var buf [8]byte
		if k, _ := unix.Read(a, buf[:]); k > 0 {
			handledOn.Store(int64(unix.Gettid()))
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
	onLoop(t, l, func() {
		if drained {
			require.NoError(t, l.AddDrained(a, Readable, h))
		} else {
			require.NoError(t, l.Add(a, Readable, h))
		}
	})
	return a, b, handledOn, ch
}

// answeredInTurn runs an ExecWait whose answer is written to peer once the wait has begun
// (at its first look at done, as a peer's answer comes after the send), and asserts that
// the answer was read on the caller's thread, in its turn, with no loop turn. disarmed: the
// loop's set is disarmed in the outer set during the wait (the wait is in the loop's set);
// otherwise nothing is (the wait is in the callers' set).
func answeredInTurn(t *testing.T, l *Loop, peer int, handledOn *atomic.Int64, handled <-chan struct{}, disarmed bool) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	me := int64(unix.Gettid())
	handledOn.Store(0)
	iterations := l.Stats().Iterations
	answered := false
	blinds := -1
	borrowed, err := l.ExecWait(func() {}, 2*waitBound, func() bool {
		if !answered {
			answered = true
			l.holdMu.Lock()
			blinds = l.blinds
			l.holdMu.Unlock()
			_, _ = unix.Write(peer, []byte{1})
		}
		return handledOn.Load() != 0
	})
	require.NoError(t, err)
	require.True(t, borrowed)
	if disarmed {
		require.Equal(t, 1, blinds, "the loop's set was not disarmed for the wait")
	} else {
		require.Zero(t, blinds, "the loop's set was disarmed for a wait in the callers' set")
	}
	recv(t, handled)
	require.Equal(t, me, handledOn.Load(), "the answer was handled off the waiting caller's thread")
	require.Equal(t, iterations, l.Stats().Iterations, "the loop thread woke for the answer")
}

// TestCallersSetWakesTheCallerAlone: a draining fd is in the callers' set; a caller waiting
// there gets its event on its own thread and the loop thread sleeps on, with nothing
// disarmed for the wait (the outer set is never touched).
func TestCallersSetWakesTheCallerAlone(t *testing.T) {
	l := newLoop(t)
	fd, peer, handledOn, handled := byteReader(t, l, true)
	onOuter(t, l)
	for range 3 {
		answeredInTurn(t, l, peer, handledOn, handled, false)
	}
	onLoop(t, l, func() {
		require.Zero(t, l.unpaired)
		require.True(t, l.fds.get(fd).paired, "a draining socket is not in the callers' set")
		l.holdMu.Lock()
		defer l.holdMu.Unlock()
		require.Zero(t, l.blinds, "the outer set is left disarmed")
	})
	// Once the caller is gone the loop serves the fd again.
	handledOn.Store(0)
	_, err := unix.Write(peer, []byte{2})
	require.NoError(t, err)
	recv(t, handled)
	require.NotZero(t, handledOn.Load())
}

// TestModifyKeepsTheCallersSet: an exclusive registration cannot be modified in place;
// Modify takes a draining fd out of both sets and adds it again in the same order, so a
// caller waiting on the callers' set still gets its events alone, and what was ready when
// it was modified is not lost.
func TestModifyKeepsTheCallersSet(t *testing.T) {
	l := newLoop(t)
	fd, peer, handledOn, handled := byteReader(t, l, true)
	onOuter(t, l)
	onLoop(t, l, func() {
		require.NoError(t, l.Modify(fd, Readable|Writable))
		require.NoError(t, l.Modify(fd, Readable))
		require.True(t, l.fds.get(fd).paired)
	})
	sleeping(t, l)
	answeredInTurn(t, l, peer, handledOn, handled, false)

	// Ready while it is modified: handled once it is back.
	handledOn.Store(0)
	onLoop(t, l, func() {
		_, err := unix.Write(peer, []byte{3})
		require.NoError(t, err)
		require.NoError(t, l.Modify(fd, Readable))
	})
	recv(t, handled)
	require.NotZero(t, handledOn.Load())
	onLoop(t, l, func() { require.NoError(t, l.Remove(fd)) })
	closeFd(fd)
}

// TestPlainFdIsTakenOverFromTheCaller: an fd added with Add (its handler may leave
// readiness behind) is in the loop's set alone. Its event while a caller waits on the
// callers' set cannot reach that caller: the loop, woken for it, ends the caller's wait
// through the eventfd and handles it on its own thread, once the turn is back.
func TestPlainFdIsTakenOverFromTheCaller(t *testing.T) {
	l := newLoop(t)
	fd, peer, handledOn, handled := byteReader(t, l, false)
	onOuter(t, l)
	onLoop(t, l, func() { require.False(t, l.fds.get(fd).paired) })
	sleeping(t, l) // the turn is free for the caller: the loop is back in its wait
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	me := int64(unix.Gettid())
	before := l.Stats()
	wrote := false
	// The bound is far beyond the test's: a wait the loop did not end fails the test.
	borrowed, err := l.ExecWait(func() {}, 3*waitBound, func() bool {
		if !wrote {
			wrote = true
			_, _ = unix.Write(peer, []byte{1})
		}
		return handledOn.Load() != 0
	})
	require.NoError(t, err)
	require.True(t, borrowed)
	recv(t, handled)
	require.NotEqual(t, me, handledOn.Load(), "the plain fd's event was handled on the caller's thread")
	require.Greater(t, l.Stats().TakenOver, before.TakenOver)
}

// unpairedFd registers, as draining, an fd the kernel will not add exclusively (an epoll
// fd, as the soft provider's completion channels): it goes in the loop's set alone.
func unpairedFd(t *testing.T, l *Loop) int {
	t.Helper()
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	require.NoError(t, err)
	onLoop(t, l, func() { require.NoError(t, l.AddDrained(ep, Readable, func(Events) {})) })
	return ep
}

// TestUnpairedFdWaitsInTheLoopsSet: with a draining fd outside the callers' set, ExecWait
// waits in the loop's own set with that set disarmed in the outer one (the callers' set
// would not see the fd): the answer is still read on the caller's thread with no loop
// turn, and the disarm is given back. Without that fd again, the callers' set is used.
func TestUnpairedFdWaitsInTheLoopsSet(t *testing.T) {
	l := newLoop(t)
	fd, peer, handledOn, handled := byteReader(t, l, true)
	ep := unpairedFd(t, l)
	onLoop(t, l, func() {
		require.Equal(t, 1, l.unpaired)
		require.False(t, l.fds.get(ep).paired)
		require.True(t, l.fds.get(fd).paired)
	})
	onOuter(t, l)
	answeredInTurn(t, l, peer, handledOn, handled, true)
	onLoop(t, l, func() {
		l.holdMu.Lock()
		defer l.holdMu.Unlock()
		require.Zero(t, l.blinds, "the outer set is left disarmed")
	})
	onLoop(t, l, func() {
		require.NoError(t, l.Close(ep))
		require.Zero(t, l.unpaired)
	})
	sleeping(t, l)
	answeredInTurn(t, l, peer, handledOn, handled, false)
}

// TestCallersSetSeesTheEventfd: the wake-up eventfd is in the callers' set with its
// generation, so a batch of a caller waiting there reports the wake-up (a submission or
// Stop ends the wait at once) rather than skipping it as a stale event.
func TestCallersSetSeesTheEventfd(t *testing.T) {
	l := newLoop(t)
	sleeping(t, l)
	var woken bool
	borrowed, err := l.ExecWait(func() {
		_, _ = unix.Write(l.wfd, wakeOne[:]) // as a producer does (the loop wakes for it too)
		_, woken = l.borrowedBatch(l.callers, 0)
	}, waitBound, func() bool { return true })
	require.NoError(t, err)
	require.True(t, borrowed)
	require.True(t, woken, "the eventfd's event in the callers' set was not seen")
}
