// The peer machine's sends (see peerMachine in machine.go): a send is queued on its name or
// peer, gets its seq when it is posted on a channel or sent over OOB, is checked against the
// sizes the peer and the channel take, and ends in sendResult: delivered, retried on
// another path with its seq, given up and fenced, or rebound to a restarted peer.

package notify

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"
)

// send accepts a notify for name (a host:port or an advertised name). nid is the caller's
// idempotency id ("" none).
func (m *peerMachine) send(now time.Time, id reqID, name, nid string, deadline time.Time, size int) {
	defer m.unhold(now)
	ne := m.names[name]
	if ne == nil {
		if len(m.names) >= m.cfg.maxNames {
			m.stats.NamesRefused++
			m.emit(mAction{kind: aComplete, req: id, err: sendErr(ErrLimit, name, "",
				fmt.Errorf("max_names: %d peer names known, the limit", m.cfg.maxNames), false)})
			return
		}
		ne = &nameEntry{name: name}
		m.names[name] = ne
	}
	ne.lastUsed = now
	r := m.newReq()
	r.id, r.name, r.nid, r.deadline, r.size = id, name, nid, deadline, size
	m.reqs[id] = r
	m.setTimer(deadline) // a send that waits past its deadline is withdrawn
	if ne.legacyOOB && now.Before(ne.retryAt) {
		r.legacy, r.oob = true, true
		m.emit(mAction{kind: aOOB, req: id, name: name, legacy: true, deadline: deadline})
		return
	}
	if p := ne.peer; p != nil && len(ne.waiters) == 0 && ne.stragglers == 0 {
		m.enqueue(now, p, r, name)
		return
	}
	if len(ne.waiters) >= m.cfg.maxPendingSends {
		m.complete(id, sendErr(ErrBackpressure, name, "", fmt.Errorf("%d sends already wait for the handshake with %s", len(ne.waiters), name), false))
		return
	}
	ne.waiters = append(ne.waiters, id)
	if !ne.connecting && ne.stragglers == 0 {
		m.connectName(now, ne, nil)
	}
	m.waitUnknown(ne)
}

// enqueue queues r on its peer and posts what the peer's path allows.
func (m *peerMachine) enqueue(now time.Time, p *peerEntry, r *reqEntry, name string) {
	r.peer = p
	if p.holdFrom == noneHeld {
		p.holdFrom = r.id // the oldest with a superseded peer (oldestOf)
	}
	p.lastActive = now
	m.confirmPeer(p) // a peer we send to
	if len(p.waiters) >= m.cfg.maxPendingSends {
		m.complete(r.id, sendErr(ErrBackpressure, m.peerName(p), "",
			fmt.Errorf("%d sends already wait (max_pending_sends)", len(p.waiters)), false))
		return
	}
	p.waiters = append(p.waiters, r.id)
	m.flush(now, p, name)
}

// flush posts p's waiting sends on its path, drawing their seqs, as far as the window and
// the channel's send slots allow. Without a path it starts one.
func (m *peerMachine) flush(now time.Time, p *peerEntry, via string) {
	m.unpark(p)
	switch {
	case p.mode == modeOOB && (p.tokenOut != 0 || p.key.legacy != ""):
		// Without a token (a name refused for proof, the pair's own handshake still on its
		// way) an OOB notify would be refused: the sends wait for that handshake (below).
		for len(p.waiters) > 0 && (p.key.legacy != "" || !p.seqs.full()) && !m.heldBehind(p, p.waiters[0]) {
			r := m.reqs[m.popWaiter(p)]
			if r == nil {
				continue
			}
			if _, err := m.sizeCheck(p, r, nil); err != nil {
				m.complete(r.id, err)
				continue
			}
			m.sendOOB(p, r, false)
		}
	case p.ch != 0 && m.chans[p.ch].up:
		ce := m.chans[p.ch]
		if ce.legacy && p.oldInflight > 0 {
			return // the replaced channel's sends complete or come back first
		}
		for len(p.waiters) > 0 && p.inflight < m.cfg.maxPendingSends && (ce.legacy || !p.seqs.full()) && !m.heldBehind(p, p.waiters[0]) {
			r := m.reqs[m.popWaiter(p)]
			if r == nil {
				continue
			}
			if viaOOB, err := m.sizeCheck(p, r, ce); err != nil {
				if !viaOOB {
					m.complete(r.id, err)
					continue
				}
				m.sendOOB(p, r, true)
				if ce.legacy {
					return // the channel waits until it is answered (oldInflight)
				}
				continue
			}
			if r.seq == 0 && !ce.legacy {
				r.seq = p.seqs.draw()
			}
			m.post(p, r, ce)
		}
	default:
		if len(p.waiters) > 0 {
			m.connectPeer(now, p, via)
		}
	}
}

