package soft

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/twosided/twosided/ibv"
)

// Limits of a soft QP.
const (
	MaxQPWR     = 16384 // max_send_wr, max_recv_wr
	MaxSGE      = 32    // max_send_sge, max_recv_sge
	MaxInline   = 1024  // max_inline_data
	coalesceMax = 32    // SENDs held back behind unacknowledged ones before PostSend writes anyway
)

var epoch = time.Now()

func nanotime() int64 { return int64(time.Since(epoch)) }

type sendSlot struct {
	wrid      uint64
	op        uint8
	solicited bool
	signaled  bool
	inline    bool
	imm       uint32
	length    uint32
	psn       uint32
	sges      []ibv.SGE // cap MaxSendSGE
	data      []byte    // inline copy, cap MaxInlineData
}

type recvSlot struct {
	wrid uint64
	sges []ibv.SGE // cap MaxRecvSGE
}

// qp is an RC queue pair. Its state is guarded by mu, taken by the consumer's posts and
// modifies and by the NIC goroutines (readers, timers). Lock order: qp, then conn, then cq.
type qp struct {
	ctx    *context
	pd     *pd
	d      *device
	qpn    uint32
	scq    *cq
	rcq    *cq
	caps   ibv.QPCap
	sigAll bool

	mu        sync.Mutex
	state     ibv.QPState
	attr      ibv.QPAttr
	destroyed bool
	conn      *conn

	// Send queue, as monotonic counters (slot = counter % len(sq)):
	// [sqHead, sqAck) acked but held by unsignaled WRs, [sqAck, sqSent) in flight,
	// [sqSent, sqTail) posted, not yet (re)transmitted. sqMaxSent is the transmit high mark.
	sq                                       []sendSlot
	sqHead, sqAck, sqSent, sqMaxSent, sqTail uint64
	sqPSN                                    uint32
	retryLeft, rnrLeft                       uint8
	progress                                 uint64
	ackNanos                                 int64
	ackDeadline                              int64
	ackArmed                                 bool
	ackTimer                                 *time.Timer
	rnrWait                                  bool
	rnrTimer                                 *time.Timer
	rxFromPeer                               uint64 // packets accepted from the connected peer
	pathMark                                 uint64 // rxFromPeer when the path was found lost
	pathArmed                                bool
	pathTimer                                *time.Timer
	pumpAfter                                *conn // a pipe to pump once mu is released
	posting                                  bool  // PostSend runs: the consumer's doorbell may wait for Flush

	rq             []recvSlot
	rqHead, rqTail uint64
	ePSN           uint32
	nakSent        bool // a NAK for ePSN went out; later packets are dropped quietly
	respOp         uint8
	respSynd       uint8
	respPSN        uint32
	touched        bool
}

var _ ibv.QP = (*qp)(nil)

func newQP(p *pd, a ibv.QPInitAttr) (*qp, error) {
	x := p.ctx
	name := x.d.name
	if a.Type != ibv.QPTypeRC {
		return nil, fmt.Errorf("soft: %s: create qp: type %d: only RC is supported: %w", name, a.Type, ibv.ErrInvalid)
	}
	scq, ok := a.SendCQ.(*cq)
	if !ok || scq == nil || scq.ctx != x {
		return nil, fmt.Errorf("soft: %s: create qp: SendCQ: not a CQ of this context: %w", name, ibv.ErrInvalid)
	}
	rcq, ok := a.RecvCQ.(*cq)
	if !ok || rcq == nil || rcq.ctx != x {
		return nil, fmt.Errorf("soft: %s: create qp: RecvCQ: not a CQ of this context: %w", name, ibv.ErrInvalid)
	}
	c := a.Cap
	for _, f := range []struct {
		name string
		v    uint32
		max  uint32
	}{{"MaxSendWR", c.MaxSendWR, MaxQPWR}, {"MaxRecvWR", c.MaxRecvWR, MaxQPWR},
		{"MaxSendSGE", c.MaxSendSGE, MaxSGE}, {"MaxRecvSGE", c.MaxRecvSGE, MaxSGE},
		{"MaxInlineData", c.MaxInlineData, MaxInline}} {
		if f.v > f.max {
			return nil, fmt.Errorf("soft: %s: create qp: Cap.%s %d: above %d: %w", name, f.name, f.v, f.max, ibv.ErrInvalid)
		}
	}
	c.MaxSendSGE = max(c.MaxSendSGE, 1)
	c.MaxRecvSGE = max(c.MaxRecvSGE, 1)
	q := &qp{ctx: x, pd: p, d: x.d, scq: scq, rcq: rcq, caps: c, sigAll: a.SqSigAll,
		sq: make([]sendSlot, c.MaxSendWR), rq: make([]recvSlot, c.MaxRecvWR)}
	sges := make([]ibv.SGE, int(c.MaxSendSGE)*len(q.sq))
	inl := make([]byte, int(c.MaxInlineData)*len(q.sq))
	for i := range q.sq {
		q.sq[i].sges = sges[i*int(c.MaxSendSGE) : i*int(c.MaxSendSGE) : (i+1)*int(c.MaxSendSGE)]
		q.sq[i].data = inl[i*int(c.MaxInlineData) : i*int(c.MaxInlineData) : (i+1)*int(c.MaxInlineData)]
	}
	rsges := make([]ibv.SGE, int(c.MaxRecvSGE)*len(q.rq))
	for i := range q.rq {
		q.rq[i].sges = rsges[i*int(c.MaxRecvSGE) : i*int(c.MaxRecvSGE) : (i+1)*int(c.MaxRecvSGE)]
	}
	q.ackTimer = time.AfterFunc(time.Hour, q.onAckTimer)
	q.ackTimer.Stop()
	q.pathTimer = time.AfterFunc(time.Hour, q.onPathTimer)
	q.pathTimer.Stop()
	q.rnrTimer = time.AfterFunc(time.Hour, q.onRNRTimer)
	q.rnrTimer.Stop()

	x.mu.Lock()
	if x.closed {
		x.mu.Unlock()
		return nil, fmt.Errorf("soft: %s: create qp: %w", name, ibv.ErrClosed)
	}
	p.mu.Lock()
	if p.gone {
		p.mu.Unlock()
		x.mu.Unlock()
		return nil, fmt.Errorf("soft: %s: create qp: pd: %w", name, ibv.ErrClosed)
	}
	p.qps++
	p.mu.Unlock()
	for _, cq := range []*cq{scq, rcq} {
		cq.mu.Lock()
		cq.qps++
		cq.mu.Unlock()
	}
	x.qps[q] = struct{}{}
	x.mu.Unlock()
	x.d.addQP(q)
	return q, nil
}

