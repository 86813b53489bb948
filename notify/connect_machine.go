// The peer machine's answer to a channel made off the loop (connect_worker.go): whether it
// is still wanted once its worker is done.

package notify

import "time"

// chanWanted reports whether channel id, made by a connect worker, is still wanted: its
// entry is there and was not dropped meanwhile (a peer's goodbye, an eviction, an
// unconfirmed channel's expiry, a superseding channel, the engine's close). The driver
// adopts a wanted channel and releases any other.
func (m *peerMachine) chanWanted(id chanID) bool {
	ce := m.chans[id]
	return id != 0 && ce != nil && !ce.dropped
}

// connectShed: our handshake via name was refused by the peer's OOB node before its engine
// saw it (no session in the reply): the node's handshakes waiting for an answer are at
// their bound (max_pending_handshakes, in all or per address: a reconnect storm from one
// host, now that an answer waits for the channel's verbs), or it is busy. Not the engine's
// answer, and not a Mooncake engine's (it sends no ts_refuse): a load to back off from. The
// handshake is tried again after the backoff; the sends whose deadline allows wait for it,
// the others fail (or go over OOB where fallback allows), as backingOff decides.
func (m *peerMachine) connectShed(now time.Time, name string, ch chanID, kind, err error) {
	m.connects--
	defer m.unhold(now) // the name's handshake failed: it holds nothing now
	defer m.nextConnect(now)
	if ce := m.chans[ch]; ce != nil {
		m.dropChan(ce, true)
		m.emit(mAction{kind: aClose, ch: ch, err: kind})
	}
	ne := m.names[name]
	if ne == nil {
		m.pruneOffered() // its name entry went while the handshake was out
		return
	}
	ne.connecting = false
	m.withdraw(ne)
	ne.hinted, ne.hintedOut, ne.unreachable = false, false, false // an engine's OOB node answered
	m.handshakeFailed(now, ne, sendErr(kind, name, "handshake", err, false))
	m.backingOff(now, ne, ne.peer)
}
