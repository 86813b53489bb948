// The peer machine's handshakes (see peerMachine in machine.go): when to start one (the
// connect slots and the per-name backoff), and what its result means: a channel adopted, a
// pair over OOB, a refusal by code, a Mooncake peer, or a failure that backs off.

package notify

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/twosided/twosided/oob"
)

func (m *peerMachine) connectPeer(now time.Time, p *peerEntry, via string) {
	if via == "" || m.names[via] == nil || m.names[via].peer != p {
		via = ""
		for _, n := range p.names {
			// Only a name that still leads to p: one that now reaches another engine (p's
			// restarted at its address) would bind that engine again, and p's sends would
			// wait on p for ever.
			if ne := m.names[n]; ne != nil && ne.peer == p {
				via = n
				break
			}
		}
	}
	if via == "" {
		// No name leads to it any more (its names now reach another engine): what waits
		// for it cannot be sent.
		err := p.lastErr
		if err == nil {
			err = sendErr(ErrPeerUnreachable, m.peerName(p), "", errors.New("no name reaches this peer any more"), false)
		}
		m.failPeerWaiters(now, p, err)
		return
	}
	ne := m.names[via]
	if ne.connecting {
		return
	}
	for _, n := range p.names {
		if x := m.names[n]; x != nil && x.connecting {
			return
		}
	}
	if now.Before(p.awaiting) {
		return // the peer's own channel is on its way
	}
	m.connectName(now, ne, p)
}

// connectName starts our handshake via ne. p is the peer behind the name, when known. At
// most maxConnects run at once (each holds a channel with its RECVs posted): the rest wait
// in order for a slot, bounded by their sends' deadlines.
func (m *peerMachine) connectName(now time.Time, ne *nameEntry, p *peerEntry) {
	defer m.waitUnknown(ne) // its sends hold later ones to the peers it may lead to
	if p != nil && now.Before(p.retryAt) {
		m.failPeerWaiters(now, p, p.lastErr)
		return
	}
	if ne.failures > 0 && now.Before(ne.backoffAt) && !ne.hinted {
		m.backingOff(now, ne, p)
		return
	}
	if m.connects >= m.cfg.maxConnects {
		if !ne.queued {
			ne.queued = true
			m.connectQ = append(m.connectQ, ne.name)
			m.stats.ConnectsQueued++
		}
		return
	}
	ne.queued = false
	m.connects++
	ne.connecting = true
	act := mAction{kind: aConnect, name: ne.name}
	ne.kept = 0
	if p != nil && p.hasState() {
		ne.kept = p.key.session
	} else if p == nil {
		ne.kept = ne.lost // the pair the engine at the name refused: ours predates this handshake
	}
	ne.lost = 0
	if p != nil {
		act.epoch = p.epoch + 1
		act.session = p.key.session
		act.proof = p.tokenOut
		act.token = p.tokenIn[0]
	} else {
		act.epoch = 1
	}
	if act.token == 0 {
		act.token = m.rand()
	}
	ne.token = act.token
	m.offer(ne)
	if m.cfg.channels && (p == nil || p.mode == modeChannel) {
		if m.channels >= m.cfg.maxChannels {
			m.stats.ChannelsRefused++
			ne.connecting = false
			m.withdraw(ne)
			m.connects--
			err := sendErr(ErrLimit, ne.name, "rdma_twosided", fmt.Errorf("max_channels: %d channels open, the limit", m.cfg.maxChannels), false)
			m.failName(now, ne, err)
			return
		}
		m.nextChan++
		m.channels++
		act.ch = m.nextChan
		m.chans[act.ch] = &chanEntry{id: act.ch, name: ne.name, epoch: act.epoch, initiator: m.local, peer: p}
	}
	m.emit(act)
}

// offer records the token ne's handshake carries while it is in flight (withdraw ends
// it): the peer may use it before its reply reaches us (a simultaneous open, see
// oobArrive). Bounded by the handshakes in flight (maxConnects).
func (m *peerMachine) offer(ne *nameEntry) {
	if m.offered == nil {
		m.offered = make(map[uint64]string)
	}
	if len(m.offered) >= 2*m.cfg.maxConnects {
		m.pruneOffered()
	}
	m.offered[ne.token] = ne.name
}

