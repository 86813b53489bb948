package bench

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// CPUCheck is a fixed compute loop timed on each CPU the bench may run on, at the start
// and at the end of the suite. On a VM one vCPU can run the same code several times slower
// than another (its host is busy), and a two-process figure then depends on where each
// process ran: the engines' code is user time, which a slow vCPU stretches, where the
// floors' is mostly the kernel's.
type CPUCheck struct {
	CPUs    []int     `json:"cpus"`
	StartMS []float64 `json:"start_ms"`         // the loop's CPU time on each CPU, before the runs
	EndMS   []float64 `json:"end_ms,omitempty"` // after them
}

// cpuCheckMax bounds the CPUs timed: past it the check is left out (a large machine's
// vCPUs, and the time it would take).
const cpuCheckMax = 16

// cpuLoopIters is the loop's length: a dependent multiply-add chain, about 25 ms at 3 GHz,
// long enough to span the host's scheduling of a vCPU.
const cpuLoopIters = 20_000_000

var cpuLoopSink uint64

// cpuLoop is the work timed: each step depends on the one before, so it runs at the core's
// speed whatever its width.
func cpuLoop(n int) uint64 {
	x := uint64(1)
	for i := 0; i < n; i++ {
		x = x*6364136223846793005 + 1442695040888963407
	}
	return x
}

// timeCPUs times cpuLoop on each CPU of this thread's affinity (at most cpuCheckMax; none
// otherwise) after a warm-up, and leaves the affinity as it was. The time is the thread's
// CPU time (CLOCK_THREAD_CPUTIME_ID), not the wall clock's: another process sharing the CPU
// for a moment (the last run's child exiting) takes wall time but not the thread's, while a
// host that runs the vCPU a part of the time only slows the thread's own (the guest's
// clock runs on while the host has the vCPU off).
func timeCPUs() (cpus []int, ms []float64) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var orig unix.CPUSet
	if unix.SchedGetaffinity(0, &orig) != nil || orig.Count() > cpuCheckMax {
		return nil, nil
	}
	defer func() { _ = unix.SchedSetaffinity(0, &orig) }()
	for cpu := 0; cpu < len(orig)*64 && len(cpus) < orig.Count(); cpu++ {
		if !orig.IsSet(cpu) {
			continue
		}
		var one unix.CPUSet
		one.Set(cpu)
		if unix.SchedSetaffinity(0, &one) != nil {
			continue
		}
		cpuLoopSink += cpuLoop(cpuLoopIters / 8)
		t0, ok0 := threadCPU()
		cpuLoopSink += cpuLoop(cpuLoopIters)
		t1, ok1 := threadCPU()
		if !ok0 || !ok1 || t1 <= t0 {
			continue
		}
		cpus = append(cpus, cpu)
		ms = append(ms, float64(t1-t0)/1e6)
	}
	return cpus, ms
}

// threadCPU is the calling thread's CPU time.
func threadCPU() (time.Duration, bool) {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}

// newCPUCheck times the CPUs before the runs; nil where they could not be timed.
func newCPUCheck() *CPUCheck {
	cpus, ms := timeCPUs()
	if len(cpus) == 0 {
		return nil
	}
	return &CPUCheck{CPUs: cpus, StartMS: ms}
}

// finish times the CPUs again after the runs.
func (c *CPUCheck) finish() {
	if c == nil {
		return
	}
	if cpus, ms := timeCPUs(); slices.Equal(cpus, c.CPUs) {
		c.EndMS = ms
	}
}

// Spread is the slowest CPU's time over the fastest's, over both checks (1: even).
func (c *CPUCheck) Spread() float64 {
	if c == nil {
		return 1
	}
	all := append(slices.Clone(c.StartMS), c.EndMS...)
	if len(all) == 0 || slices.Min(all) <= 0 {
		return 1
	}
	return slices.Max(all) / slices.Min(all)
}

// unevenCPUs is the spread from which the table says the CPUs ran unevenly.
const unevenCPUs = 1.25

// note is the table's line about an uneven check; "" when the CPUs ran evenly.
func (c *CPUCheck) note() string {
	if c.Spread() < unevenCPUs {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "uneven CPUs (%.1f× apart): a fixed loop took", c.Spread())
	for i, cpu := range c.CPUs {
		sep := ","
		if i == 0 {
			sep = ""
		}
		fmt.Fprintf(&b, "%s %.2f", sep, c.StartMS[i])
		if len(c.EndMS) == len(c.CPUs) {
			fmt.Fprintf(&b, " then %.2f", c.EndMS[i])
		}
		fmt.Fprintf(&b, " ms on CPU %d", cpu)
	}
	b.WriteString(" (before and after the runs); a figure depends on which CPU each process ran on")
	return b.String()
}
