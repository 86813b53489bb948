package ctrlchannel

import (
	"encoding/binary"
	"fmt"
	"math"
)

// NotifyCompat is a decoded NOTIFY_COMPAT payload. Name and Msg alias the decoded bytes.
type NotifyCompat struct {
	Name []byte
	Msg  []byte
}

// DecodeNotifyCompat decodes p (u32 name_len, name, u32 msg_len, msg) into n. Trailing
// bytes are an error. On error n is untouched.
func DecodeNotifyCompat(p []byte, n *NotifyCompat) error {
	if len(p) < 4 {
		return frameErr("notify name_len: %d bytes left, need 4", len(p))
	}
	nl := uint64(binary.LittleEndian.Uint32(p))
	rest := p[4:]
	if nl > uint64(len(rest)) {
		return frameErr("notify name_len %d: only %d bytes follow", nl, len(rest))
	}
	name := rest[:nl:nl]
	rest = rest[nl:]
	if len(rest) < 4 {
		return frameErr("notify msg_len: %d bytes left, need 4", len(rest))
	}
	ml := uint64(binary.LittleEndian.Uint32(rest))
	rest = rest[4:]
	if ml > uint64(len(rest)) {
		return frameErr("notify msg_len %d: only %d bytes follow", ml, len(rest))
	}
	if ml < uint64(len(rest)) {
		return frameErr("notify payload: %d trailing bytes after msg", uint64(len(rest))-ml)
	}
	n.Name = name
	n.Msg = rest[:ml:ml]
	return nil
}

// Resource is a credit resource of CREDIT_GRANT.
type Resource uint16

// Credit resources (Mooncake CreditResource). The notify channel uses RequestSlots: one
// slot is one posted RECV buffer.
const (
	DataBytes    Resource = 1
	RequestSlots Resource = 2
	BounceBytes  Resource = 3
	BounceSlots  Resource = 4
)

// Valid reports whether r is one of the four resources.
func (r Resource) Valid() bool { return r >= DataBytes && r <= BounceSlots }

func (r Resource) String() string {
	switch r {
	case DataBytes:
		return "DataBytes"
	case RequestSlots:
		return "RequestSlots"
	case BounceBytes:
		return "BounceBytes"
	case BounceSlots:
		return "BounceSlots"
	}
	return fmt.Sprintf("Resource(%d)", uint16(r))
}

// MaxGrantEntries is the most entries one CREDIT_GRANT carries.
const MaxGrantEntries = 4

// GrantEntry is one {resource, cumulative total} pair.
type GrantEntry struct {
	Resource Resource
	Total    uint64
}

// CreditGrant is a CREDIT_GRANT payload: u16 count (≤ 4), then count × {u16 resource,
// u64 cumulative total}.
type CreditGrant struct {
	N       int
	Entries [MaxGrantEntries]GrantEntry
}

// Len is the encoded payload size.
func (g *CreditGrant) Len() int { return 2 + 10*g.N }

func (g *CreditGrant) check() error {
	if g.N < 0 || g.N > MaxGrantEntries {
		return frameErr("credit grant count %d: want 0..%d", g.N, MaxGrantEntries)
	}
	for i := 0; i < g.N; i++ {
		r := g.Entries[i].Resource
		if !r.Valid() {
			return frameErr("credit grant entries[%d].resource %d: want 1..4", i, uint16(r))
		}
	}
	return nil
}

// EncodeCreditGrant writes the payload of g into dst and returns its length.
func EncodeCreditGrant(dst []byte, g *CreditGrant) (int, error) {
	if err := g.check(); err != nil {
		return 0, err
	}
	n := g.Len()
	if len(dst) < n {
		return 0, frameErr("buffer: %d bytes, the credit grant needs %d", len(dst), n)
	}
	binary.LittleEndian.PutUint16(dst, uint16(g.N))
	for i := 0; i < g.N; i++ {
		e := dst[2+10*i:]
		binary.LittleEndian.PutUint16(e, uint16(g.Entries[i].Resource))
		binary.LittleEndian.PutUint64(e[2:], g.Entries[i].Total)
	}
	return n, nil
}