// pruneOffered drops the tokens of handshakes that ended without a withdraw (their name
// entry went meanwhile).
func (m *peerMachine) pruneOffered() {
	for tok, name := range m.offered {
		if x := m.names[name]; x == nil || !x.connecting || x.token != tok {
			delete(m.offered, tok)
		}
	}
}

func (m *peerMachine) withdraw(ne *nameEntry) {
	if m.offered[ne.token] == ne.name {
		delete(m.offered, ne.token)
	}
}

// nextConnect starts queued handshakes while slots are free.
func (m *peerMachine) nextConnect(now time.Time) {
	for len(m.connectQ) > 0 && m.connects < m.cfg.maxConnects {
		name := m.connectQ[0]
		m.connectQ = m.connectQ[1:]
		ne := m.names[name]
		if ne == nil || !ne.queued || ne.connecting {
			continue
		}
		ne.queued = false
		p := ne.peer
		if len(ne.waiters) > 0 || (p != nil && len(p.waiters) > 0) {
			m.connectName(now, ne, p)
		}
	}
}

// Connect backoff bounds: the first retry waits 75-100 ms, each failure doubles it, up to
// 6-8 s. A peer that is down sees at most about 20 handshakes in its first minute from a
// sender that sends all the time (not one per send), and one that comes back is reached
// again within 8 s.
const (
	connectBackoffMin = 100 * time.Millisecond
	connectBackoffMax = 8 * time.Second
)

// handshakeFailed counts a failed handshake via ne and sets its backoff: a random delay in
// [3d/4, d], d doubling per failure in a row from connectBackoffMin up to connectBackoffMax
// (the random part spreads the retries of many senders).
func (m *peerMachine) handshakeFailed(now time.Time, ne *nameEntry, err error) {
	m.stats.HandshakesFailed++
	ne.failures++
	d := connectBackoffMax
	if ne.failures < 20 {
		d = min(connectBackoffMin<<(ne.failures-1), connectBackoffMax)
	}
	d = d - d/4 + time.Duration(m.rand()%uint64(d/4+1))
	ne.backoffAt, ne.backoffErr = now.Add(d), err
	m.setTimer(ne.backoffAt) // the name entry is kept until then (tick)
}

// backingOff: no new QP or handshake per send while the peer behind ne keeps failing. With
// fallback on, a pair with a token sends over OOB meanwhile; otherwise a send that can
// wait for the next handshake (at backoffAt) waits for it, and the others fail now with
// the failure that started the backoff.
func (m *peerMachine) backingOff(now time.Time, ne *nameEntry, p *peerEntry) {
	err := &backoffError{err: ne.backoffErr, wait: ne.backoffAt.Sub(now)}
	if p != nil && m.cfg.fallback && (p.tokenOut != 0 || p.key.legacy != "") {
		m.failPeerWaiters(now, p, err)
		return
	}
	keep := func(ws []reqID) []reqID {
		out := ws[:0]
		for _, id := range ws {
			r := m.reqs[id]
			switch {
			case r == nil:
			case r.deadline.After(ne.backoffAt):
				out = append(out, id)
			default:
				m.stats.BackoffRefused++
				if r.seq != 0 && r.peer != nil {
					r.peer.seqs.giveUp(r.seq)
				}
				m.complete(id, err)
			}
		}
		return out
	}
	ne.waiters = keep(ne.waiters)
	if p != nil {
		p.waiters = keep(p.waiters)
		m.fence(p)
	}
	m.setTimer(ne.backoffAt) // tick starts the next handshake for what waits
}

// connectionLost reports whether err is an OOB request's connection that was made and then
// lost before the answer: somebody served the address (oob.ErrNotSent marks a connection
// never made: refused, timed out, unroutable, unresolved).
func connectionLost(err error) bool {
	return errors.Is(err, oob.ErrPeerUnreachable) && !errors.Is(err, oob.ErrNotSent)
}

// liveSibling reports whether another name of ne's port leads to a pair that is alive (its
// channel up, or active within the connect timeout).
func (m *peerMachine) liveSibling(now time.Time, ne *nameEntry) bool {
	for _, o := range m.names {
		p := o.peer
		if o == ne || p == nil || o.unreachable || p.superseded || !mayLeadTo(ne.name, p) {
			continue
		}
		if ce := m.chans[p.ch]; (p.ch != 0 && ce != nil && ce.up) || now.Sub(p.lastActive) < m.cfg.connectTimeout {
			return true
		}
	}
	return false
}