// sizeCheck says whether r is too large for p (the limit the peer announced: refused, on
// every path) or for ce, the channel it would be posted on (nil: over OOB): then it goes
// over OOB when fallback is on (viaOOB), else it is refused. Refused before a seq is drawn.
func (m *peerMachine) sizeCheck(p *peerEntry, r *reqEntry, ce *chanEntry) (viaOOB bool, err error) {
	switch {
	case p.maxNotify > 0 && r.size > p.maxNotify:
		return false, sendErr(ErrTooLarge, m.peerName(p), "", fmt.Errorf("name+msg %d bytes: above the peer's max_notify_size %d (this engine's is %d)",
			r.size, p.maxNotify, m.cfg.maxNotifySize), false)
	case ce == nil || ce.maxSize == 0 || r.size <= ce.maxSize:
		return false, nil
	case m.cfg.fallback:
		return true, errTooLargeForChannel
	}
	return false, sendErr(ErrTooLarge, m.peerName(p), pathName(true), fmt.Errorf("name+msg %d bytes: the ctrl channel carries at most %d "+
		"(one RECV buffer: the peer cannot reassemble fragments, being a Mooncake engine or having a RECV ring below %d), and OOB fallback is off",
		r.size, ce.maxSize, minFragmentRing), false)
}

// errTooLargeForChannel: a notify that goes over OOB because its channel cannot carry it.
var errTooLargeForChannel = errors.New("too large for the ctrl channel")

// minFragmentRing is the smallest RECV ring (MC_RDMA_NOTIFY_RECV_COUNT) with which twosided
// peers negotiate extensions, fragments among them (ctrlchannel's credit flow control).
const minFragmentRing = 3

// setChanLimit records the largest notify channel ch carries (the driver reads it off the
// connected channel).
func (m *peerMachine) setChanLimit(ch chanID, maxSize int) {
	if ce := m.chans[ch]; ce != nil {
		ce.maxSize = maxSize
	}
}

func (m *peerMachine) popWaiter(p *peerEntry) reqID {
	id := p.waiters[0]
	if len(p.waiters) == 1 {
		p.waiters = p.waiters[:0] // keeps its array: the next send appends without allocating
		return id
	}
	p.waiters = p.waiters[1:]
	return id
}

func (m *peerMachine) post(p *peerEntry, r *reqEntry, ce *chanEntry) {
	r.ch, r.oob = ce.id, false
	ce.postNo++
	r.postNo = ce.postNo
	p.inflight++
	m.inflight++
	p.sent++
	m.emit(mAction{kind: aPost, req: r.id, ch: ce.id, seq: r.seq, epoch: ce.epoch, deadline: r.deadline})
}

func (m *peerMachine) sendOOB(p *peerEntry, r *reqEntry, retry bool) {
	r.ch, r.oob = 0, true
	if p.key.legacy != "" {
		// A Mooncake peer: seq-less, in order on one OOB queue; nothing goes on a new
		// channel before these are answered.
		r.legacy = true
		p.oldInflight++
		m.emit(mAction{kind: aOOB, req: r.id, name: m.peerName(p), legacy: true, deadline: r.deadline})
		return
	}
	if r.seq == 0 {
		r.seq = p.seqs.draw()
	}
	if retry {
		m.stats.Fallbacks++
	}
	if p.paced() {
		m.park(p, r) // the peer answered busy: it waits its turn (machine_busy.go)
		return
	}
	m.emitOOB(p, r)
}

// cancel withdraws a send whose caller stopped waiting. A send not yet posted is
// completed with ErrTimeout (not delivered) and reports true; a posted one goes on (its
// outcome is unknown to the caller) and reports false.
func (m *peerMachine) cancel(now time.Time, id reqID, err error) bool {
	defer m.unhold(now)
	r := m.reqs[id]
	if r == nil {
		return false
	}
	if r.parked {
		m.withdrawParked(r, err)
		return true
	}
	if r.ch != 0 || r.oob {
		return false
	}
	drop := func(ws []reqID) []reqID {
		for i, w := range ws {
			if w == id {
				return append(ws[:i:i], ws[i+1:]...)
			}
		}
		return ws
	}
	if ne := m.names[r.name]; ne != nil {
		ne.waiters = drop(ne.waiters)
	}
	if r.peer != nil {
		r.peer.waiters = drop(r.peer.waiters)
	}
	m.complete(id, sendErr(ErrTimeout, r.name, "", err, false))
	return true
}

