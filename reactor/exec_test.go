package reactor

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// sleeping waits until the loop blocks in epoll_wait with its turn free to borrow. Nothing in
// these tests wakes it afterwards, so the next Exec borrows the turn.
func sleeping(t *testing.T, l *Loop) {
	t.Helper()
	require.Eventually(t, func() bool {
		if l.state.Load() != asleep || !l.turn.TryLock() {
			return false
		}
		l.turn.Unlock()
		return true
	}, waitBound, 100*time.Microsecond)
}

// TestExecBorrowsSleepingLoop: with the loop asleep, Exec runs f before it returns, on the
// caller's thread, as the loop (InLoop true, loop-only calls allowed), with no eventfd
// write and no loop wake-up; afterwards the caller is not the loop.
func TestExecBorrowsSleepingLoop(t *testing.T) {
	l := newLoop(t)
	sleeping(t, l)
	before := l.Stats()
	ran, inLoop := false, false
	var addErr error
	require.NoError(t, l.Exec(func() {
		ran, inLoop = true, l.InLoop()
		timer := l.AfterFunc(time.Hour, func() {})
		timer.Stop()
		addErr = l.Add(-1, Readable, func(Events) {}) // a loop-only call: refused for the fd, not the thread
	}))
	require.True(t, ran, "Exec returned before f ran")
	require.True(t, inLoop, "InLoop in a borrowed turn")
	require.ErrorIs(t, addErr, ErrInvalid)
	require.NotErrorIs(t, addErr, ErrNotInLoop)
	require.False(t, l.InLoop(), "after the borrowed turn")
	after := l.Stats()
	require.Equal(t, before.Borrowed+1, after.Borrowed)
	require.Equal(t, before.Submissions+1, after.Submissions)
	require.Equal(t, before.SubmitEvents, after.SubmitEvents, "an eventfd write for a borrowed turn")
	require.Equal(t, before.Wakeups, after.Wakeups, "the loop woke for a borrowed turn")
}

// TestExecOnAwakeLoopQueues: from a loop callback (the turn is the loop's) Exec queues f,
// which runs after the callback, as Submit.
func TestExecOnAwakeLoopQueues(t *testing.T) {
	l := newLoop(t)
	var order []int
	done := make(chan struct{})
	var execErr error // asserted here: the callback runs on the loop goroutine
	onLoop(t, l, func() {
		execErr = l.Exec(func() { order = append(order, 2); close(done) })
		order = append(order, 1)
	})
	require.NoError(t, execErr)
	recv(t, done)
	onLoop(t, l, func() {})
	require.Equal(t, []int{1, 2}, order)
	require.Zero(t, l.Stats().Borrowed)
}

// TestExecRunsWhatItSubmits: a func submitted in a borrowed turn runs before Exec returns,
// and costs no eventfd write.
func TestExecRunsWhatItSubmits(t *testing.T) {
	l := newLoop(t)
	sleeping(t, l)
	before := l.Stats()
	var order []int
	require.NoError(t, l.Exec(func() {
		require.NoError(t, l.Submit(func() { order = append(order, 2) }))
		order = append(order, 1)
	}))
	require.Equal(t, []int{1, 2}, order)
	after := l.Stats()
	require.Equal(t, before.SubmitEvents, after.SubmitEvents)
	require.Equal(t, before.Wakeups, after.Wakeups)
}

// TestExecTimerWakesLoop: a timer set in a borrowed turn, earlier than the loop's sleep (here
// the loop has no timer: it sleeps with no deadline), still fires: the turn's end wakes the
// loop to take the new deadline.
func TestExecTimerWakesLoop(t *testing.T) {
	l := newLoop(t)
	sleeping(t, l)
	fired := make(chan bool, 1)
	require.NoError(t, l.Exec(func() {
		l.AfterFunc(time.Millisecond, func() { fired <- l.InLoop() })
	}))
	require.True(t, recv(t, fired), "the timer ran off the loop")
	// A later timer than the loop's own deadline does not wake it: it is found when the loop
	// wakes for the earlier one.
	sleeping(t, l)
	first, second := make(chan struct{}), make(chan struct{})
	onLoop(t, l, func() { l.AfterFunc(20*time.Millisecond, func() { close(first) }) })
	sleeping(t, l)
	require.NoError(t, l.Exec(func() { l.AfterFunc(40*time.Millisecond, func() { close(second) }) }))
	recv(t, first)
	recv(t, second)
}

// submitRetry runs f by Exec (exec) or Submit, trying again while the queue is full.
func submitRetry(l *Loop, f func(), exec bool) error {
	for {
		var err error
		if exec {
			err = l.Exec(f)
		} else {
			err = l.Submit(f)
		}
		if err != ErrQueueFull {
			return err
		}
		time.Sleep(time.Millisecond)
	}
}

