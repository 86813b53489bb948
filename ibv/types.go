package ibv

import (
	"encoding/hex"
	"errors"
	"fmt"
)

// MTU is an IB path MTU enumeration value (IBV_MTU_*).
type MTU uint8

// IB MTU values, as in enum ibv_mtu.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes is the MTU in bytes, or 0 for an invalid value.
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}

// Valid reports whether m is one of the five IB MTU values.
func (m MTU) Valid() bool { return m >= MTU256 && m <= MTU4096 }

func (m MTU) String() string {
	if !m.Valid() {
		return fmt.Sprintf("MTU(%d)", uint8(m))
	}
	return fmt.Sprintf("%d", m.Bytes())
}

// MTUFromBytes maps 256, 512, 1024, 2048 or 4096 to its MTU value.
func MTUFromBytes(n int) (MTU, error) {
	for m := MTU256; m <= MTU4096; m++ {
		if m.Bytes() == n {
			return m, nil
		}
	}
	return 0, fmt.Errorf("ibv: mtu %d: must be one of 256, 512, 1024, 2048, 4096", n)
}

// MinMTU is the smaller of two MTUs: what both ends of a path can carry.
func MinMTU(a, b MTU) MTU {
	if a < b {
		return a
	}
	return b
}

// PortState is enum ibv_port_state.
type PortState uint8

// Port states.
const (
	PortNop         PortState = 0
	PortDown        PortState = 1
	PortInit        PortState = 2
	PortArmed       PortState = 3
	PortActive      PortState = 4
	PortActiveDefer PortState = 5
)

func (s PortState) String() string {
	switch s {
	case PortNop:
		return "PORT_NOP"
	case PortDown:
		return "PORT_DOWN"
	case PortInit:
		return "PORT_INIT"
	case PortArmed:
		return "PORT_ARMED"
	case PortActive:
		return "PORT_ACTIVE"
	case PortActiveDefer:
		return "PORT_ACTIVE_DEFER"
	}
	return fmt.Sprintf("PortState(%d)", uint8(s))
}

// GID is a 128-bit global identifier (union ibv_gid).
type GID [16]byte

// String formats the GID as Mooncake's handshake carries it in local_gid (gidBytesToString
// in its rdma_context.cpp): 16 bytes, two lower-case hex digits each, colon-separated, as
// in "fe:80:00:00:00:00:00:00:02:42:ac:ff:fe:11:00:02". Mooncake's parser accepts only
// this form.
func (g GID) String() string {
	const digits = "0123456789abcdef"
	var b [16*3 - 1]byte
	for i, v := range g {
		if i > 0 {
			b[3*i-1] = ':'
		}
		b[3*i], b[3*i+1] = digits[v>>4], digits[v&0x0f]
	}
	return string(b[:])
}

// IsZero reports whether every byte of the GID is zero.
func (g GID) IsZero() bool { return g == GID{} }

// ErrBadGID is wrapped by ParseGID's errors.
var ErrBadGID = errors.New("ibv: bad gid")

// ParseGID parses a GID in Mooncake's form (16 colon-separated bytes of two hex digits,
// what String writes) or in the form older twosided versions wrote (8 colon-separated
// groups of four hex digits). Upper- and lower-case digits are accepted; nothing else is
// (no "::" shortening, no signs, spaces or prefixes).
func ParseGID(s string) (GID, error) {
	var g GID
	var groups, width int
	switch len(s) {
	case 16*3 - 1:
		groups, width = 16, 2
	case 8*5 - 1:
		groups, width = 8, 4
	default:
		return GID{}, fmt.Errorf("%w: %q: %d characters: want 47 (16 bytes as xx:) or 39 (8 groups as xxxx:)",
			ErrBadGID, s, len(s))
	}
	per := width / 2 // bytes per group
	for i := 0; i < groups; i++ {
		at := i * (width + 1)
		if i > 0 && s[at-1] != ':' {
			return GID{}, fmt.Errorf("%w: %q: character %d: want ':' between groups", ErrBadGID, s, at-1)
		}
		if _, err := hex.Decode(g[i*per:(i+1)*per], []byte(s[at:at+width])); err != nil {
			return GID{}, fmt.Errorf("%w: %q: group %d %q: want %d hex digits", ErrBadGID, s, i, s[at:at+width], width)
		}
	}
	return g, nil
}

// PortAttr is the part of struct ibv_port_attr (plus its GID table) that twosided uses.
type PortAttr struct {
	Num       uint8 // 1-based port number
	State     PortState
	MaxMTU    MTU
	ActiveMTU MTU
	LID       uint16
	// GIDIndex and GID are SelectGID's automatic choice on this port (what a QP uses when
	// no index is configured).
	GIDIndex  int
	GID       GID
	LinkLayer string // "InfiniBand" or "Ethernet"
	// GIDs are the port's valid GID table entries, by index (nil: the provider cannot list
	// them; GIDTable then gives GIDIndex/GID alone).
	GIDs []GIDEntry
}

// DeviceInfo describes one device of a provider, as ibv_devinfo prints it.
type DeviceInfo struct {
	Name     string // e.g. "soft0", "mlx5_0"
	Provider string // e.g. "soft", "verbs"
	NodeGUID uint64
	Ports    []PortAttr
}

