package ctrlchannel

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// SendReq is one notify to send. Seq is assigned by the engine (strictly increasing per
// sending session, 0 = unstamped). Done is called exactly once: nil only after the SEND
// of the notify (every fragment) completed successfully.
type SendReq struct {
	Seq  uint64
	Name string
	Msg  []byte
	// ID is an optional caller-chosen notify id of at most MaxIDLen bytes. It travels
	// (NOTIFY_ID frames) only to a peer that negotiated Extensions; towards any other
	// peer the notify goes out without it.
	ID       string
	Deadline time.Time // zero: none; passing it before the first frame is posted fails the send
	Done     func(err error)

	kind  reqKind
	count uint64 // fence: seqs Seq..Seq+count-1
}

// MaxIDLen is the longest SendReq.ID: its length travels in one byte.
const MaxIDLen = 255

// reqKind says what a queued SendReq posts. Fences and the goodbye travel in the send
// FIFO so they keep their place among the notifies.
type reqKind uint8

const (
	reqNotify reqKind = iota
	reqFence          // FENCE: the sender gave up on seqs Seq..Seq+count-1
	reqBye            // SESSION_CLOSE: the last frame; its completion closes the channel
)

// ActionKind says what an Action asks the driver to do.
type ActionKind uint8

// Action kinds.
const (
	// ActPostRecv: post the RECV buffer Slot.
	ActPostRecv ActionKind = iota + 1
	// ActPostSend: post a SEND of send-ring slot Slot, Len bytes, with WRID and Signaled.
	ActPostSend
	// ActDeliver: hand a notify to the application, in order.
	ActDeliver
	// ActComplete: complete Req with Err.
	ActComplete
	// ActSetTimer: call Tick at At (zero At: cancel the timer).
	ActSetTimer
	// ActClose: the channel is closed with Err; tear the QP down.
	ActClose
	// ActFence: the peer gave up on its seqs Seq..Seq+Count-1 of Session; in order with
	// ActDeliver.
	ActFence
	// ActDrop: a received frame was dropped for Reason (Err says why); the driver logs it.
	ActDrop
	// ActDrain: the goodbye ended (its SESSION_CLOSE completed, or its deadline passed):
	// move the QP to ERR, so the NIC acknowledges no further SEND, reap the CQ (each RECV
	// completion is still handed to RecvWC, and delivered), then call Close with Err.
	// Closing at once lost what the peer sent across the goodbye and saw complete.
	ActDrain
)

func (k ActionKind) String() string {
	switch k {
	case ActPostRecv:
		return "PostRecv"
	case ActPostSend:
		return "PostSend"
	case ActDeliver:
		return "Deliver"
	case ActComplete:
		return "Complete"
	case ActSetTimer:
		return "SetTimer"
	case ActClose:
		return "Close"
	case ActFence:
		return "Fence"
	case ActDrop:
		return "Drop"
	case ActDrain:
		return "Drain"
	}
	return fmt.Sprintf("ActionKind(%d)", uint8(k))
}

// Action is one thing the machine asks its driver to do. Only the fields of its Kind are set.
type Action struct {
	Kind     ActionKind
	Slot     int
	Len      int
	WRID     uint64
	Signaled bool
	Type     FrameType // PostSend: the frame's type

	// Deliver: the notify. Name, Msg and ID alias the RECV buffer (valid until that slot
	// is posted again) unless Owned, when they alias a buffer the receiver may keep.
	// Fence: Session, Seq (the first seq given up) and Count.
	Session, Epoch, Seq uint64
	Name, Msg, ID       []byte
	Owned               bool
	Count               uint64

	Req    *SendReq   // Complete
	Err    error      // Complete, Close, Drop
	At     time.Time  // SetTimer
	Reason DropReason // Drop
}

// DropReason says why a received frame was dropped. Every drop is counted in MachineStats
// under its reason and reported by an ActDrop action; none closes the channel.
type DropReason uint8

// Drop reasons.
const (
	// DropBadMagic: no MCKC magic, and not a legacy raw notify of a Mooncake peer.
	DropBadMagic DropReason = iota + 1
	// DropDecode: a bad version, flags, length or payload.
	DropDecode
	// DropUnknownType: a type this codec does not know.
	DropUnknownType
	// DropStaleEpoch: an epoch other than the channel's (or 0 from a legacy peer).
	DropStaleEpoch
	// DropForeignSession: a session other than the peer's.
	DropForeignSession
	// DropDuplicate: a notify whose seq was already delivered.
	DropDuplicate
	// DropExtension: an extension frame from a peer that did not negotiate Extensions.
	DropExtension
	// DropFragment: a fragment out of order, of another notify, or too large.
	DropFragment
	// DropTooLarge: a whole notify above MaxNotifySize, from a sender that did not check
	// the limit this side announced (a Mooncake peer; a twosided sender refuses it itself).
	// Its seq is given up (ActFence), so the engine's window does not wait for it.
	DropTooLarge
)

func (r DropReason) String() string {
	switch r {
	case DropBadMagic:
		return "bad-magic"
	case DropDecode:
		return "decode"
	case DropUnknownType:
		return "unknown-type"
	case DropStaleEpoch:
		return "stale-epoch"
	case DropForeignSession:
		return "foreign-session"
	case DropDuplicate:
		return "duplicate"
	case DropExtension:
		return "extension-not-negotiated"
	case DropFragment:
		return "fragment"
	case DropTooLarge:
		return "too-large"
	}
	return fmt.Sprintf("DropReason(%d)", uint8(r))
}

// Params configures a Machine. The machine writes frames into SendRing, SendSlots slots
// of BufSize bytes; the driver registers that memory and posts SENDs from it.
type Params struct {
	RecvCount       int // RECV buffers this side posts (the notify_rq_depth it advertises)
	BufSize         int // bytes per RECV buffer and per send-ring slot
	SendSlots       int // send-ring slots, the send queue depth
	SendRing        []byte
	MaxPendingSends int  // queued + in-flight sends before Submit fails with ErrBackpressure
	MaxNotifySize   int  // largest name+msg
	Extensions      bool // this side understands twosided extension frames
	DisableCredits  bool // test-only: send without credit
	SignalEvery     int  // a signaled SEND at least every this many (0: SendSlots/4)
}