// TestExecOrderPerProducer: a producer mixing Exec and Submit, with others doing the same,
// sees its funcs run in its order, each exactly once, whether each ran borrowed or queued.
func TestExecOrderPerProducer(t *testing.T) {
	l := newLoop(t)
	const producers, each = 4, 3000
	last := make([]int, producers) // loop-side state: touched only in loop turns
	var bad, ran atomic.Int64
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 1; i <= each; i++ {
				f := func() {
					if last[p] != i-1 {
						bad.Add(1)
					}
					last[p] = i
					ran.Add(1)
				}
				if err := submitRetry(l, f, i%3 != 0); err != nil {
					bad.Add(1)
					return
				}
			}
		}()
	}
	wg.Wait()
	onLoop(t, l, func() {})
	require.Zero(t, bad.Load(), "funcs out of order")
	require.Equal(t, int64(producers*each), ran.Load())
	st := l.Stats()
	t.Logf("borrowed %d of %d, submit wake-ups %d", st.Borrowed, producers*each, st.SubmitEvents)
}

// TestExecStopped: Exec after Stop is ErrStopped, as Submit; a Stop from a borrowed turn
// stops the loop.
func TestExecStopped(t *testing.T) {
	l, err := New(quiet)
	require.NoError(t, err)
	sleeping(t, l)
	var stopErr error
	require.NoError(t, l.Exec(func() { stopErr = l.Stop(context.Background()) }))
	require.NoError(t, stopErr)
	recv(t, l.Done())
	require.ErrorIs(t, l.Exec(func() {}), ErrStopped)
	require.ErrorIs(t, l.Exec(nil), ErrInvalid)
}

// TestExecPanicReturnsTurn: a func that panics in a borrowed turn (the caller recovers) gives
// the turn back: the loop goes on, and the caller is not the loop any more.
func TestExecPanicReturnsTurn(t *testing.T) {
	l := newLoop(t)
	sleeping(t, l)
	func() {
		defer func() { require.Equal(t, "boom", recover()) }()
		_ = l.Exec(func() { panic("boom") })
	}()
	require.False(t, l.InLoop())
	onLoop(t, l, func() {})
	sleeping(t, l)
	ran := false
	require.NoError(t, l.Exec(func() { ran = true }))
	require.True(t, ran)
}

// TestPollHandlesOnCallersThread: a caller that holds the spin and polls gets the loop's fd
// events, its queue and its due timers handled on its own thread, with the loop asleep; the
// loop's wake-up eventfd is left to the loop (a submission made meanwhile still runs).
func TestPollHandlesOnCallersThread(t *testing.T) {
	for _, busy := range []time.Duration{0, 50 * time.Microsecond} {
		t.Run(fmt.Sprintf("busy=%v", busy), func(t *testing.T) {
			l := newLoop(t, WithBusyPoll(busy))
			peer, handledOn, _ := watchedPair(t, l)
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			me := int64(unix.Gettid())
			l.HoldSpin()
			// Held, a busy-polling loop blocks instead of spinning; the holder's first Poll
			// disarms its own set in the outer set.
			onLoop(t, l, func() {})
			sleeping(t, l)
			for end := time.Now().Add(waitBound); !l.Poll() && time.Now().Before(end); {
				if l.holdBlind.Load() || busy == 0 {
					break // a Poll that found nothing still took the watch
				}
				runtime.Gosched()
			}
			_, err := unix.Write(peer, []byte{1})
			require.NoError(t, err)
			// Polled here, not in require.Eventually (its condition runs on another goroutine).
			for end := time.Now().Add(waitBound); handledOn.Load() == 0 && time.Now().Before(end); {
				if !l.Poll() {
					runtime.Gosched()
				}
			}
			require.NotZero(t, handledOn.Load(), "the event was never handled")
			l.ReleaseSpin()
			// Without busy poll the loop thread waits on the same set and may take it; a
			// held busy-polling loop does not watch its set, so only the caller can have.
			if busy > 0 {
				require.Equal(t, me, handledOn.Load(), "the event was not handled on the polling caller's thread")
				require.Positive(t, l.Stats().Borrowed)
			}
			// A submission after the polls still reaches the loop.
			onLoop(t, l, func() {})
		})
	}
}