// unstraggle: r, a straggler, is answered (completed, or refused and sent again in the
// new pair); the last one of its name releases the name's waiters (releaseStragglers).
func (m *peerMachine) unstraggle(r *reqEntry) {
	if !r.straggler {
		return
	}
	r.straggler = false
	if ne := m.names[r.name]; ne != nil && ne.stragglers > 0 {
		ne.stragglers--
		if ne.stragglers == 0 {
			m.unheld = append(m.unheld, ne.name)
		}
	}
}

// releaseStragglers sends on what waited behind the stragglers of a name that has none
// left: to the new peer when the name leads to one, else through a new handshake.
func (m *peerMachine) releaseStragglers(now time.Time) {
	for len(m.unheld) > 0 {
		name := m.unheld[0]
		m.unheld = m.unheld[1:]
		ne := m.names[name]
		if ne == nil || ne.stragglers > 0 || len(ne.waiters) == 0 {
			continue
		}
		switch {
		case ne.peer != nil:
			p := ne.peer
			m.moveWaiters(ne, p)
			m.flush(now, p, name)
		case !ne.connecting:
			m.connectName(now, ne, nil)
		}
	}
	m.unheld = nil
}

// sendResult is the outcome of a post (ch != 0) or an OOB send of req. maybe says whether
// a failed attempt may have reached the peer; local says the failure is ours (a deadline,
// a size), not the path's, so no other path is tried.
func (m *peerMachine) sendResult(now time.Time, id reqID, err error, maybe, local bool) {
	r := m.reqs[id]
	if r == nil {
		return
	}
	defer m.unhold(now)
	defer m.releaseStragglers(now)
	p := r.peer
	onCh := r.ch
	paced := r.paced
	if paced {
		r.paced = false
		if p != nil {
			p.oobOut = max(p.oobOut-1, 0)
			// Whatever the outcome, the pair's parked notifies go as its pacing allows.
			defer func() { m.unpark(p); m.paceIdle(p) }()
		}
	}
	if r.oob && r.legacy && p != nil && p.oldInflight > 0 {
		p.oldInflight--
	}
	if onCh != 0 && p != nil {
		p.inflight--
		m.inflight--
		if ce := m.chans[onCh]; (ce == nil || ce.dropped) && p.oldInflight > 0 {
			p.oldInflight--
		}
	}
	r.ch, r.oob = 0, false
	if err != nil {
		r.tries.record(pathName(onCh != 0), err, maybe)
	}
	if err != nil && maybe {
		r.maybe = true
	}
	maybe = maybe || r.maybe
	if err == nil {
		if p != nil && !r.legacy && r.seq != 0 {
			p.seqs.resolve(r.seq)
		}
		if ce := m.chans[onCh]; ce != nil && p != nil {
			m.confirm(ce)
			m.confirmFences(p, ce, r.postNo)
		}
		m.complete(id, nil)
		if p != nil {
			if paced {
				m.oobAnswered(p)
			}
			p.lastActive = now
			m.flush(now, p, "")
		}
		return
	}
	kind := ErrPeerUnreachable
	if local {
		kind = ErrTimeout
	}
	var ke *kindError
	if errors.As(err, &ke) {
		kind = ke.kind
	}
	if p == nil || r.legacy {
		m.complete(id, r.tries.sendErr(kind, r.name, pathName(onCh != 0), err, maybe))
		return
	}
	// A refusal is the peer's answer (the notify is invalid there, or its seq was given
	// up): final for this seq; other failures are the path's and may be retried.
	retry := !local && !now.After(r.deadline) && !errors.Is(err, errGaveUp) && !errors.Is(err, ErrRejected)
	// A refusal of the token of a pair since renewed (a handshake gave us a new one while
	// this try was on its way) says nothing of the current pair: it must not be torn down.
	stale := p.staleRefusal(err, r.oobToken)
	if retry && r.straggler {
		// On its way to a pair its name no longer leads to, or one the peer renewed (it
		// forgot us and kept its session): its seq belongs to that pair, and the name's
		// other sends went back in line with new seqs. Not delivered, it joins them in send
		// order; maybe delivered, the caller learns "unknown" (below).
		if !r.maybe && m.rebind(now, p, r, stale) {
			return
		}
		retry = false
	}
	if retry && paced && errors.Is(err, errPeerBusy) {
		// Not delivered: it waits its turn, in seq order, for the peer's next answer.
		m.busyAnswer(now, p, r)
		return
	}
	if retry {
		if p.ch != 0 && p.ch != onCh && m.chans[p.ch].up {
			// Its channel was replaced, or OOB failed while a channel is up: the same seq
			// goes on the current channel. Towards a Mooncake peer it goes back in line,
			// in its place, so the order holds without a receive window.
			m.stats.Reposted++
			if m.chans[p.ch].legacy {
				i, _ := slices.BinarySearch(p.waiters, r.id)
				p.waiters = slices.Insert(p.waiters, i, r.id)
				m.flush(now, p, "")
				return
			}
			m.post(p, r, m.chans[p.ch])
			return
		}
		if stale && !r.maybe {
			// Sent again in the current pair, with its seq.
			m.sendOOB(p, r, false)
			return
		}
		if errors.Is(err, errRebind) && !r.maybe && m.rebind(now, p, r, false) {
			// The peer no longer knows this pair (it restarted, or forgot us): handshake
			// again and send the notify in the new pair. It was refused, so it was not
			// delivered — unless an earlier attempt may have landed at the engine that
			// went away: then the caller learns "unknown" rather than risk a duplicate.
			return
		}
		if onCh != 0 && m.cfg.fallback && (p.tokenOut != 0 || p.key.legacy != "") {
			m.sendOOB(p, r, true)
			return
		}
	}
	// Given up: the receiver is told, so it never waits for this seq.
	m.stats.GivenUp++
	if !local && errors.Is(kind, ErrPeerUnreachable) {
		// The path to p broke: its engine may be gone from its address, and another take
		// its place there. What is still with p may then be refused and sent again to
		// that one: it holds later sends to peers of p's port (supersede).
		m.supersede(p)
	}
	p.seqs.giveUp(r.seq)
	m.fence(p)
	m.complete(id, r.tries.sendErr(kind, m.peerName(p), pathName(onCh != 0), err, maybe))
	m.flush(now, p, "")
}

