// The peer machine's order across names (see peerMachine in machine.go): sends are ordered
// per pair of engines, whatever names they went to. A name's first sends wait for its
// handshake, which tells which engine it leads to; meanwhile a later send to a known peer
// the name may lead to waits too, so that its seq is not drawn before theirs.

package notify

import (
	"strings"
	"time"
)

// waitUnknown notes that ne, a name whose engine is not known yet, holds sends (its first
// handshake is on its way, or waits for a slot): later sends to any peer it may lead to
// wait behind them (heldBehind).
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

// unknownWaits reports whether ne's sends hold back later sends to the peers it may lead
// to: its engine is not known, and its first handshake (none failed in a row) is on its
// way or waits for a slot, or the engine there refused the pair the name led to and the
// name's next handshake has not ended (rebound: its sends, refused, go again in the pair
// that handshake finds, and later sends to another name of that engine must not draw
// their seqs there first). A name whose handshakes fail holds nothing: a dead engine must
// not stall the live ones for as long as it is retried.
func (m *peerMachine) unknownWaits(ne *nameEntry) bool {
	return ne != nil && ne.peer == nil && len(ne.waiters) > 0 &&
		(ne.rebound || (ne.failures == 0 && ne.stragglers == 0 && (ne.connecting || ne.queued)))
}

// heldBehind reports whether the send id, next in line for p, must wait: an older send
// waits for the handshake of a name that may lead to p. Names that no longer hold anything
// leave the list here.
func (m *peerMachine) heldBehind(p *peerEntry, id reqID) bool {
	if len(m.unknown) == 0 || p.key.legacy != "" {
		return false // a Mooncake peer is keyed by its name: no other name leads to it
	}
	held, k := false, 0
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
