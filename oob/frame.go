package oob

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// MsgType is the type byte of a daemon frame.
type MsgType uint8

// Mooncake HandShakeRequestType values.
const (
	TypeConnection MsgType = 0
	TypeMetadata   MsgType = 1
	TypeNotify     MsgType = 2
	TypeProbe      MsgType = 3
	// TypeOldProtocol is a frame of Mooncake's older daemon protocol: no type byte, the
	// u64 length counts the JSON text only. Mooncake's readString takes a first body byte
	// above 3 as the start of such a frame and serves it as a Connection request, replying
	// without a type byte too; so does twosided (first byte 4..127, JSON starts with '{'
	// or whitespace). Bytes 128..255 stay an unknown type. The value 0x7f is this
	// package's marker (Mooncake's is 0xff, an unknown type byte here); it never travels.
	TypeOldProtocol MsgType = 0x7f
	// TypeNotifyCompact is a Notify request or reply in the compact binary form two
	// twosided Nodes use once the server's hello offered it (see compact.go): 0x80 plus
	// TypeNotify. Mooncake never sends a type byte above 0x7f.
	TypeNotifyCompact MsgType = 0x80 | TypeNotify
)

func (t MsgType) String() string {
	switch t {
	case TypeConnection:
		return "connection"
	case TypeMetadata:
		return "metadata"
	case TypeNotify:
		return "notify"
	case TypeProbe:
		return "probe"
	case TypeOldProtocol:
		return "connection (no type byte)"
	case TypeNotifyCompact:
		return "notify (compact)"
	}
	return fmt.Sprintf("type(%d)", uint8(t))
}

func (t MsgType) valid() bool { return t <= TypeProbe || t == TypeNotifyCompact }

// headerLen is the bytes before the body: the length, and the type byte when there is one.
func (t MsgType) headerLen() int {
	if t == TypeOldProtocol {
		return 8
	}
	return HeaderSize
}

// oldProtocolByte reports whether b, the byte after the length, starts an old-protocol
// frame's body (see TypeOldProtocol).
func oldProtocolByte(b byte) bool { return b > byte(TypeProbe) && b < 0x80 }

// HeaderSize is the u64 length plus the type byte.
const HeaderSize = 9

// Frame size limits (Mooncake MC_HANDSHAKE_MAX_LENGTH: default 1 MiB, allowed 1..128 MiB).
const (
	DefaultMaxFrame = 1 << 20
	MinMaxFrame     = 1 << 20
	MaxMaxFrame     = 128 << 20
)

// NotifyFrameLimit is the largest Notify frame a limit of maxFrame (Config.MaxFrame, MC_HANDSHAKE_MAX_LENGTH)
// takes: maxFrame plus a third plus 64 KiB, so that a notify whose name+msg is maxFrame
// bytes fits however twosided encodes it (a binary msg as base64, 4 bytes per 3, JSON
// text with a few escapes, and the ts_* fields). It is what a twosided Node accepts on a
// Notify frame and what it lets through to a twosided peer that announced maxFrame; to a
// Mooncake peer a frame stays within its MaxFrame. Limits below MinMaxFrame (the 64 KiB a
// connection takes before it authenticates) get no allowance.
func NotifyFrameLimit(maxFrame int) int {
	if maxFrame < MinMaxFrame {
		return maxFrame
	}
	return maxFrame + maxFrame/3 + notifyFraming
}

// notifyFraming is the JSON of a Notify frame besides its name and msg: keys, the ts_*
// members (an id and a from of up to 255 bytes each, escaped), with room to spare.
const notifyFraming = 64 << 10

// frameLimit is the length limit of a frame of type t under maxFrame.
func frameLimit(t MsgType, maxFrame int) int {
	if t == TypeNotify || t == TypeNotifyCompact {
		return NotifyFrameLimit(maxFrame)
	}
	return maxFrame
}