// PeerParams is what the handshake decided about one peer.
type PeerParams struct {
	LocalSession uint64 // session stamped on our frames
	PeerSession  uint64 // session expected on the peer's frames (0: any, for Mooncake peers)
	Epoch        uint64 // the connection's epoch, on every frame both ways
	RQDepth      int    // the peer's notify_rq_depth
	BufSize      int    // the peer's RECV buffer size (0: same as ours)
	Extensions   bool   // the peer understands twosided extension frames
	DeliveredSeq uint64 // highest seq from PeerSession the engine already delivered
	// MaxNotifySize is the largest name+msg the peer delivers (0: not said); larger
	// notifies fail Submit with ErrTooLarge naming both limits.
	MaxNotifySize int
	// Legacy: the peer is a Mooncake PR #3440 ctrl channel. Its frames carry epoch 0 and
	// seqs that restart at 1 on every channel (DeliveredSeq is ignored); it gets no
	// extension frames, no credit frames and no FENCE.
	Legacy bool
}

// MachineStats are the machine's counters.
type MachineStats struct {
	FramesSent, FragmentsSent, GrantsSent, NotifiesSent uint64
	FencesSent, FencesReceived                          uint64
	FramesReceived, Delivered, LegacyDelivered          uint64 // LegacyDelivered: raw notifies without a header (Mooncake phase 1), of Delivered
	Ignored, CreditWaits, CreditOverruns                uint64 // Ignored: known frames without effect here (SESSION_OPEN, DATA_ACK, ...)
	Backpressured, Expired, TooLarge, Failed            uint64
	KeepalivesSent, KeepalivesReceived                  uint64
	KeepalivesNoCredit                                  uint64 // Keepalive found the channel idle but no credit it may spend on a keepalive
	ByeAcked                                            uint64 // sends completed by the count in the peer's SESSION_CLOSE, not by their WC
	CreditAvail                                         uint64 // credit to send now (grant mode)
	Pending, Held, InFlight                             int

	// Received frames dropped, by reason (DropReason); the channel stays up.
	DroppedBadMagic, DroppedDecode, DroppedUnknownType, DroppedStaleEpoch uint64
	DroppedForeignSession, DroppedDuplicate, DroppedExtension             uint64
	DroppedFragment, DroppedTooLarge                                      uint64
}

// Dropped is the number of received frames dropped for any reason.
func (s MachineStats) Dropped() uint64 {
	return s.DroppedBadMagic + s.DroppedDecode + s.DroppedUnknownType + s.DroppedStaleEpoch +
		s.DroppedForeignSession + s.DroppedDuplicate + s.DroppedExtension + s.DroppedFragment +
		s.DroppedTooLarge
}

func (s *MachineStats) countDrop(r DropReason) {
	switch r {
	case DropBadMagic:
		s.DroppedBadMagic++
	case DropDecode:
		s.DroppedDecode++
	case DropUnknownType:
		s.DroppedUnknownType++
	case DropStaleEpoch:
		s.DroppedStaleEpoch++
	case DropForeignSession:
		s.DroppedForeignSession++
	case DropDuplicate:
		s.DroppedDuplicate++
	case DropExtension:
		s.DroppedExtension++
	case DropFragment:
		s.DroppedFragment++
	case DropTooLarge:
		s.DroppedTooLarge++
	}
}

// minCreditRQ is the smallest RECV ring credit flow control works with: one RECV kept for
// credit frames, and enough that a grant answering a grant is rarer than one for one.
const minCreditRQ = 3

type creditMode uint8

const (
	creditNone   creditMode = iota // DisableCredits: only the send ring limits
	creditCompat                   // Mooncake peer: at most window SENDs without a completion
	creditGrant                    // twosided peer: cumulative RequestSlots grants
)

type machineState uint8

const (
	stateInit machineState = iota
	stateConnected
	stateClosed
)

type sendSlot struct {
	req  *SendReq
	last bool // the req's final frame: its completion completes req
	bye  bool // SESSION_CLOSE: its completion closes the channel
}

type freeSlot struct {
	slot int
	data bool // it held a notify frame (consumed data credit)
}

type heldFrame struct {
	slot int
	act  Action // ActDeliver, or Kind 0 for a fragment that completed nothing
}

// Machine is the pure channel state machine. Call an event method, then Ready for the
// actions; Ready's slice is valid until the next Ready. Not safe for concurrent use.
type Machine struct {
	p     Params
	state machineState
	peer  PeerParams
	ext   bool
	mode  creditMode

	frameMax  int
	window    uint64 // creditCompat: SENDs without a completion
	reserve   uint64 // creditGrant: peer RECVs kept for credit frames
	threshold uint64 // data RECVs reposted before an explicit grant
	signal    int
	ledger    Ledger

	// Send side.
	ring        []sendSlot
	posted      uint64 // frames posted; a frame's WRID is its number, from 1
	completed   uint64 // frames whose completion arrived
	sinceSignal int
	lastPost    int // index in acts of the last PostSend of this batch, -1: none
	queue       []*SendReq
	qhead, qlen int
	headOff     int // bytes of the head request's payload already posted
	pending     int // requests queued or in flight
	fences      int // fences queued
	timerAt     time.Time
	byeAt       time.Time // Bye: the channel closes by then at the latest
	bye         bool      // Bye was called: no new sends
	byeEnding   bool      // ActDrain was emitted: the driver closes once the CQ is reaped

	// Receive side.
	recvPosted   uint64 // cumulative RECVs posted this epoch
	recvCount    uint64 // frames received
	announced    uint64 // the last total told to the peer
	releasedData uint64 // data RECVs reposted since the last announcement
	free         []freeSlot
	paused       bool
	held         []heldFrame
	deliveredSeq uint64
	reasm        Reassembler
	keepRecv     uint64 // recvCount at the last Keepalive

	stats MachineStats
	bufs  [2][]Action
	cur   int
	acts  []Action
}

// NewMachine validates p and returns a machine whose first Ready posts every RECV buffer.
func NewMachine(p Params) (*Machine, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	if p.SignalEvery <= 0 {
		p.SignalEvery = max(1, p.SendSlots/4)
	}
	m := &Machine{
		p:        p,
		signal:   min(p.SignalEvery, p.SendSlots),
		ring:     make([]sendSlot, p.SendSlots),
		queue:    make([]*SendReq, 2*p.MaxPendingSends+1), // notifies, as many fences, a goodbye
		free:     make([]freeSlot, 0, p.RecvCount),
		lastPost: -1,
		reasm:    Reassembler{Max: p.MaxNotifySize},
	}
	// held (only while paused) and the action buffers grow to what traffic needs, once;
	// a channel that never carries much (or never connects) stays small.
	m.bufs[0] = make([]Action, 0, p.RecvCount+16)
	m.bufs[1] = make([]Action, 0, 16)
	m.acts = m.bufs[0]
	for i := 0; i < p.RecvCount; i++ {
		m.acts = append(m.acts, Action{Kind: ActPostRecv, Slot: i})
	}
	m.recvPosted = uint64(p.RecvCount)
	return m, nil
}

