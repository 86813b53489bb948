//go:build rdma

package verbs

import "github.com/twosided/twosided/ibv"

// gidType is enum ibv_gid_type.
type gidType = ibv.GIDType

const (
	gidTypeIB     = ibv.GIDTypeIB
	gidTypeRoCEv1 = ibv.GIDTypeRoCEv1
	gidTypeRoCEv2 = ibv.GIDTypeRoCEv2
)

// gidEntry is one valid row of a port's GID table.
type gidEntry struct {
	Port  uint8
	Index int
	Type  gidType
	GID   ibv.GID
}

// portTable is the part of the device's GID table that belongs to port, as ibv.GIDEntry.
func portTable(entries []gidEntry, port uint8) []ibv.GIDEntry {
	var out []ibv.GIDEntry
	for _, e := range entries {
		if e.Port == port && !e.GID.IsZero() {
			out = append(out, ibv.GIDEntry{Index: e.Index, Type: e.Type, GID: e.GID})
		}
	}
	return out
}

// pickGID is ibv.SelectGID's automatic choice on port: -1 and a zero GID when the port has
// no usable entry.
func pickGID(entries []gidEntry, port uint8, ethernet bool) (int, ibv.GID) {
	pa := ibv.PortAttr{Num: port, LinkLayer: "InfiniBand", GIDs: portTable(entries, port)}
	if ethernet {
		pa.LinkLayer = "Ethernet"
	}
	if len(pa.GIDs) == 0 {
		return -1, ibv.GID{}
	}
	e, err := ibv.SelectGID(pa, -1)
	if err != nil {
		return -1, ibv.GID{}
	}
	return e.Index, e.GID
}
