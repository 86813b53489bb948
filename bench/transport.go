package bench

import (
	"context"
	"fmt"
	"time"
)

// Transports a scenario runs over.
const (
	TransportRDMA       = "rdma_twosided"    // notify engine, ctrl channel on RC QPs of the device an engine picks (Config.Provider)
	TransportOOB        = "oob"              // notify engine, persistent OOB connections
	TransportOOBClassic = "oob-classic"      // one TCP connection per notify, as Mooncake's classic notify
	FloorBlock          = "floor-block"      // TCP ping-pong, blocking reads on locked threads
	FloorSpin           = "floor-spin"       // TCP ping-pong, non-blocking reads in a spin loop
	FloorStream         = "floor-stream"     // pipelined TCP, window in flight, each message acked (burst only)
	FloorEpoll          = "floor-epoll"      // floor-block's exchange with a reactor's waits (epoll, ExecWait's disarm) and no engine (latency)
	FloorLoop           = "floor-loop"       // floor-epoll's exchange on the engines' reactor (fd handlers, ExecWait), no OOB node or engine (latency)
	FloorNode           = "floor-node"       // floor-loop's exchange as the engine's OOB frames through an oob.Node, no notify engine (latency)
	FloorURing          = "floor-uring"      // floor-block's exchange waited for as a reactor on io_uring would (SEND and RECV in one io_uring_enter), no engine (latency)
	FloorEcho           = "floor-echo"       // floor-block with the engines' echo: the receiving thread sends every message back on its own connection, each message acked (latency, two processes)
	FloorVerbs          = "floor-verbs"      // RC SEND/RECV on ibv directly, completion events (latency, burst)
	FloorVerbsSpin      = "floor-verbs-spin" // the same, busy-polling the CQ (latency, burst)
	FloorVerbsEcho      = "floor-verbs-echo" // floor-verbs with the engines' echo: the receiving thread sends every message back on a QP of its own, each message answered (latency, two processes)
)

// Transports lists the default suite's transports in table order.
var Transports = []string{TransportRDMA, TransportOOB, TransportOOBClassic, FloorBlock, FloorSpin, FloorStream}

// AllTransports adds the reference floors (floor-epoll, floor-loop, floor-node and
// floor-uring: what the reactor's waits, the reactor, the OOB node cost, and what waits on
// io_uring would; floor-echo: the echoed round trip's frames on raw sockets) and the verbs
// floors (the device, bench --provider verbs; floor-verbs-echo: the echoed round trip's
// SENDs on it), asked for by name (or "all").
var AllTransports = append(append([]string(nil), Transports...), FloorEpoll, FloorLoop, FloorNode, FloorURing, FloorEcho, FloorVerbs, FloorVerbsSpin, FloorVerbsEcho)

func isFloor(t string) bool {
	return t == FloorBlock || t == FloorSpin || t == FloorStream || t == FloorEpoll || t == FloorLoop || t == FloorNode || t == FloorURing || t == FloorEcho || isVerbsFloor(t)
}

func isVerbsFloor(t string) bool {
	return t == FloorVerbs || t == FloorVerbsSpin || t == FloorVerbsEcho
}

// isEchoFloor reports whether t is a floor whose two-process round trip is the engines'
// echo (the message, the receiver's echo on its own connection, each answered): the echoed
// latency's like-for-like references. They run the latency scenario only.
func isEchoFloor(t string) bool { return t == FloorEcho || t == FloorVerbsEcho }

// node is one endpoint of a run: it receives into a sink and makes clients that send to
// other nodes.
type node interface {
	addr() string
	newClient(peers []string) (client, error)
	wakeups() uint64 // reactor wake-ups so far (0 for floors)
	close(ctx context.Context) error
}

// client sends to a fixed list of peers. send returns once the peer has the message.
// Clients are used from one goroutine each; lockThread says that goroutine must be locked
// to its OS thread (floors).
type client interface {
	send(ctx context.Context, peer int, msg []byte) error
	lockThread() bool
	close()
}

func newNode(transport string, o nodeOpts, s *sink) (node, error) {
	switch transport {
	case FloorBlock, FloorSpin, FloorEcho:
		return newFloorNode(transport == FloorSpin, o.single, false, o.host, s)
	case FloorStream:
		return newFloorNode(false, false, true, o.host, s)
	case FloorEpoll:
		return newEpollFloorNode(o.host, s)
	case FloorLoop:
		return newLoopFloorNode(o.host, s)
	case FloorNode:
		return newOOBNode(o.host, s)
	case FloorURing:
		return newURingFloorNode(o.host, s)
	case FloorVerbs, FloorVerbsSpin, FloorVerbsEcho:
		return newVerbsNode(transport == FloorVerbsSpin, o, s)
	case TransportRDMA, TransportOOB, TransportOOBClassic:
		return newEngineNode(transport, o, s)
	}
	return nil, fmt.Errorf("%w: transport %q: want one of %v", ErrConfig, transport, Transports)
}

func durationNS(ns int64) time.Duration { return time.Duration(ns) }

func closeNodes(ctx context.Context, nodes []node) error {
	var first error
	for _, n := range nodes {
		if n == nil {
			continue
		}
		if err := n.close(ctx); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func addrs(nodes []node) []string {
	out := make([]string, len(nodes))
	for i, n := range nodes {
		out[i] = n.addr()
	}
	return out
}

func sumWakeups(nodes []node) uint64 {
	var w uint64
	for _, n := range nodes {
		w += n.wakeups()
	}
	return w
}