// shortBackoff makes ne's next handshake go after busyRetryAfter (and as much again at
// random), not after its backoff: its sends hold a live pair's meanwhile.
func (m *peerMachine) shortBackoff(now time.Time, ne *nameEntry) {
	if at := now.Add(busyRetryAfter + time.Duration(m.rand()%uint64(busyRetryAfter))); at.Before(ne.backoffAt) {
		ne.backoffAt = at
		m.setTimer(at)
	}
}

// handshakeOK ends ne's backoff.
func (m *peerMachine) handshakeOK(ne *nameEntry) {
	ne.failures, ne.backoffAt, ne.backoffErr = 0, time.Time{}, nil
}

// backoffError is what a send gets while its peer's handshakes back off: the failure that
// started the backoff, and when the next handshake may go.
type backoffError struct {
	err  error
	wait time.Duration
}

func (e *backoffError) Error() string {
	return fmt.Sprintf("%v (handshakes paused after repeated failures; the next in %v, after this send's deadline)", e.err, e.wait.Round(time.Millisecond))
}

func (e *backoffError) Unwrap() error { return e.err }

// hsResult is what our handshake via a name came back with.
type hsResult struct {
	err       error  // transport failure, or a reply we could not use (the kind wrapped)
	refuse    string // the peer's typed refusal
	session   uint64 // the peer's session; 0: a Mooncake peer
	token     uint64 // the token the peer issued us (ts_token)
	epoch     uint64 // the peer's epoch in a refusal ("superseded")
	ctrl      bool   // the channel is connected (ch != 0)
	peerName  string // the name the peer advertised
	noCtrlMsg string
	fresh     bool   // the peer's state for the pair starts at 1 (ts_fresh), in a refusal too
	maxNotify int    // the peer's max_notify_size (ts_max_notify; 0: not said)
	refuseMsg string // the text of the peer's refusal (which limit, ...)
	// refuseCause (ts_refuse_cause) qualifies refuse: causeDevice with refuseLimit is the
	// peer's device that cannot make a channel, not a cap.
	refuseCause string
	// localErr: the handshake succeeded but our own side of the channel failed (a verbs
	// call: modify to RTR, ...): not the peer's refusal.
	localErr error
}

// Refusal codes (oob ts_refuse).
const (
	refuseNoCtrl     = "no_ctrl"
	refuseLimit      = "limit"
	refuseAuth       = "auth"
	refuseClosed     = "closed"
	refuseInvalid    = "invalid"
	refuseBusy       = "busy"
	refuseSuperseded = "superseded"
	refuseStale      = "stale"
)

// causeDevice (oob.CauseDevice): the peer refused because its device cannot make a channel.
const causeDevice = "device"