// errGaveUp marks a refusal that means the receiver gave the seq up (its gap timed out):
// not delivered, and never to be sent again under that seq.
var errGaveUp = errors.New("notify: the receiver gave this seq up")

// errRebind marks a refusal that means the peer does not know the pair any more.
var errRebind = errors.New("notify: the peer does not know this pair")

// staleRefusal reports whether err refused token, a token of p's pair that a handshake
// has since replaced: the refusal is about the old pair, not the current one.
func (p *peerEntry) staleRefusal(err error, token uint64) bool {
	return token != 0 && p.tokenOut != 0 && token != p.tokenOut && errors.Is(err, errRebind)
}

// rebind forgets that r's name leads to p, and sends r again through a new handshake.
// p's seq of r is given up (fenced in case p is still alive and merely forgot its token).
// stale: the refusal was of a token p has since replaced; the name keeps p and its
// current pair, and r goes back in line for it.
func (m *peerMachine) rebind(now time.Time, p *peerEntry, r *reqEntry, stale bool) bool {
	ne := m.names[r.name]
	if ne == nil {
		return false
	}
	if r.seq != 0 {
		p.seqs.giveUp(r.seq)
		r.seq = 0
	}
	m.unstraggle(r)
	r.peer = nil // not one of the stragglers marked below
	// A stale refusal leaves the current pair as it is.
	if ne.peer == p && !stale {
		m.releaseParked(p)      // refused in turn, as the name's other sends on their way to p
		ne.lost = p.key.session // its next handshake kept the pair's state (bind)
		m.supersede(p)
		m.unalias(p, r.name)
		ne.peer = nil
		for _, id := range p.waiters {
			if w := m.reqs[id]; w != nil && w.name == r.name {
				w.peer = nil
				ne.waiters = append(ne.waiters, id)
			}
		}
		p.waiters = slices.DeleteFunc(p.waiters, func(id reqID) bool { w := m.reqs[id]; return w == nil || w.peer == nil })
		p.tokenOut, p.tokenOutSure = 0, false
		// The name's other sends on their way to p are refused too, in any order.
		m.markStragglers(ne, nil)
	}
	i, _ := slices.BinarySearch(ne.waiters, r.id) // in send order (ids grow with each send)
	ne.waiters = slices.Insert(ne.waiters, i, r.id)
	m.waitUnknown(ne)
	if ne.stragglers > 0 {
		return true // releaseStragglers moves them on once the last straggler is answered
	}
	switch {
	case ne.peer != nil: // rebound meanwhile: the new pair takes it
		m.unheld = append(m.unheld, ne.name)
		m.releaseStragglers(now)
	case !ne.connecting:
		m.connectName(now, ne, nil)
	}
	return true
}

