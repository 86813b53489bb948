// The peer machine's arrivals (see peerMachine in machine.go): notifies and fences from a
// channel or over OOB, checked (session, token, seq) and delivered through the pair's
// receive window, once and in order.

package notify

import (
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// chanArrival is a notify that came on channel ch.
func (m *peerMachine) chanArrival(now time.Time, ch chanID, seq uint64, nid string, n Notify) {
	ce := m.chans[ch]
	if ce == nil || ce.peer == nil {
		return // a channel being closed: its drain is delivered by the channel's own entry
	}
	p := ce.peer
	p.lastActive = now
	m.confirm(ce)
	n.Peer = m.peerName(p)
	if ce.legacy || seq == 0 {
		m.stats.LegacyDelivered++
		p.received++
		m.emit(mAction{kind: aDeliver, n: n})
		return
	}
	if m.arrive(now, p, seq, nid, n) == arrDuplicate && p.win.takeGaveUp(seq) {
		// It came after its gap was given up, and its sender's SEND completed: it is
		// delivered, late and out of order, rather than lost (counted: Window.Late).
		p.received++
		m.emit(mAction{kind: aDeliver, n: n})
	}
}

func (m *peerMachine) arrive(now time.Time, p *peerEntry, seq uint64, nid string, n Notify) arrival {
	res := p.win.arrive(now, seq, nid, n, func(d Notify) {
		p.received++
		m.emit(mAction{kind: aDeliver, n: d})
	})
	m.heldDups(p)
	switch res {
	case arrDuplicate:
		p.dups++
		m.stats.Duplicates++
	case arrHeld:
		m.setTimer(p.win.gapDeadline(m.cfg.gapTimeout))
	}
	return res
}

// heldDups counts, as duplicates, the held notifies p's window dropped at release because
// another copy with the same id went first.
func (m *peerMachine) heldDups(p *peerEntry) {
	if d := p.win.takeHeldDupIDs(); d > 0 {
		p.dups += d
		m.stats.Duplicates += d
	}
}

// chanFence: the peer gave up [first, first+count) (a FENCE on channel ch).
func (m *peerMachine) chanFence(now time.Time, ch chanID, first, count uint64) {
	ce := m.chans[ch]
	if ce == nil || ce.peer == nil || ce.legacy {
		return
	}
	m.confirm(ce)
	m.skip(now, ce.peer, first, count)
}

func (m *peerMachine) skip(now time.Time, p *peerEntry, first, count uint64) {
	p.win.skip(now, first, count, func(d Notify) {
		p.received++
		m.emit(mAction{kind: aDeliver, n: d})
	})
	m.heldDups(p)
}

// oobArrival is a notify (or a fence) that came over OOB.
type oobArrival struct {
	session, token, to, seq, skipFrom, skipN uint64
	nid                                      string
	from                                     string
	n                                        Notify
}

// oobArrive decides an OOB notify: "" accepted (delivered, held, or a duplicate already
// delivered), else a refusal code for the reply.
func (m *peerMachine) oobArrive(now time.Time, a oobArrival) (string, error) {
	defer m.unhold(now)
	if a.session == 0 {
		// A Mooncake engine: no session, no seq; delivered as it comes.
		m.stats.LegacyDelivered++
		a.n.Peer = a.from
		m.emit(mAction{kind: aDeliver, n: a.n})
		return "", nil
	}
	if a.to != 0 && a.to != m.local {
		// The sender's pair is with this engine's predecessor: it must handshake again.
		m.stats.OOBRefused++
		return refuseAuth, fmt.Errorf("%w: ts_to: %x is not this engine's session (it restarted)", ErrAuth, a.to)
	}
	p := m.peers[peerKey{session: a.session}]
	if p == nil || !m.tokenOK(p, a.token) {
		var code string
		var err error
		if p, code, err = m.provenByToken(now, p, &a); code != "" {
			return code, err
		}
	}
	if p == nil || !m.tokenOK(p, a.token) {
		m.stats.OOBRefused++
		m.stats.AuthRefused++
		return refuseAuth, fmt.Errorf("%w: ts_token: no handshake of session %x with this engine issued it", ErrAuth, a.session)
	}
	p.lastActive = now
	m.confirmPeer(p) // it used the pair's token
	p.proved = true
	if a.skipN > 0 {
		m.skip(now, p, a.skipFrom, a.skipN)
	}
	if a.seq == 0 {
		return "", nil
	}
	a.n.Peer = m.peerName(p)
	switch m.arrive(now, p, a.seq, a.nid, a.n) {
	case arrRefused:
		m.stats.OOBRefused++
		return refuseBusy, fmt.Errorf("%w: ts_seq %d is beyond the receive window", ErrBackpressure, a.seq)
	case arrDuplicate:
		if p.win.gaveUp(a.seq) {
			// Its gap timed out before it came: it was not delivered, and never will be.
			m.stats.OOBRefused++
			return refuseStale, fmt.Errorf("%w: ts_seq %d came after its gap was given up", ErrRejected, a.seq)
		}
	}
	return "", nil
}

// provenByToken applies the two proofs an OOB notify's token can carry for a pair this
// engine does not hold, or not with that token: the cookie of a max_channels refusal
// (inbound), or the token of our own handshake still in flight (offer: the sender answered
// it, nobody else has seen it, and it sends before its reply reached us). The latter opens
// only a session we do not know yet or the one its name already leads to, so the engine at
// that name cannot speak for another peer's session. It returns p, or the entry it made;
// a non-empty code refuses the notify (max_peers), or asks for it again (busy): the token
// is that of our handshake to a name that may be another of p's names (its port), whose
// reply is not here yet. Both engines opened at once, each reaching the other by a name
// the other does not know as its own yet: the reply, on its way, tells whether the name
// is p's (the token becomes the pair's) or not (refused then). Refused now, the sender
// would take the pair for forgotten and start it over, and its sends under this name
// would go after later ones under another (docs/design.md, the delivery contract).
func (m *peerMachine) provenByToken(now time.Time, p *peerEntry, a *oobArrival) (*peerEntry, string, error) {
	if a.token == 0 {
		return p, "", nil
	}
	cookie := (p == nil || m.cookieTakes(p)) && a.token == m.cookie(a.session, a.from)
	if cookie && p != nil {
		m.evictPeer(p) // an entry nobody has used gives way to our cookie (cookieTakes)
		p = nil
	}
	name, offered := m.offered[a.token]
	if offered && p != nil && p.adv != name && !slices.Contains(p.names, name) {
		if ne := m.names[name]; ne != nil && ne.connecting && ne.token == a.token && ne.peer == nil && mayLeadTo(name, p) {
			m.stats.OOBRefused++
			return p, refuseBusy, fmt.Errorf("%w: ts_token: the handshake that issued it (to %s) has no reply yet", ErrBackpressure, name)
		}
		offered = false
	}
	if !cookie && !offered {
		return p, "", nil
	}
	if p == nil {
		// Proven: it may take the place of an entry whose channel is in its grace.
		if busy, err := m.roomForPeer(now, netip.Addr{}, true); err != nil {
			m.stats.OOBRefused++
			if busy {
				return nil, refuseBusy, err
			}
			return nil, refuseLimit, err
		}
		p = m.newPeer(now, peerKey{session: a.session})
	}
	m.addTokenIn(p, a.token)
	if cookie {
		// Refused a channel: served over OOB, under the name it handshook with.
		p.mode = modeOOB
		if name = a.from; name != "" {
			p.names = append(p.names, name)
			p.adv = name
		}
	}
	if name != "" {
		m.learnName(now, p, name)
	}
	return p, "", nil
}
