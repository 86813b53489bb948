package oob

import "time"

// warnReason names a flood or a limit hit that is logged at warn level.
type warnReason uint8

const (
	warnMaxConns         warnReason = iota // an accepted connection over MaxConns
	warnHandshakes                         // a handshake over MaxPendingHandshakes
	warnHandshakesByAddr                   // a handshake over MaxPendingHandshakesPerAddr
	warnBadFrames                          // a malformed request
	warnAuth                               // an authentication failure
	warnOverflow                           // a connection over MaxConnBuffer
	warnPeers                              // a peer entry evicted or refused: MaxPeers
	warnTooLarge                           // a request refused before sending: over the peer's frame limit
	warnBusy                               // a notify answered busy: MaxOpenRequests on its connection
	nWarnReasons
)

var warnText = [nWarnReasons]string{
	warnMaxConns:         "oob: connection refused: MaxConns reached",
	warnHandshakes:       "oob: handshake refused: MaxPendingHandshakes reached",
	warnHandshakesByAddr: "oob: handshake refused: MaxPendingHandshakesPerAddr reached",
	warnBadFrames:        "oob: malformed requests refused",
	warnAuth:             "oob: authentication failures",
	warnOverflow:         "oob: connections closed over MaxConnBuffer",
	warnPeers:            "oob: peer entries at MaxPeers",
	warnTooLarge:         "oob: requests over the peer's frame limit refused",
	warnBusy:             "oob: notifies answered busy: MaxOpenRequests reached on a connection",
}

// warnLimiter logs each reason at most once per second, with the number of events since
// the last line it wrote. Loop-only; its state is one fixed array, whatever the flood.
type warnLimiter struct {
	last  [nWarnReasons]int64 // loop time of the last line, ns
	count [nWarnReasons]uint64
	any   [nWarnReasons]bool
}

// warn counts one event of reason r and logs when a second has passed since the last line.
func (n *Node) warn(r warnReason, detail string) {
	w := &n.warns
	w.count[r]++
	now := n.now()
	if w.any[r] && now-w.last[r] < int64(time.Second) {
		return
	}
	n.log.Warn().Uint64("count", w.count[r]).Str("last", detail).Msg(warnText[r])
	w.last[r], w.any[r], w.count[r] = now, true, 0
}

// noteAuthFailed counts a server connection refused for authentication and logs the flood.
func (n *Node) noteAuthFailed() {
	n.st.authFailed.Add(1)
	n.warn(warnAuth, "")
}