// connected is the result of our handshake via name on channel ch (0: none).
func (m *peerMachine) connected(now time.Time, name string, ch chanID, res hsResult) {
	m.connects--
	defer m.unhold(now) // the name's engine is known, or its handshake failed
	defer m.nextConnect(now)
	ne := m.names[name]
	ce := m.chans[ch]
	closeCh := func(why error) {
		if ce != nil {
			m.dropChan(ce, true)
			m.emit(mAction{kind: aClose, ch: ch, err: why})
		}
	}
	if ne == nil {
		m.pruneOffered() // its name entry went while the handshake was out
		closeCh(ErrClosed)
		return
	}
	ne.connecting = false
	m.withdraw(ne)
	// An engine that answered it is closing (oob.ErrPeerClosed) was there: a restart, not
	// an address nobody serves. So was one whose connection was made and then lost before
	// the answer (closed or reset: a cut, an engine dying): its next handshake tells, and
	// until it ends the name's waiting sends hold later sends to the peers of its port, as
	// another name may already reach the same engine. Only the first such failure in a row:
	// an address whose connections keep ending so is not let hold the other peers of its
	// port (another host's engine may share the port) for longer than one backoff.
	lost := connectionLost(res.err) && ne.failures == 0
	// Later such failures in a row still hold when another name of the port leads to a
	// pair that is alive: the engine serves the port, the name most likely leads to it,
	// and its sends must not be overtaken; it is tried again shortly, not after its
	// backoff (shortBackoff).
	sibling := connectionLost(res.err) && !lost && m.liveSibling(now, ne)
	lost = lost || sibling
	ne.unreachable = res.err != nil && !errors.Is(res.err, oob.ErrPeerClosed) && !lost
	// A hint that came while this handshake was out outlives its failure (the engine that
	// answered on the port came up after it went); any other ends here.
	ne.hinted, ne.hintedOut = ne.unreachable && ne.hintedOut, false
	if res.err != nil {
		closeCh(res.err)
		kind := ErrPeerUnreachable
		var ke *kindError
		if errors.As(res.err, &ke) {
			kind = ke.kind // a limit the peer's OOB port said, an auth failure, ...
		}
		err := sendErr(kind, name, "handshake", res.err, false)
		m.handshakeFailed(now, ne, err)
		if sibling {
			m.shortBackoff(now, ne)
		}
		m.failName(now, ne, err)
		return
	}
	if res.localErr != nil && res.session == 0 {
		// Our side of a Mooncake peer's channel failed: its OOB path serves when fallback
		// allows, the channel is tried again after the backoff.
		closeCh(res.localErr)
		err := sendErr(ErrNoCtrlChannel, name, "rdma_twosided", res.localErr, false)
		m.handshakeFailed(now, ne, err)
		if m.cfg.fallback {
			m.legacyOOB(now, ne, ne.backoffAt)
			return
		}
		m.failName(now, ne, err)
		return
	}
	if res.session == 0 {
		m.connectedLegacy(now, ne, ce, res, closeCh)
		return
	}
	asked := ne.askedAgain // this handshake went to ask the name again (staleAnswer)
	switch res.refuse {
	case refuseAuth:
		closeCh(ErrAuth)
		m.stats.AuthRefused++
		p := m.peers[peerKey{session: res.session}]
		if (p != nil && p.tokenOut != 0) || (p == nil && m.anyConnecting()) {
			// The name is another way to an engine we already talk to (or may be
			// handshaking with by another name): the peer knows our session from that
			// handshake and wants its proof. The name becomes an alias; its sends join the
			// pair, and wait (bounded) for the other handshake when it is still on its way.
			// The refusal is a failed handshake of the name all the same: when the pair's
			// own token is what the peer refuses (another engine claimed our session there
			// first), the next handshake waits out the backoff instead of following at once,
			// refused again, for ever.
			m.handshakeFailed(now, ne, sendErr(ErrAuth, name, "handshake", errors.New("the peer refused our token"), false))
			p, err := m.bind(now, ne, res.session, "", false)
			if err != nil {
				m.failName(now, ne, err)
				return
			}
			if m.staleAnswer(now, ne, p, asked) {
				return
			}
			if res.peerName != "" {
				m.readvertised(p, res.peerName) // its name, in a refusal too
			}
			m.hintPort(now, name, p)
			if p.tokenOut == 0 {
				p.awaiting = now.Add(m.cfg.connectTimeout)
				p.lastErr = sendErr(ErrAuth, name, "handshake", errors.New("the peer refused our token"), false)
				m.setTimer(p.awaiting)
			}
			m.moveWaiters(ne, p)
			m.flush(now, p, "")
			return
		}
		m.failName(now, ne, sendErr(ErrAuth, name, "handshake", errors.New("the peer refused our token"), false))
		return
	case refuseClosed:
		closeCh(ErrClosed)
		err := sendErr(ErrPeerUnreachable, name, "handshake", errors.New("the peer is closing"), false)
		m.handshakeFailed(now, ne, err)
		m.failName(now, ne, err)
		return
	case refuseInvalid, refuseStale:
		closeCh(ErrRejected)
		why := res.refuse
		if res.refuseMsg != "" {
			why += ": " + res.refuseMsg
		}
		err := sendErr(ErrRejected, name, "handshake", fmt.Errorf("refused (%s)", why), false)
		m.handshakeFailed(now, ne, err)
		m.failName(now, ne, err)
		return
	}
	// A fresh answer counts in a refusal too (superseded, a channel limit): the peer keeps
	// the entry that answered, and the token this reply carries is the one we send under
	// next, so our seqs must start where its state does.
	p, err := m.bind(now, ne, res.session, res.peerName, res.fresh)
	if err != nil {
		closeCh(err)
		m.failName(now, ne, err)
		return
	}
	if m.staleAnswer(now, ne, p, asked) {
		closeCh(fmt.Errorf("%w: %s: the engine that answered was replaced at its address", ErrPeerDead, name))
		return
	}
	m.hintPort(now, name, p)
	p.tokenOut, p.tokenOutSure = res.token, res.token != 0
	p.fenceAt = time.Time{} // a new token: refused fences may pass now
	if res.maxNotify > 0 {
		p.maxNotify = res.maxNotify
	}
	m.addTokenIn(p, ne.token)
	p.epoch = max(p.epoch, res.epoch)
	switch {
	case res.session == m.local && res.refuse == "":
		// The name is this engine's own: served over OOB, for good (see inbound).
		closeCh(ErrNoCtrlChannel)
		p.mode = modeOOB
		m.handshakeOK(ne)
	case res.localErr != nil || (m.cfg.channels && !m.cfg.fallback && (res.refuse == refuseNoCtrl || (res.refuse == "" && !res.ctrl))):
		// Our side of the channel failed, or the peer serves none: with fallback off
		// nothing goes over OOB; the channel is tried again after the backoff.
		cause := res.localErr
		if cause == nil {
			cause = errors.New("the peer serves no ctrl channel, and OOB fallback is off")
		}
		closeCh(cause)
		err := sendErr(ErrNoCtrlChannel, name, "rdma_twosided", cause, false)
		m.handshakeFailed(now, ne, err)
		p.lastErr = err
		m.moveWaiters(ne, p)
		if m.cfg.fallback && p.tokenOut != 0 {
			m.stats.Fallbacks += uint64(len(p.waiters))
			p.mode = modeOOB
			p.retryAt = ne.backoffAt // then a channel is tried again (tick)
			m.flush(now, p, name)
			return
		}
		m.failPeerWaiters(now, p, err)
		return
	case res.refuse == refuseNoCtrl || (res.refuse == "" && !res.ctrl):
		closeCh(ErrNoCtrlChannel)
		p.mode = modeOOB
		p.lastErr = sendErr(ErrNoCtrlChannel, name, "handshake", errors.New("served over OOB"), false)
		if m.cfg.channels {
			p.retryAt = now.Add(m.cfg.noCtrlRetry)
			m.setTimer(p.retryAt)
		}
	case res.refuse == refuseSuperseded:
		// The pair has (or is getting) a better channel, from the peer's side.
		closeCh(errSuperseded)
		m.stats.Superseded++
		if p.ch == 0 {
			p.awaiting = now.Add(m.cfg.connectTimeout)
			m.setTimer(p.awaiting)
		}
	case res.refuse == refuseBusy:
		// The peer is taking many handshakes at once (a reconnect storm, or a flood it
		// refuses): ask again shortly; the sends wait, bounded by their deadlines.
		closeCh(ErrBackpressure)
		p.lastErr = sendErr(ErrBackpressure, name, "handshake", errors.New("the peer is busy with handshakes"), false)
		if p.ch == 0 {
			p.awaiting = now.Add(busyRetryAfter + time.Duration(m.rand()%uint64(busyRetryAfter)))
			m.setTimer(p.awaiting)
		}
	case res.refuse == refuseLimit:
		// A cap of the peer's, or its device (cause "device": the peer cannot make a
		// channel, ErrNoCtrlChannel); either way it is asked again after the backoff and,
		// with fallback on and a token, serves over OOB meanwhile.
		kind, why := ErrLimit, "a limit"
		if res.refuseCause == causeDevice {
			kind, why = errPeerDevice, "its device cannot make a ctrl channel"
		}
		closeCh(kind)
		p.retryAt = now.Add(m.cfg.limitBackoff)
		if res.refuseMsg != "" {
			why = res.refuseMsg
		}
		p.lastErr = sendErr(kind, name, "handshake", fmt.Errorf("the peer refused: %s", why), false)
		m.setTimer(p.retryAt)
		if m.cfg.fallback && p.tokenOut != 0 {
			// The peer issued us a token: it serves our notifies over OOB meanwhile.
			p.mode = modeOOB
			ne.retryAt = p.retryAt
		} else {
			m.moveWaiters(ne, p)
			m.failPeerWaiters(now, p, p.lastErr)
			return
		}
	case res.refuse != "":
		closeCh(ErrRejected)
		m.failName(now, ne, sendErr(ErrRejected, name, "handshake", fmt.Errorf("refused (%s)", res.refuse), false))
		return
	default:
		ce.peer = p
		if cur := m.chans[p.ch]; p.ch != 0 && cur != nil && !wins(ce, cur) {
			// A simultaneous open: the peer's channel wins on both sides.
			m.stats.Superseded++
			m.dropChan(ce, false)
			m.emit(mAction{kind: aClose, ch: ce.id, err: errSuperseded})
		} else {
			m.adopt(now, p, ce)
		}
	}
	m.handshakeOK(ne) // the peer answered: it is there
	m.moveWaiters(ne, p)
	m.flush(now, p, name)
	m.fence(p) // seqs given up while the pair had no path (a rebind) now have one
}

