// The peer machine's side of peers' handshakes (see peerMachine in machine.go): which
// channel of a pair wins, whether a handshake gets a channel, a session without one or a
// refusal, and what a channel's end or our own failure leaves behind.

package notify

import (
	"fmt"
	"net/netip"
	"time"
)

// wins reports whether channel a beats channel b of the same pair.
func wins(a, b *chanEntry) bool {
	if a.epoch != b.epoch {
		return a.epoch > b.epoch
	}
	return a.initiator > b.initiator
}

// adopt makes ce p's channel; a channel it replaces is drained and closed.
func (m *peerMachine) adopt(now time.Time, p *peerEntry, ce *chanEntry) {
	if p.ch != 0 && p.ch != ce.id {
		if old := m.chans[p.ch]; old != nil {
			for _, r := range m.reqs {
				if r.ch == old.id {
					p.oldInflight++
				}
			}
			m.dropChan(old, false)
			m.emit(mAction{kind: aClose, ch: old.id, err: errSuperseded})
		}
	}
	ce.up = true
	p.ch = ce.id
	p.mode = modeChannel
	p.epoch = max(p.epoch, ce.epoch)
	p.awaiting = time.Time{}
	p.retryAt = time.Time{}
	p.lastErr = nil
	p.lastActive = now
	m.fence(p)
}

// dropChan takes ce out of service. A channel that carried traffic stays known (forget
// false) until the driver reports it closed, so what its drain delivers still finds its
// peer.
func (m *peerMachine) dropChan(ce *chanEntry, forget bool) {
	if !ce.dropped {
		ce.dropped = true
		m.channels--
		if ce.inbound && !ce.confirmed {
			m.unusedGone(ce)
		}
		if p := ce.peer; p != nil && p.ch == ce.id {
			p.ch = 0
		}
	}
	ce.up = false
	if forget {
		if p := ce.peer; p != nil {
			for _, f := range ce.fences {
				p.seqs.refence(f.r)
			}
		}
		ce.fences = nil
		delete(m.chans, ce.id)
	}
}

// chanClosed: channel ch ended (an error, the peer's goodbye, our close). Its pending
// sends were reported through sendResult before.
func (m *peerMachine) chanClosed(now time.Time, ch chanID, err error) {
	defer m.unhold(now)
	ce := m.chans[ch]
	if ce == nil {
		return
	}
	p := ce.peer
	m.dropChan(ce, true)
	if p != nil {
		m.fence(p)
	}
	if p != nil && p.ch == 0 {
		p.lastErr = err
		if len(p.waiters) > 0 {
			m.flush(now, p, "")
		}
	}
}

// inboundHS is a peer's handshake request.
type inboundHS struct {
	name    string // the name it advertised
	session uint64 // 0: a Mooncake peer
	token   uint64 // the token it issues us
	proof   uint64 // the token we issued it before (0: none)
	epoch   uint64
	ctrl    bool // it offers a ctrl channel
	// maxNotify: its max_notify_size (ts_max_notify; 0: not said)
	maxNotify int
	from      netip.Addr // where the handshake came from (zero: unknown)
}

// inboundReply is the machine's answer to a handshake request.
type inboundReply struct {
	refuse string
	err    error
	ch     chanID // accept with a channel: the driver creates and connects it, then calls inboundUp
	token  uint64 // the token we issue the peer
	epoch  uint64
	fresh  bool // our state for the pair starts at 1 (ts_fresh; see inbound)
}

// replyLost reports whether hs, a handshake without proof of a session we know, may be
// one whose earlier reply never reached its sender (the connection cut after we made the
// pair, before our answer): the peer never showed it holds our token, so it may not, and
// it is answered again with that token instead of refused for ever. Once the peer has
// proved the pair, a handshake must prove it too: nobody else takes the pair over.
func replyLost(p *peerEntry, hs inboundHS) bool {
	return hs.proof == 0 && !p.proved
}