func (q *qp) QPNum() uint32 { return q.qpn }

func (q *qp) Cap() ibv.QPCap { return q.caps }

func (q *qp) State() ibv.QPState {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.state
}

func (q *qp) Query() (ibv.QPAttr, ibv.QPCap, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.destroyed {
		return ibv.QPAttr{}, ibv.QPCap{}, fmt.Errorf("soft: qp %d: query: %w", q.qpn, ibv.ErrClosed)
	}
	a := q.attr
	a.QPState = q.state
	return a, q.caps, nil
}

// transition returns the required and optional attributes of an RC transition, as
// ib_modify_qp_is_ok does; ok is false for a transition that does not exist.
func transition(cur, next ibv.QPState) (req, opt ibv.QPAttrMask, ok bool) {
	switch {
	case next == ibv.QPSReset || next == ibv.QPSErr:
		return 0, 0, true
	case cur == ibv.QPSReset && next == ibv.QPSInit:
		return ibv.AttrPKeyIndex | ibv.AttrPort | ibv.AttrAccessFlags, 0, true
	case cur == ibv.QPSInit && next == ibv.QPSInit:
		return 0, ibv.AttrPKeyIndex | ibv.AttrPort | ibv.AttrAccessFlags, true
	case cur == ibv.QPSInit && next == ibv.QPSRTR:
		return ibv.AttrAV | ibv.AttrPathMTU | ibv.AttrDestQPN | ibv.AttrRqPSN | ibv.AttrMaxDestRdAtomic | ibv.AttrMinRNRTimer,
			ibv.AttrAltPath | ibv.AttrAccessFlags | ibv.AttrPKeyIndex, true
	case cur == ibv.QPSRTR && next == ibv.QPSRTS:
		return ibv.AttrSqPSN | ibv.AttrTimeout | ibv.AttrRetryCnt | ibv.AttrRnrRetry | ibv.AttrMaxQPRdAtomic,
			ibv.AttrCurState | ibv.AttrAltPath | ibv.AttrAccessFlags | ibv.AttrMinRNRTimer | ibv.AttrPathMigState, true
	case cur == ibv.QPSRTS && next == ibv.QPSRTS:
		return 0, ibv.AttrCurState | ibv.AttrAccessFlags | ibv.AttrAltPath | ibv.AttrMinRNRTimer | ibv.AttrPathMigState, true
	}
	return 0, 0, false
}

