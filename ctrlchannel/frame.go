package ctrlchannel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// CtrlFrame v1 wire constants (Mooncake rdma_twosided ctrl_frame).
const (
	Magic     uint32 = 0x434B434D // "MCKC" in little-endian byte order
	Version   uint8  = 1
	HeaderLen        = 44
)

// FrameType is the header's type byte.
type FrameType uint8

// Frame types 1..10 are Mooncake's CtrlFrame v1 types. Types from 64 up are twosided
// extensions, sent only to a peer that announced Extensions in the handshake.
const (
	TypeCreditGrant    FrameType = 1
	TypeCreditProgress FrameType = 2
	TypeCreditRequest  FrameType = 3
	TypeDataAck        FrameType = 4
	TypeSessionOpen    FrameType = 5
	TypeSessionClose   FrameType = 6
	TypeFence          FrameType = 7
	TypeDrainAck       FrameType = 8
	TypeCtrlAck        FrameType = 9
	TypeNotifyCompat   FrameType = 10

	// TypeNotifyFragment carries one piece of a NOTIFY_COMPAT payload too large for one
	// RECV buffer (twosided extension).
	TypeNotifyFragment FrameType = 64
	// TypeNotifyID is a notify with a caller-chosen id: u8 id_len, id, then the
	// NOTIFY_COMPAT payload (twosided extension).
	TypeNotifyID FrameType = 65
	// TypeNotifyIDFragment carries one piece of a NOTIFY_ID payload, as NOTIFY_FRAGMENT
	// does for NOTIFY_COMPAT (twosided extension).
	TypeNotifyIDFragment FrameType = 66
)

// Valid reports whether t is a type this codec knows.
func (t FrameType) Valid() bool {
	return (t >= TypeCreditGrant && t <= TypeNotifyCompat) || (t >= TypeNotifyFragment && t <= TypeNotifyIDFragment)
}

// Mooncake reports whether t is one of Mooncake's CtrlFrame v1 types (1..10), the only
// ones its decoder accepts.
func (t FrameType) Mooncake() bool { return t >= TypeCreditGrant && t <= TypeNotifyCompat }

// Extension reports whether t is a twosided extension type.
func (t FrameType) Extension() bool { return t >= 64 }

func (t FrameType) String() string {
	switch t {
	case TypeCreditGrant:
		return "CREDIT_GRANT"
	case TypeCreditProgress:
		return "CREDIT_PROGRESS"
	case TypeCreditRequest:
		return "CREDIT_REQUEST"
	case TypeDataAck:
		return "DATA_ACK"
	case TypeSessionOpen:
		return "SESSION_OPEN"
	case TypeSessionClose:
		return "SESSION_CLOSE"
	case TypeFence:
		return "FENCE"
	case TypeDrainAck:
		return "DRAIN_ACK"
	case TypeCtrlAck:
		return "CTRL_ACK"
	case TypeNotifyCompat:
		return "NOTIFY_COMPAT"
	case TypeNotifyFragment:
		return "NOTIFY_FRAGMENT"
	case TypeNotifyID:
		return "NOTIFY_ID"
	case TypeNotifyIDFragment:
		return "NOTIFY_ID_FRAGMENT"
	}
	return fmt.Sprintf("FrameType(%d)", uint8(t))
}

// Flags is the header's flags field.
type Flags uint16

// FlagNeedsAck is the only flag CtrlFrame v1 defines.
const FlagNeedsAck Flags = 1 << 0

const knownFlags = FlagNeedsAck

// ErrFrame is wrapped by every codec error; the message names the field and the reason.
var ErrFrame = errors.New("ctrlchannel: malformed frame")

func frameErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrFrame}, args...)...)
}

// Header is the 44-byte CtrlFrame v1 header (magic and version are implied).
type Header struct {
	Type       FrameType
	Flags      Flags
	Session    uint64
	Epoch      uint64
	Seq        uint64
	AckSeq     uint64
	PayloadLen uint32
}

// EncodeHeader writes h into dst[:HeaderLen]. It allocates nothing.
func EncodeHeader(dst []byte, h *Header) error {
	if len(dst) < HeaderLen {
		return frameErr("buffer: %d bytes, the header needs %d", len(dst), HeaderLen)
	}
	if !h.Type.Valid() {
		return frameErr("type %d: unknown", uint8(h.Type))
	}
	if h.Flags&^knownFlags != 0 {
		return frameErr("flags 0x%04x: undefined bits 0x%04x", uint16(h.Flags), uint16(h.Flags&^knownFlags))
	}
	binary.LittleEndian.PutUint32(dst[0:], Magic)
	dst[4] = Version
	dst[5] = uint8(h.Type)
	binary.LittleEndian.PutUint16(dst[6:], uint16(h.Flags))
	binary.LittleEndian.PutUint64(dst[8:], h.Session)
	binary.LittleEndian.PutUint64(dst[16:], h.Epoch)
	binary.LittleEndian.PutUint64(dst[24:], h.Seq)
	binary.LittleEndian.PutUint64(dst[32:], h.AckSeq)
	binary.LittleEndian.PutUint32(dst[40:], h.PayloadLen)
	return nil
}

