package bench

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/rs/zerolog"
	"github.com/twosided/twosided/oob"
	"github.com/twosided/twosided/reactor"
)

// floor-node: the OOB layer alone, on the engines' reactor, with no notify engine above it:
// the receiver is an oob.Node whose handler delivers each notify to the sink and answers
// it at once; the client is a node of its own that sends each message as a Notify frame
// (the engine's wire: JSON body, the ts_* members) with NotifyOnLoop in one ExecWait, as
// SendNotify does. Between floor-loop (the reactor and a raw socket) and oob (the whole
// engine) it shows what the OOB node costs (frames, the JSON codec, its calls and
// timers) and what the engine costs above it (the peer machine, sequence and window,
// delivery, counters). Latency only.

type oobNode struct {
	loop *reactor.Loop
	node *oob.Node
	sink *sink
}

// oobNodeHandler delivers and answers on the loop.
type oobNodeHandler struct{ sink *sink }

func (h oobNodeHandler) HandleNotify(req *oob.NotifyRequest, reply oob.NotifyReply) {
	h.sink.deliver(req.Msg)
	reply.Send(nil)
}

func (h oobNodeHandler) HandleHandshake(_ *oob.HandshakeDesc, reply func(*oob.HandshakeDesc, error)) {
	reply(nil, fmt.Errorf("%w: %s serves no handshakes", ErrConfig, FloorNode))
}

func newOOBNode(host string, s *sink) (*oobNode, error) {
	loop, err := reactor.New(reactor.WithLogger(zerolog.Nop()))
	if err != nil {
		return nil, err
	}
	if host == "" {
		host = "127.0.0.1"
	}
	node, err := oob.Listen(loop, oob.Config{ListenAddr: host + ":0"}, oobNodeHandler{sink: s})
	if err != nil {
		_ = loop.Stop(context.Background())
		return nil, err
	}
	return &oobNode{loop: loop, node: node, sink: s}, nil
}

func (n *oobNode) addr() string { return n.node.Addr() }

func (n *oobNode) wakeups() uint64 { return n.loop.Stats().Wakeups }

func (n *oobNode) close(ctx context.Context) error {
	err := n.node.Close(ctx)
	if serr := n.loop.Stop(ctx); err == nil {
		err = serr
	}
	return err
}

func (n *oobNode) newClient(peers []string) (client, error) {
	if len(peers) != 1 {
		return nil, fmt.Errorf("%w: %s: one peer (latency), not %d", ErrConfig, FloorNode, len(peers))
	}
	return &oobNodeClient{n: n, peer: peers[0], replied: make(chan struct{}, 1)}, nil
}

// oobNodeClient sends through its node (the node of the client's side of the run).
type oobNodeClient struct {
	n       *oobNode
	peer    string
	req     oob.NotifyRequest
	sent    uint64
	replies atomic.Uint64
	err     atomic.Pointer[error]
	replied chan struct{} // for a send ExecWait queued (the loop was awake)
	doneFn  func(error)
}

func (c *oobNodeClient) lockThread() bool { return false } // as engine callers

func (c *oobNodeClient) close() {}

func (c *oobNodeClient) send(ctx context.Context, _ int, msg []byte) error {
	if c.doneFn == nil {
		c.doneFn = func(err error) {
			if err != nil {
				c.err.CompareAndSwap(nil, &err)
			}
			c.replies.Add(1)
			select {
			case c.replied <- struct{}{}:
			default:
			}
		}
	}
	c.sent++
	want := c.sent
	c.req = oob.NotifyRequest{Name: benchName, Msg: msg, From: c.n.node.Addr(), Session: 1, Epoch: 1, Seq: want}
	done := func() bool { return c.replies.Load() >= want }
	if err := execAndWait(ctx, c.n.loop, func() {
		if err := c.n.node.NotifyOnLoop(c.peer, &c.req, epollWait, c.doneFn); err != nil {
			c.doneFn(err)
		}
	}, done, c.replied); err != nil {
		return err
	}
	if p := c.err.Swap(nil); p != nil {
		return *p
	}
	return nil
}
