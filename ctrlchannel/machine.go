package ctrlchannel

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// SendReq is one notify to send. Seq is assigned by the engine (strictly increasing per
// sending session, 0 = unstamped). Done is called exactly once: nil only after the SEND
// of the notify (every fragment) completed successfully.
type SendReq struct {
	Seq      uint64
	Name     string
	Msg      []byte
	Deadline time.Time // zero: none; passing it before the first frame is posted fails the send
	Done     func(err error)
}

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

	// Deliver: the notify. Name and Msg alias the RECV buffer (valid until that slot is
	// posted again) unless Owned, when they alias a buffer the receiver may keep.
	Session, Epoch, Seq uint64
	Name, Msg           []byte
	Owned               bool

	Req *SendReq  // Complete
	Err error     // Complete, Close
	At  time.Time // SetTimer
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
}

// MachineStats are the machine's counters.
type MachineStats struct {
	FramesSent, FragmentsSent, GrantsSent, NotifiesSent  uint64
	FramesReceived, Delivered, DupsDropped, StaleDropped uint64
	ForeignDropped, Ignored, CreditWaits, CreditOverruns uint64
	Backpressured, Expired, TooLarge, Failed             uint64
	KeepalivesSent, KeepalivesReceived                   uint64
	KeepalivesNoCredit                                   uint64 // Keepalive found the channel idle but no credit it may spend on a keepalive
	CreditAvail                                          uint64 // credit to send now (grant mode)
	Pending, Held, InFlight                              int
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
	timerAt     time.Time

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
		queue:    make([]*SendReq, p.MaxPendingSends),
		free:     make([]freeSlot, 0, p.RecvCount),
		held:     make([]heldFrame, 0, p.RecvCount),
		lastPost: -1,
		reasm:    Reassembler{Max: p.MaxNotifySize},
	}
	n := 2*p.RecvCount + 16
	m.bufs[0] = make([]Action, 0, n)
	m.bufs[1] = make([]Action, 0, n)
	m.acts = m.bufs[0]
	for i := 0; i < p.RecvCount; i++ {
		m.acts = append(m.acts, Action{Kind: ActPostRecv, Slot: i})
	}
	m.recvPosted = uint64(p.RecvCount)
	return m, nil
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
	case len(p.SendRing) < p.SendSlots*p.BufSize:
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
	switch size := len(r.Name) + len(r.Msg); {
	case m.state == stateClosed:
		m.complete(r, fmt.Errorf("send seq %d: %w", r.Seq, ErrClosed))
		return
	case size > m.p.MaxNotifySize:
		m.stats.TooLarge++
		m.complete(r, fmt.Errorf("%w: send seq %d: name+msg %d bytes: above MaxNotifySize %d",
			ErrTooLarge, r.Seq, size, m.p.MaxNotifySize))
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
	m.queue[(m.qhead+m.qlen)%len(m.queue)] = r
	m.qlen++
	if !r.Deadline.IsZero() && (m.timerAt.IsZero() || r.Deadline.Before(m.timerAt)) {
		m.setTimer(r.Deadline)
	}
	m.trySend()
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
		if h.act.Kind == ActDeliver {
			m.deliver(h.act)
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
		m.complete(r, err)
	}
	if !m.timerAt.IsZero() {
		m.setTimer(time.Time{})
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
	for i := m.completed + 1; i <= wrid; i++ {
		s := &m.ring[(i-1)%uint64(len(m.ring))]
		if s.req != nil && s.last {
			m.stats.NotifiesSent++
			m.complete(s.req, nil)
		}
		*s = sendSlot{}
	}
	m.completed = wrid
	m.trySend()
}

// RecvWC is a successful RECV completion of buffer slot holding data (ByteLen bytes).
func (m *Machine) RecvWC(now time.Time, slot int, data []byte) {
	if m.state == stateClosed {
		return
	}
	m.recvCount++
	m.stats.FramesReceived++
	if m.mode == creditGrant && m.recvCount > m.announced {
		m.stats.CreditOverruns++
	}
	var h Header
	p, err := DecodeHeader(data, &h)
	if err != nil {
		m.protocolError(fmt.Errorf("recv slot %d: %w", slot, err))
		return
	}
	if m.state != stateConnected || h.Epoch != m.peer.Epoch {
		m.stats.StaleDropped++
		m.release(slot, h.Type == TypeNotifyCompat || h.Type == TypeNotifyFragment)
		return
	}
	if m.peer.PeerSession != 0 && h.Session != m.peer.PeerSession {
		m.stats.ForeignDropped++
		m.release(slot, h.Type == TypeNotifyCompat || h.Type == TypeNotifyFragment)
		return
	}
	if m.mode == creditGrant && h.AckSeq != 0 {
		m.grant(h.AckSeq)
	}
	switch h.Type {
	case TypeCreditGrant:
		var g CreditGrant
		if err := DecodeCreditGrant(p, &g); err != nil {
			m.protocolError(err)
			return
		}
		for i := 0; i < g.N; i++ {
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
			m.protocolError(err)
			return
		}
		m.notify(slot, &h, nc, false)
	case TypeNotifyFragment:
		if !m.p.Extensions {
			m.protocolError(fmt.Errorf("recv slot %d: %s without extensions", slot, h.Type))
			return
		}
		var f Fragment
		if err := DecodeFragment(p, &f); err != nil {
			m.protocolError(err)
			return
		}
		whole, err := m.reasm.Add(&h, &f)
		if err != nil {
			m.protocolError(err)
			return
		}
		if whole == nil {
			if m.paused {
				m.held = append(m.held, heldFrame{slot: slot})
			} else {
				m.release(slot, true)
			}
			break
		}
		var nc NotifyCompat
		if err := DecodeNotifyCompat(whole, &nc); err != nil {
			m.protocolError(err)
			return
		}
		m.notify(slot, &h, nc, true)
	default:
		m.stats.Ignored++
		m.release(slot, false)
	}
	m.trySend()
}

func (m *Machine) notify(slot int, h *Header, nc NotifyCompat, owned bool) {
	if h.Seq != 0 && h.Seq <= m.deliveredSeq {
		m.stats.DupsDropped++
		m.release(slot, true)
		return
	}
	if h.Seq != 0 {
		m.deliveredSeq = h.Seq
	}
	a := Action{Kind: ActDeliver, Session: h.Session, Epoch: h.Epoch, Seq: h.Seq, Name: nc.Name, Msg: nc.Msg, Owned: owned}
	if m.paused {
		m.held = append(m.held, heldFrame{slot: slot, act: a})
		return
	}
	m.deliver(a)
	m.release(slot, true)
}

func (m *Machine) deliver(a Action) {
	m.stats.Delivered++
	m.acts = append(m.acts, a)
}

func (m *Machine) grant(total uint64) {
	// The frame passed the epoch check, so the ledger's epoch is the channel's.
	_, _ = m.ledger.Grant(m.peer.Epoch, RequestSlots, total)
}

func (m *Machine) protocolError(err error) {
	m.Close(fmt.Errorf("%w: %w", ErrProtocol, err))
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
	for _, f := range m.free {
		m.acts = append(m.acts, Action{Kind: ActPostRecv, Slot: f.slot})
		m.recvPosted++
		if f.data {
			m.releasedData++
		}
	}
	m.free = m.free[:0]
	m.trySend()
}

// trySend posts what credit and the send ring allow: queued notifies first (each carries
// the credit total in ack_seq), then an explicit grant when one is still due.
func (m *Machine) trySend() {
	if m.state != stateConnected {
		return
	}
	ring := uint64(len(m.ring))
	for m.qlen > 0 && m.posted-m.completed < ring {
		r := m.queue[m.qhead]
		size := NotifyCompatLen(r.Name, r.Msg)
		if m.headOff == 0 && HeaderLen+size > m.frameMax && !m.ext {
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
	if m.headOff == 0 && HeaderLen+size <= m.frameMax {
		h := m.header(TypeNotifyCompat, r.Seq)
		n, _ = EncodeNotifyCompat(buf, &h, r.Name, r.Msg) // fits: checked above
		t = TypeNotifyCompat
	} else {
		chunk := min(m.frameMax-HeaderLen-FragmentHeaderLen, size-m.headOff)
		h := m.header(TypeNotifyFragment, r.Seq)
		h.PayloadLen = uint32(FragmentHeaderLen + chunk)
		_ = EncodeHeader(buf, &h)
		n = HeaderLen + encodeFragmentOf(buf[HeaderLen:], r.Name, r.Msg, m.headOff, chunk)
		m.headOff += chunk
		last = m.headOff == size
		t = TypeNotifyFragment
		m.stats.FragmentsSent++
	}
	if last {
		m.popHead()
	}
	m.ring[slot] = sendSlot{req: r, last: last}
	m.emitSend(slot, n, t)
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