// DecodeHeader decodes the frame b (exactly the bytes received) into h and returns the
// payload, a sub-slice of b. It rejects a bad magic, version, type or flags and a
// payload_len that is not exactly the bytes after the header; on error h is untouched.
func DecodeHeader(b []byte, h *Header) ([]byte, error) {
	if len(b) < HeaderLen {
		return nil, frameErr("length %d: shorter than the %d-byte header", len(b), HeaderLen)
	}
	if m := binary.LittleEndian.Uint32(b[0:]); m != Magic {
		return nil, frameErr("magic 0x%08x: want 0x%08x", m, Magic)
	}
	if b[4] != Version {
		return nil, frameErr("version %d: want %d", b[4], Version)
	}
	t := FrameType(b[5])
	if !t.Valid() {
		return nil, frameErr("type %d: unknown", b[5])
	}
	f := Flags(binary.LittleEndian.Uint16(b[6:]))
	if f&^knownFlags != 0 {
		return nil, frameErr("flags 0x%04x: undefined bits 0x%04x", uint16(f), uint16(f&^knownFlags))
	}
	pl := binary.LittleEndian.Uint32(b[40:])
	if rest := len(b) - HeaderLen; uint64(pl) != uint64(rest) {
		return nil, frameErr("payload_len %d: %d bytes follow the header", pl, rest)
	}
	*h = Header{
		Type:       t,
		Flags:      f,
		Session:    binary.LittleEndian.Uint64(b[8:]),
		Epoch:      binary.LittleEndian.Uint64(b[16:]),
		Seq:        binary.LittleEndian.Uint64(b[24:]),
		AckSeq:     binary.LittleEndian.Uint64(b[32:]),
		PayloadLen: pl,
	}
	return b[HeaderLen:], nil
}

// NotifyCompatLen is the size of the NOTIFY_COMPAT payload for name and msg.
func NotifyCompatLen(name string, msg []byte) int { return 8 + len(name) + len(msg) }

// EncodeNotifyCompat writes a whole NOTIFY_COMPAT frame (header h with Type and
// PayloadLen set by the function, then u32 name_len, name, u32 msg_len, msg) into dst and
// returns its length. It allocates nothing.
func EncodeNotifyCompat(dst []byte, h *Header, name string, msg []byte) (int, error) {
	pl := NotifyCompatLen(name, msg)
	if uint64(len(name)) > math.MaxUint32 || uint64(len(msg)) > math.MaxUint32 || uint64(pl) > math.MaxUint32 {
		return 0, frameErr("payload_len %d: above the u32 range", pl)
	}
	n := HeaderLen + pl
	if len(dst) < n {
		return 0, frameErr("buffer: %d bytes, the frame needs %d", len(dst), n)
	}
	h.Type = TypeNotifyCompat
	h.PayloadLen = uint32(pl)
	if err := EncodeHeader(dst, h); err != nil {
		return 0, err
	}
	putNotifyRange(dst[HeaderLen:n], false, "", name, msg, 0)
	return n, nil
}

// putNotifyRange writes bytes [off, off+len(dst)) of the notify payload of id (only when
// withID: u8 id_len, id), name and msg (u32 name_len, name, u32 msg_len, msg) into dst
// without building the payload.
func putNotifyRange(dst []byte, withID bool, id, name string, msg []byte, off int) {
	var l [4]byte
	w, pos := 0, 0 // bytes written; start of the current part in the payload
	if withID {
		l[0] = byte(len(id))
		w += copyAt(dst[w:], l[:1], off+w-pos)
		pos++
		w += copyAt(dst[w:], id, off+w-pos)
		pos += len(id)
	}
	binary.LittleEndian.PutUint32(l[:], uint32(len(name)))
	w += copyAt(dst[w:], l[:], off+w-pos)
	pos += 4
	w += copyAt(dst[w:], name, off+w-pos)
	pos += len(name)
	binary.LittleEndian.PutUint32(l[:], uint32(len(msg)))
	w += copyAt(dst[w:], l[:], off+w-pos)
	pos += 4
	copyAt(dst[w:], msg, off+w-pos)
}

func copyAt[S ~string | ~[]byte](dst []byte, src S, from int) int {
	if from < 0 || from >= len(src) {
		return 0
	}
	return copy(dst, src[from:])
}