func (m *peerMachine) connectedLegacy(now time.Time, ne *nameEntry, ce *chanEntry, res hsResult, closeCh func(error)) {
	if !res.ctrl || ce == nil {
		closeCh(ErrNoCtrlChannel)
		if !m.cfg.fallback && m.cfg.channels {
			// Fallback off: nothing goes over OOB, whatever the reply says; the channel is
			// asked for again after the backoff.
			msg := "the peer (a Mooncake engine) serves no ctrl channel, and OOB fallback is off"
			if res.noCtrlMsg != "" {
				msg += ": " + res.noCtrlMsg
			}
			err := sendErr(ErrNoCtrlChannel, ne.name, "handshake", errors.New(msg), false)
			m.handshakeFailed(now, ne, err)
			m.failName(now, ne, err)
			return
		}
		// A Mooncake engine without ctrl channel: seq-less OOB at once, no handshake per notify.
		m.handshakeOK(ne)
		m.legacyOOB(now, ne, now.Add(m.cfg.noCtrlRetry))
		return
	}
	m.handshakeOK(ne)
	key := peerKey{legacy: ne.name}
	p := m.peers[key]
	if p == nil {
		if len(m.peers) >= m.cfg.maxPeers {
			closeCh(ErrLimit)
			m.failName(now, ne, sendErr(ErrLimit, ne.name, "handshake", fmt.Errorf("max_peers: %d", m.cfg.maxPeers), false))
			return
		}
		p = m.newPeer(now, key)
		p.names = append(p.names, ne.name)
		p.adv = ne.name
	}
	ne.peer = p
	ce.peer, ce.legacy = p, true
	m.adopt(now, p, ce)
	m.moveWaiters(ne, p)
	m.flush(now, p, ne.name)
}