// SetSendRing gives the machine its send ring when Params.SendRing was nil (a driver that
// allocates its rings only once the peer answered). Before Connected.
func (m *Machine) SetSendRing(b []byte) error {
	switch {
	case m.state != stateInit:
		return fmt.Errorf("%w: SetSendRing: channel is not new", ErrConfig)
	case len(b) < m.p.SendSlots*m.p.BufSize:
		return fmt.Errorf("%w: SendRing %d bytes: want %d (SendSlots×BufSize)", ErrConfig, len(b), m.p.SendSlots*m.p.BufSize)
	}
	m.p.SendRing = b
	return nil
}

func (p *Params) check() error {
	bad := func(field string, v any, why string) error {
		return fmt.Errorf("%w: %s %v: %s", ErrConfig, field, v, why)
	}
	switch {
	case p.RecvCount < 1 || p.RecvCount > 65535:
		return bad("RecvCount", p.RecvCount, "want 1..65535")
	case p.BufSize < HeaderLen+FragmentHeaderLen+8:
		return bad("BufSize", p.BufSize, fmt.Sprintf("want at least %d", HeaderLen+FragmentHeaderLen+8))
	case p.SendSlots < 1:
		return bad("SendSlots", p.SendSlots, "want at least 1")
	case p.SendRing != nil && len(p.SendRing) < p.SendSlots*p.BufSize:
		return bad("SendRing", len(p.SendRing), fmt.Sprintf("want %d bytes (SendSlots×BufSize)", p.SendSlots*p.BufSize))
	case p.MaxPendingSends < 1:
		return bad("MaxPendingSends", p.MaxPendingSends, "want at least 1")
	case p.MaxNotifySize < 0 || p.MaxNotifySize > 1<<30:
		return bad("MaxNotifySize", p.MaxNotifySize, "want 0..1 GiB")
	case p.Extensions && p.RecvCount < minCreditRQ:
		return bad("RecvCount", p.RecvCount, fmt.Sprintf("credit flow control needs at least %d", minCreditRQ))
	}
	return nil
}

// Ready returns the actions of the events since the last Ready, in order.
func (m *Machine) Ready() []Action {
	out := m.acts
	m.bufs[m.cur] = out
	m.cur ^= 1
	next := m.bufs[m.cur]
	clear(next) // drop references the driver is done with
	m.acts = next[:0]
	m.lastPost = -1
	return out
}

// Stats returns the counters.
func (m *Machine) Stats() MachineStats {
	s := m.stats
	if m.mode == creditGrant {
		s.CreditAvail = m.ledger.Available(RequestSlots)
	}
	s.Pending = m.pending
	s.Held = len(m.held)
	s.InFlight = int(m.posted - m.completed)
	return s
}

// Closed reports whether the machine is closed.
func (m *Machine) Closed() bool { return m.state == stateClosed }

// Connected is the handshake result: the QP is RTS and frames may flow.
func (m *Machine) Connected(now time.Time, pp PeerParams) error {
	if m.state != stateInit {
		return fmt.Errorf("%w: Connected: channel is not new", ErrConfig)
	}
	if len(m.p.SendRing) < m.p.SendSlots*m.p.BufSize {
		return fmt.Errorf("%w: Connected: SendRing %d bytes: want %d (SendSlots×BufSize; see SetSendRing)", ErrConfig, len(m.p.SendRing), m.p.SendSlots*m.p.BufSize)
	}
	if pp.Epoch == 0 {
		return fmt.Errorf("%w: PeerParams.Epoch: %w", ErrConfig, ErrBadEpoch)
	}
	if pp.RQDepth < 1 || pp.RQDepth > 65535 {
		return fmt.Errorf("%w: PeerParams.RQDepth %d: want 1..65535", ErrConfig, pp.RQDepth)
	}
	if pp.BufSize == 0 {
		pp.BufSize = m.p.BufSize
	}
	if pp.BufSize < HeaderLen+FragmentHeaderLen+8 {
		return fmt.Errorf("%w: PeerParams.BufSize %d: want at least %d", ErrConfig, pp.BufSize, HeaderLen+FragmentHeaderLen+8)
	}
	if pp.Legacy {
		// Mooncake PR #3440: no extensions, and its seqs restart on every channel, so
		// what the engine delivered from it earlier says nothing about this channel.
		pp.Extensions, pp.DeliveredSeq = false, 0
	}
	m.ext = m.p.Extensions && pp.Extensions
	switch {
	case m.p.DisableCredits:
		m.mode = creditNone
	case m.ext:
		if pp.RQDepth < minCreditRQ {
			return fmt.Errorf("%w: PeerParams.RQDepth %d: credit flow control needs at least %d", ErrConfig, pp.RQDepth, minCreditRQ)
		}
		m.mode = creditGrant
	default:
		m.mode = creditCompat
	}
	m.peer = pp
	m.frameMax = min(m.p.BufSize, pp.BufSize)
	m.window = uint64(min(pp.RQDepth, m.p.SendSlots))
	m.reserve = 1
	m.threshold = max(1, uint64(m.p.RecvCount-1)/4)
	if err := m.ledger.Reset(pp.Epoch, Credits{RequestSlots - 1: uint64(pp.RQDepth)}); err != nil {
		return err
	}
	m.announced = m.recvPosted
	m.deliveredSeq = pp.DeliveredSeq
	m.state = stateConnected
	m.trySend()
	return nil
}

