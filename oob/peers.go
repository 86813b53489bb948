package oob

// Peer state kept by a Node for the addresses it sends to, and what a Node learns of its
// peers going away. Loop-only.

// PeerGoneHandler may be implemented by a Handler to learn at once that a twosided peer
// closed gracefully (it sent a bye), so per-peer state can be freed without waiting for a
// timeout. addr is the address this Node dialed for a connection it opened, or the name
// the peer's bye carried (its Config.Name, else its bound listen address) for one the peer
// opened; it is a hint from the peer, authenticated only when AuthKey is required. session
// is the closing peer's session as its bye said (SetSession), 0 when it did not: a bye read
// late, after another peer took the address, names the one that closed, not the one there
// now. Called on the loop goroutine; it must not block.
type PeerGoneHandler interface {
	HandlePeerGone(addr string, session uint64)
}

func (n *Node) peerGone(addr string, session uint64) {
	if h, ok := n.h.(PeerGoneHandler); ok && addr != "" {
		h.HandlePeerGone(addr, session)
	}
}

// roomForPeer makes room for one more peer entry: true when under MaxPeers, or after
// evicting an entry with nothing in flight (its idle connection is closed; a classic mark
// is forgotten, so that peer is probed again). false when every entry is busy.
func (n *Node) roomForPeer() bool {
	if len(n.peers) < n.cfg.MaxPeers {
		return true
	}
	for addr, ps := range n.peers {
		pc := ps.conn
		if pc != nil && (len(pc.pending) > 0 || len(pc.queue) > 0 || pc.state != stateOpen) {
			continue
		}
		n.dropPeer(addr, ps)
		if pc != nil {
			pc.close(nil)
		}
		n.st.peersEvicted.Add(1)
		n.warn(warnPeers, addr)
		return true
	}
	return false
}

func (n *Node) dropPeer(addr string, ps *peerState) {
	if n.peers[addr] == ps {
		delete(n.peers, addr)
		n.st.peers.Add(-1)
	}
}

// forgetIdlePeer drops ps once it holds nothing worth keeping: no connection and no
// classic mark in force. A peer that was unreachable leaves nothing behind.
func (n *Node) forgetIdlePeer(ps *peerState) {
	if ps.conn == nil && ps.classicUntil <= n.now() {
		n.dropPeer(ps.addr, ps)
	}
}