func (q *qp) Modify(a *ibv.QPAttr, mask ibv.QPAttrMask) error {
	if a == nil {
		return fmt.Errorf("soft: qp %d: modify: attr: nil: %w", q.qpn, ibv.ErrInvalid)
	}
	if h := q.d.rtrHook.Load(); h != nil && mask&ibv.AttrState != 0 && a.QPState == ibv.QPSRTR {
		(*h)() // a slow address resolution, as a RoCE NIC's kernel does it (outside every lock)
	}
	var gids []ibv.GIDEntry
	if mask&ibv.AttrAV != 0 {
		gids = q.d.info().Ports[0].GIDs // before q.mu: the device's lock is not taken under a QP's
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.destroyed {
		return fmt.Errorf("soft: qp %d: modify: %w", q.qpn, ibv.ErrClosed)
	}
	cur, next := q.state, q.state
	if mask&ibv.AttrState != 0 {
		next = a.QPState
	}
	req, opt, ok := transition(cur, next)
	if !ok {
		return fmt.Errorf("soft: qp %d: modify %s→%s: no such transition: %w", q.qpn, cur, next, ibv.ErrInvalid)
	}
	if miss := req &^ mask; miss != 0 {
		return fmt.Errorf("soft: qp %d: modify %s→%s: required attributes missing (mask %#x): %w", q.qpn, cur, next, uint32(miss), ibv.ErrInvalid)
	}
	if extra := mask &^ (req | opt | ibv.AttrState); extra != 0 {
		return fmt.Errorf("soft: qp %d: modify %s→%s: attributes not allowed (mask %#x): %w", q.qpn, cur, next, uint32(extra), ibv.ErrInvalid)
	}
	bad := func(field, why string) error {
		return fmt.Errorf("soft: qp %d: modify %s→%s: %s: %s: %w", q.qpn, cur, next, field, why, ibv.ErrInvalid)
	}
	if mask&ibv.AttrPort != 0 && a.PortNum != 1 {
		return bad("PortNum", fmt.Sprintf("%d: only port 1 exists", a.PortNum))
	}
	if mask&ibv.AttrPKeyIndex != 0 && a.PKeyIndex != 0 {
		return bad("PKeyIndex", fmt.Sprintf("%d: only index 0 exists", a.PKeyIndex))
	}
	if mask&ibv.AttrPathMTU != 0 && (!a.PathMTU.Valid() || a.PathMTU > ibv.MTU4096) {
		return bad("PathMTU", fmt.Sprintf("%d: not an IB MTU", a.PathMTU))
	}
	if mask&ibv.AttrAV != 0 {
		if !a.AHAttr.IsGlobal || a.AHAttr.DGID.IsZero() {
			return bad("AHAttr", "a soft (RoCE-like) port needs a global route with a DGID")
		}
		if a.AHAttr.PortNum != 0 && a.AHAttr.PortNum != 1 {
			return bad("AHAttr.PortNum", fmt.Sprintf("%d: only port 1 exists", a.AHAttr.PortNum))
		}
		// As the kernel's RoCE address resolution: the source GID must be a table entry,
		// of the destination's address family.
		var sgid *ibv.GIDEntry
		for i := range gids {
			if gids[i].Index == int(a.AHAttr.SGIDIndex) {
				sgid = &gids[i]
			}
		}
		switch {
		case sgid == nil:
			return bad("AHAttr.SGIDIndex", fmt.Sprintf("%d: empty GID table entry", a.AHAttr.SGIDIndex))
		case ipv4Family(sgid.GID) != ipv4Family(a.AHAttr.DGID):
			return bad("AHAttr.SGIDIndex", fmt.Sprintf("%d (%s %s) and DGID %s are of different address families",
				a.AHAttr.SGIDIndex, sgid.Type, sgid.GID, a.AHAttr.DGID))
		}
	}
	if mask&ibv.AttrDestQPN != 0 && a.DestQPNum > psnMask {
		return bad("DestQPNum", "wider than 24 bits")
	}
	if mask&ibv.AttrRqPSN != 0 && a.RqPSN > psnMask {
		return bad("RqPSN", "wider than 24 bits")
	}
	if mask&ibv.AttrSqPSN != 0 && a.SqPSN > psnMask {
		return bad("SqPSN", "wider than 24 bits")
	}
	if mask&ibv.AttrMinRNRTimer != 0 && a.MinRNRTimer > 31 {
		return bad("MinRNRTimer", "above 31")
	}
	if mask&ibv.AttrTimeout != 0 && a.Timeout > 31 {
		return bad("Timeout", "above 31")
	}
	if mask&ibv.AttrRetryCnt != 0 && a.RetryCnt > 7 {
		return bad("RetryCnt", "above 7")
	}
	if mask&ibv.AttrRnrRetry != 0 && a.RnrRetry > 7 {
		return bad("RnrRetry", "above 7")
	}
	if next == ibv.QPSRTR && cur == ibv.QPSInit && q.d.phantom {
		return bad("port", "port 1 is DOWN")
	}

	// Apply.
	if mask&ibv.AttrAccessFlags != 0 {
		q.attr.QPAccessFlags = a.QPAccessFlags
	}
	if mask&ibv.AttrPort != 0 {
		q.attr.PortNum = a.PortNum
	}
	if mask&ibv.AttrPKeyIndex != 0 {
		q.attr.PKeyIndex = a.PKeyIndex
	}
	if mask&ibv.AttrPathMTU != 0 {
		q.attr.PathMTU = a.PathMTU
	}
	if mask&ibv.AttrAV != 0 {
		q.attr.AHAttr = a.AHAttr
	}
	if mask&ibv.AttrDestQPN != 0 {
		q.attr.DestQPNum = a.DestQPNum
	}
	if mask&ibv.AttrRqPSN != 0 {
		q.attr.RqPSN = a.RqPSN
	}
	if mask&ibv.AttrSqPSN != 0 {
		q.attr.SqPSN = a.SqPSN
	}
	if mask&ibv.AttrMaxDestRdAtomic != 0 {
		q.attr.MaxDestRdAtomic = a.MaxDestRdAtomic
	}
	if mask&ibv.AttrMaxQPRdAtomic != 0 {
		q.attr.MaxRdAtomic = a.MaxRdAtomic
	}
	if mask&ibv.AttrMinRNRTimer != 0 {
		q.attr.MinRNRTimer = a.MinRNRTimer
	}
	if mask&ibv.AttrTimeout != 0 {
		q.attr.Timeout = a.Timeout
		q.ackNanos = ackTimeoutNanos(a.Timeout)
	}
	if mask&ibv.AttrRetryCnt != 0 {
		q.attr.RetryCnt = a.RetryCnt
		q.retryLeft = a.RetryCnt
	}
	if mask&ibv.AttrRnrRetry != 0 {
		q.attr.RnrRetry = a.RnrRetry
		q.rnrLeft = a.RnrRetry
	}
	switch {
	case next == ibv.QPSReset:
		q.resetLocked()
	case next == ibv.QPSErr:
		if cur != ibv.QPSErr {
			q.enterErrLocked(0, 0, false)
		}
	case cur == ibv.QPSInit && next == ibv.QPSRTR:
		q.ePSN = a.RqPSN
		q.state = next
		q.conn = nil
		_ = q.connLocked() // dial now, so that the first SEND finds the connection up
	case cur == ibv.QPSRTR && next == ibv.QPSRTS:
		q.sqPSN = a.SqPSN
		q.state = next
	default:
		q.state = next
	}
	return nil
}

func (q *qp) remoteGID() ibv.GID { return q.attr.AHAttr.DGID }

func (q *qp) resetLocked() {
	q.stopTimersLocked()
	q.state = ibv.QPSReset
	q.sqHead, q.sqAck, q.sqSent, q.sqMaxSent, q.sqTail = 0, 0, 0, 0, 0
	q.rqHead, q.rqTail = 0, 0
	q.nakSent, q.rnrWait = false, false
	q.respOp = 0
	q.conn = nil
	q.attr = ibv.QPAttr{}
	q.ackNanos = 0
}

func (q *qp) stopTimersLocked() {
	q.ackTimer.Stop()
	q.ackArmed = false
	q.pathTimer.Stop()
	q.pathArmed = false
	q.rnrTimer.Stop()
	q.rnrWait = false
}

func (q *qp) slot(i uint64) *sendSlot { return &q.sq[i%uint64(len(q.sq))] }

// enterErrLocked moves the QP to ERR: the WR at errIdx (when hasErr) completes with st, every
// other outstanding WR of both queues with WR_FLUSH_ERR.
func (q *qp) enterErrLocked(errIdx uint64, st ibv.WCStatus, hasErr bool) {
	q.state = ibv.QPSErr
	q.stopTimersLocked()
	for i := q.sqAck; i != q.sqTail; i++ {
		s := q.slot(i)
		wc := ibv.WC{WRID: s.wrid, Status: ibv.WCWRFlushErr, Opcode: ibv.WCSend, QPNum: q.qpn}
		if hasErr && i == errIdx {
			wc.Status = st
		}
		q.scq.push(&wc, false)
	}
	q.sqHead, q.sqAck, q.sqSent, q.sqMaxSent = q.sqTail, q.sqTail, q.sqTail, q.sqTail
	for i := q.rqHead; i != q.rqTail; i++ {
		wc := ibv.WC{WRID: q.rq[i%uint64(len(q.rq))].wrid, Status: ibv.WCWRFlushErr, Opcode: ibv.WCRecv, QPNum: q.qpn}
		q.rcq.push(&wc, false)
	}
	q.rqHead = q.rqTail
}

// overrunLocked handles a CQE lost to a full CQ: the QP is fatally broken, as on hardware.
func (q *qp) overrunLocked() {
	if q.state == ibv.QPSErr {
		return
	}
	q.enterErrLocked(0, 0, false)
	q.ctx.raise(ibv.AsyncEvent{Type: ibv.EventQPFatal, QP: q})
}

// unlockAndPump releases mu, then delivers what transmitLocked left on an in-process pipe.
func (q *qp) unlockAndPump() {
	c := q.pumpAfter
	q.pumpAfter = nil
	q.mu.Unlock()
	if c != nil {
		c.pump()
	}
}

func (q *qp) PostSend(wr *ibv.SendWR) (*ibv.SendWR, error) {
	q.mu.Lock()
	q.posting = true
	bad, err := q.postSendLocked(wr)
	q.posting = false
	q.unlockAndPump()
	return bad, err
}

func (q *qp) postSendLocked(wr *ibv.SendWR) (*ibv.SendWR, error) {
	if q.destroyed {
		return wr, fmt.Errorf("soft: qp %d: post send: %w", q.qpn, ibv.ErrClosed)
	}
	posted := false
	for w := wr; w != nil; w = w.Next {
		if q.state == ibv.QPSErr {
			wc := ibv.WC{WRID: w.WRID, Status: ibv.WCWRFlushErr, Opcode: ibv.WCSend, QPNum: q.qpn}
			q.scq.push(&wc, false)
			continue
		}
		if q.state != ibv.QPSRTS {
			q.kickLocked(posted)
			return w, fmt.Errorf("soft: qp %d: post send: state %s: must be RTS: %w", q.qpn, q.state, ibv.ErrInvalid)
		}
		if err := q.checkSendLocked(w); err != nil {
			q.kickLocked(posted)
			return w, err
		}
		s := q.slot(q.sqTail)
		s.wrid = w.WRID
		s.op = opSend
		s.imm = 0
		if w.Opcode == ibv.WRSendWithImm {
			s.op, s.imm = opSendImm, w.ImmData
		}
		s.solicited = w.SendFlags&ibv.SendSolicited != 0
		s.signaled = q.sigAll || w.SendFlags&ibv.SendSignaled != 0
		s.inline = w.SendFlags&ibv.SendInline != 0
		s.sges = append(s.sges[:0], w.SGList...)
		s.data = s.data[:0]
		var n uint64
		for i := range w.SGList {
			n += uint64(w.SGList[i].Length)
		}
		if n > maxMsgLen {
			n = maxMsgLen + 1 // completes with LOC_LEN_ERR when transmitted
		}
		s.length = uint32(n)
		if s.inline {
			for i := range w.SGList {
				sg := &w.SGList[i]
				b, ok := q.d.translate(sg, q.pd, false)
				if !ok {
					b, ok = q.d.findByAddr(sg.Addr, sg.Length, q.pd)
				}
				if !ok {
					q.kickLocked(posted)
					return w, fmt.Errorf("soft: qp %d: post send: SGList[%d]: inline data outside registered memory (soft reads only registered memory): %w", q.qpn, i, ibv.ErrInvalid)
				}
				s.data = append(s.data, b...)
			}
		}
		s.psn = q.sqPSN
		q.sqPSN = (q.sqPSN + 1) & psnMask
		q.sqTail++
		posted = true
	}
	q.kickLocked(posted)
	return nil, nil
}

func (q *qp) checkSendLocked(w *ibv.SendWR) error {
	if w.Opcode != ibv.WRSend && w.Opcode != ibv.WRSendWithImm {
		return fmt.Errorf("soft: qp %d: post send: wr %d: Opcode %s: soft supports SEND and SEND_WITH_IMM: %w", q.qpn, w.WRID, w.Opcode, ibv.ErrInvalid)
	}
	if uint32(len(w.SGList)) > q.caps.MaxSendSGE {
		return fmt.Errorf("soft: qp %d: post send: wr %d: SGList: %d entries above max_send_sge %d: %w", q.qpn, w.WRID, len(w.SGList), q.caps.MaxSendSGE, ibv.ErrInvalid)
	}
	if w.SendFlags&ibv.SendInline != 0 {
		var n uint64
		for i := range w.SGList {
			n += uint64(w.SGList[i].Length)
		}
		if n > uint64(q.caps.MaxInlineData) {
			return fmt.Errorf("soft: qp %d: post send: wr %d: inline %d bytes above max_inline_data %d: %w", q.qpn, w.WRID, n, q.caps.MaxInlineData, ibv.ErrInvalid)
		}
	}
	if q.sqTail-q.sqHead >= uint64(len(q.sq)) {
		return fmt.Errorf("soft: qp %d: post send: wr %d: send queue full (max_send_wr %d): %w", q.qpn, w.WRID, len(q.sq), ibv.ErrNoMem)
	}
	return nil
}

// kickLocked is the doorbell: transmit what was posted, unless batching holds it back
// behind SENDs still waiting for their ACK (the ACK's arrival transmits it).
func (q *qp) kickLocked(posted bool) {
	if !posted || q.state != ibv.QPSRTS || q.rnrWait {
		return
	}
	if q.d.coalesce && q.sqAck != q.sqSent && q.sqTail-q.sqSent < coalesceMax {
		return
	}
	q.transmitLocked(nil)
}

func (q *qp) connLocked() *conn {
	if c := q.conn; c != nil && c.state.Load() != connDead {
		return c
	}
	q.conn = q.d.connTo(q.remoteGID())
	return q.conn
}

// transmitLocked sends the WRs of [sqSent, sqTail). With rx set (a reader calls), the write
// is left to the end of the reader's batch.
func (q *qp) transmitLocked(rx *rxBatch) {
	if q.sqSent == q.sqTail || q.rnrWait || q.state != ibv.QPSRTS {
		return
	}
	c := q.connLocked()
	if c == nil {
		// The device is dead: the packets vanish; the ACK timer will notice.
		q.sqSent = q.sqTail
		q.sqMaxSent = q.sqTail
		q.armAckLocked()
		return
	}
	c.mu.Lock()
	for q.sqSent != q.sqTail {
		s := q.slot(q.sqSent)
		if start, ok := c.startPacketLocked(); ok {
			if st := q.buildSendLocked(c, s); st != ibv.WCSuccess {
				c.out = c.out[:start]
				c.mu.Unlock()
				q.enterErrLocked(q.sqSent, st, true)
				return
			}
			c.endPacketLocked(start)
		}
		if q.sqSent < q.sqMaxSent {
			q.d.ctr.retransmits.Add(1)
		} else {
			q.d.ctr.bytesSent.Add(uint64(s.length))
		}
		q.sqSent++
	}
	q.sqMaxSent = max(q.sqMaxSent, q.sqSent)
	switch {
	case rx != nil:
		rx.markDirty(c)
	case c.pipe:
		q.pumpAfter = c
	case q.posting && q.d.deferOut.Load():
		q.d.addPending(c)
	default:
		c.flushLocked()
	}
	c.mu.Unlock()
	q.armAckLocked()
}

func grow(b []byte, n int) []byte {
	b = slices.Grow(b, n)
	return b[:len(b)+n]
}

// buildSendLocked appends the packet of s to c.out, gathering its payload from the MRs.
func (q *qp) buildSendLocked(c *conn, s *sendSlot) ibv.WCStatus {
	if s.length > maxMsgLen {
		return ibv.WCLocLenErr
	}
	h := header{op: s.op, dstQPN: q.attr.DestQPNum, srcQPN: q.qpn, psn: s.psn, imm: s.imm, length: s.length}
	if s.solicited {
		h.flags = flagSolicited
	}
	off := len(c.out)
	c.out = grow(c.out, hdrLen+int(s.length))
	h.put(c.out[off:])
	p := off + hdrLen
	if s.inline {
		copy(c.out[p:], s.data)
		return ibv.WCSuccess
	}
	for i := range s.sges {
		b, ok := q.d.translate(&s.sges[i], q.pd, false)
		if !ok {
			return ibv.WCLocProtErr
		}
		p += copy(c.out[p:], b)
	}
	return ibv.WCSuccess
}

func (q *qp) armAckLocked() {
	if q.ackArmed || q.ackNanos == 0 || q.sqAck == q.sqSent {
		return
	}
	q.ackArmed = true
	q.ackDeadline = nanotime() + q.ackNanos
	q.ackTimer.Reset(time.Duration(q.ackNanos))
}

// onAckTimer is the local ACK timeout: no progress for a period → go back to the oldest
// unacknowledged SEND and retransmit, or fail it with RETRY_EXC_ERR when retries ran out.
func (q *qp) onAckTimer() {
	q.mu.Lock()
	defer q.unlockAndPump()
	if !q.ackArmed {
		return
	}
	if q.destroyed || q.state != ibv.QPSRTS || q.rnrWait || q.sqAck == q.sqSent {
		q.ackArmed = false
		return
	}
	if now := nanotime(); now < q.ackDeadline {
		q.ackTimer.Reset(time.Duration(q.ackDeadline - now))
		return
	}
	q.d.ctr.retryTimeouts.Add(1)
	if q.retryLeft == 0 {
		q.ackArmed = false
		q.d.ctr.retryExceeded.Add(1)
		q.enterErrLocked(q.sqAck, ibv.WCRetryExcErr, true)
		return
	}
	q.retryLeft--
	q.sqSent = q.sqAck
	q.ackDeadline = nanotime() + q.ackNanos
	q.ackTimer.Reset(time.Duration(q.ackNanos))
	q.transmitLocked(nil)
}

func (q *qp) onRNRTimer() {
	q.mu.Lock()
	defer q.unlockAndPump()
	if !q.rnrWait || q.destroyed || q.state != ibv.QPSRTS {
		return
	}
	q.rnrWait = false
	q.transmitLocked(nil)
}

// onPacket dispatches a packet read from c to its QP.
func (d *device) onPacket(c *conn, h *header, payload []byte, rx *rxBatch) {
	d.ctr.packetsRecv.Add(1)
	if d.p.faultsOn.Load() != 0 {
		if cut, _ := d.p.linkState(c.remote, d.gid); cut || d.isDown() {
			d.ctr.cutDropped.Add(1)
			return
		}
	}
	q := d.qpByNum(h.dstQPN)
	if q == nil {
		d.ctr.unknownQPDropped.Add(1)
		return
	}
	switch h.op {
	case opSend, opSendImm:
		q.onSend(c, h, payload, rx)
	case opAck, opNak:
		q.onResponse(c, h, rx)
	}
}

// fromPeerLocked reports whether a packet comes from the GID and QPN the QP was connected to.
func (q *qp) fromPeerLocked(c *conn, h *header) bool {
	if c.remote != q.attr.AHAttr.DGID || h.srcQPN != q.attr.DestQPNum {
		q.d.ctr.forgedDropped.Add(1)
		return false
	}
	q.rxFromPeer++
	return true
}

// minPathWait is the least time an idle QP waits, after its remote device was found gone,
// before it fails.
const minPathWait = time.Second

// pathLost tells a QP that the remote device gid is gone: its connection ended and a new
// one was refused (see device.checkRemote). Hardware learns this only when it sends and
// the retries run out; an idle QP would never learn it. Here the end of the TCP connection
// is the link going down: a QP connected to gid and idle (no SEND in flight: those have the
// ACK timer) fails like an exhausted retry, once its retry budget (at least minPathWait)
// passed with no packet from the peer. Its RECVs and any SEND posted meanwhile complete with
// WR_FLUSH_ERR and it enters ERR.
func (q *qp) pathLost(gid ibv.GID) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.destroyed || q.pathArmed || (q.state != ibv.QPSRTR && q.state != ibv.QPSRTS) || q.remoteGID() != gid {
		return
	}
	wait := time.Duration(q.ackNanos) * time.Duration(int(q.attr.RetryCnt)+1)
	q.pathMark = q.rxFromPeer
	q.pathArmed = true
	q.pathTimer.Reset(max(wait, minPathWait))
}

