package ibv

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSelectGID(t *testing.T) {
	ll := GID{0: 0xfe, 1: 0x80, 8: 2, 15: 1}
	v4 := GID{10: 0xff, 11: 0xff, 12: 192, 13: 168, 15: 7}
	v6 := GID{0: 0x20, 1: 0x01, 15: 9}
	ib := GID{0: 0xfe, 1: 0x80, 8: 0x0c, 15: 2}
	eth := func(e ...GIDEntry) PortAttr { return PortAttr{Num: 1, LinkLayer: "Ethernet", GIDs: e} }
	mlx5 := eth(GIDEntry{0, GIDTypeRoCEv1, ll}, GIDEntry{1, GIDTypeRoCEv2, ll}, GIDEntry{2, GIDTypeRoCEv1, v4}, GIDEntry{3, GIDTypeRoCEv2, v4})
	tests := []struct {
		name    string
		port    PortAttr
		req     int
		want    int
		wantErr string
	}{
		{"mlx5 auto: RoCE v2 IPv4", mlx5, -1, 3, ""},
		{"mlx5 requested v1 IPv4", mlx5, 2, 2, ""},
		{"mlx5 requested link-local v1", mlx5, 0, 0, ""},
		{"mlx5 requested empty", mlx5, 9, 0, "gid index 9 on port 1: empty"},
		{"v2 IPv6 global beats v2 link-local", eth(GIDEntry{1, GIDTypeRoCEv2, ll}, GIDEntry{5, GIDTypeRoCEv2, v6}), -1, 5, ""},
		{"v2 link-local beats v1 global", eth(GIDEntry{1, GIDTypeRoCEv1, v4}, GIDEntry{4, GIDTypeRoCEv2, ll}), -1, 4, ""},
		{"v1 global beats v1 link-local", eth(GIDEntry{0, GIDTypeRoCEv1, ll}, GIDEntry{2, GIDTypeRoCEv1, v4}), -1, 2, ""},
		{"lowest index among equals", eth(GIDEntry{7, GIDTypeRoCEv2, v4}, GIDEntry{3, GIDTypeRoCEv2, v4}), -1, 3, ""},
		{"IB entry unusable on Ethernet", eth(GIDEntry{0, GIDTypeIB, ib}), 0, 0, "type IB cannot be used"},
		{"no usable entry", eth(GIDEntry{0, GIDTypeIB, ib}), -1, 0, "no usable GID"},
		{"zero GID is empty", eth(GIDEntry{0, GIDTypeRoCEv2, GID{}}), 0, 0, "empty"},
		{"InfiniBand: lowest index", PortAttr{Num: 1, LinkLayer: "InfiniBand", GIDs: []GIDEntry{{3, GIDTypeIB, ib}, {0, GIDTypeIB, ib}}}, -1, 0, ""},
		{"RoCE entry unusable on InfiniBand", PortAttr{Num: 1, LinkLayer: "InfiniBand", GIDs: []GIDEntry{{1, GIDTypeRoCEv2, v4}}}, 1, 0, "cannot be used"},
		{"no table: the port's GID", PortAttr{Num: 1, LinkLayer: "Ethernet", GIDIndex: 0, GID: v4}, -1, 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := SelectGID(tt.port, tt.req)
			if tt.wantErr != "" {
				require.ErrorIs(t, err, ErrGIDIndex)
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, e.Index)
		})
	}
}
