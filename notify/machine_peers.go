// The peer machine's table (see peerMachine in machine.go): entries and their names,
// tokens, the room a new entry gets (unconfirmed entries are capped per address and evicted
// first), what a goodbye forgets, and how a peer is named in Stats.

package notify

import (
	"fmt"
	"net/netip"
	"time"
)

func (m *peerMachine) newPeer(now time.Time, key peerKey) *peerEntry {
	m.nextPair++
	p := &peerEntry{key: key, pair: m.nextPair, seqs: newSeqSpace(m.cfg.window), win: newRecvWindow(m.cfg.window, m.cfg.idCap), lastActive: now, born: now}
	if !m.cfg.channels {
		p.mode = modeOOB
	}
	m.peers[key] = p
	m.unconfirmedPeers++
	m.armPrune(now)
	return p
}

// unconfirmedPerAddr is how many unconfirmed peer entries the handshakes of one address
// may hold: a quarter of max_peers.
func (m *peerMachine) unconfirmedPerAddr() int { return max(1, m.cfg.maxPeers/4) }

// setFrom records where the handshake that made p came from.
func (m *peerMachine) setFrom(p *peerEntry, from netip.Addr) {
	if p.confirmed || !from.IsValid() || p.from.IsValid() {
		return
	}
	p.from = from
	m.unconfirmedBy[from]++
}

// confirmPeer marks p as proven to be its peer's (peerEntry.confirmed).
func (m *peerMachine) confirmPeer(p *peerEntry) {
	if p.confirmed {
		return
	}
	m.uncount(p)
	p.confirmed = true
}

// uncount takes an unconfirmed p out of the unconfirmed counts.
func (m *peerMachine) uncount(p *peerEntry) {
	if p.confirmed {
		return
	}
	m.unconfirmedPeers--
	if p.from.IsValid() {
		if m.unconfirmedBy[p.from]--; m.unconfirmedBy[p.from] <= 0 {
			delete(m.unconfirmedBy, p.from)
		}
	}
}

// evictable reports whether p may be forgotten to make room: unconfirmed, and holding
// nothing (no channel, send, seq or held notify).
func (m *peerMachine) evictable(p *peerEntry) bool {
	return !p.confirmed && p.ch == 0 && len(p.waiters) == 0 && p.inflight == 0 && p.oldInflight == 0 &&
		p.win.held == 0 && p.seqs.unresolved() == 0 && !m.connectingTo(p)
}

// evictOldest forgets the oldest evictable entry (made by a handshake from "from" when it
// is valid) and reports whether there was one.
func (m *peerMachine) evictOldest(from netip.Addr) bool {
	var old *peerEntry
	for _, p := range m.peers {
		if (from.IsValid() && p.from != from) || !m.evictable(p) {
			continue
		}
		if old == nil || p.born.Before(old.born) {
			old = p
		}
	}
	if old == nil {
		return false
	}
	m.forget(old.key, old)
	m.stats.PeersEvicted++
	return true
}

// roomForPeer makes room for a new peer entry (from: the handshake's address, when it is a
// peer's handshake): an address at its share of unconfirmed entries gives up its oldest,
// and a full table its oldest unconfirmed one. A non-nil error refuses the entry.
func (m *peerMachine) roomForPeer(from netip.Addr) error {
	if from.IsValid() && m.unconfirmedBy[from] >= m.unconfirmedPerAddr() && !m.evictOldest(from) {
		m.stats.PeersRefused++
		return fmt.Errorf("%w: max_peers: %d unconfirmed peer entries from %s, the share of one address", ErrLimit, m.unconfirmedBy[from], from)
	}
	if len(m.peers) >= m.cfg.maxPeers && !m.evictOldest(netip.Addr{}) {
		m.stats.PeersRefused++
		return fmt.Errorf("%w: max_peers: %d peers known, the limit", ErrLimit, m.cfg.maxPeers)
	}
	return nil
}

// openRace reports whether a handshake without proof for a known session is the other half
// of a simultaneous open: its sender could not know our session when it sent, we learned
// its session from our own handshake moments ago, and nothing came from it since. That is
// the one window in which a third party claiming the session is accepted without proof.
func (m *peerMachine) openRace(now time.Time, p *peerEntry, hs inboundHS) bool {
	return hs.proof == 0 && p.bornActive && p.received == 0 && now.Sub(p.born) < m.cfg.connectTimeout
}

func (m *peerMachine) addTokenIn(p *peerEntry, t uint64) {
	if t == 0 || p.tokenIn[0] == t || p.tokenIn[1] == t {
		return
	}
	p.tokenIn[1], p.tokenIn[0] = p.tokenIn[0], t
}

func (m *peerMachine) tokenOK(p *peerEntry, t uint64) bool {
	return t != 0 && (p.tokenIn[0] == t || p.tokenIn[1] == t)
}

