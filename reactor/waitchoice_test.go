package reactor

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWaitChoiceFollowsTheTraffic: waits that rarely wake the loop stay on the callers'
// set; once most of them do, the caller waits on the loop's set, with every 16th wait on the
// callers' set again, and it comes back when those stop waking the loop.
func TestWaitChoiceFollowsTheTraffic(t *testing.T) {
	var c waitChoice
	// One wait in eight woke the loop (an answer beating the wait's start): stays.
	for i := range 400 {
		require.True(t, c.onCallers(), "wait %d", i)
		c.record(i%8 == 0)
	}
	// Every other wait woke the loop (an answer and an event close behind it).
	switched := -1
	for i := 0; i < 400; i++ {
		if !c.onCallers() {
			switched = i
			break
		}
		c.record(i%2 == 0)
	}
	require.Positive(t, switched, "never left the callers' set")
	require.Less(t, switched, 48, "left the callers' set too late")
	// On the loop's set now (the wait that switched was its first): every 16th wait tries
	// the callers' set.
	for round := range 20 {
		first := 1
		if round == 0 {
			first = 2
		}
		for i := first; i < choiceProbe; i++ {
			require.False(t, c.onCallers(), "round %d, wait %d", round, i)
		}
		require.True(t, c.onCallers(), "round %d: no try of the callers' set", round)
		c.record(true)
	}
	// The tries stop waking the loop: back on the callers' set after a few of them.
	back := -1
	for i := 0; i < 64*choiceProbe; i++ {
		if c.onCallers() {
			c.record(false)
			if c.rate <= choiceBound {
				back = i
				break
			}
		}
	}
	require.Positive(t, back, "never came back to the callers' set")
	for i := range 100 {
		require.True(t, c.onCallers(), "wait %d after coming back", i)
		c.record(false)
	}
}