func (q *qp) onPathTimer() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.pathArmed {
		return
	}
	q.pathArmed = false
	if q.destroyed || (q.state != ibv.QPSRTR && q.state != ibv.QPSRTS) || q.rxFromPeer != q.pathMark ||
		q.sqAck != q.sqSent || q.rnrWait {
		return // the peer spoke since, or a SEND is in flight and its ACK timer decides
	}
	q.d.ctr.pathsLost.Add(1)
	q.enterErrLocked(0, 0, false)
}

func (q *qp) setRespLocked(op, synd uint8, psn uint32, rx *rxBatch) {
	q.respOp, q.respSynd, q.respPSN = op, synd, psn
	if !q.touched {
		q.touched = true
		rx.touched = append(rx.touched, q)
	}
}

// onSend is the responder: place an in-order SEND in the oldest RECV, or NAK it.
func (q *qp) onSend(c *conn, h *header, payload []byte, rx *rxBatch) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.destroyed || (q.state != ibv.QPSRTR && q.state != ibv.QPSRTS) {
		q.d.ctr.stateDropped.Add(1)
		return
	}
	if !q.fromPeerLocked(c, h) {
		return
	}
	diff := psnDiff(h.psn, q.ePSN)
	if diff < 0 {
		q.d.ctr.dupPackets.Add(1)
		q.setRespLocked(opAck, 0, (q.ePSN-1)&psnMask, rx)
		return
	}
	if diff > 0 {
		if !q.nakSent {
			q.nakSent = true
			q.d.ctr.seqNaksSent.Add(1)
			q.setRespLocked(opNak, nakSeq, q.ePSN, rx)
		}
		return
	}
	if q.rqHead == q.rqTail {
		q.nakSent = true
		q.d.ctr.rnrNaksSent.Add(1)
		q.setRespLocked(opNak, nakRNR, q.ePSN, rx)
		return
	}
	s := &q.rq[q.rqHead%uint64(len(q.rq))]
	var room uint64
	for i := range s.sges {
		room += uint64(s.sges[i].Length)
	}
	if uint64(len(payload)) > room {
		q.setRespLocked(opNak, nakInvReq, q.ePSN, rx)
		q.recvErrLocked(ibv.WCLocLenErr)
		return
	}
	rest := payload
	for i := range s.sges {
		b, ok := q.d.translate(&s.sges[i], q.pd, true)
		if !ok {
			q.setRespLocked(opNak, nakRemOp, q.ePSN, rx)
			q.recvErrLocked(ibv.WCLocProtErr)
			return
		}
		rest = rest[copy(b, rest):]
	}
	wc := ibv.WC{WRID: s.wrid, Status: ibv.WCSuccess, Opcode: ibv.WCRecv, ByteLen: uint32(len(payload)),
		QPNum: q.qpn, SrcQP: h.srcQPN}
	if h.op == opSendImm {
		wc.ImmData, wc.WCFlags = h.imm, ibv.WCWithImm
	}
	q.rqHead++
	q.ePSN = (q.ePSN + 1) & psnMask
	q.nakSent = false
	q.d.ctr.bytesRecv.Add(uint64(len(payload)))
	q.setRespLocked(opAck, 0, h.psn, rx)
	if !q.rcq.push(&wc, h.flags&flagSolicited != 0) {
		q.overrunLocked()
	}
}