// DecodeCreditGrant decodes p into g. A count above 4, a resource outside 1..4, a short
// payload or trailing bytes are errors; on error g is untouched. A resource named twice is
// accepted, as by Mooncake's decodeCreditGrantPayload: totals are cumulative, so the
// receiver applies the largest.
func DecodeCreditGrant(p []byte, g *CreditGrant) error {
	if len(p) < 2 {
		return frameErr("credit grant count: %d bytes, need 2", len(p))
	}
	var out CreditGrant
	out.N = int(binary.LittleEndian.Uint16(p))
	if out.N > MaxGrantEntries {
		return frameErr("credit grant count %d: want 0..%d", out.N, MaxGrantEntries)
	}
	if want := out.Len(); len(p) != want {
		return frameErr("credit grant length %d: count %d needs exactly %d", len(p), out.N, want)
	}
	for i := 0; i < out.N; i++ {
		e := p[2+10*i:]
		out.Entries[i] = GrantEntry{Resource(binary.LittleEndian.Uint16(e)), binary.LittleEndian.Uint64(e[2:])}
	}
	if err := out.check(); err != nil {
		return err
	}
	*g = out
	return nil
}

// FragmentHeaderLen is the NOTIFY_FRAGMENT payload header: u32 total, u32 offset.
const FragmentHeaderLen = 8

// Fragment is a NOTIFY_FRAGMENT payload: bytes [Offset, Offset+len(Chunk)) of a
// NOTIFY_COMPAT payload of Total bytes. Chunk aliases the decoded bytes.
type Fragment struct {
	Total  uint32
	Offset uint32
	Chunk  []byte
}

// DecodeFragment decodes p into f. An empty chunk, a total below the 8 bytes of an empty
// NOTIFY_COMPAT payload, or a chunk reaching past total are errors; on error f is
// untouched.
func DecodeFragment(p []byte, f *Fragment) error {
	if len(p) < FragmentHeaderLen {
		return frameErr("fragment header: %d bytes, need %d", len(p), FragmentHeaderLen)
	}
	total := binary.LittleEndian.Uint32(p)
	off := binary.LittleEndian.Uint32(p[4:])
	chunk := p[FragmentHeaderLen:]
	if total < 8 {
		return frameErr("fragment total %d: below 8, the smallest notify payload", total)
	}
	if len(chunk) == 0 {
		return frameErr("fragment chunk: empty")
	}
	if uint64(off)+uint64(len(chunk)) > uint64(total) {
		return frameErr("fragment offset %d + %d bytes: past total %d", off, len(chunk), total)
	}
	*f = Fragment{Total: total, Offset: off, Chunk: chunk}
	return nil
}

// encodeFragmentOf writes a NOTIFY_FRAGMENT (NOTIFY_ID_FRAGMENT when withID) payload
// carrying bytes [off, off+n) of the notify payload of id, name and msg into dst, and
// returns its length.
func encodeFragmentOf(dst []byte, withID bool, id, name string, msg []byte, off, n int) int {
	total := NotifyCompatLen(name, msg)
	if withID {
		total = NotifyIDLen(id, name, msg)
	}
	binary.LittleEndian.PutUint32(dst, uint32(total))
	binary.LittleEndian.PutUint32(dst[4:], uint32(off))
	putNotifyRange(dst[FragmentHeaderLen:FragmentHeaderLen+n], withID, id, name, msg, off)
	return FragmentHeaderLen + n
}

// Reassembler rebuilds NOTIFY_COMPAT (NOTIFY_ID) payloads from NOTIFY_FRAGMENT
// (NOTIFY_ID_FRAGMENT) frames. Fragments of one notify share (type, session, epoch, seq)
// and arrive in order (an RC QP keeps order), so a fragment must start exactly where the
// previous one ended.
type Reassembler struct {
	// Max is the largest name+msg accepted (so the largest payload is Max+8, plus the id
	// of a NOTIFY_ID).
	Max int

	active  bool
	typ     FrameType
	session uint64
	epoch   uint64
	seq     uint64
	buf     []byte
	got     int
}

// Active reports whether a notify is partly reassembled.
func (r *Reassembler) Active() bool { return r.active }

// Reset drops a partly reassembled notify (a new epoch, a closed channel).
func (r *Reassembler) Reset() { *r = Reassembler{Max: r.Max} }

