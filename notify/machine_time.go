// The peer machine's timer (see peerMachine in machine.go): deadlines of waiting sends,
// receive gaps, refused fences, retries after a refusal, unconfirmed channels and idle
// entries, all in tick.

package notify

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

func (m *peerMachine) setTimer(at time.Time) {
	if at.IsZero() {
		return
	}
	if m.timerAt.IsZero() || at.Before(m.timerAt) {
		m.timerAt = at
		m.emit(mAction{kind: aTimer, at: at})
	}
}

func (m *peerMachine) armPrune(now time.Time) { m.setTimer(now.Add(m.cfg.peerIdle)) }

// tick runs what is due at now: receive gaps that timed out, peers that yielded and never
// connected, backoffs that ended, idle peers to forget.
func (m *peerMachine) tick(now time.Time) {
	m.timerAt = time.Time{}
	var next time.Time
	later := func(t time.Time) {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	for _, p := range m.peersInOrder() {
		if m.peers[p.key] != p {
			continue // forgotten or replaced by an earlier visit
		}
		if p.win.held > 0 {
			p.win.expire(now, m.cfg.gapTimeout, func(d Notify) {
				p.received++
				m.emit(mAction{kind: aDeliver, n: d})
			})
			m.heldDups(p)
			later(p.win.gapDeadline(m.cfg.gapTimeout))
		}
		if !p.awaiting.IsZero() {
			if !now.Before(p.awaiting) {
				p.awaiting = time.Time{}
				switch {
				case p.ch == 0 && p.tokenOut == 0 && p.mode == modeChannel && len(p.waiters) > 0 && errors.Is(p.lastErr, ErrAuth):
					// The handshake we waited for never came: the refusal stands.
					m.failPeerWaiters(now, p, p.lastErr)
				case p.ch == 0 && len(p.waiters) > 0:
					p.epoch++ // outbid whatever the peer meant to send
					m.flush(now, p, "")
				}
			} else {
				later(p.awaiting)
			}
		}
		later(m.busyTick(now, p)) // the head of a parked queue goes again
		if !p.fenceAt.IsZero() {
			if !now.Before(p.fenceAt) {
				p.fenceAt = time.Time{}
				m.fence(p)
			} else {
				later(p.fenceAt)
			}
		}
		if !p.retryAt.IsZero() {
			if !now.Before(p.retryAt) {
				p.retryAt = time.Time{}
				if p.mode == modeOOB && m.cfg.channels {
					p.mode = modeChannel
				}
			} else {
				later(p.retryAt)
			}
		}
		if len(p.waiters) > 0 && p.ch == 0 && p.awaiting.IsZero() && !m.connectingTo(p) {
			m.flush(now, p, "") // nothing is on its way for them: start a path
		}
		if p.ch == 0 && len(p.waiters) == 0 && p.inflight == 0 && p.win.held == 0 && p.seqs.unresolved() == 0 &&
			!m.connectingTo(p) && now.Sub(p.lastActive) >= m.cfg.peerIdle {
			m.forget(p.key, p)
			m.stats.PeersPruned++
			continue
		}
		if p.ch == 0 {
			later(p.lastActive.Add(m.cfg.peerIdle))
		}
	}
	for _, ce := range m.chansInOrder() {
		if m.chans[ce.id] != ce || !ce.inbound || ce.confirmed || ce.dropped {
			continue
		}
		if exp := ce.born.Add(m.cfg.connectTimeout); now.Before(exp) {
			later(exp)
			continue
		}
		m.stats.UnconfirmedExpired++
		m.dropChan(ce, false)
		m.emit(mAction{kind: aClose, ch: ce.id, err: fmt.Errorf("%w: the peer never used the channel its handshake made", ErrPeerDead)})
		if p := ce.peer; p != nil && p.ch == 0 {
			// Its peer was visited above while the channel still stood: its idle prune
			// is due from now on (else an entry the initiator forgot outlives it, and
			// that initiator's next handshakes are refused for want of a proof).
			later(p.lastActive.Add(m.cfg.peerIdle))
		}
	}
	// Sends whose deadline passed while they waited for a path: only those are sorted (in
	// send order), not every request the engine holds.
	var due []reqID
	for id, r := range m.reqs {
		if r.ch == 0 && !r.oob && !now.Before(r.deadline) { // on its way: its path's own bound ends it
			due = append(due, id)
		}
	}
	slices.Sort(due)
	for _, id := range due {
		if r := m.reqs[id]; r != nil && r.ch == 0 && !r.oob {
			m.cancel(now, id, errors.New("deadline passed while waiting for a path"))
		}
	}
	for _, r := range m.reqs {
		if r.ch == 0 && !r.oob {
			later(r.deadline)
		}
	}
	for _, ne := range m.namesInOrder() {
		if m.names[ne.name] != ne {
			continue
		}
		if (ne.peer == nil || ne.askedAgain) && !ne.connecting && len(ne.waiters) > 0 && ne.failures > 0 && ne.stragglers == 0 {
			if now.Before(ne.backoffAt) {
				later(ne.backoffAt)
			} else {
				m.connectName(now, ne, nil) // the backoff is over: what waited goes
			}
			continue
		}
		if ne.peer == nil && !ne.connecting && len(ne.waiters) == 0 && ne.stragglers == 0 && (ne.retryAt.IsZero() || !now.Before(ne.retryAt)) && !m.keepsLost(ne) {
			if now.Before(ne.backoffAt) {
				later(ne.backoffAt) // its backoff outlives the entry's use
				continue
			}
			delete(m.names, ne.name)
		}
	}
	m.releaseStragglers(now)
	m.unhold(now)
	m.setTimer(next)
}
