// The peer machine's OOB pacing (see peerMachine in machine.go): a receiver whose queue is
// full holds a few OOB notifies, answered when its application takes them, and answers the
// others "busy". The sender then follows the receiver's answers, not timers: what was
// answered busy waits, with its seq, in its pair's parked queue, and the pair's notifies on
// the wire are capped (oobCap). Each success (the receiver took one) lets the next go and
// slowly raises the cap; each busy answer halves it. A busy answer that leaves nothing on
// the wire sends the head at once (the receiver holds one notify of each sender that has
// none held, so that one is answered when taken); a busy answer to that one again means
// the receiver holds none of ours (an older engine, or a full window), and the head is sent
// again after a wait doubling from busyProbeMin to busyProbeMax. So the tries towards a busy
// peer are one per answer or per wait, whatever the number in flight.

package notify

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"
)

// errPeerBusy marks an OOB notify the peer answered "busy" (its receive queue is full): not
// delivered, and sent again when the pair's pacing allows.
var errPeerBusy = errors.New("notify: the peer answered busy")

const (
	// busyProbeMin, busyProbeMax bound the wait before the head of a parked queue is sent
	// again when a busy answer left nothing of the pair on the wire twice in a row.
	busyProbeMin = time.Millisecond
	busyProbeMax = 50 * time.Millisecond
	// maxHeldOOB bounds the OOB notifies a receiver holds, unanswered, while its receive
	// queue is full; past it only a peer with none held gets one held (oobHold).
	maxHeldOOB = 64
)

// paced reports whether p's next OOB notify must wait in parked: earlier ones wait there,
// the head waits for its probe time, or the cap is reached.
func (p *peerEntry) paced() bool {
	return len(p.parked) > 0 || !p.busyAt.IsZero() || (p.oobCap > 0 && p.oobOut >= p.oobCap)
}

// emitOOB puts r, with its seq, on the wire to p.
func (m *peerMachine) emitOOB(p *peerEntry, r *reqEntry) {
	r.ch, r.oob, r.parked, r.paced = 0, true, false, true
	p.oobOut++
	r.oobToken = p.tokenOut
	m.emit(mAction{kind: aOOB, req: r.id, name: m.peerName(p), seq: r.seq, session: p.key.session,
		token: p.tokenOut, deadline: r.deadline})
}

// park queues r in p's parked queue, in seq order.
func (m *peerMachine) park(p *peerEntry, r *reqEntry) {
	r.oob, r.parked = false, true
	if n := len(p.parked); n == 0 || m.parkedSeq(p.parked[n-1]) < r.seq {
		p.parked = append(p.parked, r.id) // a new seq: the last
		return
	}
	i, _ := slices.BinarySearchFunc(p.parked, r.seq, func(id reqID, seq uint64) int { return cmp.Compare(m.parkedSeq(id), seq) })
	p.parked = slices.Insert(p.parked, i, r.id)
}

func (m *peerMachine) parkedSeq(id reqID) uint64 {
	if r := m.reqs[id]; r != nil {
		return r.seq
	}
	return 0
}

// busyAnswer: p answered r "busy". r waits in parked; the cap halves; with nothing of the
// pair left on the wire the head goes again, at once the first time, then after a wait.
func (m *peerMachine) busyAnswer(now time.Time, p *peerEntry, r *reqEntry) {
	m.stats.BusyAnswers++
	m.park(p, r)
	c := p.oobOut + 1
	if p.oobCap > 0 {
		c = min(c, p.oobCap)
	}
	p.oobCap, p.oobGrow = max(1, c/2), 0
	if p.oobOut > 0 || !p.busyAt.IsZero() {
		return // an answer still to come, or the probe's time, sends the next
	}
	if p.busyWait == 0 {
		p.busyWait = busyProbeMin
		m.sendHead(p)
		return
	}
	p.busyAt = now.Add(p.busyWait)
	p.busyWait = min(2*p.busyWait, busyProbeMax)
	m.setTimer(p.busyAt)
}

// oobAnswered: p took one of its OOB notifies: the cap grows by one per cap answers, and
// the next wait before a probe starts over.
func (m *peerMachine) oobAnswered(p *peerEntry) {
	p.busyWait = 0
	if p.oobCap > 0 {
		if p.oobGrow++; p.oobGrow >= p.oobCap {
			p.oobCap++
			p.oobGrow = 0
		}
	}
	m.paceIdle(p)
}

