//go:build rdma

package verbs

import (
	"errors"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/twosided/twosided/ibv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// activeDevice returns a device with an active port, or skips the test saying why none is.
func activeDevice(t testing.TB) ibv.DeviceInfo {
	t.Helper()
	devs, err := Provider{}.GetDeviceList()
	if err != nil {
		t.Skipf("needs an RDMA device with an active port: %v", err)
	}
	for _, d := range devs {
		if _, ok := d.ActivePort(); ok {
			return d
		}
	}
	t.Skip("needs an RDMA device with an active port: none listed")
	return ibv.DeviceInfo{}
}

func TestRegistered(t *testing.T) {
	p, err := ibv.LookupProvider("verbs")
	require.NoError(t, err)
	require.Equal(t, "verbs", p.Name())
	require.IsType(t, Provider{}, p)
}

func TestABI(t *testing.T) {
	for _, p := range abiPairs() {
		require.Equal(t, p.cVal, p.goVal, p.name)
	}
}

func TestListError(t *testing.T) {
	tests := []struct {
		name  string
		errno error
		want  string
	}{
		{"no kernel support", syscall.ENOSYS, "no RDMA device: ibv_get_device_list: function not implemented (no kernel RDMA support)"},
		{"empty list", nil, "no RDMA device: ibv_get_device_list: no device found"},
		{"no permission", syscall.EACCES, "no RDMA device: ibv_get_device_list: permission denied (no access to /dev/infiniband)"},
		{"other errno", syscall.ENODEV, "no RDMA device: ibv_get_device_list: no such device"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := listError(tt.errno)
			require.ErrorIs(t, err, ibv.ErrNoDevice)
			require.EqualError(t, err, tt.want)
		})
	}
}

// noKernelRDMA reports whether this machine's kernel has no RDMA support at all, the case
// where libibverbs fails with ENOSYS.
func noKernelRDMA() bool {
	_, err := os.Stat("/sys/class/infiniband_verbs")
	return errors.Is(err, os.ErrNotExist)
}

func TestGetDeviceListWithoutDevice(t *testing.T) {
	devs, err := Provider{}.GetDeviceList()
	if err == nil {
		t.Skipf("this machine has RDMA devices (%d listed); the device-less path is not reachable", len(devs))
	}
	require.ErrorIs(t, err, ibv.ErrNoDevice)
	require.Contains(t, err.Error(), "no RDMA device: ")
	if noKernelRDMA() {
		require.Empty(t, devs)
		require.EqualError(t, err, "no RDMA device: ibv_get_device_list: function not implemented (no kernel RDMA support)")
	}

	// The registry passes the reason through, named by provider, when no other provider has
	// a device (the engine tests link the soft provider into this binary).
	if _, err := ibv.LookupProvider("soft"); err == nil {
		return
	}
	_, err = ibv.GetDeviceList()
	require.ErrorIs(t, err, ibv.ErrNoDevice)
	require.Contains(t, err.Error(), "verbs: no RDMA device: ")
}

func TestOpenWithoutDevice(t *testing.T) {
	_, err := Provider{}.Open("twosided-no-such-device")
	require.ErrorIs(t, err, ibv.ErrNoDevice)
	require.Contains(t, err.Error(), `"twosided-no-such-device"`)
}

func TestPickGID(t *testing.T) {
	ipv4 := ibv.GID{10: 0xff, 11: 0xff, 12: 192, 13: 168, 14: 1, 15: 7}
	link := ibv.GID{0: 0xfe, 1: 0x80, 15: 1}
	ib := ibv.GID{0: 0xfe, 1: 0x80, 8: 0x0c, 15: 2}
	tests := []struct {
		name      string
		entries   []gidEntry
		port      uint8
		ethernet  bool
		wantIndex int
		wantGID   ibv.GID
	}{
		{"none", nil, 1, true, -1, ibv.GID{}},
		{"infiniband takes the lowest index", []gidEntry{{1, 3, gidTypeIB, ib}, {1, 0, gidTypeIB, ib}}, 1, false, 0, ib},
		{"roce v2 ipv4 beats v1 and link-local v2", []gidEntry{
			{1, 0, gidTypeRoCEv1, link}, {1, 1, gidTypeRoCEv2, link},
			{1, 2, gidTypeRoCEv1, ipv4}, {1, 3, gidTypeRoCEv2, ipv4},
		}, 1, true, 3, ipv4},
		{"roce v2 beats v1", []gidEntry{{1, 0, gidTypeRoCEv1, link}, {1, 1, gidTypeRoCEv2, link}}, 1, true, 1, link},
		{"roce v1 when alone", []gidEntry{{1, 4, gidTypeRoCEv1, link}}, 1, true, 4, link},
		{"zero gid is unusable", []gidEntry{{1, 0, gidTypeRoCEv2, ibv.GID{}}}, 1, true, -1, ibv.GID{}},
		{"other port ignored", []gidEntry{{2, 3, gidTypeRoCEv2, ipv4}, {1, 1, gidTypeRoCEv1, link}}, 1, true, 1, link},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			idx, gid := pickGID(tt.entries, tt.port, tt.ethernet)
			require.Equal(t, tt.wantIndex, idx)
			require.Equal(t, tt.wantGID, gid)
		})
	}
}

func TestHandles(t *testing.T) {
	obj := new(int)
	h := newHandle(obj)
	require.NotZero(t, h)
	require.Same(t, obj, lookupHandle(h))
	require.NotEqual(t, h, newHandle(obj), "handles are never reused")
	freeHandle(h)
	require.Nil(t, lookupHandle(h))
}

// TestPollAllocatesNothing needs a device: it polls an empty CQ.
func TestPollAllocatesNothing(t *testing.T) {
	dev := activeDevice(t)
	ctx, err := Provider{}.Open(dev.Name)
	require.NoError(t, err)
	defer func() { require.NoError(t, ctx.Close()) }()
	ch, err := ctx.CreateCompChannel()
	require.NoError(t, err)
	defer func() { require.NoError(t, ch.Close()) }()
	cq, err := ctx.CreateCQ(16, ch)
	require.NoError(t, err)
	defer func() { require.NoError(t, cq.Destroy()) }()

	_, err = ch.GetEvent()
	require.ErrorIs(t, err, ibv.ErrWouldBlock)
	_, err = ctx.GetAsyncEvent()
	require.ErrorIs(t, err, ibv.ErrWouldBlock)

	wcs := make([]ibv.WC, 8)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := cq.Poll(wcs); err != nil {
			t.Fatal(err)
		}
	})
	require.Zero(t, allocs)
	allocs = testing.AllocsPerRun(100, func() {
		if _, err := ch.GetEvent(); err != ibv.ErrWouldBlock {
			t.Fatal(err)
		}
	})
	require.Zero(t, allocs, "an empty channel costs no allocation")
}

// BenchmarkPollEmpty is the cost of one ibv_poll_cq through cgo on an empty CQ.
func BenchmarkPollEmpty(b *testing.B) {
	dev := activeDevice(b)
	ctx, err := Provider{}.Open(dev.Name)
	require.NoError(b, err)
	defer func() { require.NoError(b, ctx.Close()) }()
	cq, err := ctx.CreateCQ(16, nil)
	require.NoError(b, err)
	defer func() { require.NoError(b, cq.Destroy()) }()
	wcs := make([]ibv.WC, 16)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := cq.Poll(wcs); err != nil {
			b.Fatal(err)
		}
	}
}
