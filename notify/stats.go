package notify

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/twosided/twosided/ctrlchannel"
	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/ibv/soft"
	"github.com/twosided/twosided/oob"
	"github.com/twosided/twosided/reactor"
)

// Stats is a snapshot of the engine. Counters count since New and never go back; the
// fields marked "now" are gauges.
type Stats struct {
	Name      string
	Transport string
	Device    string
	Session   uint64

	Queued        int  // now: received, not yet consumed (the receive queue's depth)
	QueueCapacity int  // the receive queue's bound (WithRecvQueue)
	Paused        bool // now: the queue is full and credit return is stopped
	ChannelsUp    int  // now: established ctrl channels
	PeerCount     int  // now: peers the engine keeps state for (len(Peers))

	Sent       uint64            // sends (SendNotify, SendNotifyAsync) that succeeded
	Failed     map[string]uint64 // sends that failed, by FailureReason; every reason present
	Fallbacks  uint64            // sends retried over OOB after their channel failed or was unavailable
	Delivered  uint64            // received notifies handed to the application (queue or handler)
	Duplicates uint64            // received duplicates dropped (a retry of a notify already delivered)

	// SendLatency: from the send call to its success (the peer's NIC or OOB reply
	// acknowledged it), failures excluded. DeliverLatency: from the moment a received notify
	// was queued to the moment Recv or GetNotifies took it (a WithHandler engine has none).
	SendLatency    Histogram
	DeliverLatency Histogram

	// Channels sums the counters of every ctrl channel this engine had, closed ones
	// included, and the gauges of the established ones.
	Channels ChannelStats
	// DeviceRNRNaks: RNR NAKs received by the device's requesters (the peer had no RECV
	// posted), as the device counts them: device-wide, shared with any other user of the
	// device. 0 where the device does not say (oob transport, no hw_counters).
	DeviceRNRNaks uint64

	Peers   []PeerStats
	Reactor ReactorStats
	OOB     OOBStats
}

// Histogram is a latency distribution over fixed buckets: Counts[i] observations fell at or
// below Bounds[i] and above the bound before it (not cumulative); the last Counts entry is
// above the last bound. Count is the sum of Counts.
type Histogram struct {
	Bounds []time.Duration
	Counts []uint64
	Count  uint64
	Sum    time.Duration
}

// PeerStats are the counters of one peer.
type PeerStats struct {
	Peer       string
	State      string // idle, connecting, awaiting-peer, up
	Epoch      uint64
	Sent       uint64 // notifies posted on the ctrl channel
	Received   uint64 // notifies delivered from this peer (any path)
	Duplicates uint64 // duplicates dropped
	LastError  string
	LocalQPN   uint32       // QPN of the established channel, here
	RemoteQPN  uint32       // and at the peer
	Channel    ChannelStats // the established channel's; zero without one
}

// ChannelStats are the counters of a ctrl channel (or a sum of channels).
type ChannelStats struct {
	FramesSent     uint64 // frames posted, every type
	FramesReceived uint64
	NotifiesSent   uint64 // notify frames posted
	Delivered      uint64 // notifies handed to the engine
	GrantsSent     uint64 // credit grants posted

	// Frames received and dropped, by reason.
	DupFramesDropped     uint64 // a seq already delivered on this channel
	StaleFramesDropped   uint64 // another epoch, or the channel not connected
	ForeignFramesDropped uint64 // another session than the peer's
	IgnoredFrames        uint64 // a type this engine does not act on

	CreditWaits    uint64 // times a send found no credit and waited (credit stalls)
	CreditOverruns uint64 // frames received beyond the credit announced

	// Sends the channel refused or failed.
	Backpressured uint64 // too many pending sends
	Expired       uint64 // deadline passed before the SEND completed
	TooLarge      uint64 // frame above what the peer can take
	SendsFailed   uint64 // failed with the channel

	KeepalivesSent     uint64
	KeepalivesReceived uint64

	WCErrors         uint64 // completions with an error status
	RNRRetryExceeded uint64 // of which RNR retries exhausted
	PostErrors       uint64 // PostSend/PostRecv failures

	// Now (established channels).
	CreditAvail uint64 // credit to send now
	Pending     int    // sends queued or in flight
	InFlight    int    // SENDs posted and not completed
	Held        int    // received frames held while the engine is paused
	SendSlots   int
	PathMTU     int // bytes
}

