// The peer machine's table (see peerMachine in machine.go): entries and their names,
// tokens, the room a new entry gets (unconfirmed entries are capped per address and evicted
// first), what a goodbye forgets, and how a peer is named in Stats.

package notify

import (
	"fmt"
	"net/netip"
	"slices"
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

// unusedPool tells apart the channels peers have not used (unconfirmed inbound channels)
// by how their handshake came: a first one (poolFirst), or one that returned the cookie of
// a "busy" refusal (poolCookie), which a flood that never reads replies cannot make. Each
// pool has its own caps, so such a flood filling the first leaves the second to newcomers.
type unusedPool uint8

const (
	poolFirst unusedPool = iota
	poolCookie
)

// unusedKey counts unconfirmed channels per pool and source address.
type unusedKey struct {
	from netip.Addr
	pool unusedPool
}

// unusedCap is how many unconfirmed channels one pool holds in all (max_unconfirmed), and
// unusedShare how many of them the handshakes of one address: a quarter of that or of
// max_channels, whichever is less.
func (m *peerMachine) unusedCap() int { return m.cfg.maxUnconfirmed }
func (m *peerMachine) unusedShare() int {
	return max(1, min(m.cfg.maxUnconfirmed, m.cfg.maxChannels)/4)
}

// unusedGrace is how long a new unconfirmed channel cannot be taken by another first
// handshake: half the connect timeout, the time its peer has to use it before it expires.
// A legitimate engine uses its channel within that (its first notify follows its
// handshake); a burst of them beyond the caps is answered busy, not churned.
func (m *peerMachine) unusedGrace() time.Duration { return m.cfg.connectTimeout / 2 }

// unused reports whether ce is an inbound channel its peer has not used (nor was it
// dropped): a handshake naming a QPN nobody owns makes one.
func unused(ce *chanEntry) bool {
	return ce != nil && ce.inbound && !ce.confirmed && !ce.dropped
}

// takeable reports whether the unused channel ce may close to make room: past its grace,
// or (strong: for a proven newcomer's peer entry) any of the first pool.
func (m *peerMachine) takeable(now time.Time, ce *chanEntry, strong bool) bool {
	return unused(ce) && (!now.Before(ce.born.Add(m.unusedGrace())) || (strong && ce.pool == poolFirst))
}

// evictable reports whether p may be forgotten to make room: unconfirmed, holding no send,
// seq or held notify, and no channel but one its peer has not used that may close
// (takeable; strong: for a proven newcomer).
func (m *peerMachine) evictable(now time.Time, p *peerEntry, strong bool) bool {
	if p.confirmed || !m.holdsNothing(p) {
		return false
	}
	for _, id := range [2]chanID{p.ch, p.inCh} {
		if ce := m.chans[id]; id != 0 && ce != nil && !ce.dropped && ce.peer == p && !m.takeable(now, ce, strong) {
			return false
		}
	}
	return true
}

// holdsNothing reports whether p holds no send, seq or held notify and no handshake of ours
// is on its way to it: forgetting it loses nothing.
func (m *peerMachine) holdsNothing(p *peerEntry) bool {
	return len(p.waiters) == 0 && p.inflight == 0 && p.oldInflight == 0 && p.win.held == 0 &&
		p.seqs.unresolved() == 0 && !m.connectingTo(p)
}

// evictOldest forgets the oldest evictable entry (made by a handshake from "from" when it
// is valid) and reports whether there was one.
func (m *peerMachine) evictOldest(now time.Time, from netip.Addr, strong bool) bool {
	var old *peerEntry
	for _, p := range m.peers {
		if (from.IsValid() && p.from != from) || !m.evictable(now, p, strong) {
			continue
		}
		if old == nil || p.born.Before(old.born) || (p.born.Equal(old.born) && p.pair < old.pair) {
			old = p
		}
	}
	if old == nil {
		return false
	}
	m.evictPeer(old)
	return true
}

// evictPeer forgets the evictable p; its channels (none of which its peer used) close.
func (m *peerMachine) evictPeer(p *peerEntry) {
	for _, id := range [2]chanID{p.ch, p.inCh} {
		if ce := m.chans[id]; id != 0 && ce != nil && !ce.dropped && ce.peer == p {
			m.evictChan(ce)
		}
	}
	m.forget(p.key, p)
	m.stats.PeersEvicted++
}

// evictChan closes ce, a channel its peer has not used, to make room. One being made is
// forgotten at once (finishInbound finds it gone and refuses the handshake); one that is up
// is drained and closed.
func (m *peerMachine) evictChan(ce *chanEntry) {
	m.stats.UnconfirmedEvicted++
	if !ce.up {
		m.dropChan(ce, true)
		return
	}
	m.dropChan(ce, false)
	m.emit(mAction{kind: aClose, ch: ce.id, err: fmt.Errorf("%w: the peer did not use the channel its handshake made within its grace, and a newer handshake needed its place", ErrPeerDead)})
}

// roomForUnused makes room for one more unused channel in pool, asked for by a handshake
// from "from" for the entry keep (nil: a new one): an address at its share gives up its
// oldest past its grace, and a pool at its cap the oldest past its grace of the address
// holding most. False: none could close (refused busy, nothing kept).
func (m *peerMachine) roomForUnused(now time.Time, from netip.Addr, pool unusedPool, keep *peerEntry) bool {
	if from.IsValid() && m.unusedBy[unusedKey{from, pool}] >= m.unusedShare() && !m.evictUnused(now, from, pool, keep) {
		return false
	}
	if m.unusedIn[pool] >= m.unusedCap() && !m.evictUnused(now, netip.Addr{}, pool, keep) {
		return false
	}
	return true
}

// evictUnused closes the oldest channel of pool past its grace, from "from" when it is
// valid, else of the address holding most, and reports whether there was one. Its entry
// goes with it when nothing else holds that.
func (m *peerMachine) evictUnused(now time.Time, from netip.Addr, pool unusedPool, keep *peerEntry) bool {
	var old *chanEntry
	for _, ce := range m.chans {
		if ce.pool != pool || (from.IsValid() && ce.from != from) || !m.takeable(now, ce, false) {
			continue
		}
		if old == nil {
			old = ce
			continue
		}
		n, o := m.unusedBy[unusedKey{ce.from, pool}], m.unusedBy[unusedKey{old.from, pool}]
		if n > o || (n == o && ce.id < old.id) {
			old = ce
		}
	}
	if old == nil {
		return false
	}
	if p := old.peer; p != nil && p != keep && m.peers[p.key] == p && m.evictable(now, p, false) {
		m.evictPeer(p)
	} else {
		m.evictChan(old)
	}
	return true
}

// roomForPeer makes room for a new peer entry (from: the handshake's address, when it is a
// peer's handshake; strong: a proven newcomer, which may take the place of an entry whose
// channel of the first pool is in its grace): an address at its share of unconfirmed
// entries gives up its oldest, and a full table its oldest unconfirmed one. A non-nil
// error refuses the entry; busy: unconfirmed channels in their grace hold the room, which
// frees by itself (they are used, or become takeable, or expire): ask again.
func (m *peerMachine) roomForPeer(now time.Time, from netip.Addr, strong bool) (busy bool, err error) {
	refuse := func(why string) (bool, error) {
		m.stats.PeersRefused++
		if m.unconfirmed > 0 {
			return true, fmt.Errorf("%w: max_peers: %s, some holding channels in their grace: ask again", ErrBackpressure, why)
		}
		return false, fmt.Errorf("%w: max_peers: %s", ErrLimit, why)
	}
	if from.IsValid() && m.unconfirmedBy[from] >= m.unconfirmedPerAddr() && !m.evictOldest(now, from, strong) {
		return refuse(fmt.Sprintf("%d unconfirmed peer entries from %s, the share of one address", m.unconfirmedBy[from], from))
	}
	if len(m.peers) >= m.cfg.maxPeers && !m.evictOldest(now, netip.Addr{}, strong) {
		return refuse(fmt.Sprintf("%d peers known, the limit", m.cfg.maxPeers))
	}
	return false, nil
}

// cookieTakes reports whether p, the entry of a session that returns our cookie (a handshake
// or an OOB notify), gives way to it: no handshake or notify proved p, it neither sent nor
// received a notify, and it holds nothing (no send, no channel it confirmed, no handshake
// of ours). Such an entry may have been made by a third party claiming the session after
// we refused the real peer busy and gave it the cookie; kept, it would refuse the cookie
// (it counts only when no entry stands), the peer's sends under it would be refused while
// the entry stands and accepted once it was evicted, and a seq refused before a later one
// was accepted leaves a gap the peer can no longer fence (docs/design.md). Letting the
// cookie take its place gives a claimant nothing it lacked: an unproved entry answers a
// handshake without proof anyway (replyLost). An entry made by a handshake that returned
// the cookie holds the cookie as a token, so the cookie never gets here for it.
func (m *peerMachine) cookieTakes(p *peerEntry) bool {
	return p != nil && !p.proved && !p.confirmed && !p.hasState() && m.holdsNothing(p)
}

// openRace reports whether a handshake without proof for a known session is the other half
// of a simultaneous open: its sender could not know our session when it sent, we learned
// its session from our own handshake moments ago, and nothing came from it since. That is
// the one window in which a third party claiming the session is accepted without proof.
func (m *peerMachine) openRace(now time.Time, p *peerEntry, hs inboundHS) bool {
	return hs.proof == 0 && p.bornActive && p.received == 0 && now.Sub(p.born) < m.cfg.connectTimeout
}

func (m *peerMachine) addTokenIn(p *peerEntry, t uint64) {
	if t == 0 || slices.Contains(p.tokenIn[:], t) {
		return
	}
	copy(p.tokenIn[1:], p.tokenIn[:])
	p.tokenIn[0] = t
}

func (m *peerMachine) tokenOK(p *peerEntry, t uint64) bool {
	return t != 0 && slices.Contains(p.tokenIn[:], t)
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

// peerGone: the engine behind name closed (its goodbye, which carried its session; 0 from
// a peer that does not say). Its pair is forgotten when nothing of it is in flight. A
// goodbye read after another engine took the name (a restart on the address, its
// handshake served first) is the old engine's: the name's pair is the new one's, and stays.
func (m *peerMachine) peerGone(now time.Time, name string, session uint64) {
	ne := m.names[name]
	if ne == nil || ne.peer == nil {
		return
	}
	p := ne.peer
	if session != 0 && p.key.session != session {
		m.stats.StaleByes++
		return
	}
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
	for _, p := range m.peersInOrder() {
		m.flushWindow(p)
	}
	var unknown error // for a send on its way (posted, or written over OOB) or one whose earlier try may have landed
	for _, id := range m.reqsInOrder() {
		r := m.reqs[id]
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
	for _, ce := range m.chansInOrder() {
		m.emit(mAction{kind: aClose, ch: ce.id, err: err})
	}
	clear(m.chans)
	m.channels, m.unconfirmed, m.connects, m.connectQ = 0, 0, 0, nil
	clear(m.unusedBy)
	m.unusedIn = [2]int{}
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