// Submit queues r. It completes at once with ErrClosed, ErrTooLarge, ErrBackpressure or
// context.DeadlineExceeded (wrapped) when r cannot be queued.
func (m *Machine) Submit(now time.Time, r *SendReq) {
	m.pending++ // complete() takes it back
	r.kind = reqNotify
	switch size := len(r.Name) + len(r.Msg); {
	case m.state == stateClosed || m.bye:
		m.complete(r, fmt.Errorf("send seq %d: %w", r.Seq, ErrClosed))
		return
	case len(r.ID) > MaxIDLen:
		m.stats.TooLarge++
		m.complete(r, fmt.Errorf("%w: send seq %d: id %d bytes: at most %d", ErrTooLarge, r.Seq, len(r.ID), MaxIDLen))
		return
	case size > m.p.MaxNotifySize:
		m.stats.TooLarge++
		m.complete(r, fmt.Errorf("%w: send seq %d: name+msg %d bytes: above MaxNotifySize %d",
			ErrTooLarge, r.Seq, size, m.p.MaxNotifySize))
		return
	case m.state == stateConnected && size > m.MaxNotify():
		m.stats.TooLarge++
		m.complete(r, fmt.Errorf("%w: send seq %d: %w", ErrTooLarge, r.Seq, m.tooLarge(size)))
		return
	case m.pending > m.p.MaxPendingSends:
		m.stats.Backpressured++
		m.complete(r, fmt.Errorf("%w: send seq %d: %d sends pending", ErrBackpressure, r.Seq, m.p.MaxPendingSends))
		return
	case !r.Deadline.IsZero() && !now.Before(r.Deadline):
		m.stats.Expired++
		m.complete(r, expired(r))
		return
	}
	m.enqueue(r)
	if !r.Deadline.IsZero() && (m.timerAt.IsZero() || r.Deadline.Before(m.timerAt)) {
		m.setTimer(r.Deadline)
	}
	m.trySend()
}

func (m *Machine) enqueue(r *SendReq) {
	m.queue[(m.qhead+m.qlen)%len(m.queue)] = r
	m.qlen++
}

// Fence tells the peer, in order with the notifies queued before it, that this side gave
// up on its seqs first..first+count-1 and will never send them: the peer's window must
// not wait for them. Towards a legacy (Mooncake) peer, whose seqs are per channel, it
// does nothing. A fence adjacent to a queued fence not yet posted extends it. It fails
// with ErrClosed after Close or Bye, with ErrConfig for first 0, count 0 or a range past
// 2^64-1, and with ErrBackpressure when MaxPendingSends fences are already queued.
func (m *Machine) Fence(first, count uint64) error {
	switch {
	case m.state == stateClosed || m.bye:
		return fmt.Errorf("fence seq %d+%d: %w", first, count, ErrClosed)
	case first == 0 || count == 0 || first+count-1 < first:
		return fmt.Errorf("%w: fence first %d count %d: want first ≥ 1, count ≥ 1, no overflow", ErrConfig, first, count)
	case m.state == stateConnected && m.peer.Legacy:
		return nil
	}
	if m.qlen > 0 {
		last := m.queue[(m.qhead+m.qlen-1)%len(m.queue)]
		if last.kind == reqFence && last.Seq+last.count == first && last.count+count > last.count {
			last.count += count
			return nil
		}
	}
	if m.fences >= m.p.MaxPendingSends {
		return fmt.Errorf("%w: fence seq %d+%d: %d fences queued", ErrBackpressure, first, count, m.fences)
	}
	m.fences++
	m.enqueue(&SendReq{Seq: first, kind: reqFence, count: count})
	m.trySend()
	return nil
}

// Bye closes the channel gracefully: no new sends are taken, the notifies and fences
// queued before it still go out, then one SESSION_CLOSE frame (Mooncake's type 6, which
// PR #3440 ignores, so it goes to every peer), and the channel closes with ErrClosed once
// that frame completed, or at deadline, whichever comes first. Its peer delivers
// everything before the SESSION_CLOSE and closes with ErrPeerClosed.
func (m *Machine) Bye(now, deadline time.Time) {
	if m.state == stateClosed || m.bye {
		return
	}
	m.bye = true
	if m.state != stateConnected || !now.Before(deadline) {
		m.Close(errBye)
		return
	}
	m.byeAt = deadline
	if m.timerAt.IsZero() || deadline.Before(m.timerAt) {
		m.setTimer(deadline)
	}
	m.enqueue(&SendReq{kind: reqBye})
	m.trySend()
}

var errBye = fmt.Errorf("%w: session closed by this side", ErrClosed)

// byeEnd: the goodbye is over; the driver drains the QP and then closes with err
// (ActDrain). Frames reaped meanwhile are still delivered.
func (m *Machine) byeEnd(err error) {
	if m.byeEnding {
		return
	}
	m.byeEnding = true
	m.byeAt = time.Time{}
	m.acts = append(m.acts, Action{Kind: ActDrain, Err: err})
}

func expired(r *SendReq) error {
	return fmt.Errorf("send seq %d: not posted before its deadline: %w", r.Seq, context.DeadlineExceeded)
}

// Tick tells the machine the time: queued sends whose deadline passed before their first
// frame was posted fail with context.DeadlineExceeded.
func (m *Machine) Tick(now time.Time) {
	if m.state == stateClosed {
		return
	}
	m.timerAt = time.Time{}
	var next time.Time
	w := 0
	n := m.qlen
	for i := 0; i < n; i++ {
		r := m.queue[(m.qhead+i)%len(m.queue)]
		started := i == 0 && m.headOff > 0
		if !started && !r.Deadline.IsZero() {
			if !now.Before(r.Deadline) {
				m.stats.Expired++
				m.qlen--
				m.complete(r, expired(r))
				continue
			}
			if next.IsZero() || r.Deadline.Before(next) {
				next = r.Deadline
			}
		}
		m.queue[(m.qhead+w)%len(m.queue)] = r
		w++
	}
	for i := w; i < n; i++ {
		m.queue[(m.qhead+i)%len(m.queue)] = nil
	}
	if !m.byeAt.IsZero() {
		if !now.Before(m.byeAt) {
			m.byeEnd(fmt.Errorf("%w: SESSION_CLOSE did not complete before the deadline", errBye))
			return
		}
		if next.IsZero() || m.byeAt.Before(next) {
			next = m.byeAt
		}
	}
	if !next.IsZero() {
		m.setTimer(next)
	}
	m.trySend()
}

// Keepalive probes an idle peer. When no frame arrived since the previous Keepalive and
// no SEND is in flight (so neither is an earlier keepalive), it posts one signaled
// CTRL_ACK frame: a 44-byte header, seq 0, no payload, ack_seq piggybacking the credit
// total as on every frame (0 towards a Mooncake peer, which ignores CTRL_ACK and reposts
// its RECV). Towards a twosided peer it takes one RequestSlots credit when more than the
// reserve is left, or the reserve itself when it returns at least two RECVs, as a grant
// would; otherwise it sends nothing (KeepalivesNoCredit). Towards a Mooncake peer the compat
// window applies, which is empty when nothing is in flight. If the peer is gone, the SEND
// fails after the QP's timeout×retry_cnt and FailWC closes the channel. It reports
// whether a frame was posted.
func (m *Machine) Keepalive() bool {
	if m.state != stateConnected {
		return false
	}
	heard := m.recvCount != m.keepRecv
	m.keepRecv = m.recvCount
	if heard || m.posted != m.completed {
		return false
	}
	if m.mode == creditGrant && !m.keepaliveCredit() {
		m.stats.KeepalivesNoCredit++
		return false
	}
	slot := int(m.posted % uint64(len(m.ring)))
	h := m.header(TypeCtrlAck, 0)
	_ = EncodeHeader(m.slotBuf(slot), &h) // a header fits every slot
	m.ring[slot] = sendSlot{}
	m.stats.KeepalivesSent++
	m.emitSend(slot, HeaderLen, TypeCtrlAck)
	m.acts[m.lastPost].Signaled = true // its completion, or its failure, is the answer
	m.sinceSignal = 0
	return true
}