// paceIdle ends p's pacing once nothing of it is parked or on the wire.
func (m *peerMachine) paceIdle(p *peerEntry) {
	if p.oobOut == 0 && len(p.parked) == 0 {
		p.oobCap, p.oobGrow, p.busyAt = 0, 0, time.Time{}
	}
}

// sendHead sends the head of p's parked queue (a probe: nothing else of p is on the wire).
func (m *peerMachine) sendHead(p *peerEntry) {
	for len(p.parked) > 0 {
		r := m.reqs[p.parked[0]]
		p.parked = p.parked[1:]
		if r != nil && r.parked {
			m.stats.BusyProbes++
			m.emitOOB(p, r)
			return
		}
	}
}

// unpark sends what p's pacing lets go from its parked queue, head first.
func (m *peerMachine) unpark(p *peerEntry) {
	for len(p.parked) > 0 && p.busyAt.IsZero() && (p.oobCap == 0 || p.oobOut < p.oobCap) {
		r := m.reqs[p.parked[0]]
		p.parked = p.parked[1:]
		if r != nil && r.parked {
			m.emitOOB(p, r)
		}
	}
	if len(p.parked) == 0 {
		p.parked = p.parked[:0:0] // let a long queue's array go
	}
}

// releaseParked sends everything parked for p at once, whatever the pacing: p's pair is
// ending (the peer forgot it), and what is on the wire to it is refused and sent again in
// the new pair, in order (stragglers).
func (m *peerMachine) releaseParked(p *peerEntry) {
	ids := p.parked
	p.parked, p.busyAt = nil, time.Time{}
	for _, id := range ids {
		if r := m.reqs[id]; r != nil && r.parked {
			m.emitOOB(p, r)
		}
	}
}

// busyTick sends p's head when its probe time came; else it returns when it is due.
func (m *peerMachine) busyTick(now time.Time, p *peerEntry) (next time.Time) {
	if p.busyAt.IsZero() {
		return time.Time{}
	}
	if now.Before(p.busyAt) {
		return p.busyAt
	}
	p.busyAt = time.Time{}
	if p.oobOut == 0 {
		m.sendHead(p)
	}
	m.unpark(p)
	m.paceIdle(p)
	return time.Time{}
}

// withdrawParked ends r, parked, whose caller stopped waiting or whose deadline passed:
// not delivered (unless an earlier try may have been), its seq given up and fenced.
func (m *peerMachine) withdrawParked(r *reqEntry, cause error) {
	p := r.peer
	r.parked = false
	if i := slices.Index(p.parked, r.id); i >= 0 {
		p.parked = slices.Delete(p.parked, i, i+1)
	}
	m.stats.GivenUp++
	p.seqs.giveUp(r.seq)
	m.fence(p)
	m.complete(r.id, r.tries.sendErr(ErrBackpressure, m.peerName(p), pathName(false),
		fmt.Errorf("the peer's receive queue is full (it answered busy), and the send ended while it waited: %w", cause), r.maybe))
	m.paceIdle(p)
}

// oobHold decides an OOB notify that comes while the receive queue is full, of which held
// are held already: held (answered when the application takes it), or answered "busy".
// Up to maxHeldOOB are held; past it, one of a known pair (its token checks) that has none
// held still is, so every sender has one notify here whose answer, when it is taken, tells
// it to go on (a sender sends nothing else while all it sent was answered busy). At most
// maxHeldOOB plus one per peer entry are held. pair says which entry counts it (0: none);
// oobTaken uncounts it.
func (m *peerMachine) oobHold(session, token uint64, held int) (hold bool, pair uint64) {
	var p *peerEntry
	if session != 0 {
		if p = m.peers[peerKey{session: session}]; p != nil && !m.tokenOK(p, token) {
			p = nil
		}
	}
	if held >= maxHeldOOB && (p == nil || p.heldOOB > 0) {
		return false, 0
	}
	if p == nil {
		return true, 0
	}
	p.heldOOB++
	return true, p.pair
}

// oobTaken: a held OOB notify that oobHold counted for pair is taken.
func (m *peerMachine) oobTaken(session, pair uint64) {
	if pair == 0 {
		return
	}
	if p := m.peers[peerKey{session: session}]; p != nil && p.pair == pair && p.heldOOB > 0 {
		p.heldOOB--
	}
}