func channelStatsOf(s ctrlchannel.ChannelStats) ChannelStats {
	return ChannelStats{
		FramesSent: s.FramesSent, FramesReceived: s.FramesReceived, NotifiesSent: s.NotifiesSent,
		Delivered: s.Delivered, GrantsSent: s.GrantsSent,
		DupFramesDropped: s.DupsDropped, StaleFramesDropped: s.StaleDropped,
		ForeignFramesDropped: s.ForeignDropped, IgnoredFrames: s.Ignored,
		CreditWaits: s.CreditWaits, CreditOverruns: s.CreditOverruns,
		Backpressured: s.Backpressured, Expired: s.Expired, TooLarge: s.TooLarge, SendsFailed: s.Failed,
		KeepalivesSent: s.KeepalivesSent, KeepalivesReceived: s.KeepalivesReceived,
		WCErrors: s.WCErrors, RNRRetryExceeded: s.RNRRetryExceeded, PostErrors: s.PostErrors,
		CreditAvail: s.CreditAvail, Pending: s.Pending, InFlight: s.InFlight, Held: s.Held,
		SendSlots: s.SendSlots, PathMTU: s.PathMTU.Bytes(),
	}
}

// add sums o's counters into s, and its gauges too when live.
func (s *ChannelStats) add(o ChannelStats, live bool) {
	s.FramesSent += o.FramesSent
	s.FramesReceived += o.FramesReceived
	s.NotifiesSent += o.NotifiesSent
	s.Delivered += o.Delivered
	s.GrantsSent += o.GrantsSent
	s.DupFramesDropped += o.DupFramesDropped
	s.StaleFramesDropped += o.StaleFramesDropped
	s.ForeignFramesDropped += o.ForeignFramesDropped
	s.IgnoredFrames += o.IgnoredFrames
	s.CreditWaits += o.CreditWaits
	s.CreditOverruns += o.CreditOverruns
	s.Backpressured += o.Backpressured
	s.Expired += o.Expired
	s.TooLarge += o.TooLarge
	s.SendsFailed += o.SendsFailed
	s.KeepalivesSent += o.KeepalivesSent
	s.KeepalivesReceived += o.KeepalivesReceived
	s.WCErrors += o.WCErrors
	s.RNRRetryExceeded += o.RNRRetryExceeded
	s.PostErrors += o.PostErrors
	if live {
		s.CreditAvail += o.CreditAvail
		s.Pending += o.Pending
		s.InFlight += o.InFlight
		s.Held += o.Held
		s.SendSlots += o.SendSlots
		s.PathMTU = max(s.PathMTU, o.PathMTU)
	}
}

// ReactorStats are the engine's reactor loop counters since New.
type ReactorStats struct {
	Iterations      uint64        // loop iterations
	Wakeups         uint64        // returns from a blocking epoll_wait
	Interrupts      uint64        // epoll_waits cut short by a signal
	BusyPolls       uint64        // busy-poll rounds (WithBusyPoll)
	FdEvents        uint64        // socket events handled
	CQEvents        uint64        // completion-channel events
	WCs             uint64        // work completions handled
	TimerEvents     uint64        // timers fired
	SubmitEvents    uint64        // wake-ups by a submission
	Submissions     uint64        // submitted funcs run
	QueueFull       uint64        // submissions refused: queue full
	SlowCallbacks   uint64        // callbacks over the slow threshold
	LongestCallback time.Duration // longest single callback
	Busy            time.Duration // time spent working, outside epoll_wait and busy-polling
}

func reactorStatsOf(s reactor.Stats) ReactorStats {
	return ReactorStats{
		Iterations: s.Iterations, Wakeups: s.Wakeups, Interrupts: s.Interrupts, BusyPolls: s.BusyPolls,
		FdEvents: s.FdEvents, CQEvents: s.CQEvents, WCs: s.WCs, TimerEvents: s.TimerEvents,
		SubmitEvents: s.SubmitEvents, Submissions: s.Submissions, QueueFull: s.QueueFull,
		SlowCallbacks: s.SlowCallbacks, LongestCallback: s.LongestCallback, Busy: s.Busy,
	}
}

// OOBStats are the engine's OOB channel counters since New.
type OOBStats struct {
	Accepted          uint64 // server connections accepted
	RejectedConns     uint64 // connections closed at once: MaxConns reached
	Dialed            uint64 // client connections that connected
	DialFailed        uint64 // connects that failed or timed out
	ServerConns       int64  // now: server connections open
	ClientConns       int64  // now: client connections open
	NotifyServed      uint64 // notifies received
	HandshakeServed   uint64 // handshakes received
	ProbeServed       uint64 // probes answered
	NotifySent        uint64 // notifies that got a reply (success or rejected)
	ClassicSent       uint64 // requests sent on a one-shot connection
	PersistentSent    uint64 // requests sent on a multiplexed connection
	BadFrames         uint64 // requests answered with an error and the connection closed
	IdleCuts          uint64 // connections closed for idling
	Overflows         uint64 // connections closed for exceeding their buffer
	AuthOK            uint64 // server connections whose client proved the key
	AuthFailed        uint64 // server connections refused: wrong or missing proof
	HandshakeLimited  uint64 // handshakes refused: too many pending
	PendingHandshakes int64  // now: handshakes not answered yet
}