// AppendFrame appends one frame (length, type, body) to dst.
func AppendFrame(dst []byte, t MsgType, body []byte) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, uint64(len(body))+1)
	dst = append(dst, byte(t))
	return append(dst, body...)
}

// beginFrame appends a header with a placeholder length; finishFrame patches it once the
// body has been appended after it. Lets encoders write JSON straight into the output.
func beginFrame(dst []byte, t MsgType) ([]byte, int) {
	at := len(dst)
	dst = append(dst, 0, 0, 0, 0, 0, 0, 0, 0)
	if t != TypeOldProtocol {
		dst = append(dst, byte(t))
	}
	return dst, at
}

func finishFrame(dst []byte, at int) []byte {
	binary.LittleEndian.PutUint64(dst[at:], uint64(len(dst)-at-8))
	return dst
}

// FrameError is a framing failure. Type is the request's type byte when one was read
// (HasType), so the error reply can carry it.
type FrameError struct {
	Err     error // ErrFrameTooLarge or ErrBadFrame
	Length  uint64
	Type    MsgType
	HasType bool
	Reason  string
}

func (e *FrameError) Error() string { return e.Err.Error() + ": " + e.Reason }
func (e *FrameError) Unwrap() error { return e.Err }

// ErrNotOOB: the peer answered with bytes that are no daemon frame: another protocol's
// server (HTTP, SSH, ...) listens at the address. The error is a *NotOOBError.
var ErrNotOOB = errors.New("oob: the peer does not speak the OOB protocol")

// NotOOBError is a reply that is text where a frame's u64 length should be: the peer at
// Addr is not a handshake daemon. Said is the start of what it sent. It wraps ErrNotOOB and
// ErrPeerUnreachable; the request was not delivered to any notify engine.
type NotOOBError struct {
	Addr string
	Said []byte
}

func (e *NotOOBError) Error() string {
	said := e.Said
	if i := bytes.IndexAny(said, "\r\n"); i >= 0 {
		said = said[:i]
	}
	if len(said) > maxSaid {
		said = said[:maxSaid]
	}
	return fmt.Sprintf("%v: %s answered %q: it is no handshake daemon (a twosided or Mooncake engine's OOB port)",
		ErrNotOOB, e.Addr, said)
}

func (e *NotOOBError) Unwrap() []error { return []error{ErrNotOOB, ErrPeerUnreachable} }

// maxSaid bounds what a NotOOBError quotes.
const maxSaid = 64