// recvErrLocked completes the oldest RECV with st and moves the QP to ERR.
func (q *qp) recvErrLocked(st ibv.WCStatus) {
	wc := ibv.WC{WRID: q.rq[q.rqHead%uint64(len(q.rq))].wrid, Status: st, Opcode: ibv.WCRecv, QPNum: q.qpn}
	q.rqHead++
	q.rcq.push(&wc, false)
	q.enterErrLocked(0, 0, false)
}

// respond writes the QP's pending ACK/NAK (the newest one of the batch) at the batch's end.
func (q *qp) respond(rx *rxBatch) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.touched = false
	op := q.respOp
	q.respOp = 0
	// An ACK owed for data already placed (its CQE may be reaped, the QP destroyed since)
	// still goes out, as a NIC's would: otherwise the requester retries against a QP that
	// is gone and fails a SEND whose bytes were delivered.
	if op == 0 || (q.destroyed && op != opAck) {
		return
	}
	c := q.connLocked()
	if c == nil {
		return
	}
	h := header{op: op, synd: q.respSynd, dstQPN: q.attr.DestQPNum, srcQPN: q.qpn, psn: q.respPSN}
	if op == opNak && q.respSynd == nakRNR {
		h.rnrTime = q.attr.MinRNRTimer
	}
	c.mu.Lock()
	if start, ok := c.startPacketLocked(); ok {
		c.out = grow(c.out, hdrLen)
		h.put(c.out[start:])
		c.endPacketLocked(start)
		rx.markDirty(c)
	}
	c.mu.Unlock()
}