// inbound decides a peer's handshake request.
func (m *peerMachine) inbound(now time.Time, hs inboundHS) inboundReply {
	defer m.unhold(now)
	if hs.session == 0 {
		return m.inboundLegacy(now, hs)
	}
	key := peerKey{session: hs.session}
	p := m.peers[key]
	proven := p != nil && m.tokenOK(p, hs.proof) // a pair we know, proving its token
	if proven {
		p.proved = true
	}
	if !proven && hs.proof != 0 && m.cookieTakes(p) && hs.proof == m.cookie(hs.session, hs.name) {
		// Our cookie, returned for an entry nobody has used: it gives way (cookieTakes).
		m.evictPeer(p)
		p = nil
	}
	if p != nil && p.tokenIn[0] != 0 && !proven && !m.openRace(now, p, hs) && !replyLost(p, hs) {
		m.stats.AuthRefused++
		return inboundReply{refuse: refuseAuth, err: fmt.Errorf("%w: ts_proof: session %x is known here and the proof does not match", ErrAuth, hs.session)}
	}
	// A handshake of a session we do not know that returns the cookie of our "busy"
	// refusal: it got our reply at the address it names, and asks again.
	cookied := p == nil && hs.proof != 0 && hs.proof == m.cookie(hs.session, hs.name)
	pool := poolFirst
	if cookied {
		pool = poolCookie
	}
	if hs.ctrl && m.cfg.channels && !proven && hs.session != m.local && !m.roomForUnused(now, hs.from, pool, p) {
		// Its pool's channels that peers have not used are at their cap (of its address or
		// in all), none past its grace: refused, keeping nothing. The cookie lets it ask
		// again in the other pool, which a flood that never reads replies cannot fill.
		m.stats.UnconfirmedRefused++
		rep := inboundReply{refuse: refuseBusy, err: m.unusedBusy(hs.from, pool)}
		if p == nil {
			rep.token = m.cookie(hs.session, hs.name)
		}
		return rep
	}
	// fresh: our state for the pair starts at 1 (ts_fresh), so a dialer that kept state for
	// it restarts the pair (bind). An entry made here is; so is one no handshake has proved
	// and that neither sent nor received a notify: a handshake without proof (not proven)
	// comes from an engine that holds no token of it, so it has never used the entry, and
	// what it kept is of a pair we forgot. Such an entry may have been made by a third
	// party claiming the session (it is answered, replyLost) after our entry for the real
	// peer went: a reply saying "not fresh" would have the peer go on with seqs our window
	// does not expect, held there until the gap timeout.
	fresh := p != nil && !proven && !p.proved && !p.hasState()
	if p == nil {
		if busy, err := m.roomForPeer(now, hs.from, cookied); err != nil {
			if busy {
				// Unconfirmed entries in their grace fill the room: ask again (with the
				// cookie, which may take the place of one).
				return inboundReply{refuse: refuseBusy, token: m.cookie(hs.session, hs.name), err: err}
			}
			return inboundReply{refuse: refuseLimit, err: err}
		}
		if hs.ctrl && m.cfg.channels && m.channels >= m.cfg.maxChannels {
			// Refused, and nothing kept: the token is a cookie; a peer that uses it over OOB
			// gets its entry then (oobArrive).
			m.stats.ChannelsRefused++
			return inboundReply{refuse: refuseLimit, token: m.cookie(hs.session, hs.name),
				err: fmt.Errorf("%w: max_channels: %d channels open, the limit", ErrLimit, m.cfg.maxChannels)}
		}
		p = m.newPeer(now, key)
		m.setFrom(p, hs.from)
		fresh = true
		if hs.name != "" {
			p.names = append(p.names, hs.name)
		}
		if cookied {
			// The pair's token is a new one; the cookie stays valid beside it, so what the
			// peer sent over OOB under the cookie before this reply reached it lands in
			// this entry rather than being refused, or taking its place (cookieTakes).
			m.addTokenIn(p, hs.proof)
			m.addTokenIn(p, m.rand())
		}
	}
	p.lastActive = now
	switch {
	case proven:
		// It proved the pair, so it handshakes by a name it knows leads here, offering
		// the token it issues now: one it holds.
		p.tokenOut, p.tokenOutSure = hs.token, true
	case !p.tokenOutSure:
		p.tokenOut = hs.token
	}
	p.fenceAt = time.Time{} // a new token: refused fences may pass now
	if hs.maxNotify > 0 {
		p.maxNotify = hs.maxNotify
	}
	if hs.name != "" {
		p.adv = hs.name
	}
	m.fence(p) // seqs given up while the pair had no path (a rebind) now have one
	if p.tokenIn[0] == 0 {
		m.addTokenIn(p, m.rand())
	}
	if hs.name != "" {
		m.learnName(now, p, hs.name)
	}
	rep := inboundReply{token: p.tokenIn[0], epoch: p.epoch, fresh: fresh}
	if !m.cfg.channels || !hs.ctrl || hs.session == m.local {
		// A session without channel: the pair talks over OOB with seqs. So does this
		// engine with itself (a name of its own): both ends of one QP would be one peer's
		// two channels, and each would supersede the other.
		if p.ch == 0 {
			p.mode = modeOOB
		}
		if !m.cfg.channels {
			rep.refuse = refuseNoCtrl
		}
		m.flush(now, p, "")
		return rep
	}
	epoch := hs.epoch
	if epoch == 0 {
		epoch = p.epoch + 1
	}
	cand := &chanEntry{epoch: epoch, initiator: hs.session, peer: p}
	if p.ch != 0 {
		if cur := m.chans[p.ch]; cur != nil && !wins(cand, cur) {
			m.stats.Superseded++
			rep.refuse = refuseSuperseded
			return rep
		}
	}
	for _, ce := range m.chans {
		if ce.peer == p && !ce.up && !ce.dropped && !wins(cand, ce) {
			// Our own handshake to it is in flight and will win on both sides.
			m.stats.Superseded++
			rep.refuse = refuseSuperseded
			return rep
		}
	}
	if p.ch == 0 && m.channels >= m.cfg.maxChannels {
		m.stats.ChannelsRefused++
		rep.refuse = refuseLimit
		rep.err = fmt.Errorf("%w: max_channels: %d channels open, the limit", ErrLimit, m.cfg.maxChannels)
		return rep
	}
	m.nextChan++
	m.channels++
	cand.id = m.nextChan
	if proven {
		cand.inbound, cand.confirmed = true, true // its peer proved the pair: a real QP
	} else {
		m.addUnconfirmed(now, cand, hs.from, pool)
	}
	p.inCh = cand.id
	m.chans[cand.id] = cand
	rep.ch = cand.id
	rep.epoch = epoch
	return rep
}

