// The peer machine's order across names (see peerMachine in machine.go): sends are ordered
// per pair of engines, whatever names they went to. A name's first sends wait for its
// handshake, which tells which engine it leads to; meanwhile a later send to a known peer
// the name may lead to waits too, so that its seq is not drawn before theirs.

package notify

import (
	"strings"
	"time"
)

// waitUnknown notes that ne holds sends (unknownWaits): later sends to any peer it may lead
// to wait behind them (heldBehind). Called wherever a name may start to hold.
func (m *peerMachine) waitUnknown(ne *nameEntry) {
	if !m.unknownWaits(ne) {
		return
	}
	for _, n := range m.unknown {
		if n == ne.name {
			return
		}
	}
	m.unknown = append(m.unknown, ne.name)
}

// unknownWaits reports whether ne's waiting sends hold back later sends to the peers it may
// lead to: sends wait on a name while its engine is not known (its handshake is on its
// way, waits for a slot or for its backoff), and while the name's stragglers are answered
// (then they join its peer, in send order); either way they may draw seqs in the pair of
// a peer the name may lead to, after later sends that did not wait. A name whose last
// handshake found nobody there holds nothing (a dead engine must not stall the live ones
// for as long as it is retried) until an engine answers on its port (hinted).
func (m *peerMachine) unknownWaits(ne *nameEntry) bool {
	if ne == nil || len(ne.waiters) == 0 {
		return false
	}
	return ne.peer != nil || ne.stragglers > 0 || !ne.unreachable || ne.hinted
}

// heldBehind reports whether the send id, next in line for p, must wait: an older send
// waits for the handshake of a name that may lead to p, or is still with an engine that
// went away from a name that may lead to p (superseded). Names and peers that no longer
// hold anything leave their lists here.
func (m *peerMachine) heldBehind(p *peerEntry, id reqID) bool {
	if (len(m.unknown) == 0 && len(m.superseded) == 0) || p.key.legacy != "" {
		return false // a Mooncake peer is keyed by its name: no other name leads to it
	}
	held := m.heldBySuperseded(p, id)
	k := 0
	for _, n := range m.unknown {
		ne := m.names[n]
		if !m.unknownWaits(ne) {
			continue
		}
		m.unknown[k] = n
		k++
		if !held && ne.waiters[0] < id && mayLeadTo(n, p) { // waiters are in send order
			held = true
		}
	}
	clear(m.unknown[k:])
	m.unknown = m.unknown[:k]
	if held && !p.held {
		p.held = true
		m.held = append(m.held, p)
	}
	return held
}

// hintPort: an engine at p answered a handshake via name. The names that may lead to it
// (its port) whose last handshakes found nobody are hinted: their next handshake goes at
// once, not after their backoff, and their sends hold later sends to p until it ends, as a
// new name's do. Those with sends waiting try now. So an engine restarted at an address is
// reached by all its names at once, and their waiting sends keep their order.
func (m *peerMachine) hintPort(now time.Time, name string, p *peerEntry) {
	for _, ne := range m.namesInOrder() {
		if m.names[ne.name] != ne || ne.name == name || !ne.unreachable || !mayLeadTo(ne.name, p) {
			continue
		}
		ne.hinted = true
		ne.hintedOut = ne.connecting
		switch {
		case ne.connecting || ne.queued || ne.stragglers > 0:
		case ne.peer == nil && len(ne.waiters) > 0:
			m.connectName(now, ne, nil)
		case ne.peer != nil && ne.peer != p && len(ne.peer.waiters) > 0:
			m.connectPeer(now, ne.peer, ne.name)
		}
		m.waitUnknown(ne)
	}
}