// Add feeds one fragment. When it completes a notify, Add returns the whole NOTIFY_COMPAT
// payload in a buffer the caller now owns. An out-of-order fragment, a fragment of another
// notify while one is incomplete, or a total above Max+8 is an error (the Reassembler is
// then reset).
func (r *Reassembler) Add(h *Header, f *Fragment) ([]byte, error) {
	if !r.active {
		if f.Offset != 0 {
			return nil, r.fail(frameErr("fragment offset %d: a notify starts at 0", f.Offset))
		}
		limit := uint64(r.Max) + 8
		if h.Type == TypeNotifyIDFragment {
			limit += 1 + MaxIDLen
		}
		if uint64(f.Total) > limit {
			return nil, r.fail(fmt.Errorf("%w: fragment total %d: above the %d-byte notify maximum",
				ErrTooLarge, f.Total, r.Max))
		}
		r.active, r.typ, r.session, r.epoch, r.seq = true, h.Type, h.Session, h.Epoch, h.Seq
		r.buf = make([]byte, f.Total)
		r.got = 0
	} else {
		if h.Type != r.typ || h.Session != r.session || h.Epoch != r.epoch || h.Seq != r.seq {
			return nil, r.fail(frameErr("fragment seq %d: notify seq %d is incomplete (%d of %d bytes)",
				h.Seq, r.seq, r.got, len(r.buf)))
		}
		if int(f.Total) != len(r.buf) {
			return nil, r.fail(frameErr("fragment total %d: notify seq %d started with %d", f.Total, r.seq, len(r.buf)))
		}
		if int(f.Offset) != r.got {
			return nil, r.fail(frameErr("fragment offset %d: want %d", f.Offset, r.got))
		}
	}
	r.got += copy(r.buf[r.got:], f.Chunk)
	if r.got < len(r.buf) {
		return nil, nil
	}
	out := r.buf
	*r = Reassembler{Max: r.Max}
	return out, nil
}

func (r *Reassembler) fail(err error) error {
	r.Reset()
	return err
}

// NotifyIDLen is the size of the NOTIFY_ID payload for id, name and msg.
func NotifyIDLen(id, name string, msg []byte) int { return 1 + len(id) + NotifyCompatLen(name, msg) }

// EncodeNotifyID writes a NOTIFY_ID payload (u8 id_len, id, u32 name_len, name, u32
// msg_len, msg) into dst and returns its length.
func EncodeNotifyID(dst []byte, id, name string, msg []byte) (int, error) {
	if len(id) > MaxIDLen {
		return 0, frameErr("notify id: %d bytes, at most %d", len(id), MaxIDLen)
	}
	n := NotifyIDLen(id, name, msg)
	if len(dst) < n || uint64(n) > math.MaxUint32 {
		return 0, frameErr("buffer: %d bytes, the notify id payload needs %d", len(dst), n)
	}
	putNotifyRange(dst[:n], true, id, name, msg, 0)
	return n, nil
}

// DecodeNotifyID decodes a NOTIFY_ID payload into n and returns the id; id, name and msg
// alias p. On error n is untouched.
func DecodeNotifyID(p []byte, n *NotifyCompat) ([]byte, error) {
	if len(p) < 1 {
		return nil, frameErr("notify id_len: empty payload")
	}
	il := int(p[0])
	if il > len(p)-1 {
		return nil, frameErr("notify id_len %d: only %d bytes follow", il, len(p)-1)
	}
	if err := DecodeNotifyCompat(p[1+il:], n); err != nil {
		return nil, err
	}
	return p[1 : 1+il : 1+il], nil
}

// FenceLen is the size of a FENCE payload.
const FenceLen = 16

// Fence is a FENCE payload (twosided's layout; Mooncake defines the type but no payload
// and ignores the frame): u64 first, u64 count. The sender gave up on its seqs
// first..first+count-1 of this pair and will never send them.
type Fence struct {
	First, Count uint64
}

func (f *Fence) check() error {
	switch {
	case f.First == 0:
		return frameErr("fence first 0: seq 0 is unstamped")
	case f.Count == 0:
		return frameErr("fence count 0: names no seq")
	case f.First+f.Count-1 < f.First:
		return frameErr("fence first %d count %d: past 2^64-1", f.First, f.Count)
	}
	return nil
}

// EncodeFence writes the payload of f into dst and returns its length.
func EncodeFence(dst []byte, f *Fence) (int, error) {
	if err := f.check(); err != nil {
		return 0, err
	}
	if len(dst) < FenceLen {
		return 0, frameErr("buffer: %d bytes, the fence needs %d", len(dst), FenceLen)
	}
	binary.LittleEndian.PutUint64(dst, f.First)
	binary.LittleEndian.PutUint64(dst[8:], f.Count)
	return FenceLen, nil
}

