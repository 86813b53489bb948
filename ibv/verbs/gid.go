//go:build rdma

package verbs

import "github.com/twosided/twosided/ibv"

// gidType is enum ibv_gid_type.
type gidType uint32

const (
	gidTypeIB     gidType = 0
	gidTypeRoCEv1 gidType = 1
	gidTypeRoCEv2 gidType = 2
)

// gidEntry is one valid row of a port's GID table.
type gidEntry struct {
	Port  uint8
	Index int
	Type  gidType
	GID   ibv.GID
}

// ipv4Mapped reports whether g is ::ffff:a.b.c.d, the GID RoCE derives from an IPv4 address.
func ipv4Mapped(g ibv.GID) bool {
	for _, b := range g[:10] {
		if b != 0 {
			return false
		}
	}
	return g[10] == 0xff && g[11] == 0xff
}

// pickGID chooses the GID index of port that twosided uses when none is configured: on
// InfiniBand the lowest index; on Ethernet a RoCE v2 GID of an IPv4 address first (it routes
// across subnets and is what Mooncake deployments run), then any RoCE v2 GID, then any
// non-zero one. It returns -1 and a zero GID when the port has no usable entry.
func pickGID(entries []gidEntry, port uint8, ethernet bool) (int, ibv.GID) {
	rank := func(e gidEntry) int {
		switch {
		case e.GID.IsZero():
			return 0
		case !ethernet:
			return 1
		case e.Type == gidTypeRoCEv2 && ipv4Mapped(e.GID):
			return 3
		case e.Type == gidTypeRoCEv2:
			return 2
		}
		return 1
	}
	best, bestRank := -1, 0
	var gid ibv.GID
	for _, e := range entries {
		if e.Port != port {
			continue
		}
		r := rank(e)
		if r > bestRank || (r == bestRank && r > 0 && e.Index < best) {
			best, bestRank, gid = e.Index, r, e.GID
		}
	}
	return best, gid
}