// TestPollNoLostWakeups: callers polling the loop (holding the spin) while others submit,
// borrow and queue: every func runs, and the loop, no longer held, still serves its fds.
func TestPollNoLostWakeups(t *testing.T) {
	for _, busy := range []time.Duration{0, 50 * time.Microsecond} {
		t.Run(fmt.Sprintf("busy=%v", busy), func(t *testing.T) {
			l := newLoop(t, WithBusyPoll(busy))
			const producers, each = 3, 2000
			var ran atomic.Int64
			stop := make(chan struct{})
			var pollers sync.WaitGroup
			for range 2 {
				pollers.Add(1)
				go func() {
					defer pollers.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						l.HoldSpin()
						for range 50 {
							if !l.Poll() {
								runtime.Gosched()
							}
						}
						l.ReleaseSpin()
					}
				}()
			}
			var wg sync.WaitGroup
			for p := range producers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range each {
						f := func() { ran.Add(1) }
						if submitRetry(l, f, (i+p)%2 == 0) != nil {
							return
						}
					}
				}()
			}
			wg.Wait()
			close(stop)
			pollers.Wait()
			require.Eventually(t, func() bool { return ran.Load() == producers*each }, waitBound, time.Millisecond)
			peer, _, got := watchedPair(t, l)
			_, err := unix.Write(peer, []byte{1})
			require.NoError(t, err)
			recv(t, got)
			st := l.Stats()
			t.Logf("borrowed %d, submit wake-ups %d", st.Borrowed, st.SubmitEvents)
		})
	}
}

// watchedPair adds one end of a socket pair to the loop; its handler records the thread that
// read a byte and signals got. It returns the other end, to write to (closed at cleanup).
func watchedPair(t *testing.T, l *Loop) (peer int, handledOn *atomic.Int64, got chan struct{}) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { closeFd(fds[1]) })
	handledOn, got = new(atomic.Int64), make(chan struct{}, 4)
	var addErr error // asserted here: the callback runs on the loop goroutine
	onLoop(t, l, func() {
		addErr = l.AddDrained(fds[0], Readable, func(Events) {
			var b [8]byte
			if k, _ := unix.Read(fds[0], b[:]); k <= 0 {
				return // an event another turn already took, or the peer's close
			}
			handledOn.Store(int64(unix.Gettid()))
			select {
			case got <- struct{}{}:
			default:
			}
		})
	})
	require.NoError(t, addErr)
	return fds[1], handledOn, got
}

// outerFixture is a loop with a watchedPair, asleep on its outer set (a first wait as the
// loop makes it block there from its next wait on), and the test goroutine locked to its
// thread, whose id is me.
func outerFixture(t *testing.T) (l *Loop, peer int, handledOn *atomic.Int64, got chan struct{}, me int64) {
	t.Helper()
	l = newLoop(t)
	peer, handledOn, got = watchedPair(t, l)
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	me = int64(unix.Gettid())
	sleeping(t, l)
	borrowed, err := l.ExecWait(func() {}, time.Second, func() bool { return true })
	require.NoError(t, err)
	require.True(t, borrowed)
	onLoop(t, l, func() {})
	sleeping(t, l)
	return l, peer, handledOn, got, me
}

// TestExecWaitHandlesOnCallersThread: a caller waiting as the loop gets the loop's fd events
// on its own thread (the loop thread, waiting on its eventfd alone meanwhile, cannot take
// them), runs due timers, and once it stops waiting the loop serves its fds again.
func TestExecWaitHandlesOnCallersThread(t *testing.T) {
	l, peer, handledOn, got, me := outerFixture(t)
	var timerOn atomic.Int64
	calls := 0
	done := func() bool {
		calls++
		if calls == 1 {
			// In the turn: the write lands while the caller holds it, so only the
			// caller's epoll_wait can see it. The timer is due at once.
			l.AfterFunc(0, func() { timerOn.Store(int64(unix.Gettid())) })
			_, _ = unix.Write(peer, []byte{1})
		}
		return handledOn.Load() != 0 && timerOn.Load() != 0
	}
	iterations := l.Stats().Iterations
	borrowed, err := l.ExecWait(func() {}, 2*waitBound, done)
	require.NoError(t, err)
	require.True(t, borrowed)
	require.True(t, done(), "the wait ended before the event")
	require.Equal(t, iterations, l.Stats().Iterations, "the loop thread woke for an event its waiting caller took")
	recv(t, got)
	require.Equal(t, me, handledOn.Load(), "the event was handled off the waiting caller's thread")
	require.Equal(t, me, timerOn.Load(), "the timer ran off the waiting caller's thread")
	require.False(t, l.InLoop())
	// The loop waits on its set again.
	handledOn.Store(0)
	_, err = unix.Write(peer, []byte{2})
	require.NoError(t, err)
	recv(t, got)
	require.NotEqual(t, me, handledOn.Load())
}

// TestExecWaitGivesWayToSubmissions: a submission made while a caller waits as the loop ends
// the wait (the eventfd is in the set), and the loop runs it; the wait's bound is far beyond
// the test's, so a wait that did not end fails the test.
func TestExecWaitGivesWayToSubmissions(t *testing.T) {
	l := newLoop(t)
	sleeping(t, l)
	ran := make(chan struct{})
	first := true
	result := make(chan bool, 1)
	go func() {
		borrowed, _ := l.ExecWait(func() {}, 3*waitBound, func() bool {
			if first {
				first = false
				go func() { _ = l.Submit(func() { close(ran) }) }()
			}
			return false
		})
		result <- borrowed
	}()
	recv(t, ran)
	require.True(t, recv(t, result), "the wait was not in a borrowed turn")
}