func (m *peerMachine) addUnconfirmed(now time.Time, ce *chanEntry, from netip.Addr, pool unusedPool) {
	ce.inbound, ce.born, ce.from, ce.pool = true, now, from, pool
	m.unconfirmed++
	m.unusedIn[pool]++
	m.unusedBy[unusedKey{from, pool}]++
	m.setTimer(now.Add(m.cfg.connectTimeout))
}

// unusedBusy is the error of a handshake refused busy for want of room for an unused
// channel in pool (roomForUnused).
func (m *peerMachine) unusedBusy(from netip.Addr, pool unusedPool) error {
	where := ""
	if from.IsValid() {
		where = fmt.Sprintf(", %d of them from %s (its share: %d)", m.unusedBy[unusedKey{from, pool}], from, m.unusedShare())
	}
	return fmt.Errorf("%w: max_unconfirmed: %d channels handshaken and not yet used by their peers%s, none past its grace; ask again",
		ErrBackpressure, m.unusedIn[pool], where)
}

// unusedGone takes an unconfirmed inbound channel out of the counts (it was used, or
// dropped).
func (m *peerMachine) unusedGone(ce *chanEntry) {
	m.unconfirmed--
	m.unusedIn[ce.pool]--
	k := unusedKey{ce.from, ce.pool}
	if m.unusedBy[k]--; m.unusedBy[k] <= 0 {
		delete(m.unusedBy, k)
	}
}

// confirm marks ce used by its peer.
func (m *peerMachine) confirm(ce *chanEntry) {
	if ce.peer != nil {
		m.confirmPeer(ce.peer) // it used the channel
		if ce.inbound {
			ce.peer.proved = true // it had our reply, which described the channel
		}
	}
	if ce.inbound && !ce.confirmed {
		ce.confirmed = true
		if !ce.dropped {
			m.unusedGone(ce)
		}
	}
}

// learnName makes the advertised name an alias of p, taking over sends waiting on it.
func (m *peerMachine) learnName(now time.Time, p *peerEntry, name string) {
	ne := m.names[name]
	if ne == nil {
		if len(m.names) >= m.cfg.maxNames {
			return
		}
		ne = &nameEntry{name: name, lastUsed: now}
		m.names[name] = ne
	}
	if ne.peer != p {
		old := ne.peer
		if old != nil {
			m.leave(ne, old, p)
		}
		ne.peer = p
		if old != nil {
			m.markStragglers(ne, p) // its sends on their way to old are refused there
		}
	}
	if ne.connecting {
		// Our own handshake to this name is on its way with ne.token: the peer may use it
		// before our reply arrives (a simultaneous open).
		m.addTokenIn(p, ne.token)
	}
	m.alias(p, name)
	m.hintPort(now, name, p)
	m.moveWaiters(ne, p) // in their order, ahead of any later send to the name
}