// ackThroughLocked retires the in-flight SENDs before psn (and psn itself when inclusive).
func (q *qp) ackThroughLocked(psn uint32, inclusive bool) {
	advanced := false
	for q.sqAck != q.sqMaxSent {
		s := q.slot(q.sqAck)
		d := psnDiff(psn, s.psn)
		if d < 0 || (d == 0 && !inclusive) {
			break
		}
		q.sqAck++
		advanced = true
		if s.signaled {
			q.sqHead = q.sqAck
			wc := ibv.WC{WRID: s.wrid, Status: ibv.WCSuccess, Opcode: ibv.WCSend, ByteLen: s.length, QPNum: q.qpn}
			if !q.scq.push(&wc, false) {
				q.overrunLocked()
				return
			}
		}
	}
	if !advanced {
		return
	}
	if q.sqSent < q.sqAck {
		q.sqSent = q.sqAck
	}
	q.progress++
	q.ackDeadline = nanotime() + q.ackNanos
	q.retryLeft, q.rnrLeft = q.attr.RetryCnt, q.attr.RnrRetry
}

// onResponse is the requester's side of an ACK or NAK.
func (q *qp) onResponse(c *conn, h *header, rx *rxBatch) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.destroyed || q.state != ibv.QPSRTS {
		q.d.ctr.stateDropped.Add(1)
		return
	}
	if !q.fromPeerLocked(c, h) {
		return
	}
	if h.op == opAck {
		q.ackThroughLocked(h.psn, true)
		if q.state == ibv.QPSRTS && !q.rnrWait {
			q.transmitLocked(rx)
		}
		return
	}
	q.ackThroughLocked(h.psn, false)
	if q.state != ibv.QPSRTS || q.sqAck == q.sqMaxSent || q.slot(q.sqAck).psn != h.psn {
		return // stale
	}
	switch h.synd {
	case nakRNR:
		q.d.ctr.rnrNaksRecv.Add(1)
		if q.rnrLeft == 0 {
			q.d.ctr.rnrRetryExceeded.Add(1)
			q.enterErrLocked(q.sqAck, ibv.WCRNRRetryExcErr, true)
			return
		}
		if q.rnrLeft != 7 {
			q.rnrLeft--
		}
		q.rnrWait = true
		q.sqSent = q.sqAck
		q.rnrTimer.Reset(time.Duration(rnrTimerNanos[h.rnrTime]))
	case nakSeq:
		q.sqSent = q.sqAck
		q.transmitLocked(rx)
	case nakInvReq:
		q.enterErrLocked(q.sqAck, ibv.WCRemInvReqErr, true)
	case nakRemOp:
		q.enterErrLocked(q.sqAck, ibv.WCRemOpErr, true)
	}
}

