package reactor

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twosided/twosided/ibv"
)

func newFake(t *testing.T) (*fakeChannel, *fakeCQ) {
	t.Helper()
	ch, err := newFakeChannel()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	return ch, newFakeCQ(ch)
}

func watch(t *testing.T, l *Loop, cq ibv.CQ, h CQHandler) *CQWatch {
	t.Helper()
	var w *CQWatch
	var err error
	onLoop(t, l, func() { w, err = l.WatchCQ(cq, h) })
	require.NoError(t, err)
	onLoop(t, l, func() {}) // the first cycle ran
	return w
}

// The completion handling rule's step 3: a CQE that lands after the last poll and before the
// arm raises no event (the CQ was disarmed by the event that woke the loop), so only the poll
// after ReqNotify finds it. The provider hook lands it exactly there. With that poll removed
// from cycle, this test fails (checked: "lost wake-up: the CQE that landed between the last
// poll and the arm was not handled").
func TestCQNoLostWakeupBetweenPollAndArm(t *testing.T) {
	l := newLoop(t)
	_, cq := newFake(t)
	rec := &recorder{handled: make(chan uint64, 16)}
	watch(t, l, cq, rec)

	var once sync.Once
	cq.mu.Lock()
	cq.beforeArm = func() { once.Do(func() { cq.land(ibv.WC{WRID: 2}) }) }
	cq.mu.Unlock()

	cq.land(ibv.WC{WRID: 1}) // armed: fires the channel and disarms the CQ
	require.Equal(t, uint64(1), recv(t, rec.handled))
	var got []uint64
	var armed bool
	onLoop(t, l, func() { // runs after the cycle that handled WRID 1 has finished
		got = rec.got()
		armed = cq.isArmed()
	})
	require.Equal(t, []uint64{1, 2}, got, "lost wake-up: the CQE that landed between the last poll and the arm was not handled")
	require.True(t, armed, "the cycle must end with the CQ armed")
	require.Equal(t, 1, cq.gotEvents(), "the hook's CQE landed on a disarmed CQ: no event")
	n, _ := cq.acks()
	require.Equal(t, 1, n)

	// The loop sleeps armed: the next CQE from the "NIC" wakes it through the channel.
	cq.land(ibv.WC{WRID: 3})
	require.Equal(t, uint64(2), recv(t, rec.handled))
	require.Equal(t, uint64(3), recv(t, rec.handled))
}

// The same race after a Kick: the CQ fires while the loop is busy (its event queued, not
// read), Kick handles the CQE and, the CQ's arm not seen to fire, does not arm it again; the
// event's drain then runs the cycle that arms, and the hook lands a CQE right before that
// arm. Both are handled, and the CQ raised one event per arm.
func TestCQNoLostWakeupInKick(t *testing.T) {
	l := newLoop(t)
	_, cq := newFake(t)
	rec := &recorder{handled: make(chan uint64, 16)}
	w := watch(t, l, cq, rec)
	onLoop(t, l, func() {}) // the watch's first cycle has run
	var got []uint64
	var arms int
	onLoop(t, l, func() {
		cq.land(ibv.WC{WRID: 4}) // armed: fires the channel and disarms the CQ
		cq.mu.Lock()
		cq.beforeArm = func() { cq.beforeArm = nil; cq.wcs = append(cq.wcs, ibv.WC{WRID: 5}) }
		arms = cq.arms
		cq.mu.Unlock()
		w.Kick()
		got = rec.got()
		cq.mu.Lock()
		arms = cq.arms - arms
		cq.mu.Unlock()
	})
	require.Equal(t, []uint64{4}, got)
	require.Zero(t, arms, "Kick armed a CQ whose event was not read yet: it could fire twice")
	require.Equal(t, uint64(4), recv(t, rec.handled))
	require.Equal(t, uint64(5), recv(t, rec.handled), "lost wake-up in the cycle after Kick")
	require.Equal(t, 1, cq.gotEvents())
	onLoop(t, l, func() { got = rec.got() })
	require.Equal(t, []uint64{4, 5}, got)
}

