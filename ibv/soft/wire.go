package soft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/twosided/twosided/ibv"
)

// Packet opcodes.
const (
	opSend    uint8 = 1
	opSendImm uint8 = 2
	opAck     uint8 = 3
	opNak     uint8 = 4
	opHello   uint8 = 5
)

// NAK syndromes.
const (
	nakRNR    uint8 = 1
	nakSeq    uint8 = 2
	nakInvReq uint8 = 3
	nakRemOp  uint8 = 4
)

const (
	hdrLen       = 24
	helloMagic   = 0x54464f53
	helloVersion = 1
	psnMask      = 1<<24 - 1
	// maxMsgLen is the largest SEND the soft device carries (its max_msg_sz).
	maxMsgLen           = 16 << 20
	flagSolicited uint8 = 1
)

// errBadPacket is returned by decodeHeader for a header that no soft device sends.
var errBadPacket = errors.New("soft: bad packet")

// header is the fixed part of every packet.
type header struct {
	op      uint8
	synd    uint8
	rnrTime uint8
	flags   uint8
	dstQPN  uint32
	srcQPN  uint32
	psn     uint32
	imm     uint32
	length  uint32
}

func (h *header) put(b []byte) {
	_ = b[hdrLen-1]
	b[0], b[1], b[2], b[3] = h.op, h.synd, h.rnrTime, h.flags
	binary.LittleEndian.PutUint32(b[4:], h.dstQPN)
	binary.LittleEndian.PutUint32(b[8:], h.srcQPN)
	binary.LittleEndian.PutUint32(b[12:], h.psn)
	binary.LittleEndian.PutUint32(b[16:], h.imm)
	binary.LittleEndian.PutUint32(b[20:], h.length)
}

// decodeHeader parses b[:hdrLen] into h. It rejects unknown opcodes and syndromes, PSNs
// wider than 24 bits, payloads on ACK/NAK and oversized messages; h is untouched on failure.
func decodeHeader(b []byte, h *header) error {
	if len(b) < hdrLen {
		return fmt.Errorf("%w: header: %d bytes, want %d", errBadPacket, len(b), hdrLen)
	}
	var x header
	x.op, x.synd, x.rnrTime, x.flags = b[0], b[1], b[2], b[3]
	x.dstQPN = binary.LittleEndian.Uint32(b[4:])
	x.srcQPN = binary.LittleEndian.Uint32(b[8:])
	x.psn = binary.LittleEndian.Uint32(b[12:])
	x.imm = binary.LittleEndian.Uint32(b[16:])
	x.length = binary.LittleEndian.Uint32(b[20:])
	switch x.op {
	case opSend, opSendImm:
		if x.synd != 0 || x.rnrTime != 0 || x.flags&^flagSolicited != 0 {
			return fmt.Errorf("%w: send: reserved bits set", errBadPacket)
		}
		if x.length > maxMsgLen {
			return fmt.Errorf("%w: send: length %d above %d", errBadPacket, x.length, maxMsgLen)
		}
	case opAck:
		if x.synd != 0 || x.rnrTime != 0 || x.flags != 0 || x.length != 0 {
			return fmt.Errorf("%w: ack: reserved bits or payload", errBadPacket)
		}
	case opNak:
		if x.synd < nakRNR || x.synd > nakRemOp || x.flags != 0 || x.length != 0 {
			return fmt.Errorf("%w: nak: syndrome %d or payload", errBadPacket, x.synd)
		}
		if x.rnrTime > 31 || (x.synd != nakRNR && x.rnrTime != 0) {
			return fmt.Errorf("%w: nak: rnr timer %d", errBadPacket, x.rnrTime)
		}
	case opHello:
		if x.dstQPN != helloMagic || x.srcQPN != helloVersion || x.length != 16 ||
			x.synd != 0 || x.rnrTime != 0 || x.flags != 0 || x.psn != 0 || x.imm != 0 {
			return fmt.Errorf("%w: hello: bad magic, version or length", errBadPacket)
		}
	default:
		return fmt.Errorf("%w: opcode %d", errBadPacket, x.op)
	}
	if x.psn > psnMask {
		return fmt.Errorf("%w: psn %#x wider than 24 bits", errBadPacket, x.psn)
	}
	*h = x
	return nil
}

// psnDiff is a-b in 24-bit serial arithmetic, in [-2^23, 2^23).
func psnDiff(a, b uint32) int32 {
	return int32((a-b)&psnMask<<8) >> 8
}

// gidFromAddr encodes a TCP address as a soft GID (see the package doc).
func gidFromAddr(ap netip.AddrPort) (ibv.GID, error) {
	a := ap.Addr().Unmap()
	if !a.Is4() {
		return ibv.GID{}, fmt.Errorf("soft: listen address %s: only IPv4 fits in a soft GID", ap)
	}
	if a.IsUnspecified() {
		a = netip.AddrFrom4([4]byte{127, 0, 0, 1})
	}
	var g ibv.GID
	binary.BigEndian.PutUint16(g[0:], ap.Port())
	g[10], g[11] = 0xff, 0xff
	v4 := a.As4()
	copy(g[12:], v4[:])
	return g, nil
}

// addrFromGID decodes a soft GID into the TCP address of its device.
func addrFromGID(g ibv.GID) (netip.AddrPort, error) {
	for _, b := range g[2:10] {
		if b != 0 {
			return netip.AddrPort{}, fmt.Errorf("soft: gid %s: not a soft GID (bytes 2..9 must be zero)", g)
		}
	}
	if g[10] != 0xff || g[11] != 0xff {
		return netip.AddrPort{}, fmt.Errorf("soft: gid %s: not a soft GID (bytes 10..11 must be ffff)", g)
	}
	port := binary.BigEndian.Uint16(g[0:])
	if port == 0 {
		return netip.AddrPort{}, fmt.Errorf("soft: gid %s: port 0", g)
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte(g[12:16])), port), nil
}

// rnrTimerNanos is the IB min_rnr_timer encoding, in nanoseconds.
var rnrTimerNanos = [32]int64{
	655_360_000, 10_000, 20_000, 30_000, 40_000, 60_000, 80_000, 120_000,
	160_000, 240_000, 320_000, 480_000, 640_000, 960_000, 1_280_000, 1_920_000,
	2_560_000, 3_840_000, 5_120_000, 7_680_000, 10_240_000, 15_360_000, 20_480_000, 30_720_000,
	40_960_000, 61_440_000, 81_920_000, 122_880_000, 163_840_000, 245_760_000, 327_680_000, 491_520_000,
}

// minAckTimeout is the floor of the soft device's local ACK timer.
const minAckTimeout = 500_000

// ackTimeoutNanos is 4.096 µs × 2^t (0 = infinite, returned as 0), floored at minAckTimeout.
func ackTimeoutNanos(t uint8) int64 {
	if t == 0 {
		return 0
	}
	ns := int64(4096) << t
	if ns < minAckTimeout {
		ns = minAckTimeout
	}
	return ns
}
