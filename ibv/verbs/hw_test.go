//go:build rdma

package verbs

import (
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv"
)

// A failed ibv_dereg_mr keeps the buffer pinned (the NIC may still write into it) and the MR
// is kept, so a caller that drops it (as ctrlchannel's teardown does) leaves no Pinner to the
// garbage collector: before, Go panicked "found leaking pinned pointer" when it collected
// the dropped MR. The PD's Dealloc tries the failed MR again and releases it.
func TestDeregFailureKeepsPin(t *testing.T) {
	dev := activeDevice(t)
	ctx, err := Provider{}.Open(dev.Name)
	require.NoError(t, err)
	defer func() { require.NoError(t, ctx.Close()) }()
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	before := StuckMRs()
	func() {
		mr, err := pd.RegMR(make([]byte, 1<<16), ibv.AccessLocalWrite)
		require.NoError(t, err)
		deregFault.Store(int32(syscall.EBUSY))
		defer deregFault.Store(0)
		err = mr.Dereg()
		require.ErrorIs(t, err, syscall.EBUSY)
		require.Equal(t, before+1, StuckMRs())
		// The caller drops mr here.
	}()
	for i := 0; i < 10; i++ { // a leaked pin would panic in a finalizer meanwhile
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	require.Equal(t, before+1, StuckMRs(), "the failed MR is kept with its pin")
	require.NoError(t, pd.Dealloc(), "Dealloc deregisters the failed MR first")
	require.Equal(t, before, StuckMRs())
}

// CQs are spread over the device's completion vectors: the i-th CQ of a context is on
// vector i % num_comp_vectors (softverbs has one vector, so every CQ is on 0 there).
func TestCompVectors(t *testing.T) {
	require.Equal(t, []int{0, 1, 2, 0, 1}, []int{compVector(0, 3), compVector(1, 3), compVector(2, 3), compVector(3, 3), compVector(4, 3)})
	require.Zero(t, compVector(7, 1))
	require.Zero(t, compVector(7, 0))
	dev := activeDevice(t)
	c, err := Provider{}.Open(dev.Name)
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()) }()
	n := int(tsvNumCompVectors(c.(*deviceContext)))
	for i := 0; i < 4; i++ {
		q, err := c.CreateCQ(4, nil)
		require.NoError(t, err)
		require.Equal(t, compVector(uint64(i), n), q.(*cq).vector, "cq %d of %d vectors", i, n)
		require.NoError(t, q.Destroy())
	}
}

// ForkInit is ibv_fork_init, once; later calls return nil.
func TestForkInit(t *testing.T) {
	activeDevice(t)
	require.NoError(t, Provider{}.ForkInit())
	require.NoError(t, Provider{}.ForkInit())
}
