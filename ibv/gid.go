package ibv

import (
	"errors"
	"fmt"
)

// GIDType is enum ibv_gid_type: what kind of frame a GID table entry sends.
type GIDType uint8

// GID types, with libibverbs' values. GIDTypeUnknown marks an entry whose type the provider
// could not read (a kernel without the GID table query).
const (
	GIDTypeIB      GIDType = 0
	GIDTypeRoCEv1  GIDType = 1
	GIDTypeRoCEv2  GIDType = 2
	GIDTypeUnknown GIDType = 0xff
)

func (t GIDType) String() string {
	switch t {
	case GIDTypeIB:
		return "IB"
	case GIDTypeRoCEv1:
		return "RoCE v1"
	case GIDTypeRoCEv2:
		return "RoCE v2"
	case GIDTypeUnknown:
		return "unknown"
	}
	return fmt.Sprintf("GIDType(%d)", uint8(t))
}

// GIDEntry is one valid row of a port's GID table (struct ibv_gid_entry).
type GIDEntry struct {
	Index int
	Type  GIDType
	GID   GID
}

// IPv4Mapped reports whether g is ::ffff:a.b.c.d, the GID RoCE derives from an IPv4 address.
func (g GID) IPv4Mapped() bool {
	for _, b := range g[:10] {
		if b != 0 {
			return false
		}
	}
	return g[10] == 0xff && g[11] == 0xff
}

// LinkLocal reports whether g is in fe80::/10.
func (g GID) LinkLocal() bool { return g[0] == 0xfe && g[1]&0xc0 == 0x80 }

// ErrGIDIndex is wrapped by SelectGID's errors: the requested index is empty or of a type
// the port cannot use, or the port has no usable GID.
var ErrGIDIndex = errors.New("ibv: gid index")

// usable reports whether a GID of type t can source traffic on a port of that link layer.
func usable(t GIDType, ethernet bool) bool {
	switch t {
	case GIDTypeUnknown:
		return true
	case GIDTypeIB:
		return !ethernet
	case GIDTypeRoCEv1, GIDTypeRoCEv2:
		return ethernet
	}
	return false
}

// gidRank orders the entries SelectGID may pick on its own; 0 is never picked.
func gidRank(e GIDEntry, ethernet bool) int {
	switch {
	case e.GID.IsZero() || !usable(e.Type, ethernet):
		return 0
	case !ethernet:
		return 1
	case e.Type == GIDTypeRoCEv2 && e.GID.IPv4Mapped():
		return 6
	case e.Type == GIDTypeRoCEv2 && !e.GID.LinkLocal():
		return 5
	case e.Type == GIDTypeRoCEv2:
		return 4
	case e.Type == GIDTypeRoCEv1 && !e.GID.LinkLocal():
		return 3
	case e.Type == GIDTypeRoCEv1:
		return 2
	}
	return 1 // an Ethernet entry of unknown type
}

// GIDTable returns the port's GID table: GIDs when the provider listed it, else the one entry
// GIDIndex/GID (of unknown type) when that GID is set.
func (p PortAttr) GIDTable() []GIDEntry {
	if len(p.GIDs) > 0 {
		return p.GIDs
	}
	if p.GID.IsZero() {
		return nil
	}
	return []GIDEntry{{Index: p.GIDIndex, Type: GIDTypeUnknown, GID: p.GID}}
}

// SelectGID is the one choice of the GID that a QP on port p sources its traffic from: the
// GID twosided advertises in its handshake and the sgid_index of its address vector are
// both this entry's. requested < 0 picks one: on InfiniBand the lowest non-empty index; on
// Ethernet (RoCE) a RoCE v2 GID of an IPv4 address (IPv4-mapped) first, then a RoCE v2 IPv6
// GID (not link-local first), then RoCE v1 (not link-local first), the lowest index among
// equals. requested >= 0 (MC_GID_INDEX) takes that entry; it is an error, wrapping
// ErrGIDIndex and naming the index, when the entry is empty or of a type the port's link
// layer cannot use (IB on Ethernet, RoCE on InfiniBand).
func SelectGID(p PortAttr, requested int) (GIDEntry, error) {
	ethernet := p.LinkLayer == "Ethernet"
	table := p.GIDTable()
	if requested >= 0 {
		for _, e := range table {
			if e.Index != requested {
				continue
			}
			if e.GID.IsZero() {
				break
			}
			if !usable(e.Type, ethernet) {
				return GIDEntry{}, fmt.Errorf("%w %d on port %d: type %s cannot be used on a port of link layer %s", ErrGIDIndex, requested, p.Num, e.Type, p.LinkLayer)
			}
			return e, nil
		}
		return GIDEntry{}, fmt.Errorf("%w %d on port %d: empty (the port's GIDs: %s)", ErrGIDIndex, requested, p.Num, describeTable(table))
	}
	best, bestRank := GIDEntry{Index: -1}, 0
	for _, e := range table {
		if r := gidRank(e, ethernet); r > bestRank || (r == bestRank && r > 0 && e.Index < best.Index) {
			best, bestRank = e, r
		}
	}
	if bestRank == 0 {
		return GIDEntry{}, fmt.Errorf("%w: port %d has no usable GID (%s)", ErrGIDIndex, p.Num, describeTable(table))
	}
	return best, nil
}

func describeTable(t []GIDEntry) string {
	if len(t) == 0 {
		return "none"
	}
	s := ""
	for i, e := range t {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%d %s %s", e.Index, e.Type, e.GID)
	}
	return s
}