// isText reports whether b starts with 8 bytes of printable ASCII where a frame's u64
// little-endian length should be. A frame's length is at most MaxMaxFrame (128 MiB), so
// its top bytes are zero and it never reads as text; a status line ("HTTP/1.1 400") or a
// banner ("SSH-2.0-") always does.
func isText(b []byte) bool {
	if len(b) < 8 {
		return false
	}
	for _, c := range b[:8] {
		if c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}

// failedHead is the start of the frame Next failed on: the bytes it held, then rest, the
// input it had not consumed.
func (p *Parser) failedHead(rest []byte) []byte {
	if len(p.buf) == 0 {
		return rest
	}
	h := append([]byte(nil), p.buf[:min(len(p.buf), maxSaid)]...)
	return append(h, rest[:min(len(rest), maxSaid)]...)
}

// ParseHeader validates a frame header. hdr must hold at least 8 bytes; the type byte is
// read when len(hdr) >= 9. It returns the body length (without the type byte). For an
// old-protocol frame (TypeOldProtocol) the body is the whole length, starting at hdr[8].
// A length is checked as soon as its 8 bytes are present; ok is false when more bytes
// are needed.
func ParseHeader(hdr []byte, maxFrame int) (t MsgType, bodyLen int, ok bool, err error) {
	if len(hdr) < 8 {
		return 0, 0, false, nil
	}
	n := binary.LittleEndian.Uint64(hdr)
	if n == 0 {
		return 0, 0, false, &FrameError{Err: ErrBadFrame, Reason: "length 0 (must count the type byte)"}
	}
	if len(hdr) < HeaderSize {
		if n > uint64(NotifyFrameLimit(maxFrame)) {
			// Wait for the type byte so the reply can carry it.
			return 0, 0, false, nil
		}
		return 0, 0, false, nil
	}
	t = MsgType(hdr[8])
	old := oldProtocolByte(hdr[8])
	if old {
		t = TypeOldProtocol
	}
	if limit := frameLimit(t, maxFrame); n > uint64(limit) {
		return t, 0, false, &FrameError{Err: ErrFrameTooLarge, Length: n, Type: t, HasType: true,
			Reason: fmt.Sprintf("length %d above maximum %d", n, limit)}
	}
	if old {
		return t, int(n), true, nil
	}
	if !t.valid() {
		return t, 0, false, &FrameError{Err: ErrBadFrame, Length: n, Type: t, HasType: true,
			Reason: fmt.Sprintf("unknown type %d", uint8(t))}
	}
	return t, int(n - 1), true, nil
}

// ParseFrame parses the first frame in b. It returns n == 0 and a nil error when b holds
// only part of a frame; then call again with more bytes. body aliases b. On error the
// connection must be answered with an error reply and closed.
func ParseFrame(b []byte, maxFrame int) (t MsgType, body []byte, n int, err error) {
	t, bl, ok, err := ParseHeader(b, maxFrame)
	if err != nil || !ok {
		return t, nil, 0, err
	}
	hl := t.headerLen()
	if len(b)-hl < bl {
		return t, nil, 0, nil
	}
	return t, b[hl : hl+bl], hl + bl, nil
}

// Parser parses frames from a byte stream delivered in pieces of any size. Bytes of a
// frame that spans pieces are copied into an internal buffer reused across frames; a
// frame wholly inside one piece is returned without copying.
type Parser struct {
	MaxFrame int
	buf      []byte // partial frame bytes (header and body so far)
}

// Buffered is the number of bytes of an incomplete frame held by p.
func (p *Parser) Buffered() int { return len(p.buf) }

// Reset drops any partial frame.
func (p *Parser) Reset() { p.buf = p.buf[:0] }

// Next consumes bytes from in and returns the next complete frame, if any. consumed is how
// many bytes of in were used; call again with in[consumed:] until consumed is 0 and ok is
// false. body is valid until the next call. After an error the Parser must be Reset before
// reuse.
func (p *Parser) Next(in []byte) (t MsgType, body []byte, consumed int, ok bool, err error) {
	if len(p.buf) == 0 && cap(p.buf) > 256<<10 {
		p.buf = nil // do not hold a large frame's buffer on an idle connection
	}
	if len(p.buf) == 0 {
		t, body, n, err := ParseFrame(in, p.MaxFrame)
		if err != nil {
			return t, nil, 0, false, err
		}
		if n > 0 {
			return t, body, n, true, nil
		}
		// Incomplete: hold what we have (bounded: at most HeaderSize+NotifyFrameLimit(MaxFrame) bytes).
		p.buf = append(p.buf, in...)
		return 0, nil, len(in), false, nil
	}
	// Complete the header first.
	if len(p.buf) < HeaderSize {
		k := min(HeaderSize-len(p.buf), len(in))
		p.buf = append(p.buf, in[:k]...)
		consumed = k
		in = in[k:]
	}
	t, bl, hok, err := ParseHeader(p.buf, p.MaxFrame)
	if err != nil {
		return t, nil, consumed, false, err
	}
	if !hok {
		return 0, nil, consumed, false, nil
	}
	need := t.headerLen() + bl - len(p.buf)
	k := min(need, len(in))
	p.buf = append(p.buf, in[:k]...)
	consumed += k
	if k < need {
		return 0, nil, consumed, false, nil
	}
	body = p.buf[t.headerLen():]
	p.buf = p.buf[:0]
	return t, body, consumed, true, nil
}