func (m *peerMachine) anyConnecting() bool {
	for _, ne := range m.names {
		if ne.connecting {
			return true
		}
	}
	return false
}

func (m *peerMachine) connectingTo(p *peerEntry) bool {
	for _, n := range p.names {
		if ne := m.names[n]; ne != nil && ne.connecting {
			return true
		}
	}
	return false
}

// peerGone: the engine behind name closed (its goodbye). Its pair is forgotten when
// nothing of it is in flight.
func (m *peerMachine) peerGone(now time.Time, name string) {
	ne := m.names[name]
	if ne == nil || ne.peer == nil {
		return
	}
	p := ne.peer
	m.supersede(p) // what is still with it may be sent again to the engine that takes its place
	if ce := m.chans[p.ch]; p.ch != 0 && ce != nil {
		// Its channel goes too (drained first: what its NIC acknowledged is delivered).
		m.dropChan(ce, false)
		m.emit(mAction{kind: aClose, ch: ce.id, err: fmt.Errorf("%w: %s closed", ErrPeerDead, name)})
	}
	if len(p.waiters) == 0 && p.inflight == 0 && p.win.held == 0 && p.seqs.unresolved() == 0 && !m.connectingTo(p) && !m.namesHold(p) {
		m.forget(p.key, p)
		m.stats.PeersPruned++
	}
}

// namesHold reports whether a name of p holds sends (waiting for its stragglers): forgetting
// p would drop the name with them.
func (m *peerMachine) namesHold(p *peerEntry) bool {
	for _, n := range p.names {
		if ne := m.names[n]; ne != nil && ne.peer == p && (len(ne.waiters) > 0 || ne.stragglers > 0) {
			return true
		}
	}
	return false
}

// forget drops a peer entry and its names. Its sequence spaces go with it: a peer that
// comes back handshakes again and starts new ones.
func (m *peerMachine) forget(key peerKey, p *peerEntry) {
	m.uncount(p)
	for _, n := range p.names {
		if ne := m.names[n]; ne != nil && ne.peer == p {
			delete(m.names, n)
		}
	}
	delete(m.peers, key)
}

// statsName names p in Stats: an alias, else its session; a peer whose names went to
// another engine (it restarted on the same address) is not shown under that address.
func (m *peerMachine) statsName(p *peerEntry) string {
	if len(p.names) > 0 || p.key.legacy != "" {
		return m.peerName(p)
	}
	return fmt.Sprintf("session-%x", p.key.session)
}

// peerName is how p is named in notifies and errors: the name it advertised, else the
// first name it was reached by, else the name of its last handshake.
func (m *peerMachine) peerName(p *peerEntry) string {
	if len(p.names) > 0 {
		return p.names[0]
	}
	if p.adv != "" {
		return p.adv
	}
	if p.key.legacy != "" {
		return p.key.legacy
	}
	return fmt.Sprintf("session-%x", p.key.session)
}

// flushWindow delivers what p's window holds, in seq order, and gives its gaps up.
func (m *peerMachine) flushWindow(p *peerEntry) {
	p.win.flush(func(d Notify) {
		p.received++
		m.emit(mAction{kind: aDeliver, n: d})
	})
	m.heldDups(p)
}

// closeAll fails every waiting send and forgets every channel (the engine closes); what
// windows hold is delivered, gaps given up.
func (m *peerMachine) closeAll(err error) {
	for _, p := range m.peers {
		m.flushWindow(p)
	}
	var unknown error // for a send on its way (posted, or written over OOB) or one whose earlier try may have landed
	for id, r := range m.reqs {
		e := err
		if r.ch != 0 || r.oob || r.maybe {
			if unknown == nil {
				unknown = sendErr(ErrClosed, "", "", err, true)
			}
			e = unknown
		}
		m.emit(mAction{kind: aComplete, req: id, err: e})
	}
	clear(m.reqs)
	for id := range m.chans {
		m.emit(mAction{kind: aClose, ch: id, err: err})
	}
	clear(m.chans)
	m.channels, m.unconfirmed, m.connects, m.connectQ = 0, 0, 0, nil
	for _, p := range m.peers {
		p.ch, p.waiters, p.inflight = 0, nil, 0
		p.parked, p.oobOut, p.busyAt = nil, 0, time.Time{}
	}
	m.inflight = 0
}

// peerState names p's state for Stats.
func (m *peerMachine) peerState(p *peerEntry) string {
	switch {
	case p.ch != 0:
		return "up"
	case p.mode == modeOOB:
		return "oob"
	case m.connectingTo(p):
		return "connecting"
	case !p.awaiting.IsZero():
		return "awaiting-peer"
	}
	return "idle"
}