// The same race, landed by the hook inside WatchCQ's own arm.
func TestCQNoLostWakeupAtWatch(t *testing.T) {
	l := newLoop(t)
	_, cq := newFake(t)
	cq.beforeArm = func() { cq.beforeArm = nil; cq.wcs = append(cq.wcs, ibv.WC{WRID: 7}) }
	// handled is buffered and waited on with a bound: the first cycle may finish in a turn
	// after watch's own (a loaded host); a lost wake-up never handles it at all
	rec := &recorder{handled: make(chan uint64, 4)}
	watch(t, l, cq, rec)
	require.Equal(t, uint64(7), recv(t, rec.handled), "lost wake-up at WatchCQ")
	require.Equal(t, []uint64{7}, rec.got())
}

// A poll that fills less than the batch emptied the CQ: the cycle goes on to arm and polls
// once after the arm, not once more before it. A full batch is polled on. Every WC is handled
// either way (the lost wake-up tests above hold the arm's side).
func TestCQShortPollEndsStepOne(t *testing.T) {
	for _, tc := range []struct {
		name        string
		batch, land int
		polls       int // in the cycle the event starts
	}{
		{"short", 32, 3, 2},          // 3 WCs; the poll after the arm
		{"full then short", 4, 6, 3}, // 4, 2; the poll after the arm
		{"full", 4, 4, 3},            // 4; 0 (a full batch may not be all); the poll after the arm
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLoop(t, WithCQBatch(tc.batch))
			_, cq := newFake(t)
			rec := &recorder{handled: make(chan uint64, 64)}
			watch(t, l, cq, rec)
			var polls0 int
			onLoop(t, l, func() {
				cq.mu.Lock()
				polls0 = cq.polls
				cq.mu.Unlock()
				for i := range tc.land {
					cq.land(ibv.WC{WRID: uint64(i + 1)})
				}
			})
			for range tc.land {
				recv(t, rec.handled)
			}
			var polls int
			var armed bool
			onLoop(t, l, func() {
				cq.mu.Lock()
				polls = cq.polls - polls0
				cq.mu.Unlock()
				armed = cq.isArmed()
			})
			require.Len(t, rec.got(), tc.land)
			require.True(t, armed)
			require.Equal(t, tc.polls, polls)
		})
	}
}

func TestCQEventsAckedInOneBatchPerCQ(t *testing.T) {
	l := newLoop(t)
	ch, a := newFake(t)
	b := newFakeCQ(ch)
	ra := &recorder{handled: make(chan uint64, 16)}
	rb := &recorder{handled: make(chan uint64, 16)}
	watch(t, l, a, ra)
	watch(t, l, b, rb)
	require.True(t, a.isArmed())
	require.True(t, b.isArmed())

	// While the loop is busy in this func, the channel collects three events: two for a (it
	// is re-armed in between), one for b.
	onLoop(t, l, func() {
		a.land(ibv.WC{WRID: 1})
		_ = a.ReqNotify(false)
		a.land(ibv.WC{WRID: 2})
		b.land(ibv.WC{WRID: 3})
	})
	require.ElementsMatch(t, []uint64{1, 2}, []uint64{recv(t, ra.handled), recv(t, ra.handled)})
	require.Equal(t, uint64(3), recv(t, rb.handled))
	onLoop(t, l, func() {})
	nA, callsA := a.acks()
	nB, callsB := b.acks()
	require.Equal(t, 2, nA)
	require.Equal(t, []int{2}, callsA, "one AckEvents per CQ per wake-up")
	require.Equal(t, 1, nB)
	require.Equal(t, []int{1}, callsB)
	require.Equal(t, uint64(3), l.Stats().CQEvents)
	require.Equal(t, uint64(3), l.Stats().WCs)
	require.True(t, a.isArmed())
	require.True(t, b.isArmed())

	// Repost comes after the reaping, in every cycle.
	ra.mu.Lock()
	steps := append([]string(nil), ra.steps...)
	ra.mu.Unlock()
	require.Equal(t, []string{"repost", "wc", "repost"}, steps, "first cycle at WatchCQ, then reap, then repost")
}