func oobStatsOf(s oob.Stats) OOBStats {
	return OOBStats{
		Accepted: s.Accepted, RejectedConns: s.RejectedConns, Dialed: s.Dialed, DialFailed: s.DialFailed,
		ServerConns: s.ServerConns, ClientConns: s.ClientConns, NotifyServed: s.NotifyServed,
		HandshakeServed: s.HandshakeServed, ProbeServed: s.ProbeServed, NotifySent: s.NotifySent,
		ClassicSent: s.ClassicSent, PersistentSent: s.PersistentSent, BadFrames: s.BadFrames,
		IdleCuts: s.IdleCuts, Overflows: s.Overflows, AuthOK: s.AuthOK, AuthFailed: s.AuthFailed,
		HandshakeLimited: s.HandshakeLimited, PendingHandshakes: s.PendingHandshakes,
	}
}

// Stats returns a snapshot; it waits at most a second for the reactor (the per-peer and
// channel figures are missing when it does not answer in time).
func (e *Engine) Stats() Stats {
	c := &e.ctr
	s := Stats{
		Name: e.name, Transport: e.cfg.transport, Device: e.devName, Session: e.session,
		Queued: e.rq.len(), QueueCapacity: e.cfg.recvQueue,
		Sent: c.sent.Load(), Fallbacks: c.fallbacks.Load(),
		Delivered: c.delivered.Load(), Duplicates: c.duplicates.Load(),
		Failed:      make(map[string]uint64, len(failureReasons)),
		SendLatency: c.sendLatency.snapshot(), DeliverLatency: c.deliverLatency.snapshot(),
	}
	for i, r := range failureReasons {
		s.Failed[r] = c.failed[i].Load()
	}
	if e.loop == nil {
		return s
	}
	s.Reactor = reactorStatsOf(e.loop.Stats())
	s.OOB = oobStatsOf(e.node.Stats())
	s.DeviceRNRNaks = e.deviceRNRNaks()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	done := make(chan Stats, 1)
	if err := e.loop.SubmitWait(ctx, func() { done <- e.loopStats() }); err != nil {
		return s
	}
	select {
	case ls := <-done:
		s.Peers, s.Paused, s.ChannelsUp, s.PeerCount, s.Channels = ls.Peers, ls.Paused, ls.ChannelsUp, ls.PeerCount, ls.Channels
	case <-ctx.Done():
	}
	return s
}

// loopStats is the loop-owned part of Stats. Loop-only.
func (e *Engine) loopStats() Stats {
	s := Stats{Paused: e.paused, PeerCount: len(e.peers), Channels: e.ctr.closedChannels}
	s.Peers = make([]PeerStats, 0, len(e.peers))
	for _, p := range e.peers {
		st := PeerStats{Peer: p.name, State: p.state.String(), Epoch: p.epoch, Sent: p.sent,
			Received: p.received, Duplicates: p.dups}
		if p.lastErr != nil {
			st.LastError = p.lastErr.Error()
		}
		if p.ch != nil {
			s.ChannelsUp++
			st.LocalQPN, st.RemoteQPN = p.ch.Local().QPN, p.remoteQPN
			st.Channel = channelStatsOf(p.ch.Stats())
			s.Channels.add(st.Channel, true)
		}
		s.Peers = append(s.Peers, st)
	}
	sort.Slice(s.Peers, func(i, j int) bool { return s.Peers[i].Peer < s.Peers[j].Peer })
	return s
}

// deviceRNRNaks reads the RNR NAKs the device's requesters received: the soft provider's
// counter, or the kernel's hw_counters/rnr_nak_retry_err of the port.
func (e *Engine) deviceRNRNaks() uint64 {
	if e.dev == nil {
		return 0
	}
	if c, err := soft.DeviceCounters(e.dev); err == nil {
		return c.RNRNaksRecv
	}
	b, err := os.ReadFile(fmt.Sprintf("/sys/class/infiniband/%s/ports/%d/hw_counters/rnr_nak_retry_err", e.devName, e.cfg.ibPort))
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// DeviceContext is the open device of the rdma_twosided transport (nil for oob), for
// diagnostics such as a provider's counters. The engine owns it: never post on it or close it.
func (e *Engine) DeviceContext() ibv.Context { return e.dev }

// ReactorStats are the reactor's counters (epoll wake-ups, events, submissions, busy time),
// read without waking it.
func (e *Engine) ReactorStats() ReactorStats { return reactorStatsOf(e.loop.Stats()) }
