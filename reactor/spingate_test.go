package reactor

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSpinGate drives the gate through hit and miss sequences; it counts decisions only.
func TestSpinGate(t *testing.T) {
	var g SpinGate
	// A new gate spins; misses only turn it off after spinMissMax of them.
	misses := 0
	for g.Allow() {
		g.Record(false)
		misses++
		require.LessOrEqual(t, misses, spinMissMax)
	}
	require.Equal(t, spinMissMax, misses)
	require.False(t, g.Spinning())
	// Off, it spins only to probe.
	allowed := 0
	for i := 0; i < 4*spinProbeEvery; i++ {
		if g.Allow() {
			allowed++
			g.Record(false)
		}
	}
	require.Equal(t, 4, allowed, "one probe in spinProbeEvery while every spin misses")

	// A probe that hits turns spinning on; hits keep it on.
	for !g.Allow() {
	}
	g.Record(true)
	for i := 0; i < 20; i++ {
		require.True(t, g.Allow(), "phase %d after hits", i)
		g.Record(true)
	}
	// Half the spins hit: it stays on.
	for i := 0; i < 100; i++ {
		require.True(t, g.Allow(), "phase %d at a 50%% hit rate", i)
		g.Record(i%2 == 0)
	}
	// One hit in four (below the half): it turns off, and stays off but for probes.
	allowed = 0
	for i := 0; i < 8*spinProbeEvery; i++ {
		if g.Allow() {
			allowed++
			g.Record(allowed%4 == 0)
		}
	}
	require.Less(t, allowed, 8*spinProbeEvery/4, "a 25%% hit rate keeps spinning mostly off")
}

// The gate's counters stay in range under concurrent callers (run with -race).
func TestSpinGateConcurrent(t *testing.T) {
	var g SpinGate
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				if g.Allow() {
					g.Record((i+w)%3 != 0)
				}
			}
		}(w)
	}
	wg.Wait()
	m := g.misses.Load()
	require.True(t, m >= 0 && m <= spinMissMax, "misses %d", m)
}

func TestSpinGateAllocs(t *testing.T) {
	var g SpinGate
	require.Zero(t, testing.AllocsPerRun(100, func() {
		if g.Allow() {
			g.Record(true)
		}
	}))
}