// kindError lets a driver say which sentinel a send failure is.
type kindError struct {
	kind  error
	cause error
}

func (k *kindError) Error() string { return k.cause.Error() }

func (k *kindError) Unwrap() []error { return []error{k.kind, k.cause} }

func pathName(channel bool) string {
	if channel {
		return "rdma_twosided"
	}
	return "oob"
}

// fence posts p's given-up ranges on its channel, or over OOB. A range counts as resolved
// only once the peer has it: on a channel when a later send completes, over OOB when the
// peer answers (fenceResult); a range whose fence may be lost is posted again.
func (m *peerMachine) fence(p *peerEntry) {
	if len(p.seqs.fences) == 0 {
		return
	}
	var ce *chanEntry
	if p.ch != 0 && m.chans[p.ch].up {
		ce = m.chans[p.ch]
	} else if p.tokenOut == 0 || !p.fenceAt.IsZero() {
		return // no path now (or backing off): the next channel, handshake or tick carries them
	}
	for _, r := range mergeRanges(p.seqs.takeFences()) {
		m.stats.FencesSent++
		a := mAction{kind: aFence, name: m.peerName(p), session: p.key.session, token: p.tokenOut,
			first: r.first, count: r.count, pair: p.pair}
		if ce != nil {
			a.ch = ce.id
			ce.fences = append(ce.fences, fenceRec{r: r, after: ce.postNo})
		}
		m.emit(a)
	}
}

// mergeRanges sorts rs and joins the ranges that touch, so that seqs given up one by one
// (parked notifies whose sends ended, fences refused and put back) go as few fences.
func mergeRanges(rs []seqRange) []seqRange {
	if len(rs) < 2 {
		return rs
	}
	slices.SortFunc(rs, func(a, b seqRange) int { return cmp.Compare(a.first, b.first) })
	out := rs[:1]
	for _, r := range rs[1:] {
		last := &out[len(out)-1]
		if r.first <= last.first+last.count {
			last.count = max(last.count, r.first+r.count-last.first)
			continue
		}
		out = append(out, r)
	}
	return out
}

// confirmFences resolves the fences posted on ce before the send numbered postNo, which
// completed.
func (m *peerMachine) confirmFences(p *peerEntry, ce *chanEntry, postNo uint64) {
	k := 0
	for _, f := range ce.fences {
		if f.after < postNo {
			p.seqs.fenced(f.r)
			continue
		}
		ce.fences[k] = f
		k++
	}
	ce.fences = ce.fences[:k]
}

// fenceResult is the peer's answer to a fence sent over OOB for the seqs of entry pair.
func (m *peerMachine) fenceResult(now time.Time, session, first, count, token, pair uint64, err error) {
	p := m.peers[peerKey{session: session}]
	if p == nil || p.pair != pair {
		// The entry was replaced since (restartPair: the peer had forgotten the pair and
		// both sides started its seqs over): the fence gave up seqs of the old pair, and
		// refenced on the new one it would skip the new pair's notifies of those numbers.
		return
	}
	if err == nil {
		p.seqs.fenced(seqRange{first, count})
		p.fenceWait = 0
		return
	}
	p.seqs.refence(seqRange{first, count})
	if p.staleRefusal(err, token) {
		// The token of a pair since renewed was refused: the current pair gets it now.
		m.fence(p)
		return
	}
	if errors.Is(err, errRebind) || now.Sub(p.lastActive) >= m.cfg.gapTimeout {
		// The peer does not know this pair any more (it restarted, or forgot us), or has
		// not answered for a gap timeout, by which its window gave these seqs up itself:
		// nobody waits for them. Resolved, so the entry can be pruned.
		for _, r := range p.seqs.takeFences() {
			p.seqs.fenced(r)
			m.stats.FencesDropped++
		}
		p.fenceAt, p.fenceWait = time.Time{}, 0
		return
	}
	if p.ch != 0 && m.chans[p.ch].up {
		m.fence(p) // on the channel
		return
	}
	// Refused over OOB (busy, a token the peer no longer knows, unreachable): sending it
	// again at once would be refused again, as fast as the peer answers. A busy peer is
	// taking notifies: its window holds later seqs behind these, so the wait stays short.
	p.fenceWait = min(max(2*p.fenceWait, m.cfg.fenceRetry), max(m.cfg.limitBackoff, m.cfg.fenceRetry))
	if errors.Is(err, errPeerBusy) {
		p.fenceWait = min(p.fenceWait, busyProbeMax)
	}
	if p.fenceAt.IsZero() {
		p.fenceAt = now.Add(p.fenceWait)
		m.setTimer(p.fenceAt)
	}
}