// legacyOOB serves the Mooncake engine at ne seq-less over OOB until until, its waiting
// sends first.
func (m *peerMachine) legacyOOB(now time.Time, ne *nameEntry, until time.Time) {
	ne.legacyOOB = true
	ne.retryAt = until
	ws := ne.waiters
	ne.waiters = nil
	for _, id := range ws {
		if r := m.reqs[id]; r != nil {
			r.legacy, r.oob = true, true
			m.emit(mAction{kind: aOOB, req: id, name: ne.name, legacy: true, deadline: r.deadline})
		}
	}
}

// busyRetryAfter is the least pause before a handshake refused "busy" is tried again (a
// random part as long again spreads a storm's retries).
const busyRetryAfter = 100 * time.Millisecond

var errSuperseded = errors.New("notify: channel superseded by a newer one of the same pair")

func (m *peerMachine) moveWaiters(ne *nameEntry, p *peerEntry) {
	if ne.stragglers > 0 {
		return // releaseStragglers moves them once the stragglers are answered
	}
	sorted := slices.IsSorted(p.waiters)
	m.handOver(ne.waiters, p)
	if sorted {
		slices.Sort(p.waiters) // send order across the name's and the peer's waiters
	}
	ne.waiters = nil
}

// handOver makes the sends ids (those still known) wait for p, after its own waiters.
func (m *peerMachine) handOver(ids []reqID, p *peerEntry) {
	if len(ids) > 0 {
		p.holdFrom = 0 // they may be older than p's (oldestOf)
	}
	for _, id := range ids {
		if r := m.reqs[id]; r != nil {
			r.peer = p
			p.waiters = append(p.waiters, id)
		}
	}
}