// DecodeFence decodes p (exactly 16 bytes) into f; on error f is untouched.
func DecodeFence(p []byte, f *Fence) error {
	if len(p) != FenceLen {
		return frameErr("fence length %d: want %d", len(p), FenceLen)
	}
	out := Fence{First: binary.LittleEndian.Uint64(p), Count: binary.LittleEndian.Uint64(p[8:])}
	if err := out.check(); err != nil {
		return err
	}
	*f = out
	return nil
}

// SessionOpenLen is the size of a SESSION_OPEN payload.
const SessionOpenLen = 8

// SessionOpen is Mooncake's SESSION_OPEN payload: u32 bounce_slots, u32 bounce_slot_size.
type SessionOpen struct {
	BounceSlots, BounceSlotSize uint32
}

// EncodeSessionOpen writes the payload of s into dst and returns its length.
func EncodeSessionOpen(dst []byte, s *SessionOpen) (int, error) {
	if len(dst) < SessionOpenLen {
		return 0, frameErr("buffer: %d bytes, the session open needs %d", len(dst), SessionOpenLen)
	}
	binary.LittleEndian.PutUint32(dst, s.BounceSlots)
	binary.LittleEndian.PutUint32(dst[4:], s.BounceSlotSize)
	return SessionOpenLen, nil
}

// DecodeSessionOpen decodes p (exactly 8 bytes, as Mooncake's decodeSessionOpenPayload
// wants) into s; on error s is untouched.
func DecodeSessionOpen(p []byte, s *SessionOpen) error {
	if len(p) != SessionOpenLen {
		return frameErr("session open length %d: want %d", len(p), SessionOpenLen)
	}
	*s = SessionOpen{BounceSlots: binary.LittleEndian.Uint32(p), BounceSlotSize: binary.LittleEndian.Uint32(p[4:])}
	return nil
}

// DataAckEntry is one entry of Mooncake's DATA_ACK payload.
type DataAckEntry struct {
	TaskID, AckedBytes uint64
}

// MaxDataAckEntries is the most entries one DATA_ACK carries (its count is a u16).
const MaxDataAckEntries = math.MaxUint16

const dataAckEntryLen = 16

// DataAckLen is the size of a DATA_ACK payload of n entries.
func DataAckLen(n int) int { return 2 + dataAckEntryLen*n }

// EncodeDataAck writes a DATA_ACK payload (u16 count, count × {u64 task_id, u64
// acked_bytes}) into dst and returns its length.
func EncodeDataAck(dst []byte, acks []DataAckEntry) (int, error) {
	if len(acks) > MaxDataAckEntries {
		return 0, frameErr("data ack count %d: at most %d", len(acks), MaxDataAckEntries)
	}
	n := DataAckLen(len(acks))
	if len(dst) < n {
		return 0, frameErr("buffer: %d bytes, the data ack needs %d", len(dst), n)
	}
	binary.LittleEndian.PutUint16(dst, uint16(len(acks)))
	for i, a := range acks {
		e := dst[2+dataAckEntryLen*i:]
		binary.LittleEndian.PutUint64(e, a.TaskID)
		binary.LittleEndian.PutUint64(e[8:], a.AckedBytes)
	}
	return n, nil
}

// DecodeDataAck decodes a DATA_ACK payload, appending its entries to dst. A short payload
// or bytes beyond count entries are errors (Mooncake's decodeDataAckPayload); on error
// dst is returned unchanged.
func DecodeDataAck(p []byte, dst []DataAckEntry) ([]DataAckEntry, error) {
	if len(p) < 2 {
		return dst, frameErr("data ack count: %d bytes, need 2", len(p))
	}
	n := int(binary.LittleEndian.Uint16(p))
	if want := DataAckLen(n); len(p) != want {
		return dst, frameErr("data ack length %d: count %d needs exactly %d", len(p), n, want)
	}
	for i := 0; i < n; i++ {
		e := p[2+dataAckEntryLen*i:]
		dst = append(dst, DataAckEntry{TaskID: binary.LittleEndian.Uint64(e), AckedBytes: binary.LittleEndian.Uint64(e[8:])})
	}
	return dst, nil
}