// ActivePort returns the first port in PORT_ACTIVE state.
func (d DeviceInfo) ActivePort() (PortAttr, bool) {
	for _, p := range d.Ports {
		if p.State == PortActive {
			return p, true
		}
	}
	return PortAttr{}, false
}

// AccessFlags is enum ibv_access_flags.
type AccessFlags uint32

// Access flags.
const (
	AccessLocalWrite   AccessFlags = 1 << 0
	AccessRemoteWrite  AccessFlags = 1 << 1
	AccessRemoteRead   AccessFlags = 1 << 2
	AccessRemoteAtomic AccessFlags = 1 << 3
)

// QPType is enum ibv_qp_type. Only RC is supported by twosided.
type QPType uint8

// QP types.
const (
	QPTypeRC QPType = 2
	QPTypeUC QPType = 3
	QPTypeUD QPType = 4
)

// QPState is enum ibv_qp_state.
type QPState uint8

// QP states.
const (
	QPSReset QPState = 0
	QPSInit  QPState = 1
	QPSRTR   QPState = 2
	QPSRTS   QPState = 3
	QPSSQD   QPState = 4
	QPSSQE   QPState = 5
	QPSErr   QPState = 6
)

func (s QPState) String() string {
	switch s {
	case QPSReset:
		return "RESET"
	case QPSInit:
		return "INIT"
	case QPSRTR:
		return "RTR"
	case QPSRTS:
		return "RTS"
	case QPSSQD:
		return "SQD"
	case QPSSQE:
		return "SQE"
	case QPSErr:
		return "ERR"
	}
	return fmt.Sprintf("QPState(%d)", uint8(s))
}

// QPAttrMask is enum ibv_qp_attr_mask: which fields of QPAttr a Modify applies.
type QPAttrMask uint32

// QP attribute mask bits, with libibverbs' values (IBV_QP_STATE, IBV_QP_ACCESS_FLAGS, ...).
const (
	AttrState            QPAttrMask = 1 << 0
	AttrCurState         QPAttrMask = 1 << 1
	AttrEnSqdAsyncNotify QPAttrMask = 1 << 2
	AttrAccessFlags      QPAttrMask = 1 << 3
	AttrPKeyIndex        QPAttrMask = 1 << 4
	AttrPort             QPAttrMask = 1 << 5
	AttrQKey             QPAttrMask = 1 << 6
	AttrAV               QPAttrMask = 1 << 7
	AttrPathMTU          QPAttrMask = 1 << 8
	AttrTimeout          QPAttrMask = 1 << 9
	AttrRetryCnt         QPAttrMask = 1 << 10
	AttrRnrRetry         QPAttrMask = 1 << 11
	AttrRqPSN            QPAttrMask = 1 << 12
	AttrMaxQPRdAtomic    QPAttrMask = 1 << 13
	AttrAltPath          QPAttrMask = 1 << 14
	AttrMinRNRTimer      QPAttrMask = 1 << 15
	AttrSqPSN            QPAttrMask = 1 << 16
	AttrMaxDestRdAtomic  QPAttrMask = 1 << 17
	AttrPathMigState     QPAttrMask = 1 << 18
	AttrCap              QPAttrMask = 1 << 19
	AttrDestQPN          QPAttrMask = 1 << 20
)

// AHAttr is struct ibv_ah_attr with its global route folded in.
type AHAttr struct {
	DLID      uint16
	SL        uint8
	IsGlobal  bool
	DGID      GID // grh.dgid
	SGIDIndex uint8
	HopLimit  uint8
	// TrafficClass is grh.traffic_class (on RoCE v2: DSCP << 2 | ECN).
	TrafficClass uint8
	PortNum      uint8
}

// QPAttr is struct ibv_qp_attr (the fields RC needs).
type QPAttr struct {
	QPState         QPState
	PathMTU         MTU
	QPAccessFlags   AccessFlags
	PKeyIndex       uint16
	PortNum         uint8
	AHAttr          AHAttr
	DestQPNum       uint32
	RqPSN           uint32
	SqPSN           uint32
	MaxRdAtomic     uint8
	MaxDestRdAtomic uint8
	// MinRNRTimer is the IB encoded RNR NAK timer (0..31; 12 = 0.64 ms, 0 = 655.36 ms).
	MinRNRTimer uint8
	// Timeout is the IB encoded local ACK timeout: 4.096 µs × 2^Timeout (0 = infinite).
	Timeout uint8
	// RetryCnt is the transport retry count (0..7).
	RetryCnt uint8
	// RnrRetry is the RNR retry count (0..7; 7 = retry forever).
	RnrRetry uint8
}

// QPCap is struct ibv_qp_cap.
type QPCap struct {
	MaxSendWR     uint32
	MaxRecvWR     uint32
	MaxSendSGE    uint32
	MaxRecvSGE    uint32
	MaxInlineData uint32
}

// QPInitAttr is struct ibv_qp_init_attr.
type QPInitAttr struct {
	SendCQ CQ
	RecvCQ CQ
	Cap    QPCap
	Type   QPType
	// SqSigAll makes every send WR signaled, whatever its flags.
	SqSigAll bool
}
