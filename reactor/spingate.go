package reactor

import "sync/atomic"

// SpinGate decides whether a busy-poll phase is worth starting, from how the recent ones
// ended: a spin that ran out of budget before its event came cost a CPU for nothing and,
// on a machine with few cores, delayed the very threads that produce the event (the peer,
// the loop the spinner waits on). Measured on the 2-vCPU VM, two processes, echo: with a
// 50 µs budget and a ~90 µs round trip every spin missed, and busy poll was slower than
// event mode (50 vs 42 µs one-way p50).
//
// The rule, like an adaptive mutex's spin count: a miss count rises by one per miss (the
// budget ran out) up to spinMissMax and falls by one per hit (the event came within the
// budget); spinning is allowed while it is below spinMissMax, so a gate starts spinning and
// stays on while at least half the spins hit. At spinMissMax, one phase in spinProbeEvery
// still spins, as a probe: a hit turns spinning back on when the traffic's gaps shrank
// below the budget. Time is not an input: the outcome of each phase is.
//
// Safe from any goroutine; allocation-free.
type SpinGate struct {
	misses atomic.Int32
	skips  atomic.Uint32
}

const (
	spinMissMax    = 8
	spinProbeEvery = 16
)

// Allow reports whether to spin now. Each phase it allows must be reported with Record.
func (g *SpinGate) Allow() bool {
	if g.misses.Load() < spinMissMax {
		return true
	}
	return g.skips.Add(1)%spinProbeEvery == 0
}

// Record reports how an allowed phase ended: hit when the awaited event came within the
// budget.
func (g *SpinGate) Record(hit bool) {
	for {
		old := g.misses.Load()
		next := old + 1
		if hit {
			next = old - 1
		}
		next = min(max(next, 0), spinMissMax)
		if next == old || g.misses.CompareAndSwap(old, next) {
			return
		}
	}
}

// Spinning reports whether the gate allows spinning without a probe.
func (g *SpinGate) Spinning() bool { return g.misses.Load() < spinMissMax }