func TestCQSpuriousEvent(t *testing.T) {
	l := newLoop(t)
	ch, cq := newFake(t)
	rec := &recorder{}
	watch(t, l, cq, rec)
	ch.fire(cq) // an event with an empty CQ
	require.Eventually(t, func() bool { n, _ := cq.acks(); return n == 1 }, waitBound, time.Millisecond)
	onLoop(t, l, func() {})
	require.Empty(t, rec.got())
	require.Empty(t, rec.errs)
	require.True(t, cq.isArmed())
}

func TestCQWatchCloseAcksAndUnregisters(t *testing.T) {
	l := newLoop(t)
	ch, a := newFake(t)
	b := newFakeCQ(ch)
	ra, rb := &recorder{}, &recorder{handled: make(chan uint64, 4)}
	wa := watch(t, l, a, ra)
	wb := watch(t, l, b, rb)

	var errs [3]error
	var registered [2]bool
	onLoop(t, l, func() {
		a.land(ibv.WC{WRID: 1})
		b.land(ibv.WC{WRID: 2})
		errs[0] = wa.Close() // gets both events: acks a's, queues b's cycle
		registered[0] = l.fds.get(ch.fd) != nil
		errs[1] = wa.Close()
	})
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], ErrClosed)
	require.True(t, registered[0], "the channel fd stays while b uses it")
	nA, _ := a.acks()
	require.Equal(t, 1, nA)
	require.Empty(t, ra.got())
	require.Equal(t, uint64(2), recv(t, rb.handled))
	nB, _ := b.acks()
	require.Equal(t, 1, nB)

	onLoop(t, l, func() {
		errs[2] = wb.Close()
		registered[1] = l.fds.get(ch.fd) != nil
	})
	require.NoError(t, errs[2])
	require.False(t, registered[1], "the channel fd leaves with its last CQ")

	// Events for a CQ no longer watched are still acknowledged (here: none reach the loop,
	// the fd is gone); re-watching works.
	watch(t, l, a, ra)
}

type noChannelCQ struct{ *fakeCQ }

func (noChannelCQ) Channel() ibv.CompChannel { return nil }

func TestWatchCQBadInput(t *testing.T) {
	l := newLoop(t)
	_, cq := newFake(t)
	rec := &recorder{}
	a, b := socketpair(t)
	defer closeFd(b)
	var errs [6]error
	onLoop(t, l, func() {
		_, errs[0] = l.WatchCQ(nil, rec)
		_, errs[1] = l.WatchCQ(cq, nil)
		_, errs[2] = l.WatchCQ(noChannelCQ{cq}, rec)
		_, errs[3] = l.WatchCQ(cq, rec)
		_, errs[4] = l.WatchCQ(cq, rec)
		errs[5] = l.Add(a, Readable, func(Events) {})
	})
	require.ErrorIs(t, errs[0], ErrInvalid)
	require.ErrorContains(t, errs[0], "cq")
	require.ErrorIs(t, errs[1], ErrInvalid)
	require.ErrorContains(t, errs[1], "handler")
	require.ErrorIs(t, errs[2], ErrInvalid)
	require.ErrorContains(t, errs[2], "completion channel")
	require.NoError(t, errs[3])
	require.ErrorIs(t, errs[4], ErrRegistered)
	require.NoError(t, errs[5])

	// A channel whose fd is an Add-ed fd is refused.
	clash := newFakeCQ(&fakeChannel{fd: a})
	onLoop(t, l, func() { _, errs[0] = l.WatchCQ(clash, rec) })
	require.ErrorIs(t, errs[0], ErrRegistered)
}