// bind makes name an alias of the peer with session (created when new).
func (m *peerMachine) bind(now time.Time, ne *nameEntry, session uint64, advertised string, fresh bool) (*peerEntry, error) {
	key := peerKey{session: session}
	p := m.peers[key]
	if p != nil && fresh && p.hasState() && ne.kept == session {
		// Our state predates this handshake (not a simultaneous open's), and the peer has
		// none: it forgot the pair. Only state that predates the handshake says so: the
		// peer may have made its state for us with this handshake (or the one of another
		// name) and used it before its reply came, so state we got since is from it; and
		// a handshake sent for another session (the engine that was at the name before)
		// says nothing of this pair.
		p = m.restartPair(now, p)
	}
	if p == nil {
		if _, err := m.roomForPeer(now, netip.Addr{}, true); err != nil { // we talk to it: as proven
			return nil, sendErr(ErrLimit, ne.name, "handshake", err, false)
		}
		p = m.newPeer(now, key)
		p.bornActive = true
		if advertised != "" {
			p.names = append(p.names, advertised)
		}
	}
	if advertised != "" {
		p.adv = advertised
		m.readvertised(p, advertised)
	}
	if old := ne.peer; old != nil && old != p {
		m.leave(ne, old, p)
	}
	ne.peer, ne.askedAgain = p, false
	m.confirmPeer(p) // it answered our handshake
	p.proved = true
	m.markStragglers(ne, p)
	m.alias(p, ne.name)
	return p, nil
}

// staleAnswer: the handshake via ne was answered by p, an engine that another name has
// shown replaced at its address since the answer left (a restart):
// the name's sends would go to a pair nobody serves, and come back refused after later
// sends by the other name went to the new engine. The name is asked once more (its sends
// wait for that answer, and hold later ones to its port meanwhile); asked: this answer is
// already that second one, taken as it is.
func (m *peerMachine) staleAnswer(now time.Time, ne *nameEntry, p *peerEntry, asked bool) bool {
	if !p.replaced || asked || len(ne.waiters) == 0 {
		return false
	}
	ne.askedAgain = true
	m.connectName(now, ne, nil)
	m.waitUnknown(ne)
	return true
}

// readvertised: p advertises the name another engine advertised before: the engine at that
// address restarted (an advertised name is its listen address). What is still on its way
// to the old one holds later sends to p (supersede), and an answer of the old one still on
// its way is stale (replaced).
func (m *peerMachine) readvertised(p *peerEntry, advertised string) {
	found := false
	for _, q := range m.peersInOrder() {
		if q == p || q.key.legacy != "" || q.adv != advertised {
			continue
		}
		q.replaced = true
		m.supersede(q)
		found = true
	}
	if found {
		// Answers come in any order: p may be the old engine, its answer late. Its sends
		// hold later ones to the other too, until the names settle.
		m.supersede(p)
	}
}

// leave: ne, which led to old, now reaches p, another engine (old's restarted at the same
// address): what waited for old goes to p, with new seqs, in send order among p's; what is
// still with old holds later sends to p (supersede).
func (m *peerMachine) leave(ne *nameEntry, old, p *peerEntry) {
	m.unalias(old, ne.name)
	old.replaced = true
	sorted := slices.IsSorted(p.waiters)
	m.handOver(old.waiters, p)
	if sorted {
		slices.Sort(p.waiters)
	}
	old.waiters = nil
	m.supersede(old)
}

// hasState reports whether the pair has moved past its start: seqs drawn, or notifies
// received.
func (p *peerEntry) hasState() bool {
	return p.seqs.next > 1 || p.win.next > 1 || p.win.held > 0
}

// restartPair: the peer made its state for old's session just now (it forgot an idle
// pair that we kept), so its seqs toward us and its window for ours start at 1. Ours do
// too, in a new entry: what old's window holds is delivered (it was acknowledged), its
// names and waiting sends move over, its channel is closed, and its sends on their way
// become stragglers of their names (sent again in the new pair, in send order). Returns
// the new entry.
func (m *peerMachine) restartPair(now time.Time, old *peerEntry) *peerEntry {
	m.stats.PairsRestarted++
	m.releaseParked(old) // on the wire to the old pair, refused, sent again in the new one
	m.supersede(old)
	m.flushWindow(old)
	p := m.newPeer(now, old.key) // replaces old in m.peers
	m.uncount(old)
	old.confirmed = true // out of the counts for good
	m.confirmPeer(p)
	p.bornActive, p.adv, p.mode = true, old.adv, old.mode
	for _, n := range old.names {
		if ne := m.names[n]; ne != nil && ne.peer == old {
			ne.peer = p
			m.alias(p, n)
		}
	}
	old.names = nil
	m.handOver(old.waiters, p)
	old.waiters = nil
	if ce := m.chans[old.ch]; old.ch != 0 && ce != nil {
		m.dropChan(ce, false)
		m.emit(mAction{kind: aClose, ch: ce.id, err: errSuperseded})
	}
	old.tokenOut, old.tokenOutSure = 0, false
	for _, n := range p.names {
		if ne := m.names[n]; ne != nil {
			m.markStragglers(ne, p)
		}
	}
	return p
}