// keepaliveCredit takes the credit of a keepalive. The RECV kept in reserve for credit
// frames goes only to a keepalive that returns as much as a grant would (at least two
// RECVs): two peers spending their last credit on keepalives that return nothing could
// no longer grant each other anything.
func (m *Machine) keepaliveCredit() bool {
	if m.ledger.ReserveOne(RequestSlots, m.reserve) {
		return true
	}
	return m.recvPosted-m.announced >= 2 && m.ledger.ReserveOne(RequestSlots, 0)
}

func (m *Machine) setTimer(at time.Time) {
	m.timerAt = at
	m.acts = append(m.acts, Action{Kind: ActSetTimer, At: at})
}

// SetPaused holds (true) or releases (false) delivered notifies. While paused, RECVs are
// still reaped but notifies and their buffers are kept, so no credit goes back and the
// sender waits; unpausing delivers them in order and reposts their buffers.
func (m *Machine) SetPaused(now time.Time, paused bool) {
	if m.paused == paused || m.state == stateClosed {
		m.paused = paused
		return
	}
	m.paused = paused
	if paused {
		return
	}
	for i := range m.held {
		h := &m.held[i]
		switch h.act.Kind {
		case ActDeliver, ActFence:
			m.deliver(h.act)
		case ActClose:
			// The peer's SESSION_CLOSE: everything before it is delivered now.
			m.Close(h.act.Err)
			return
		}
		m.release(h.slot, true)
		h.act = Action{}
	}
	m.held = m.held[:0]
	m.Repost()
}

// Close fails every pending send with err (wrapping ErrClosed) and asks the driver to
// tear down. Later events are ignored; later Submits fail with ErrClosed.
func (m *Machine) Close(err error) {
	if m.state == stateClosed {
		return
	}
	m.state = stateClosed
	switch {
	case err == nil:
		err = ErrClosed
	case !errors.Is(err, ErrClosed):
		err = fmt.Errorf("%w: %w", ErrClosed, err)
	}
	for i := m.completed + 1; i <= m.posted; i++ {
		s := &m.ring[(i-1)%uint64(len(m.ring))]
		if s.req != nil && s.last {
			m.complete(s.req, err)
		}
		*s = sendSlot{}
	}
	for m.qlen > 0 {
		r := m.queue[m.qhead]
		m.queue[m.qhead] = nil
		m.qhead = (m.qhead + 1) % len(m.queue)
		m.qlen--
		if r.kind == reqNotify {
			m.complete(r, err)
		}
	}
	if !m.timerAt.IsZero() {
		m.setTimer(time.Time{})
	}
	// Held notifies and fences sit in RECVs the NIC acknowledged: their senders were told
	// they landed, so they are handed over before the close, whatever closes the channel
	// (a WC error, the peer's teardown, our own close), never dropped with the buffers.
	for i := range m.held {
		if k := m.held[i].act.Kind; k == ActDeliver || k == ActFence {
			m.deliver(m.held[i].act)
		}
	}
	clear(m.held)
	m.held = m.held[:0]
	m.free = m.free[:0]
	m.reasm.Reset()
	m.acts = append(m.acts, Action{Kind: ActClose, Err: err})
}

// FailWC is a work completion with an error status: the QP is unusable, the channel closes.
func (m *Machine) FailWC(wcErr error) {
	if m.state == stateClosed {
		return
	}
	m.stats.Failed++
	m.Close(fmt.Errorf("%w: %w", ErrPeerError, wcErr))
}

// SendWC is a successful signaled SEND completion: every frame up to wrid has completed.
func (m *Machine) SendWC(wrid uint64) {
	if m.state == stateClosed || wrid <= m.completed || wrid > m.posted {
		return
	}
	if m.completeThrough(wrid) {
		m.byeEnd(errBye)
		return
	}
	m.trySend()
}

// completeThrough completes the posted sends up to and including n (RC completes in
// order); it reports whether our SESSION_CLOSE was among them.
func (m *Machine) completeThrough(n uint64) bool {
	bye := false
	for i := m.completed + 1; i <= n; i++ {
		s := &m.ring[(i-1)%uint64(len(m.ring))]
		if s.req != nil && s.last {
			m.stats.NotifiesSent++
			m.complete(s.req, nil)
		}
		bye = bye || s.bye
		*s = sendSlot{}
	}
	m.completed = max(m.completed, n)
	return bye
}

// RecvWC is a successful RECV completion of buffer slot holding data (ByteLen bytes).
// No frame closes the channel: a frame that cannot be used is dropped, counted under its
// DropReason and reported by an ActDrop action, and its RECV goes back to the ring.
func (m *Machine) RecvWC(now time.Time, slot int, data []byte) {
	if m.state == stateClosed {
		return
	}
	m.recvCount++
	m.stats.FramesReceived++
	if m.mode == creditGrant && m.recvCount > m.announced {
		m.stats.CreditOverruns++
	}
	if !hasMagic(data) {
		m.rawNotify(slot, data)
		m.trySend()
		return
	}
	var h Header
	p, err := DecodeHeader(data, &h)
	if err != nil {
		reason := DropDecode
		if len(data) >= HeaderLen && data[4] == Version && !FrameType(data[5]).Valid() {
			reason = DropUnknownType
		}
		m.drop(slot, true, reason, fmt.Errorf("recv slot %d: %w", slot, err))
		m.trySend()
		return
	}
	data0 := h.Type == TypeNotifyCompat || h.Type.Extension() || h.Type == TypeFence
	switch {
	case m.state != stateConnected:
		m.drop(slot, data0, DropStaleEpoch, fmt.Errorf("recv %s seq %d: channel not connected yet", h.Type, h.Seq))
	case h.Epoch != m.peer.Epoch && !(m.peer.Legacy && h.Epoch == 0):
		m.drop(slot, data0, DropStaleEpoch, fmt.Errorf("recv %s seq %d: epoch %d, the channel's is %d", h.Type, h.Seq, h.Epoch, m.peer.Epoch))
	case m.peer.PeerSession != 0 && h.Session != m.peer.PeerSession:
		m.drop(slot, data0, DropForeignSession, fmt.Errorf("recv %s seq %d: session %#x, the peer's is %#x", h.Type, h.Seq, h.Session, m.peer.PeerSession))
	case h.Type.Extension() && !m.ext:
		m.drop(slot, true, DropExtension, fmt.Errorf("recv %s seq %d: extensions were not negotiated", h.Type, h.Seq))
	default:
		if m.mode == creditGrant && h.AckSeq != 0 {
			m.grant(h.AckSeq)
		}
		m.frame(slot, &h, p)
	}
	m.trySend()
}