func (m *peerMachine) inboundLegacy(now time.Time, hs inboundHS) inboundReply {
	if hs.name == "" {
		return inboundReply{refuse: refuseInvalid, err: fmt.Errorf("%w: local_nic_path: empty, no peer name", ErrInvalid)}
	}
	if !m.cfg.channels || !hs.ctrl {
		return inboundReply{refuse: refuseNoCtrl, err: fmt.Errorf("%w: this engine has no ctrl channel", ErrNoCtrlChannel)}
	}
	key := peerKey{legacy: hs.name}
	p := m.peers[key]
	if !m.roomForUnused(now, hs.from, poolFirst, p) {
		m.stats.UnconfirmedRefused++
		return inboundReply{refuse: refuseBusy, err: m.unusedBusy(hs.from, poolFirst)}
	}
	fresh := false
	if p == nil {
		if m.channels >= m.cfg.maxChannels {
			m.stats.ChannelsRefused++
			return inboundReply{refuse: refuseLimit, err: fmt.Errorf("%w: max_channels: %d channels open, the limit", ErrLimit, m.cfg.maxChannels)}
		}
		if busy, err := m.roomForPeer(now, hs.from, false); err != nil {
			if busy {
				return inboundReply{refuse: refuseBusy, err: err}
			}
			return inboundReply{refuse: refuseLimit, err: err}
		}
		p = m.newPeer(now, key)
		m.setFrom(p, hs.from)
		fresh = true
		p.names = append(p.names, hs.name)
		p.adv = hs.name
		if ne := m.names[hs.name]; ne == nil && len(m.names) < m.cfg.maxNames {
			m.names[hs.name] = &nameEntry{name: hs.name, peer: p, lastUsed: now}
		} else if ne != nil && ne.peer == nil {
			ne.peer = p
			if !ne.connecting {
				m.moveWaiters(ne, p)
			}
		}
	} else if p.ch == 0 && m.channels >= m.cfg.maxChannels {
		m.stats.ChannelsRefused++
		return inboundReply{refuse: refuseLimit, err: fmt.Errorf("%w: max_channels: %d channels open, the limit", ErrLimit, m.cfg.maxChannels)}
	}
	// A Mooncake peer's latest channel is the one it uses.
	p.epoch++
	m.nextChan++
	m.channels++
	ce := &chanEntry{id: m.nextChan, epoch: p.epoch, initiator: 0, peer: p, legacy: true}
	m.addUnconfirmed(now, ce, hs.from, poolFirst)
	m.chans[ce.id] = ce
	p.inCh = ce.id
	return inboundReply{ch: ce.id, epoch: p.epoch, fresh: fresh}
}

// inboundUp: the channel of an accepted handshake is connected (err nil) or could not be
// (err: it is forgotten, and the reply carries the error).
func (m *peerMachine) inboundUp(now time.Time, ch chanID, err error) {
	defer m.unhold(now)
	ce := m.chans[ch]
	if ce == nil {
		return
	}
	if err != nil {
		m.dropChan(ce, true)
		return
	}
	p := ce.peer
	if p.ch != 0 && p.ch != ch {
		if cur := m.chans[p.ch]; cur != nil && !ce.legacy && !wins(ce, cur) {
			m.dropChan(ce, false)
			m.emit(mAction{kind: aClose, ch: ch, err: errSuperseded})
			return
		}
	}
	m.adopt(now, p, ce)
	m.flush(now, p, "")
}

// inboundFailed: our side of the channel a peer's handshake asked for could not be made
// (a QP, a CQ, an fd, a verbs call). The channel goes; an entry this handshake made (fresh)
// goes too, so a failing handshake leaves nothing behind, and the peer gets a cookie
// (as for max_channels): its first OOB notify with it makes the entry (oobArrive). An entry
// that existed keeps its token. It returns the token for the refusal.
func (m *peerMachine) inboundFailed(now time.Time, ch chanID, fresh bool, hs inboundHS) uint64 {
	defer m.unhold(now)
	ce := m.chans[ch]
	if ce == nil {
		return 0
	}
	p := ce.peer
	m.dropChan(ce, true)
	if p == nil {
		return 0
	}
	if fresh && !p.hasState() && len(p.waiters) == 0 && p.inflight == 0 && !m.connectingTo(p) {
		m.forget(p.key, p)
		return m.cookie(hs.session, hs.name)
	}
	return p.tokenIn[0]
}
