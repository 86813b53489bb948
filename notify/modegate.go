package notify

import (
	"sync/atomic"
	"time"
)

// modeGate decides, per SendNotify of a busy-polling engine, whether the caller spins (holds
// its loop's spin and polls) or waits as in event mode, from the send-to-result times each
// way recently gave. Spinning pays where a core is free for it; on a small machine shared
// with the peer it can be slower than event mode (two processes on 2 vCPUs, rdma_twosided:
// busy 19.8/19.6 µs one-way against event 17.1/19.0, after event mode learnt to wait as the
// loop). So the caller takes the way with the lower moving average, and one call in
// modeProbeEvery the other way, so that a change in load is seen. The reactor's SpinGate
// still turns spinning off while spins run out of budget.
//
// The averages are exponential (weight 1/8), per engine; updates from concurrent callers
// may overwrite one another (each is a plain load and store), which only costs a sample.
// Safe from any goroutine; allocation-free.
type modeGate struct {
	spinNs, eventNs atomic.Int64 // moving averages; 0: no sample yet
	calls           atomic.Uint32
}

const modeProbeEvery = 16

// spin reports whether this call should spin. Each call should be reported with record.
func (g *modeGate) spin() bool {
	probe := g.calls.Add(1)%modeProbeEvery == 0
	s, e := g.spinNs.Load(), g.eventNs.Load()
	switch {
	case s == 0:
		return true // try each way once before comparing
	case e == 0:
		return false
	}
	return (s <= e) != probe
}

// record adds one call's send-to-result time to its way's average.
func (g *modeGate) record(spun bool, d time.Duration) {
	avg := &g.eventNs
	if spun {
		avg = &g.spinNs
	}
	ns := max(int64(d), 1)
	if old := avg.Load(); old != 0 {
		ns = max(old+(ns-old)/8, 1)
	}
	avg.Store(ns)
}
