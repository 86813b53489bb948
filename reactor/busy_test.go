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

// TestBusyPollGate: submissions far apart (each gap many budgets long) make every spin run
// out of budget, so the loop stops spinning but for the gate's probes (SpinGate's own
// test drives the turning on again). Counts phases, times nothing: the gaps only make each
// spin a certain miss.
func TestBusyPollGate(t *testing.T) {
	l := newLoop(t, WithBusyPoll(20*time.Microsecond))
	for i := 0; i < 3*spinMissMax+spinProbeEvery; i++ {
		onLoop(t, l, func() {})
		time.Sleep(2 * time.Millisecond)
	}
	st := l.Stats()
	require.NotZero(t, st.SpinsSkipped, "spins that all missed were not skipped")
	polls := st.BusyPolls
	for i := 0; i < 40; i++ {
		onLoop(t, l, func() {})
		time.Sleep(2 * time.Millisecond)
	}
	require.Greater(t, l.Stats().SpinsSkipped, st.SpinsSkipped)
	t.Logf("skipped %d phases; busy-poll rounds %d before the last 40 gaps, %d after", l.Stats().SpinsSkipped, polls, l.Stats().BusyPolls)
}
