package reactor

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestTimersFireInDeadlineOrder(t *testing.T) {
	l := newLoop(t)
	fired := make(chan int, 8)
	onLoop(t, l, func() {
		for i, d := range []time.Duration{30, 10, 20, 0, 10} {
			l.AfterFunc(d*time.Millisecond, func() { fired <- i })
		}
	})
	var got []int
	for range 5 {
		got = append(got, recv(t, fired))
	}
	require.Equal(t, []int{3, 1, 4, 2, 0}, got, "by deadline, then by the order they were set")
	require.Equal(t, uint64(5), l.Stats().TimerEvents)
}

// epoll_wait counts milliseconds: a deadline is rounded up, so a timer is never early.
func TestTimeoutMillis(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want int
	}{
		{-time.Second, 0},
		{0, 0},
		{1, 1},
		{999 * time.Microsecond, 1},
		{time.Millisecond, 1},
		{time.Millisecond + 1, 2},
		{1500 * time.Millisecond, 1500},
		{1000 * time.Hour, math.MaxInt32},
	} {
		require.Equal(t, tc.want, timeoutMillis(int64(tc.d)), "%v", tc.d)
	}
}

func TestTimerStopAndReset(t *testing.T) {
	l := newLoop(t)
	fired := make(chan string, 4)
	var stopped, stoppedAgain, pendingAfterReset bool
	onLoop(t, l, func() {
		a := l.AfterFunc(time.Millisecond, func() { fired <- "a" })
		stopped = a.Stop()
		stoppedAgain = a.Stop()
		b := l.AfterFunc(time.Hour, func() { fired <- "b" })
		b.Reset(time.Millisecond) // pulled in
		c := l.AfterFunc(time.Millisecond, func() { fired <- "c" })
		c.Reset(2 * time.Millisecond)
		pendingAfterReset = c.idx >= 0
		l.AfterFunc(5*time.Millisecond, func() { fired <- "end" })
	})
	require.True(t, stopped)
	require.False(t, stoppedAgain)
	require.True(t, pendingAfterReset)
	require.Equal(t, "b", recv(t, fired))
	require.Equal(t, "c", recv(t, fired))
	require.Equal(t, "end", recv(t, fired))
}

func TestTimerRestartsItselfWithoutSpinningTheIteration(t *testing.T) {
	l := newLoop(t)
	const rounds = 50
	done := make(chan uint64, 1)
	onLoop(t, l, func() {
		n := 0
		start := l.st.iterations.Load()
		var tm *Timer
		tm = l.AfterFunc(0, func() {
			n++
			if n == rounds {
				done <- l.st.iterations.Load() - start
				return
			}
			tm.Reset(0) // next iteration, not this one
		})
	})
	iters := recv(t, done)
	require.GreaterOrEqual(t, iters, uint64(rounds-1))
	require.Equal(t, uint64(rounds), l.Stats().TimerEvents)
}

func TestTimerFiredCanBeReset(t *testing.T) {
	l := newLoop(t)
	fired := make(chan int, 4)
	var tm *Timer
	n := 0
	onLoop(t, l, func() {
		tm = l.AfterFunc(0, func() { n++; fired <- n })
	})
	require.Equal(t, 1, recv(t, fired))
	var stopped bool
	onLoop(t, l, func() {
		stopped = tm.Stop()
		tm.Reset(time.Millisecond)
	})
	require.False(t, stopped, "a fired timer is not pending")
	require.Equal(t, 2, recv(t, fired))
}

// The heap against a sorted model, through random push, remove and fix.
func TestTimerHeapModel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var h timerHeap
	var live []*Timer
	seq := uint64(0)
	for step := 0; step < 2000; step++ {
		switch op := r.IntN(4); {
		case op <= 1 && len(live) < 200 || len(live) == 0:
			seq++
			tm := &Timer{when: int64(r.IntN(100)), seq: seq, idx: -1}
			h.push(tm)
			live = append(live, tm)
		case op == 2:
			i := r.IntN(len(live))
			h.remove(live[i].idx)
			require.Equal(t, -1, live[i].idx)
			live = slices.Delete(live, i, i+1)
		default:
			tm := live[r.IntN(len(live))]
			seq++
			tm.when, tm.seq = int64(r.IntN(100)), seq
			h.fix(tm.idx)
		}
		for i, tm := range h {
			if tm.idx != i || (i > 0 && h.less(i, (i-1)/2)) {
				t.Fatalf("step %d: heap broken at %d", step, i)
			}
		}
		require.Len(t, h, len(live))
	}
	prev := int64(-1)
	for len(h) > 0 {
		tm := h[0]
		h.remove(0)
		require.GreaterOrEqual(t, tm.when, prev)
		prev = tm.when
	}
}