// TestExecWaitSendsAndWaitsInOneTurn: ExecWait runs f and then waits, in one borrowed turn.
// The loop's set is disarmed after f, so an answer that comes after the send (here written
// at the wait's first look at done, as a peer's answer comes) is handled on the caller's
// thread and the loop thread never wakes. An answer already there when the set is disarmed
// (f's own write) may wake the loop thread first: it is handled all the same, by one of
// the two, and the wait ends. From a loop callback the turn is the loop's: f is queued and
// nothing waits.
func TestExecWaitSendsAndWaitsInOneTurn(t *testing.T) {
	l, peer, handledOn, got, me := outerFixture(t)
	iterations := l.Stats().Iterations
	sent, answered := false, false
	borrowed, err := l.ExecWait(func() { sent = l.InLoop() }, 2*waitBound, func() bool {
		if !answered {
			answered = true
			_, _ = unix.Write(peer, []byte{1})
		}
		return handledOn.Load() != 0
	})
	require.NoError(t, err)
	require.True(t, borrowed)
	require.True(t, sent, "f ran off the borrowed turn")
	require.Equal(t, me, handledOn.Load(), "the answer was handled off the waiting caller's thread")
	require.Equal(t, iterations, l.Stats().Iterations, "the loop thread woke for the answer")
	recv(t, got)

	// An answer there before the disarm: handled once, by the caller or the loop.
	handledOn.Store(0)
	borrowed, err = l.ExecWait(func() { _, _ = unix.Write(peer, []byte{2}) }, 2*waitBound,
		func() bool { return handledOn.Load() != 0 })
	require.NoError(t, err)
	require.True(t, borrowed)
	recv(t, got)
	require.NotZero(t, handledOn.Load())

	ran := make(chan struct{})
	onLoop(t, l, func() {
		borrowed, err = l.ExecWait(func() { close(ran) }, time.Hour, func() bool { return false })
	})
	require.NoError(t, err)
	require.False(t, borrowed)
	recv(t, ran)
	_, err = l.ExecWait(nil, 0, nil)
	require.ErrorIs(t, err, ErrInvalid)
}

// TestExecBehindUnfinishedPush: a producer claimed a queue position and has not written its
// func yet (Vyukov's ring: the loop cannot pop past it); another producer's Submit(f1) sits
// behind it, and the same producer's Exec(f2) finds the loop asleep. f2 must not run in the
// borrowed turn before f1: it is queued behind it, and all three run in queue order once the
// first producer finishes. Before, Exec ran f2 at once (out of its producer's order; seen
// under load by TestExecOrderPerProducer).
func TestExecBehindUnfinishedPush(t *testing.T) {
	l := newLoop(t)
	sleeping(t, l)
	// Producer A claims a position and stalls before writing it.
	pos := l.q.head.Load()
	require.True(t, l.q.head.CompareAndSwap(pos, pos+1))
	var mu sync.Mutex
	var order []string
	note := func(s string) func() {
		return func() { mu.Lock(); order = append(order, s); mu.Unlock() }
	}
	require.NoError(t, l.Submit(note("f1"))) // wakes the loop, which cannot pop past A's slot
	sleeping(t, l)
	require.NoError(t, l.Exec(note("f2")))
	mu.Lock()
	require.Empty(t, order, "f2 ran before the funcs queued ahead of it")
	mu.Unlock()
	// A finishes its push and wakes the loop, as push and trySubmit do.
	c := &l.q.cells[pos%l.q.size]
	c.f = note("a")
	c.seq.Store(2*pos + 1)
	if l.state.CompareAndSwap(asleep, awake) {
		l.wake()
	}
	onLoop(t, l, func() {})
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"a", "f1", "f2"}, order)
}

// Queued says whether a submitted func waits: nothing before the first, the one just
// submitted after it, nothing once that one runs. Off the loop it panics (race builds).
func TestQueued(t *testing.T) {
	l := newLoop(t)
	got := make(chan [3]bool, 1)
	var first, second bool
	require.NoError(t, l.Submit(func() {
		first = l.Queued()
		require.NoError(t, l.Submit(func() { got <- [3]bool{first, second, l.Queued()} }))
		second = l.Queued()
	}))
	select {
	case q := <-got:
		require.Equal(t, [3]bool{false, true, false}, q)
	case <-time.After(waitBound):
		t.Fatal("the submitted funcs did not run")
	}
	if assertLoop {
		require.PanicsWithValue(t, ErrNotInLoop, func() { l.Queued() })
	}
}
