package soft_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/ibv/conformance"
	"github.com/twosided/twosided/ibv/soft"
)

// The conformance suite over two devices whose GID tables differ (soft0 mlx5-like, its
// source GID at index 3; soft1 one entry, index 0): each side's address vector names its own
// index. Before, the suite used the remote's index as the local sgid_index, which only works
// where both sides chose the same one (soft0 sourcing from its link-local index 0 towards
// soft1's IPv4 GID is refused at RTR). The devices are held open, so the table set here
// stays; fault injection is left out (a killed device would stay dead while held).
func TestConformanceMixedGIDTables(t *testing.T) {
	p := soft.New(soft.WithDevices(2), soft.WithGIDTable(soft.GIDTableMLX5))
	for _, d := range []string{"soft0", "soft1"} {
		ctx, err := p.Open(d)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, ctx.Close()) })
	}
	require.NoError(t, p.SetGIDTable("soft1", soft.GIDTableSingle))
	pick := func(dev string) ibv.GIDEntry {
		for _, d := range must(p.GetDeviceList()) {
			if d.Name == dev {
				g, err := ibv.SelectGID(d.Ports[0], -1)
				require.NoError(t, err)
				return g
			}
		}
		t.Fatalf("%s not listed", dev)
		return ibv.GIDEntry{}
	}
	require.Equal(t, 3, pick("soft0").Index)
	require.Equal(t, 0, pick("soft1").Index)
	conformance.Run(t, conformance.Fixture{Provider: p, DevA: "soft0", DevB: "soft1"})
}

// An mlx5-like soft port refuses, at RTR, a source GID that is not a table entry or is of
// another address family than the destination, as the kernel's RoCE resolution does.
func TestSoftSGIDChecked(t *testing.T) {
	p := soft.New(soft.WithDevices(1), soft.WithGIDTable(soft.GIDTableMLX5))
	ctx, err := p.Open("soft0")
	require.NoError(t, err)
	defer func() { require.NoError(t, ctx.Close()) }()
	port, err := ctx.QueryPort(1)
	require.NoError(t, err)
	require.Len(t, port.GIDs, 4)
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	defer func() { require.NoError(t, pd.Dealloc()) }()
	cq, err := ctx.CreateCQ(8, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, cq.Destroy()) }()
	for _, tt := range []struct {
		sgid uint8
		ok   bool
	}{{3, true}, {2, true}, {1, false}, {0, false}, {9, false}} {
		qp, err := pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, Type: ibv.QPTypeRC, Cap: ibv.QPCap{MaxSendWR: 1, MaxRecvWR: 1}})
		require.NoError(t, err)
		require.NoError(t, qp.Modify(&ibv.QPAttr{QPState: ibv.QPSInit, PortNum: 1}, ibv.AttrState|ibv.AttrPKeyIndex|ibv.AttrPort|ibv.AttrAccessFlags))
		err = qp.Modify(&ibv.QPAttr{QPState: ibv.QPSRTR, PathMTU: ibv.MTU1024, DestQPNum: qp.QPNum(), MaxDestRdAtomic: 1, MinRNRTimer: 12,
			AHAttr: ibv.AHAttr{IsGlobal: true, DGID: port.GID, SGIDIndex: tt.sgid, HopLimit: 1, PortNum: 1}},
			ibv.AttrState|ibv.AttrAV|ibv.AttrPathMTU|ibv.AttrDestQPN|ibv.AttrRqPSN|ibv.AttrMaxDestRdAtomic|ibv.AttrMinRNRTimer)
		if tt.ok {
			require.NoError(t, err, "sgid_index %d", tt.sgid)
		} else {
			require.ErrorIs(t, err, ibv.ErrInvalid, "sgid_index %d", tt.sgid)
			require.ErrorContains(t, err, "SGIDIndex")
		}
		require.NoError(t, qp.Destroy())
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
