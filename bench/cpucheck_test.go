package bench

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// The check times every CPU this thread may run on, each a positive time, and leaves the
// thread's affinity as it found it.
func TestTimeCPUs(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var before unix.CPUSet
	require.NoError(t, unix.SchedGetaffinity(0, &before))
	if before.Count() > cpuCheckMax {
		t.Skipf("%d CPUs: the check is left out past %d", before.Count(), cpuCheckMax)
	}
	cpus, ms := timeCPUs()
	require.Len(t, cpus, before.Count())
	require.Len(t, ms, len(cpus))
	for i, cpu := range cpus {
		require.True(t, before.IsSet(cpu), "CPU %d is not in the affinity", cpu)
		require.Positive(t, ms[i], "CPU %d", cpu)
	}
	var after unix.CPUSet
	require.NoError(t, unix.SchedGetaffinity(0, &after))
	require.Equal(t, before, after)
}

// The table speaks of the CPUs only when they ran a spread apart, and says by how much and
// where, before and after.
func TestCPUCheckNote(t *testing.T) {
	var none *CPUCheck
	require.Equal(t, 1.0, none.Spread())
	require.Empty(t, none.note())
	even := &CPUCheck{CPUs: []int{0, 1}, StartMS: []float64{1.70, 1.65}, EndMS: []float64{1.68, 1.80}}
	require.Less(t, even.Spread(), unevenCPUs)
	require.Empty(t, even.note())
	uneven := &CPUCheck{CPUs: []int{0, 1}, StartMS: []float64{4.2, 1.7}, EndMS: []float64{4.0, 1.68}}
	require.InDelta(t, 4.2/1.68, uneven.Spread(), 1e-9)
	require.Equal(t, "uneven CPUs (2.5× apart): a fixed loop took 4.20 then 4.00 ms on CPU 0, 1.70 then 1.68 ms on CPU 1"+
		" (before and after the runs); a figure depends on which CPU each process ran on", uneven.note())
	// Only the first check: the end's figures are left out of the line.
	first := &CPUCheck{CPUs: []int{2, 3}, StartMS: []float64{1, 2}}
	require.Contains(t, first.note(), "took 1.00 ms on CPU 2, 2.00 ms on CPU 3 (before")
}
