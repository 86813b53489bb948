package notify

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestModeGate: the gate tries each way, then takes the faster on average, probing the
// other one call in modeProbeEvery, and follows a change of which way is faster.
func TestModeGate(t *testing.T) {
	var g modeGate
	// Each way once.
	require.True(t, g.spin())
	g.record(true, 40*time.Microsecond)
	require.False(t, g.spin())
	g.record(false, 20*time.Microsecond)
	// Event mode is faster: spin only on probes.
	spins := 0
	for range 4 * modeProbeEvery {
		s := g.spin()
		if s {
			spins++
			g.record(true, 40*time.Microsecond)
		} else {
			g.record(false, 20*time.Microsecond)
		}
	}
	require.Equal(t, 4, spins, "spins beyond the probes while event mode was faster")
	// Spinning becomes faster (a core freed): the probes move its average (1/8 of the gap
	// each) and the gate turns within a few probes.
	for range 8 * modeProbeEvery {
		s := g.spin()
		if s {
			g.record(true, 5*time.Microsecond)
		} else {
			g.record(false, 20*time.Microsecond)
		}
	}
	var last [modeProbeEvery]bool
	for i := range last {
		last[i] = g.spin()
		g.record(last[i], 5*time.Microsecond)
	}
	events := 0
	for _, s := range last {
		if !s {
			events++
		}
	}
	require.Equal(t, 1, events, "event mode beyond its probe while spinning was faster")
}