// supersede notes that q's engine went away from at least one of its names (the name now
// leads to another engine, or the engine there refused q's pair): q's sends not yet
// answered (on their way, parked or waiting) may be refused and sent again to the engine
// that took its place, so later sends to a peer that q's names may lead to wait until
// they are answered or moved (heldBehind), and the new pair's seqs are drawn in send
// order whichever name each send went to.
func (m *peerMachine) supersede(q *peerEntry) {
	if q == nil || q.key.legacy != "" {
		return
	}
	q.holdFrom = 0 // found again (heldBySuperseded)
	if !q.superseded {
		q.superseded = true
		m.superseded = append(m.superseded, q)
	}
}

// heldBySuperseded reports whether a send of a superseded peer other than p, older than id,
// is still unanswered and may lead to p. Peers with no send left and no name leading to
// them leave the list (a name that still does may bring sends to it).
func (m *peerMachine) heldBySuperseded(p *peerEntry, id reqID) bool {
	held, k := false, 0
	for _, q := range m.superseded {
		oldest := m.oldestOf(q)
		if oldest == 0 && !m.named(q) {
			q.superseded = false
			continue
		}
		m.superseded[k] = q
		k++
		if !held && q != p && oldest != 0 && oldest < id && peersMayMeet(q, p) {
			held = true
		}
	}
	clear(m.superseded[k:])
	m.superseded = m.superseded[:k]
	return held
}

// oldestOf is the oldest send still with q (0: none), kept in q.holdFrom until it leaves q
// (noneHeld: q had none, until one joins it, in enqueue): sends join q later than the ones
// it has, and handOver clears it when it hands q older ones.
func (m *peerMachine) oldestOf(q *peerEntry) reqID {
	switch r := m.reqs[q.holdFrom]; {
	case q.holdFrom == noneHeld:
		return 0
	case q.holdFrom != 0 && r != nil && r.peer == q:
		return q.holdFrom
	}
	q.holdFrom = noneHeld
	for id, r := range m.reqs {
		if r.peer == q && (q.holdFrom == noneHeld || id < q.holdFrom) {
			q.holdFrom = id
		}
	}
	if q.holdFrom == noneHeld {
		return 0
	}
	return q.holdFrom
}

// noneHeld in peerEntry.holdFrom: no send is with the peer.
const noneHeld = ^reqID(0)

// named reports whether a name leads to q.
func (m *peerMachine) named(q *peerEntry) bool {
	for _, n := range q.names {
		if ne := m.names[n]; ne != nil && ne.peer == q {
			return true
		}
	}
	return false
}

// peersMayMeet reports whether a name of q may lead to p (its port: mayLeadTo).
func peersMayMeet(q, p *peerEntry) bool {
	if q.adv != "" && mayLeadTo(q.adv, p) {
		return true
	}
	for _, n := range q.names {
		if mayLeadTo(n, p) {
			return true
		}
	}
	return len(q.names) == 0 && q.adv == ""
}

// unhold sends on what waited behind names whose handshakes have ended since (bound to a
// peer, failed, or their sends gone). Called at the end of every event that can end one.
func (m *peerMachine) unhold(now time.Time) {
	if len(m.held) == 0 {
		return
	}
	held := m.held
	m.held = m.heldSpare[:0]
	for _, p := range held {
		p.held = false
		if m.peers[p.key] == p && len(p.waiters) > 0 {
			m.flush(now, p, "") // held again (heldBehind) when a name still holds it
		}
	}
	clear(held)
	m.heldSpare = held[:0]
}

// mayLeadTo reports whether name may be one of p's names: it has the port of one of them
// (an engine has one OOB listener; "localhost:P", "127.0.0.1:P" and the host name with P
// are one engine). A peer without a name is taken to be anyone's.
func mayLeadTo(name string, p *peerEntry) bool {
	port := portOf(name)
	if len(p.names) == 0 && p.adv == "" {
		return true
	}
	if p.adv != "" && portOf(p.adv) == port {
		return true
	}
	for _, n := range p.names {
		if portOf(n) == port {
			return true
		}
	}
	return false
}

// portOf is the port of a host:port name (all of it when it has no colon).
func portOf(name string) string {
	return name[strings.LastIndexByte(name, ':')+1:]
}
