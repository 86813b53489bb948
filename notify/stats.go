package notify

import (
	"context"
	"sort"
	"time"

	"github.com/twosided/twosided/ctrlchannel"
	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/oob"
	"github.com/twosided/twosided/reactor"
)

// PeerStats are the counters of one peer.
type PeerStats struct {
	Peer       string
	State      string // idle, connecting, awaiting-peer, up
	Epoch      uint64
	Sent       uint64 // notifies posted on the ctrl channel
	Received   uint64 // notifies delivered from this peer (any path)
	Duplicates uint64 // duplicates dropped
	LastError  string
	LocalQPN   uint32 // QPN of the established channel, here
	RemoteQPN  uint32 // and at the peer
	Session    uint64 // the peer's session (0: a Mooncake engine)
	Names      []string
	Held       int // received early, waiting for a missing seq
	Window     windowStats
	Channel    *ctrlchannel.ChannelStats
}

// Stats is a snapshot of the engine.
type Stats struct {
	Name      string
	Transport string
	Device    string
	Session   uint64
	Queued    int // received, not yet consumed
	Paused    bool
	Peers     []PeerStats
	Limits    machineStats // refusals, retries and prunes of the peer machine
	HeldOOB   int          // OOB notifies held while the receive queue is full
	OOBBusy   uint64       // OOB notifies answered "busy"
	Reactor   reactor.Stats
	OOB       oob.Stats
}

// Stats returns a snapshot; it waits at most a second for the reactor.
func (e *Engine) Stats() Stats {
	s := Stats{Name: e.name, Transport: e.cfg.transport, Device: e.devName, Session: e.session, Queued: e.rq.len()}
	if e.loop == nil {
		return s
	}
	s.Reactor = e.loop.Stats()
	s.OOB = e.node.Stats()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	done := make(chan []PeerStats, 1)
	var paused bool
	var machine machineStats
	var heldOOB int
	var busy uint64
	if err := e.loop.SubmitWait(ctx, func() {
		ps := make([]PeerStats, 0, len(e.m.peers))
		for _, p := range e.m.peers {
			st := PeerStats{Peer: e.m.peerName(p), Session: p.key.session, Names: append([]string(nil), p.names...),
				State: e.m.peerState(p), Epoch: p.epoch, Sent: p.sent, Received: p.received, Duplicates: p.dups,
				Held: p.win.held, Window: p.win.stats}
			if p.lastErr != nil {
				st.LastError = p.lastErr.Error()
			}
			if ch := e.chans[p.ch]; p.ch != 0 && ch != nil {
				st.LocalQPN, st.RemoteQPN = ch.Local().QPN, e.remote[p.ch]
				cs := ch.Stats()
				st.Channel = &cs
			}
			ps = append(ps, st)
		}
		machine = e.m.stats
		machine.Names, machine.Channels = len(e.m.names), e.m.channels
		heldOOB, busy = len(e.heldOOB), e.oobBusy
		paused = e.paused
		done <- ps
	}); err != nil {
		return s
	}
	select {
	case ps := <-done:
		sort.Slice(ps, func(i, j int) bool { return ps[i].Peer < ps[j].Peer })
		s.Peers, s.Paused, s.Limits, s.HeldOOB, s.OOBBusy = ps, paused, machine, heldOOB, busy
	case <-ctx.Done():
	}
	return s
}

// DeviceContext is the open device of the rdma_twosided transport (nil for oob), for
// diagnostics such as a provider's counters. The engine owns it: never post on it or close it.
func (e *Engine) DeviceContext() ibv.Context { return e.dev }

// ReactorStats are the reactor's counters (epoll wake-ups, events, submissions), read
// without waking it.
func (e *Engine) ReactorStats() reactor.Stats { return e.loop.Stats() }