func TestCQErrorsReported(t *testing.T) {
	l := newLoop(t)
	ch, cq := newFake(t)
	rec := &recorder{}
	w := watch(t, l, cq, rec)
	boom := errors.New("boom")

	cq.mu.Lock()
	cq.pollErr = boom
	cq.mu.Unlock()
	onLoop(t, l, func() { w.Kick() })
	cq.mu.Lock()
	cq.pollErr, cq.armErr = nil, boom
	cq.mu.Unlock()
	// The CQ is still armed from the watch: its event's drain runs the cycle that arms.
	cq.land(ibv.WC{WRID: 1})
	require.Eventually(t, func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.errs) == 2
	}, waitBound, time.Millisecond)
	cq.mu.Lock()
	cq.armErr = nil
	cq.mu.Unlock()
	ch.mu.Lock()
	ch.getErr = boom
	ch.mu.Unlock()
	ch.fire(cq)
	require.Eventually(t, func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.errs) == 3
	}, waitBound, time.Millisecond)
	require.ErrorIs(t, rec.errs[0], boom)
	require.ErrorContains(t, rec.errs[0], "poll cq")
	require.ErrorContains(t, rec.errs[1], "req notify")
	require.ErrorContains(t, rec.errs[2], "get event")
	var fails [1]bool
	onLoop(t, l, func() { fails[0] = w.cw.failed })
	require.True(t, fails[0], "a failing channel leaves the epoll set instead of waking the loop forever")
	ch.mu.Lock()
	ch.getErr = nil
	ch.mu.Unlock()
	var err error
	onLoop(t, l, func() { err = w.Close() })
	require.NoError(t, err)
}

func TestCQBusyPoll(t *testing.T) {
	l := newLoop(t, WithBusyPoll(200*time.Microsecond))
	_, cq := newFake(t)
	rec := &recorder{handled: make(chan uint64, 16)}
	watch(t, l, cq, rec)
	for i := uint64(1); i <= 20; i++ {
		cq.land(ibv.WC{WRID: i})
		require.Equal(t, i, recv(t, rec.handled))
	}
	require.NotZero(t, l.Stats().BusyPolls)
	// Once the budget is spent the loop blocks, but only with its CQs armed.
	require.Eventually(t, func() bool { return l.state.Load() == asleep }, waitBound, time.Millisecond)
	require.True(t, cq.isArmed())
	cq.land(ibv.WC{WRID: 100})
	require.Equal(t, uint64(100), recv(t, rec.handled))
}

func TestNoBusyPollByDefault(t *testing.T) {
	l := newLoop(t)
	_, cq := newFake(t)
	rec := &recorder{handled: make(chan uint64, 16)}
	watch(t, l, cq, rec)
	for i := uint64(1); i <= 10; i++ {
		cq.land(ibv.WC{WRID: i})
		require.Equal(t, i, recv(t, rec.handled))
	}
	require.Zero(t, l.Stats().BusyPolls)
}

// counter is a CQHandler that allocates nothing.
type counter struct{ handled chan struct{} }

func (c counter) HandleWC(wcs []ibv.WC) {
	for range wcs {
		c.handled <- struct{}{}
	}
}
func (counter) Repost() {}

func TestHotPathsAllocateNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	l := newLoop(t)
	_, cq := newFake(t)
	h := counter{handled: make(chan struct{}, 1)}
	watch(t, l, cq, h)
	done := make(chan struct{}, 1)
	f := func() { done <- struct{}{} }
	var tm *Timer
	onLoop(t, l, func() { tm = l.AfterFunc(time.Hour, func() {}) })
	reset := func() { tm.Reset(time.Hour); done <- struct{}{} }

	require.Zero(t, testing.AllocsPerRun(200, func() {
		_ = l.Submit(f)
		<-done
	}), "submit → run")
	require.Zero(t, testing.AllocsPerRun(200, func() {
		cq.land(ibv.WC{WRID: 1})
		<-h.handled
	}), "CQE → channel event → HandleWC")
	require.Zero(t, testing.AllocsPerRun(200, func() {
		_ = l.Submit(reset)
		<-done
	}), "timer reset")
}

