// The peer machine's answer to a channel made off the loop (connect_worker.go): whether it
// is still wanted once its worker is done.

package notify

// chanWanted reports whether channel id, made by a connect worker, is still wanted: its
// entry is there and was not dropped meanwhile (a peer's goodbye, an eviction, an
// unconfirmed channel's expiry, a superseding channel, the engine's close). The driver
// adopts a wanted channel and releases any other.
func (m *peerMachine) chanWanted(id chanID) bool {
	ce := m.chans[id]
	return id != 0 && ce != nil && !ce.dropped
}
