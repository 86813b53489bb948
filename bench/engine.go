package bench

import (
	"context"
	"fmt"
	"net"

	"github.com/twosided/twosided/notify"
)

// nodeOpts are the settings of one node of a run.
type nodeOpts struct {
	busyPoll int64  // nanoseconds; 0: never spin
	size     int    // largest message of the run
	window   int    // sends in flight per sender
	single   bool   // the run has one client per node (latency, idle, connect)
	provider string // ibv provider of rdma_twosided and the verbs floors; "": as notify picks
	noKA     bool   // keepalive off (WithKeepalive(0)); default: the engine's
	host     string // the IPv4 address its listeners bind; "": 127.0.0.1
}

func (o nodeOpts) listenHost() string {
	if o.host == "" {
		return "127.0.0.1"
	}
	return o.host
}

// engineNode is a notify engine: transports rdma_twosided, oob and oob-classic (an oob
// engine receives classic notifies; its classic clients dial raw).
type engineNode struct {
	e         *notify.Engine
	transport string
}

const benchName = "bench"

func newEngineNode(transport string, o nodeOpts, s *sink) (*engineNode, error) {
	t := notify.TransportOOB
	if transport == TransportRDMA {
		t = notify.TransportRDMATwoSided
	}
	opts := []notify.Option{
		notify.WithListenAddr(net.JoinHostPort(o.listenHost(), "0")),
		notify.WithTransport(t),
		notify.WithOOBFallback(false), // measure the transport asked for, never the fallback
		notify.WithHandler(func(n notify.Notify) { s.deliver(n.Msg) }),
		notify.WithMaxPendingSends(max(64, 2*o.window)),
	}
	if o.provider != "" && t == notify.TransportRDMATwoSided {
		opts = append(opts, notify.WithProvider(o.provider))
	}
	if o.noKA {
		opts = append(opts, notify.WithKeepalive(0))
	}
	if o.busyPoll > 0 {
		opts = append(opts, notify.WithBusyPoll(durationNS(o.busyPoll)))
	}
	if need := o.size + 256; need > 4096 {
		opts = append(opts, notify.WithBufferSize(min(65536, roundPow2(need))))
	}
	e, err := notify.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("bench: %s engine: %w", transport, err)
	}
	return &engineNode{e: e, transport: transport}, nil
}

func roundPow2(n int) int {
	p := 1
	for p < n {
		p <<= 1
	}
	return p
}

func (n *engineNode) addr() string { return n.e.Addr() }

func (n *engineNode) wakeups() uint64 { return n.e.ReactorStats().Wakeups }

func (n *engineNode) close(ctx context.Context) error { return n.e.Close(ctx) }

func (n *engineNode) newClient(peers []string) (client, error) {
	if n.transport == TransportOOBClassic {
		return newClassicClient(benchName, peers)
	}
	return &engineClient{e: n.e, peers: peers}, nil
}

// engineClient sends with SendNotify; any number of them share one engine.
type engineClient struct {
	e     *notify.Engine
	peers []string
}

func (c *engineClient) lockThread() bool { return false }

func (c *engineClient) close() {}

func (c *engineClient) send(ctx context.Context, p int, msg []byte) error {
	return c.e.SendNotify(ctx, c.peers[p], notify.Notify{Name: benchName, Msg: msg})
}