// markStragglers: ne now leads to p (nil: to no peer, a rebind). Its sends still on their
// way to another pair (the engine that was there before) are stragglers: refused by the new
// engine in any order, they are sent again in the new pair; the name's other sends wait for
// them in ne.waiters, so that the new seqs are drawn in send order (releaseStragglers).
func (m *peerMachine) markStragglers(ne *nameEntry, p *peerEntry) {
	for _, r := range m.reqs {
		if r.name == ne.name && r.peer != nil && r.peer != p && !r.legacy && (r.oob || r.ch != 0) && !r.straggler {
			r.straggler = true
			ne.stragglers++
		}
	}
	m.waitUnknown(ne)
	if ne.stragglers == 0 || p == nil {
		return
	}
	// Sends of the name already queued on p wait too.
	for _, id := range p.waiters {
		if r := m.reqs[id]; r != nil && r.name == ne.name {
			r.peer = nil
			ne.waiters = append(ne.waiters, id)
		}
	}
	p.waiters = slices.DeleteFunc(p.waiters, func(id reqID) bool { r := m.reqs[id]; return r == nil || r.peer == nil })
	slices.Sort(ne.waiters)
	m.waitUnknown(ne)
}

const maxAliases = 8

func (m *peerMachine) alias(p *peerEntry, name string) {
	for _, n := range p.names {
		if n == name {
			return
		}
	}
	if len(p.names) >= maxAliases {
		old := p.names[1]
		p.names = append(p.names[:1], p.names[2:]...)
		if ne := m.names[old]; ne != nil && ne.peer == p && len(ne.waiters) == 0 && !ne.connecting {
			delete(m.names, old)
		}
	}
	p.names = append(p.names, name)
}

func (m *peerMachine) unalias(p *peerEntry, name string) {
	for i, n := range p.names {
		if n == name {
			p.names = append(p.names[:i:i], p.names[i+1:]...)
			return
		}
	}
}

// failName fails the sends waiting on ne; a name that leads nowhere is forgotten.
func (m *peerMachine) failName(now time.Time, ne *nameEntry, err error) {
	ws := ne.waiters
	ne.waiters = nil
	for _, id := range ws {
		m.complete(id, err)
	}
	if p := ne.peer; p != nil {
		p.lastErr = err
		if p.ch == 0 {
			m.failPeerWaiters(now, p, err)
		}
		return
	}
	m.dropName(ne)
}

func (m *peerMachine) dropName(ne *nameEntry) {
	if ne.peer == nil && !ne.connecting && len(ne.waiters) == 0 && !ne.legacyOOB && ne.failures == 0 && !m.keepsLost(ne) {
		delete(m.names, ne.name)
	}
}

// keepsLost reports whether ne must stay for what it knows of a refused pair (lost): we
// still hold state for that pair, and the next handshake via ne must tell the peer's
// fresh answer to restart it (bind). A name entry made again would not know: the pair's
// sends still on their way would come back refused after later sends drew their seqs.
func (m *peerMachine) keepsLost(ne *nameEntry) bool {
	if ne.lost == 0 {
		return false
	}
	p := m.peers[peerKey{session: ne.lost}]
	return p != nil && p.hasState()
}

// failPeerWaiters fails or falls back what waits on p when no channel can carry it.
func (m *peerMachine) failPeerWaiters(now time.Time, p *peerEntry, err error) {
	ws := p.waiters
	p.waiters = nil
	for i, id := range ws {
		r := m.reqs[id]
		if r == nil {
			continue
		}
		if m.cfg.fallback && (p.tokenOut != 0 || p.key.legacy != "") && r.seq == 0 && !p.seqs.full() {
			if m.heldBehind(p, id) {
				// An older send may still come to this pair: this one and the later ones
				// wait for it (unhold flushes them), so their seqs are drawn after its.
				p.waiters = append(p.waiters, ws[i:]...)
				break
			}
			m.sendOOB(p, r, true)
			continue
		}
		if r.seq != 0 {
			p.seqs.giveUp(r.seq)
		}
		m.complete(id, err)
	}
	m.fence(p)
}