// hasMagic reports whether b starts with the CtrlFrame magic (Mooncake isCtrlFrameMagic).
func hasMagic(b []byte) bool { return len(b) >= 4 && binary.LittleEndian.Uint32(b) == Magic }

// rawNotify handles a RECV without the CtrlFrame magic as Mooncake's dispatchRecvPayload
// does: from a legacy peer it is a phase-1 raw notify (the NOTIFY_COMPAT payload alone,
// no header, so no seq) and is delivered; otherwise, or when it does not decode, it is
// dropped.
func (m *Machine) rawNotify(slot int, data []byte) {
	if m.state != stateConnected || !m.peer.Legacy {
		m.drop(slot, true, DropBadMagic, fmt.Errorf("recv slot %d: %d bytes without the CtrlFrame magic", slot, len(data)))
		return
	}
	var nc NotifyCompat
	if err := DecodeNotifyCompat(data, &nc); err != nil {
		m.drop(slot, true, DropBadMagic, fmt.Errorf("recv slot %d: no CtrlFrame magic and no raw notify: %w", slot, err))
		return
	}
	m.stats.LegacyDelivered++
	h := Header{Session: m.peer.PeerSession}
	m.notify(slot, &h, nc, nil, false)
}

// frame acts on one frame that passed the epoch and session checks.
func (m *Machine) frame(slot int, h *Header, p []byte) {
	switch h.Type {
	case TypeCreditGrant:
		var g CreditGrant
		if err := DecodeCreditGrant(p, &g); err != nil {
			m.drop(slot, false, DropDecode, err)
			return
		}
		for i := 0; i < g.N; i++ {
			// Cumulative totals: a resource named twice mints at most its largest total.
			if g.Entries[i].Resource == RequestSlots && m.mode == creditGrant {
				m.grant(g.Entries[i].Total)
			}
		}
		m.release(slot, false)
	case TypeCtrlAck:
		// A keepalive: nothing to deliver; its RECV goes back like a grant's.
		m.stats.KeepalivesReceived++
		m.release(slot, false)
	case TypeNotifyCompat:
		var nc NotifyCompat
		if err := DecodeNotifyCompat(p, &nc); err != nil {
			m.drop(slot, true, DropDecode, fmt.Errorf("recv %s seq %d: %w", h.Type, h.Seq, err))
			return
		}
		m.notify(slot, h, nc, nil, false)
	case TypeNotifyID:
		var nc NotifyCompat
		id, err := DecodeNotifyID(p, &nc)
		if err != nil {
			m.drop(slot, true, DropDecode, fmt.Errorf("recv %s seq %d: %w", h.Type, h.Seq, err))
			return
		}
		m.notify(slot, h, nc, id, false)
	case TypeNotifyFragment, TypeNotifyIDFragment:
		m.fragment(slot, h, p)
	case TypeFence:
		var f Fence
		if err := DecodeFence(p, &f); err != nil {
			m.drop(slot, true, DropDecode, fmt.Errorf("recv %s: %w", h.Type, err))
			return
		}
		m.stats.FencesReceived++
		m.hold(slot, Action{Kind: ActFence, Session: h.Session, Epoch: h.Epoch, Seq: f.First, Count: f.Count})
	case TypeSessionClose:
		err := fmt.Errorf("%w: SESSION_CLOSE from session %#x", ErrPeerClosed, h.Session)
		if m.ext && h.Seq > m.completed {
			// Its seq counts the frames the peer received from us before it: those sends
			// landed, whether or not their (possibly unsignaled) completions were reaped
			// yet. The rest fail with err below and are the caller's to resend.
			m.stats.ByeAcked += min(h.Seq, m.posted) - m.completed
			m.completeThrough(min(h.Seq, m.posted))
		}
		if m.paused {
			// Held notifies are delivered first, when the receiver takes them.
			m.held = append(m.held, heldFrame{slot: slot, act: Action{Kind: ActClose, Err: err}})
			return
		}
		m.Close(err)
	default:
		// Known types without effect on the notify channel (SESSION_OPEN, DATA_ACK,
		// CREDIT_PROGRESS, CREDIT_REQUEST, DRAIN_ACK), as in Mooncake PR #3440.
		m.stats.Ignored++
		m.release(slot, false)
	}
}

func (m *Machine) fragment(slot int, h *Header, p []byte) {
	var f Fragment
	if err := DecodeFragment(p, &f); err != nil {
		m.reasm.Reset()
		m.drop(slot, true, DropDecode, fmt.Errorf("recv %s seq %d: %w", h.Type, h.Seq, err))
		return
	}
	whole, err := m.reasm.Add(h, &f)
	if err != nil {
		m.drop(slot, true, DropFragment, fmt.Errorf("recv %s seq %d: %w", h.Type, h.Seq, err))
		return
	}
	if whole == nil {
		if m.paused {
			m.held = append(m.held, heldFrame{slot: slot})
		} else {
			m.release(slot, true)
		}
		return
	}
	var nc NotifyCompat
	var id []byte
	if h.Type == TypeNotifyIDFragment {
		id, err = DecodeNotifyID(whole, &nc)
	} else {
		err = DecodeNotifyCompat(whole, &nc)
	}
	if err != nil {
		m.drop(slot, true, DropDecode, fmt.Errorf("recv %s seq %d: reassembled: %w", h.Type, h.Seq, err))
		return
	}
	m.notify(slot, h, nc, id, true)
}

// drop releases slot and reports a dropped frame.
func (m *Machine) drop(slot int, data bool, reason DropReason, err error) {
	m.stats.countDrop(reason)
	m.release(slot, data)
	m.acts = append(m.acts, Action{Kind: ActDrop, Reason: reason, Err: err})
}

