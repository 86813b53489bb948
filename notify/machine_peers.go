// The peer machine's table (see peerMachine in machine.go): entries and their names,
// tokens, the room a new entry gets (unconfirmed entries are capped per address and evicted
// first, and so are the channels peers have not used), what a goodbye forgets, and how a
// peer is named in Stats.

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
// nothing (no send, seq or held notify) but channels its peer has not used, which close
// with it.
func (m *peerMachine) evictable(p *peerEntry) bool {
	return !p.confirmed && (p.ch == 0 || unused(m.chans[p.ch])) && len(p.waiters) == 0 && p.inflight == 0 && p.oldInflight == 0 &&
		p.win.held == 0 && p.seqs.unresolved() == 0 && !m.connectingTo(p)
}

// unused reports whether ce is an inbound channel its peer has not used (nor was it
// dropped): a handshake naming a QPN nobody owns makes one.
func unused(ce *chanEntry) bool {
	return ce != nil && ce.inbound && !ce.confirmed && !ce.dropped
}

// evictOldest forgets an evictable entry and reports whether there was one: the oldest made
// by a handshake from "from" when it is valid, else the oldest of the address holding the
// most unconfirmed entries (a flood from a few addresses gives up its own entries before a
// newcomer from another address loses its).
func (m *peerMachine) evictOldest(from netip.Addr) bool {
	var old *peerEntry
	for _, p := range m.peers {
		if (from.IsValid() && p.from != from) || !m.evictable(p) {
			continue
		}
		if old == nil || m.unconfirmedBy[p.from] > m.unconfirmedBy[old.from] ||
			(m.unconfirmedBy[p.from] == m.unconfirmedBy[old.from] && older(p, old)) {
			old = p
		}
	}
	if old == nil {
		return false
	}
	m.evictPeer(old)
	return true
}

// older reports whether entry p was made before q.
func older(p, q *peerEntry) bool {
	return p.born.Before(q.born) || (p.born.Equal(q.born) && p.pair < q.pair)
}

// evictPeer forgets the evictable p; its channels (none of which its peer used) close.
func (m *peerMachine) evictPeer(p *peerEntry) {
	for _, ce := range m.chans {
		if ce.peer == p && !ce.dropped {
			m.evictChan(ce)
		}
	}
	m.forget(p.key, p)
	m.stats.PeersEvicted++
}

// evictChan closes ce, a channel its peer has not used, to make room. One being made is
// forgotten at once (the driver holds it only once it is up: finishInbound finds it gone and
// refuses the handshake); one that is up is drained and closed.
func (m *peerMachine) evictChan(ce *chanEntry) {
	m.stats.UnconfirmedEvicted++
	if !ce.up {
		m.dropChan(ce, true)
		return
	}
	m.dropChan(ce, false)
	m.emit(mAction{kind: aClose, ch: ce.id, err: fmt.Errorf("%w: the peer never used the channel its handshake made, and a newer handshake needed its place", ErrPeerDead)})
}

// unusedPerAddr is how many channels their peers have not used the handshakes of one
// address may hold: a quarter of the cap in all.
func (m *peerMachine) unusedPerAddr() int { return max(1, m.cfg.maxUnconfirmed/4) }

// roomForUnused makes room for one more channel its peer has not used, asked for by a
// handshake from "from" for the entry keep (nil: a new one): an address at its share gives
// up its oldest, and a full cap the oldest of the address holding most. A channel goes with
// its entry when that is evictable (and not keep). It reports false when there was none to
// close (never while the counts hold: a count at its cap is of channels that can close).
func (m *peerMachine) roomForUnused(from netip.Addr, keep *peerEntry) bool {
	if from.IsValid() && m.unusedBy[from] >= m.unusedPerAddr() && !m.evictUnused(from, keep) {
		return false
	}
	if m.unconfirmed >= m.cfg.maxUnconfirmed && !m.evictUnused(netip.Addr{}, keep) {
		return false
	}
	return true
}

// evictUnused closes the oldest channel its peer has not used, from "from" when it is
// valid, else of the address holding most, and reports whether there was one.
func (m *peerMachine) evictUnused(from netip.Addr, keep *peerEntry) bool {
	var old *chanEntry
	for _, ce := range m.chans {
		if !unused(ce) || (from.IsValid() && ce.from != from) {
			continue
		}
		if old == nil || m.unusedBy[ce.from] > m.unusedBy[old.from] ||
			(m.unusedBy[ce.from] == m.unusedBy[old.from] && ce.id < old.id) {
			old = ce
		}
	}
	if old == nil {
		return false
	}
	if p := old.peer; p != nil && p != keep && m.evictable(p) && m.peers[p.key] == p {
		m.evictPeer(p)
	} else {
		m.evictChan(old)
	}
	return true
}

// roomForPeer makes room for a new peer entry (from: the handshake's address, when it is a
// peer's handshake): an address at its share of unconfirmed entries gives up its oldest,
// and a full table an unconfirmed one (evictOldest). A non-nil error refuses the entry.
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
	if ce := m.chans[p.ch]; p.ch != 0 && ce != nil {
		// Its channel goes too (drained first: what its NIC acknowledged is delivered).
		m.dropChan(ce, false)
		m.emit(mAction{kind: aClose, ch: ce.id, err: fmt.Errorf("%w: %s closed", ErrPeerDead, name)})
	}
	if len(p.waiters) == 0 && p.inflight == 0 && p.win.held == 0 && p.seqs.unresolved() == 0 && !m.connectingTo(p) {
		m.forget(p.key, p)
		m.stats.PeersPruned++
	}
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
	clear(m.unusedBy)
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