func (q *qp) PostRecv(wr *ibv.RecvWR) (*ibv.RecvWR, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.destroyed {
		return wr, fmt.Errorf("soft: qp %d: post recv: %w", q.qpn, ibv.ErrClosed)
	}
	for w := wr; w != nil; w = w.Next {
		switch q.state {
		case ibv.QPSReset:
			return w, fmt.Errorf("soft: qp %d: post recv: state RESET: must be INIT or later: %w", q.qpn, ibv.ErrInvalid)
		case ibv.QPSErr:
			wc := ibv.WC{WRID: w.WRID, Status: ibv.WCWRFlushErr, Opcode: ibv.WCRecv, QPNum: q.qpn}
			q.rcq.push(&wc, false)
			continue
		}
		if uint32(len(w.SGList)) > q.caps.MaxRecvSGE {
			return w, fmt.Errorf("soft: qp %d: post recv: wr %d: SGList: %d entries above max_recv_sge %d: %w", q.qpn, w.WRID, len(w.SGList), q.caps.MaxRecvSGE, ibv.ErrInvalid)
		}
		if q.rqTail-q.rqHead >= uint64(len(q.rq)) {
			return w, fmt.Errorf("soft: qp %d: post recv: wr %d: receive queue full (max_recv_wr %d): %w", q.qpn, w.WRID, len(q.rq), ibv.ErrNoMem)
		}
		s := &q.rq[q.rqTail%uint64(len(q.rq))]
		s.wrid = w.WRID
		s.sges = append(s.sges[:0], w.SGList...)
		q.rqTail++
	}
	return nil, nil
}

func (q *qp) Destroy() error {
	q.mu.Lock()
	if q.destroyed {
		q.mu.Unlock()
		return fmt.Errorf("soft: qp %d: destroy: %w", q.qpn, ibv.ErrClosed)
	}
	q.mu.Unlock()
	q.destroy()
	q.ctx.mu.Lock()
	delete(q.ctx.qps, q)
	q.ctx.mu.Unlock()
	return nil
}

func (q *qp) destroy() {
	q.mu.Lock()
	if q.destroyed {
		q.mu.Unlock()
		return
	}
	q.destroyed = true
	q.stopTimersLocked()
	q.mu.Unlock()
	q.d.removeQP(q)
	for _, c := range []*cq{q.scq, q.rcq} {
		c.mu.Lock()
		c.qps--
		c.mu.Unlock()
	}
	q.pd.mu.Lock()
	q.pd.qps--
	q.pd.mu.Unlock()
}
