package reactor

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// onOuter makes the loop block on its outer set (as within outerWindow of a caller's wait
// as the loop, however long this test is held up) and returns once it sleeps there with
// its turn free.
func onOuter(t *testing.T, l *Loop) {
	t.Helper()
	testOuterAlways.Store(true)
	t.Cleanup(func() { testOuterAlways.Store(false) })
	onLoop(t, l, func() {}) // a wake-up: the loop's next sleep is on the outer set
	sleeping(t, l)
}

// reader adds one end of a socket pair to the loop, with a handler that reads what comes
// and signals it on handled; it returns the other end, to write to.
func reader(t *testing.T, l *Loop) (peer int, handled <-chan struct{}) {
	t.Helper()
	a, b := socketpair(t)
	t.Cleanup(func() { closeFd(b) })
	ch := make(chan struct{}, 1)
	onLoop(t, l, func() {
		require.NoError(t, l.AddDrained(a, Readable, func(Events) {
			var buf [8]byte
			if k, _ := unix.Read(a, buf[:]); k > 0 {
				ch <- struct{}{}
			}
		}))
	})
	return b, ch
}

// leftToCaller waits, bounded, until the loop has left its set to a turn's holder n times.
func leftToCaller(l *Loop, n uint64) bool {
	deadline := time.Now().Add(waitBound)
	for l.Stats().LeftToCaller < n {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Microsecond)
	}
	return true
}

// TestAnswerBeforeDisarmStaysWithCaller: a caller's answer that arrives after its send and
// before it disarmed the loop's set (its thread preempted there) wakes the loop thread,
// which leaves it to the caller: the caller's wait as the loop reads it in its own turn,
// instead of being cut short by the loop waking for the turn (and handing the answer over
// through a Waiter).
func TestAnswerBeforeDisarmStaysWithCaller(t *testing.T) {
	l := newLoop(t)
	a, b := socketpair(t)
	defer closeFd(b)
	got := 0
	var gotOn int64
	onLoop(t, l, func() {
		require.NoError(t, l.AddDrained(a, Readable, func(Events) {
			var buf [8]byte
			if k, _ := unix.Read(a, buf[:]); k > 0 {
				got += k
				gotOn = l.borrower.Load()
			}
		}))
	})
	onOuter(t, l)
	before := l.Stats()
	var left bool
	borrowed, err := l.ExecWait(func() {
		// The "send": its answer is already there, and the loop thread wakes for it
		// before this turn disarms the set.
		_, _ = unix.Write(b, []byte{1})
		left = leftToCaller(l, before.LeftToCaller+1)
	}, waitBound, func() bool { return got == 1 })
	require.NoError(t, err)
	require.True(t, borrowed)
	require.True(t, left, "the loop did not leave its woken set to the turn's holder")
	require.Equal(t, 1, got, "the wait as the loop ended before the answer was read")
	require.NotZero(t, gotOn, "the answer was read by the loop thread, not in the caller's turn")
	after := l.Stats()
	require.Equal(t, before.Iterations, after.Iterations, "the loop thread ran a turn for the caller's answer")
	require.False(t, l.loopBlind.Load())
	onLoop(t, l, func() {
		l.holdMu.Lock()
		defer l.holdMu.Unlock()
		require.Zero(t, l.blinds, "the outer set is left disarmed")
	})
}

// TestLeftToExecTurnIsNotLost: the loop's set becomes ready during an Exec turn (which
// reads no fds): the loop leaves it to the turn, and when the turn ends the loop wakes and
// handles it.
func TestLeftToExecTurnIsNotLost(t *testing.T) {
	l := newLoop(t)
	b, handled := reader(t, l)
	onOuter(t, l)
	before := l.Stats()
	var left bool
	require.NoError(t, l.Exec(func() {
		_, _ = unix.Write(b, []byte{1})
		left = leftToCaller(l, before.LeftToCaller+1)
	}))
	require.Equal(t, before.Borrowed+1, l.Stats().Borrowed, "Exec did not borrow the turn")
	require.True(t, left, "the loop did not leave its woken set to the turn's holder")
	recv(t, handled)
	require.False(t, l.loopBlind.Load())
}

// TestLeftDisarmGivenBackByLoop: the loop left its set to a turn that ended before it could
// give the disarm back; a submission wakes the loop, which gives the disarm back itself
// and handles what waited in its set.
func TestLeftDisarmGivenBackByLoop(t *testing.T) {
	l := newLoop(t)
	b, handled := reader(t, l)
	onOuter(t, l)
	// As if waitOuter had left the set to a holder that has gone: disarmed, no holder.
	l.holdMu.Lock()
	l.loopBlind.Store(true)
	l.blind(+1)
	l.holdMu.Unlock()
	_, _ = unix.Write(b, []byte{1})
	onLoop(t, l, func() {}) // the eventfd wakes the loop; it re-arms on taking the turn
	recv(t, handled)
	require.False(t, l.loopBlind.Load())
}

// TestLeftToCallerRace: a socket made ready just as an Exec turn borrows the loop, again
// and again: whichever thread the readiness reaches, and however the loop's wake-up and
// the turn's end interleave, every byte is handled, and nothing is left disarmed once no
// turn is held.
func TestLeftToCallerRace(t *testing.T) {
	l := newLoop(t)
	a, b := socketpair(t)
	defer closeFd(b)
	var handled atomic.Int64
	onLoop(t, l, func() {
		require.NoError(t, l.AddDrained(a, Readable, func(Events) {
			var buf [64]byte
			if k, _ := unix.Read(a, buf[:]); k > 0 {
				handled.Add(int64(k))
			}
		}))
	})
	onOuter(t, l)
	// Widen the window between the loop finding the turn taken and its disarm, so that a
	// turn often ends inside it.
	hook := func() { time.Sleep(100 * time.Microsecond) }
	testHookLeaving.Store(&hook)
	defer testHookLeaving.Store(nil)
	rounds := 1000
	if testing.Short() {
		rounds = 300
	}
	for i := 1; i <= rounds; i++ {
		// The turn lasts 0-60 µs, so the loop's wake-up for the byte lands anywhere in it,
		// its end included.
		hold := time.Duration(i%61) * time.Microsecond
		require.NoError(t, l.Exec(func() {
			_, _ = unix.Write(b, []byte{1})
			for start := time.Now(); time.Since(start) < hold; {
			}
		}))
		deadline := time.Now().Add(waitBound)
		for handled.Load() < int64(i) {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the byte was never handled (left to the caller: %d, loopBlind %v)",
					i, l.Stats().LeftToCaller, l.loopBlind.Load())
			}
			time.Sleep(20 * time.Microsecond)
		}
	}
	t.Logf("left to the caller %d times in %d rounds", l.Stats().LeftToCaller, rounds)
}