// flushCQ is a CQ whose provider defers its doorbells until Flush.
type flushCQ struct {
	*fakeCQ
	mu      sync.Mutex
	posted  int // doorbells owed (a post made during a turn)
	flushes int
}

func (q *flushCQ) post() {
	q.mu.Lock()
	q.posted++
	q.mu.Unlock()
}

func (q *flushCQ) Flush() {
	q.mu.Lock()
	q.posted = 0
	q.flushes++
	q.mu.Unlock()
}

// A CQ that implements Flusher is flushed at the end of every loop turn: what a turn posted
// never waits for the next wake-up. Without the loop's flushCQs call this test fails
// ("posts left unflushed").
func TestCQFlushedEveryTurn(t *testing.T) {
	l := newLoop(t)
	ch, err := newFakeChannel()
	require.NoError(t, err)
	t.Cleanup(func() { _ = ch.Close() })
	cq := &flushCQ{fakeCQ: newFakeCQ(ch)}
	rec := &recorder{handled: make(chan uint64, 16)}
	watch(t, l, cq, rec)
	for i := 0; i < 3; i++ {
		onLoop(t, l, func() { cq.post(); cq.post() })
		// The turn of the posts has ended once the loop sleeps (a func submitted right
		// after could still run in the same turn, before its flush).
		sleeping(t, l)
		cq.mu.Lock()
		posted, flushes := cq.posted, cq.flushes
		cq.mu.Unlock()
		require.Zero(t, posted, "posts left unflushed after the turn")
		require.Positive(t, flushes)
	}
}

// A drain reads each armed CQ's one event and stops there: the read that would find the
// channel empty is not made (with the loop reading until ErrWouldBlock, this test fails:
// one empty read per wake-up). With two CQs on one channel the drain goes on while one of
// them is armed and its event not read: when both fired, one wake-up reads both, and no
// more.
func TestCQDrainSkipsTheEmptyRead(t *testing.T) {
	l := newLoop(t)
	emptyReads := func(ch *fakeChannel) int {
		ch.mu.Lock()
		defer ch.mu.Unlock()
		return ch.empty
	}
	ch, a := newFake(t)
	ra := &recorder{handled: make(chan uint64, 64)}
	watch(t, l, a, ra)
	before := emptyReads(ch)
	for i := range 20 {
		a.land(ibv.WC{WRID: uint64(i)})
		require.Equal(t, uint64(i), recv(t, ra.handled))
		onLoop(t, l, func() {}) // the cycle has armed a again
		require.True(t, a.isArmed())
	}
	require.Equal(t, before, emptyReads(ch), "a drain read the channel after its armed CQ's event")
	require.Equal(t, 20, a.gotEvents())

	ch2, b := newFake(t)
	c := newFakeCQ(ch2)
	rb := &recorder{handled: make(chan uint64, 64)}
	rc := &recorder{handled: make(chan uint64, 64)}
	watch(t, l, b, rb)
	watch(t, l, c, rc)
	before = emptyReads(ch2)
	for i := range 10 {
		onLoop(t, l, func() {
			c.land(ibv.WC{WRID: uint64(100 + i)})
			b.land(ibv.WC{WRID: uint64(200 + i)})
		})
		require.Equal(t, uint64(100+i), recv(t, rc.handled))
		require.Equal(t, uint64(200+i), recv(t, rb.handled))
		onLoop(t, l, func() {})
		require.True(t, b.isArmed())
		require.True(t, c.isArmed())
	}
	require.Equal(t, before, emptyReads(ch2))
	require.Equal(t, 10, b.gotEvents())
	require.Equal(t, 10, c.gotEvents())
}
