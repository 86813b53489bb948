package reactor

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestBusyCountsWork: the time a callback works is in Stats.Busy once its iteration ends.
func TestBusyCountsWork(t *testing.T) {
	l := newLoop(t)
	const work = 2 * time.Millisecond
	onLoop(t, l, func() {
		deadline := time.Now().Add(work)
		for time.Now().Before(deadline) { // work, without sleeping
		}
	})
	require.NoError(t, l.Stop(context.Background()))
	require.GreaterOrEqual(t, l.Stats().Busy, work)
}

// TestHoldSpin: a busy-polling loop blocks instead of spinning while a caller holds its
// spin, and spins again once the caller window after the release passed.
func TestHoldSpin(t *testing.T) {
	l := newLoop(t, WithBusyPoll(time.Hour))
	l.HoldSpin()
	onLoop(t, l, func() {})
	// Held: the loop goes to sleep in epoll_wait despite its hour of budget.
	require.Eventually(t, func() bool { return l.state.Load() == asleep }, waitBound, time.Millisecond)
	polls := l.Stats().BusyPolls
	onLoop(t, l, func() {})
	require.Eventually(t, func() bool { return l.state.Load() == asleep }, waitBound, time.Millisecond)
	require.Equal(t, polls, l.Stats().BusyPolls, "the loop spun while held")
	l.ReleaseSpin()
	// For the caller window after a release (the budget, at most 1 ms) the loop still
	// leaves the polling to the caller; the first wake-up after it spins again.
	time.Sleep(2 * time.Millisecond)
	onLoop(t, l, func() {})
	require.Eventually(t, func() bool { return l.Stats().BusyPolls > polls+100 }, waitBound, time.Millisecond)
	require.Equal(t, awake, l.state.Load(), "the released loop slept within its budget")
}