// notify delivers a received notify. Seqs are not filtered here: an RC channel delivers
// each frame once and in order, and a sender may legitimately resend a lower seq on a newer
// channel (a send of a replaced channel); the engine's receive window orders and dedups
// across channels and paths. Only seqs at or below DeliveredSeq (what the engine says it
// already delivered before this channel) are dropped.
func (m *Machine) notify(slot int, h *Header, nc NotifyCompat, id []byte, owned bool) {
	if h.Seq != 0 && h.Seq <= m.deliveredSeq {
		m.drop(slot, true, DropDuplicate, fmt.Errorf("recv notify seq %d: seq %d already delivered", h.Seq, m.deliveredSeq))
		return
	}
	if size := len(nc.Name) + len(nc.Msg); size > m.p.MaxNotifySize {
		m.drop(slot, true, DropTooLarge, fmt.Errorf("recv notify seq %d: name+msg %d bytes: above MaxNotifySize %d", h.Seq, size, m.p.MaxNotifySize))
		if h.Seq != 0 && !m.peer.Legacy {
			// Not delivered, ever: the window must not wait for its seq.
			m.deliver(Action{Kind: ActFence, Session: h.Session, Epoch: h.Epoch, Seq: h.Seq, Count: 1})
		}
		return
	}
	m.hold(slot, Action{Kind: ActDeliver, Session: h.Session, Epoch: h.Epoch, Seq: h.Seq, Name: nc.Name, Msg: nc.Msg, ID: id, Owned: owned})
}

// hold delivers a (ActDeliver or ActFence) now, or keeps it with its buffer while paused.
func (m *Machine) hold(slot int, a Action) {
	if m.paused {
		m.held = append(m.held, heldFrame{slot: slot, act: a})
		return
	}
	m.deliver(a)
	m.release(slot, true)
}

func (m *Machine) deliver(a Action) {
	if a.Kind == ActDeliver {
		m.stats.Delivered++
	}
	m.acts = append(m.acts, a)
}

func (m *Machine) grant(total uint64) {
	// The frame passed the epoch check, so the ledger's epoch is the channel's.
	_, _ = m.ledger.Grant(m.peer.Epoch, RequestSlots, total)
}

func (m *Machine) release(slot int, data bool) {
	m.free = append(m.free, freeSlot{slot: slot, data: data})
}

// Repost is step 2 of the completion rule: after the driver reaped the CQ, post again
// the RECV buffers the completions released, then return credit when it is due.
func (m *Machine) Repost() {
	if m.state == stateClosed {
		return
	}
	kept := m.free[:0]
	for _, f := range m.free {
		if f.data && m.paused {
			// A notify delivered in the batch whose deliveries filled the receiver (it
			// paused before this step): its credit stays here until SetPaused(false), as a
			// held frame's does. Posted now, it would let the sender land one more ring
			// on top of what the full receiver already holds.
			kept = append(kept, f)
			continue
		}
		m.acts = append(m.acts, Action{Kind: ActPostRecv, Slot: f.slot})
		m.recvPosted++
		if f.data {
			m.releasedData++
		}
	}
	m.free = kept
	m.trySend()
}

// MaxNotify is the largest name+msg this channel carries once connected: this side's
// MaxNotifySize, the peer's (when it said), and, towards a peer that cannot reassemble
// fragments, what one frame in the peer's RECV buffer holds.
func (m *Machine) MaxNotify() int {
	n := m.p.MaxNotifySize
	if m.peer.MaxNotifySize > 0 {
		n = min(n, m.peer.MaxNotifySize)
	}
	if !m.ext {
		n = min(n, m.frameMax-HeaderLen-notifyCompatOverhead)
	}
	return n
}

// notifyCompatOverhead is NOTIFY_COMPAT's payload beyond name and msg: two u32 lengths.
const notifyCompatOverhead = 8

// tooLarge says which limit a notify of size bytes is above.
func (m *Machine) tooLarge(size int) error {
	switch {
	case size > m.p.MaxNotifySize:
		return fmt.Errorf("name+msg %d bytes: above this side's MaxNotifySize %d", size, m.p.MaxNotifySize)
	case m.peer.MaxNotifySize > 0 && size > m.peer.MaxNotifySize:
		return fmt.Errorf("name+msg %d bytes: above the peer's max_notify_size %d (this side's is %d)", size, m.peer.MaxNotifySize, m.p.MaxNotifySize)
	}
	return fmt.Errorf("name+msg %d bytes: a %d-byte frame above the peer's %d-byte RECV buffer, and the peer cannot reassemble fragments (not negotiated on this channel)",
		size, HeaderLen+notifyCompatOverhead+size, m.frameMax)
}

// trySend posts what credit and the send ring allow: queued notifies first (each carries
// the credit total in ack_seq), then an explicit grant when one is still due.
func (m *Machine) trySend() {
	if m.state != stateConnected || m.byeEnding {
		return
	}
	ring := uint64(len(m.ring))
	for m.qlen > 0 && m.posted-m.completed < ring {
		r := m.queue[m.qhead]
		if r.kind == reqBye {
			if !m.byeCredit() {
				break
			}
			m.popHead()
			m.postBye()
			continue
		}
		if r.kind == reqFence && m.peer.Legacy {
			// Queued before the handshake said the peer is legacy: its seqs are per channel.
			m.popHead()
			m.fences--
			continue
		}
		size := m.payloadLen(r)
		if r.kind == reqNotify && m.headOff == 0 && HeaderLen+size > m.frameMax && !m.ext {
			m.popHead()
			m.stats.TooLarge++
			m.complete(r, fmt.Errorf("%w: send seq %d: %d-byte frame above the peer's %d-byte buffer, and the peer cannot reassemble fragments",
				ErrTooLarge, r.Seq, HeaderLen+size, m.frameMax))
			continue
		}
		if !m.dataCredit() {
			m.stats.CreditWaits++
			break
		}
		if r.kind == reqFence {
			m.popHead()
			m.fences--
			m.postFence(r)
			continue
		}
		m.postNotify(r, size)
	}
	if m.wantGrant() && m.posted-m.completed < ring && m.ledger.ReserveOne(RequestSlots, 0) {
		m.postGrant()
	}
	if m.lastPost >= 0 && !m.acts[m.lastPost].Signaled {
		// The newest frame is always signaled, so every frame is covered by a completion.
		m.acts[m.lastPost].Signaled = true
		m.sinceSignal = 0
	}
}

