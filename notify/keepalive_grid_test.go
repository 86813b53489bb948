package notify

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestKeepaliveGrid: rounds fall on the wall-clock grid of half-intervals, whatever the
// time a timer is armed at, and the parity of a round is that of its grid point even when
// the timer fires a little late.
func TestKeepaliveGrid(t *testing.T) {
	const step = 2500 * time.Millisecond
	base := time.Unix(1_700_000_000, 0) // a multiple of step: 1.7e9 s / 2.5 s is whole
	require.Zero(t, base.UnixNano()%int64(step))
	for _, c := range []struct {
		at   time.Duration // after base
		want time.Duration
	}{{0, step}, {time.Millisecond, step - time.Millisecond}, {step - time.Microsecond, time.Millisecond}, {step + 700*time.Millisecond, step - 700*time.Millisecond}} {
		require.Equal(t, c.want, untilNextStep(base.Add(c.at), step), "armed at base+%v", c.at)
	}
	p0 := stepParity(base, step)
	for _, late := range []time.Duration{0, time.Millisecond, step/2 - time.Millisecond} {
		require.Equal(t, p0, stepParity(base.Add(late), step), "fired %v late", late)
		require.Equal(t, 1-p0, stepParity(base.Add(step+late), step), "next step, fired %v late", late)
		require.Equal(t, p0, stepParity(base.Add(2*step+late), step))
	}
	require.Equal(t, time.Millisecond, untilNextStep(base, 0))
}