func (m *Machine) dataCredit() bool {
	switch m.mode {
	case creditCompat:
		return m.posted-m.completed < m.window
	case creditGrant:
		return m.ledger.ReserveOne(RequestSlots, m.reserve)
	}
	return true
}

// byeCredit: SESSION_CLOSE is the last frame, so it may take the RECV kept for credit
// frames.
func (m *Machine) byeCredit() bool {
	switch m.mode {
	case creditCompat:
		return m.posted-m.completed < m.window
	case creditGrant:
		return m.ledger.ReserveOne(RequestSlots, 0)
	}
	return true
}

// withID reports whether r's ID goes on the wire (NOTIFY_ID and its fragments).
func (m *Machine) withID(r *SendReq) bool { return r.ID != "" && m.ext }

// payloadLen is the size of the notify payload r puts on the wire.
func (m *Machine) payloadLen(r *SendReq) int {
	if m.withID(r) {
		return NotifyIDLen(r.ID, r.Name, r.Msg)
	}
	return NotifyCompatLen(r.Name, r.Msg)
}

func (m *Machine) wantGrant() bool {
	if m.mode != creditGrant || m.recvPosted <= m.announced {
		return false
	}
	if m.releasedData >= m.threshold {
		return true
	}
	var peerAvail uint64
	if m.announced > m.recvCount {
		peerAvail = m.announced - m.recvCount
	}
	// The peer's credit is down to the reserve (as far as we know; frames in flight only
	// make it lower): return what is reposted, but only when that is worth the RECV the
	// grant itself costs the peer: some data RECVs, or at least two RECVs of credit
	// frames. A grant that would hand back just the one RECV of the peer's last grant is
	// never sent, so grants cannot answer each other one for one; each needs two.
	return peerAvail <= m.reserve && (m.releasedData > 0 || m.recvPosted-m.announced >= 2)
}

func (m *Machine) popHead() {
	m.queue[m.qhead] = nil
	m.qhead = (m.qhead + 1) % len(m.queue)
	m.qlen--
	m.headOff = 0
}

// header fills a header for a frame posted now, piggybacking the credit total.
func (m *Machine) header(t FrameType, seq uint64) Header {
	h := Header{Type: t, Session: m.peer.LocalSession, Epoch: m.peer.Epoch, Seq: seq}
	if m.mode == creditGrant {
		h.AckSeq = m.recvPosted
		m.announced = m.recvPosted
		m.releasedData = 0
	}
	return h
}

func (m *Machine) slotBuf(slot int) []byte {
	off := slot * m.p.BufSize
	return m.p.SendRing[off : off+m.frameMax]
}

func (m *Machine) postNotify(r *SendReq, size int) {
	slot := int(m.posted % uint64(len(m.ring)))
	buf := m.slotBuf(slot)
	var n int
	var t FrameType
	last := true
	id := ""
	whole, frag := TypeNotifyCompat, TypeNotifyFragment
	if m.withID(r) {
		id, whole, frag = r.ID, TypeNotifyID, TypeNotifyIDFragment
	}
	if m.headOff == 0 && HeaderLen+size <= m.frameMax {
		h := m.header(whole, r.Seq)
		h.PayloadLen = uint32(size)
		_ = EncodeHeader(buf, &h) // fits: checked above
		putNotifyRange(buf[HeaderLen:HeaderLen+size], whole == TypeNotifyID, id, r.Name, r.Msg, 0)
		n, t = HeaderLen+size, whole
	} else {
		chunk := min(m.frameMax-HeaderLen-FragmentHeaderLen, size-m.headOff)
		h := m.header(frag, r.Seq)
		h.PayloadLen = uint32(FragmentHeaderLen + chunk)
		_ = EncodeHeader(buf, &h)
		n = HeaderLen + encodeFragmentOf(buf[HeaderLen:], frag == TypeNotifyIDFragment, id, r.Name, r.Msg, m.headOff, chunk)
		m.headOff += chunk
		last = m.headOff == size
		t = frag
		m.stats.FragmentsSent++
	}
	if last {
		m.popHead()
	}
	m.ring[slot] = sendSlot{req: r, last: last}
	m.emitSend(slot, n, t)
}

func (m *Machine) postFence(r *SendReq) {
	slot := int(m.posted % uint64(len(m.ring)))
	buf := m.slotBuf(slot)
	h := m.header(TypeFence, 0)
	h.PayloadLen = FenceLen
	_ = EncodeHeader(buf, &h)
	_, _ = EncodeFence(buf[HeaderLen:], &Fence{First: r.Seq, Count: r.count}) // checked by Fence
	m.ring[slot] = sendSlot{}
	m.stats.FencesSent++
	m.emitSend(slot, HeaderLen+FenceLen, TypeFence)
}

func (m *Machine) postBye() {
	slot := int(m.posted % uint64(len(m.ring)))
	var seq uint64
	if m.ext {
		seq = m.recvCount // the frames received from the peer before this one (see RecvWC)
	}
	h := m.header(TypeSessionClose, seq)
	_ = EncodeHeader(m.slotBuf(slot), &h)
	m.ring[slot] = sendSlot{bye: true}
	m.emitSend(slot, HeaderLen, TypeSessionClose)
}

func (m *Machine) postGrant() {
	slot := int(m.posted % uint64(len(m.ring)))
	buf := m.slotBuf(slot)
	h := m.header(TypeCreditGrant, 0)
	g := CreditGrant{N: 1, Entries: [MaxGrantEntries]GrantEntry{{Resource: RequestSlots, Total: h.AckSeq}}}
	h.PayloadLen = uint32(g.Len())
	_ = EncodeHeader(buf, &h)
	pl, _ := EncodeCreditGrant(buf[HeaderLen:], &g)
	m.ring[slot] = sendSlot{}
	m.stats.GrantsSent++
	m.emitSend(slot, HeaderLen+pl, TypeCreditGrant)
}

func (m *Machine) emitSend(slot, n int, t FrameType) {
	m.posted++
	sig := m.sinceSignal+1 >= m.signal || m.posted-m.completed == uint64(len(m.ring))
	if sig {
		m.sinceSignal = 0
	} else {
		m.sinceSignal++
	}
	m.stats.FramesSent++
	m.acts = append(m.acts, Action{Kind: ActPostSend, Slot: slot, Len: n, WRID: m.posted, Signaled: sig, Type: t})
	m.lastPost = len(m.acts) - 1
}

func (m *Machine) complete(r *SendReq, err error) {
	m.pending--
	m.acts = append(m.acts, Action{Kind: ActComplete, Req: r, Err: err})
}
