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

	Queued        int    // now: received, not yet consumed (the receive queue's depth)
	QueueCapacity int    // the receive queue's bound (WithRecvQueue)
	Paused        bool   // now: the queue is full and credit return is stopped
	HeldOOB       int    // now: OOB notifies held while the receive queue is full
	OOBBusy       uint64 // OOB notifies answered "busy"
	// Channels closed because their peer was found dead while it returned no credit: by an
	// OOB probe (nobody listens at its address any more, or another engine answers there),
	// or by the keepalive's no-credit rule (no credit for 5 s and 3 rounds, nothing else
	// known).
	DeadByProbe, DeadNoCredit uint64
	ChannelsUp                int // now: peers with an established ctrl channel
	PeerCount                 int // now: peers the engine keeps state for (len(Peers))

	Sent      uint64            // sends (SendNotify, SendNotifyAsync) that succeeded
	Failed    map[string]uint64 // sends that failed, by FailureReason; every reason present
	Delivered uint64            // received notifies handed to the application (queue or handler)

	// SendLatency: from the send call to its success (the peer's NIC or OOB reply
	// acknowledged it), failures excluded. DeliverLatency: from the moment a received notify
	// was queued to the moment Recv or GetNotifies took it (a WithHandler engine has none).
	SendLatency    Histogram
	DeliverLatency Histogram

	// Limits are the peer machine's counters: refusals, retries, fallbacks, duplicates
	// dropped, prunes.
	Limits LimitStats
	// Channels sums the counters of every ctrl channel this engine had, closed ones
	// included, and the gauges of the open ones.
	Channels ChannelStats
	// DeviceRNRNaks: RNR NAKs received by the device's requesters (the peer had no RECV
	// posted), as the device counts them: device-wide, shared with any other user of the
	// device. 0 where the device does not say (oob transport, no hw_counters).
	DeviceRNRNaks uint64

	Peers   []PeerStats
	Reactor ReactorStats
	OOB     OOBStats
	// DeviceEvents counts the RDMA device's async events and the channels they failed
	// (async.go; Engine.DeviceEvents).
	DeviceEvents DeviceEventStats
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
	State      string // idle, connecting, awaiting-peer, oob, up
	Epoch      uint64
	Sent       uint64 // notifies posted on the ctrl channel
	Received   uint64 // notifies delivered from this peer (any path)
	Duplicates uint64 // duplicates dropped
	LastError  string
	LocalQPN   uint32 // QPN of the established channel, here
	RemoteQPN  uint32 // and at the peer
	Session    uint64 // the peer's session (0: a Mooncake engine)
	Names      []string
	Held       int           // now: received early, waiting for a missing seq
	Window     WindowStats   // the peer's receive window
	Channel    *ChannelStats // the established channel's; nil without one
}

// WindowStats are the counters of one peer's receive window.
type WindowStats struct {
	Delivered, Duplicates, DuplicateIDs, Refused, Held, GapsTimedOut, Skipped, Late uint64
}

func windowStatsOf(s windowStats) WindowStats {
	return WindowStats{Delivered: s.Delivered, Duplicates: s.Duplicates, DuplicateIDs: s.DuplicateIDs,
		Refused: s.Refused, Held: s.Held, GapsTimedOut: s.GapsTimedOut, Skipped: s.Skipped, Late: s.Late}
}

// LimitStats are the peer machine's counters.
type LimitStats struct {
	Names, Channels int // now: peer names known; channels up or being created
	Unconfirmed     int // now: inbound channels their peer has not used yet
	// Unconfirmed channels are capped per source address and in all, twice over: those
	// of first handshakes, and those of handshakes that returned the cookie of a "busy"
	// refusal (see docs/design.md, unused channels). UnconfirmedRefused: handshakes
	// answered "busy" (nothing kept; the peer asks again with the cookie);
	// UnconfirmedEvicted: unconfirmed channels closed, past their grace, for a newer
	// handshake; UnconfirmedExpired: those closed after the connect timeout (a handshake
	// naming a QPN nobody owns).
	UnconfirmedRefused, UnconfirmedExpired, UnconfirmedEvicted uint64
	PeersRefused                                               uint64
	NamesRefused                                               uint64
	ChannelsRefused                                            uint64
	AuthRefused                                                uint64
	Superseded                                                 uint64 // channels that lost to a newer one of the same pair
	Reposted                                                   uint64 // sends reposted on a replacing channel
	Fallbacks                                                  uint64 // sends retried over OOB after their channel failed or was unavailable
	GivenUp                                                    uint64
	FencesSent                                                 uint64
	FencesDropped                                              uint64 // fences abandoned: the peer forgot the pair, or answered none for a gap timeout
	PairsRestarted                                             uint64 // pairs started over because the peer had forgotten them (ts_fresh)
	LegacyDelivered                                            uint64 // notifies from Mooncake peers (no session), over a channel or OOB
	OOBRefused                                                 uint64
	PeersPruned                                                uint64
	// Peer entries made by peers' handshakes that no notify, channel frame or send of ours
	// has used yet (now), and those forgotten to make room (oldest first) when the table
	// or one address's share (a quarter of max_peers) was full.
	PeersUnconfirmed int
	PeersEvicted     uint64
	// Our handshakes that failed (unreachable, refused, no ctrl channel with fallback off,
	// a local verbs failure; each starts or lengthens that name's connect backoff), and
	// sends refused at once meanwhile instead of making a QP and a handshake each.
	HandshakesFailed, BackoffRefused uint64
	Duplicates                       uint64 // received notifies dropped as duplicates (seq or id)
	ConnectsQueued                   uint64 // our handshakes that waited for a slot (64 run at once)
	// StaleByes: goodbyes read after another engine took their name (a restart on the
	// address whose handshake was served first); the new engine's pair was kept.
	StaleByes uint64
	// Our OOB notifies that peers answered "busy" (each then waited its turn, in seq order,
	// for the peer's next answer), and the notifies sent again because a busy answer left
	// nothing else of their pair on the wire (at once, then after 1 ms doubling to 50 ms).
	BusyAnswers, BusyProbes uint64
}

func limitStatsOf(s machineStats) LimitStats {
	return LimitStats{Names: s.Names, Channels: s.Channels, Unconfirmed: s.Unconfirmed,
		UnconfirmedRefused: s.UnconfirmedRefused, UnconfirmedExpired: s.UnconfirmedExpired,
		UnconfirmedEvicted: s.UnconfirmedEvicted, PeersRefused: s.PeersRefused,
		NamesRefused: s.NamesRefused, ChannelsRefused: s.ChannelsRefused, AuthRefused: s.AuthRefused,
		Superseded: s.Superseded, Reposted: s.Reposted, Fallbacks: s.Fallbacks, GivenUp: s.GivenUp,
		FencesSent: s.FencesSent, FencesDropped: s.FencesDropped, PairsRestarted: s.PairsRestarted, LegacyDelivered: s.LegacyDelivered, OOBRefused: s.OOBRefused,
		PeersPruned: s.PeersPruned, PeersUnconfirmed: s.PeersUnconfirmed, PeersEvicted: s.PeersEvicted,
		HandshakesFailed: s.HandshakesFailed, BackoffRefused: s.BackoffRefused, Duplicates: s.Duplicates, ConnectsQueued: s.ConnectsQueued, StaleByes: s.StaleByes,
		BusyAnswers: s.BusyAnswers, BusyProbes: s.BusyProbes}
}

// ChannelStats are the counters of a ctrl channel (or a sum of channels).
type ChannelStats struct {
	FramesSent, FragmentsSent, GrantsSent, NotifiesSent uint64
	FencesSent, FencesReceived                          uint64
	// RawDelivered: notifies that came without a CtrlFrame header (Mooncake's first
	// format), of Delivered. Notifies from Mooncake peers on any path are
	// LimitStats.LegacyDelivered.
	FramesReceived, Delivered, RawDelivered  uint64
	Ignored                                  uint64 // known frames without effect here
	CreditWaits                              uint64 // times a send found no credit and waited (credit stalls)
	CreditOverruns                           uint64 // frames received beyond the credit announced
	Backpressured, Expired, TooLarge, Failed uint64 // sends the channel refused or failed
	KeepalivesSent, KeepalivesReceived       uint64
	KeepalivesNoCredit                       uint64
	ByeAcked                                 uint64 // sends completed by the count in the peer's goodbye

	// Received frames dropped, by reason; the channel stays up.
	DroppedBadMagic, DroppedDecode, DroppedUnknownType, DroppedStaleEpoch uint64
	DroppedForeignSession, DroppedDuplicate, DroppedExtension             uint64
	DroppedFragment, DroppedTooLarge                                      uint64

	WCErrors         uint64 // completions with an error status
	RNRRetryExceeded uint64 // of which RNR retries exhausted
	PostErrors       uint64 // PostSend/PostRecv failures

	// Now (open channels).
	CreditAvail uint64 // credit to send now
	Pending     int    // sends queued or in flight
	InFlight    int    // SENDs posted and not completed
	Held        int    // received frames held while the engine is paused
	SendSlots   int
	PathMTU     int // bytes
}

func channelStatsOf(s ctrlchannel.ChannelStats) ChannelStats {
	m := &s.MachineStats
	return ChannelStats{
		FramesSent: m.FramesSent, FragmentsSent: m.FragmentsSent, GrantsSent: m.GrantsSent,
		NotifiesSent: m.NotifiesSent, FencesSent: m.FencesSent, FencesReceived: m.FencesReceived,
		FramesReceived: m.FramesReceived, Delivered: m.Delivered, RawDelivered: m.LegacyDelivered,
		Ignored: m.Ignored, CreditWaits: m.CreditWaits, CreditOverruns: m.CreditOverruns,
		Backpressured: m.Backpressured, Expired: m.Expired, TooLarge: m.TooLarge, Failed: m.Failed,
		KeepalivesSent: m.KeepalivesSent, KeepalivesReceived: m.KeepalivesReceived,
		KeepalivesNoCredit: m.KeepalivesNoCredit, ByeAcked: m.ByeAcked,
		DroppedBadMagic: m.DroppedBadMagic, DroppedDecode: m.DroppedDecode,
		DroppedUnknownType: m.DroppedUnknownType, DroppedStaleEpoch: m.DroppedStaleEpoch,
		DroppedForeignSession: m.DroppedForeignSession, DroppedDuplicate: m.DroppedDuplicate,
		DroppedExtension: m.DroppedExtension, DroppedFragment: m.DroppedFragment, DroppedTooLarge: m.DroppedTooLarge,
		WCErrors: s.WCErrors, RNRRetryExceeded: s.RNRRetryExceeded, PostErrors: s.PostErrors,
		CreditAvail: m.CreditAvail, Pending: m.Pending, InFlight: m.InFlight, Held: m.Held,
		SendSlots: s.SendSlots, PathMTU: s.PathMTU.Bytes(),
	}
}

// add sums o's counters into s, and its gauges too when o is an open channel's.
func (s *ChannelStats) add(o ChannelStats, open bool) {
	for _, f := range []struct{ dst, src *uint64 }{
		{&s.FramesSent, &o.FramesSent}, {&s.FragmentsSent, &o.FragmentsSent}, {&s.GrantsSent, &o.GrantsSent},
		{&s.NotifiesSent, &o.NotifiesSent}, {&s.FencesSent, &o.FencesSent}, {&s.FencesReceived, &o.FencesReceived},
		{&s.FramesReceived, &o.FramesReceived}, {&s.Delivered, &o.Delivered}, {&s.RawDelivered, &o.RawDelivered},
		{&s.Ignored, &o.Ignored}, {&s.CreditWaits, &o.CreditWaits}, {&s.CreditOverruns, &o.CreditOverruns},
		{&s.Backpressured, &o.Backpressured}, {&s.Expired, &o.Expired}, {&s.TooLarge, &o.TooLarge}, {&s.Failed, &o.Failed},
		{&s.KeepalivesSent, &o.KeepalivesSent}, {&s.KeepalivesReceived, &o.KeepalivesReceived},
		{&s.KeepalivesNoCredit, &o.KeepalivesNoCredit}, {&s.ByeAcked, &o.ByeAcked},
		{&s.DroppedBadMagic, &o.DroppedBadMagic}, {&s.DroppedDecode, &o.DroppedDecode},
		{&s.DroppedUnknownType, &o.DroppedUnknownType}, {&s.DroppedStaleEpoch, &o.DroppedStaleEpoch},
		{&s.DroppedForeignSession, &o.DroppedForeignSession}, {&s.DroppedDuplicate, &o.DroppedDuplicate},
		{&s.DroppedExtension, &o.DroppedExtension}, {&s.DroppedFragment, &o.DroppedFragment},
		{&s.DroppedTooLarge, &o.DroppedTooLarge},
		{&s.WCErrors, &o.WCErrors}, {&s.RNRRetryExceeded, &o.RNRRetryExceeded}, {&s.PostErrors, &o.PostErrors},
	} {
		*f.dst += *f.src
	}
	if open {
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
	Borrowed        uint64        // turns run on a caller's thread while the loop slept (reactor.Loop.Exec, ExecWait, Poll)
	LeftToCaller    uint64        // loop wake-ups for its fds while a caller held the turn, left to that caller
	TakenOver       uint64        // of those, ones the waiting caller could not see: its wait was ended
	QueueFull       uint64        // submissions refused: queue full
	SlowCallbacks   uint64        // callbacks over the slow threshold
	LongestCallback time.Duration // longest single callback
	Busy            time.Duration // time spent working, outside epoll_wait and busy-polling
}

func reactorStatsOf(s reactor.Stats) ReactorStats {
	return ReactorStats{
		Iterations: s.Iterations, Wakeups: s.Wakeups, Interrupts: s.Interrupts, BusyPolls: s.BusyPolls,
		FdEvents: s.FdEvents, CQEvents: s.CQEvents, WCs: s.WCs, TimerEvents: s.TimerEvents,
		SubmitEvents: s.SubmitEvents, Submissions: s.Submissions, Borrowed: s.Borrowed, LeftToCaller: s.LeftToCaller, TakenOver: s.TakenOver, QueueFull: s.QueueFull,
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

	HandshakeLimitedByAddr uint64 // handshakes refused: too many pending from one IP
	ShakingAddrs           int64  // now: remote IPs with a handshake pending
	Peers                  int64  // now: peer addresses with OOB client state
	PeersEvicted           uint64 // OOB peer entries dropped to make room
	PeersLimited           uint64 // requests refused: OOB peer entries at their cap
	TooLarge               uint64 // requests refused before sending: encoded frame over the peer's limit
	SendBufferFull         uint64 // requests refused before sending: a connection's buffer would overflow
	OldProtocol            uint64 // Mooncake requests without a type byte served
	ByesSent               uint64 // byes sent by Close
	ByesReceived           uint64 // byes received: a peer closed gracefully
	BusyRefused            uint64 // notifies answered busy: a connection's open requests at their cap
}

func oobStatsOf(s oob.Stats) OOBStats {
	return OOBStats{
		Accepted: s.Accepted, RejectedConns: s.RejectedConns, Dialed: s.Dialed, DialFailed: s.DialFailed,
		ServerConns: s.ServerConns, ClientConns: s.ClientConns, NotifyServed: s.NotifyServed,
		HandshakeServed: s.HandshakeServed, ProbeServed: s.ProbeServed, NotifySent: s.NotifySent,
		ClassicSent: s.ClassicSent, PersistentSent: s.PersistentSent, BadFrames: s.BadFrames,
		IdleCuts: s.IdleCuts, Overflows: s.Overflows, AuthOK: s.AuthOK, AuthFailed: s.AuthFailed,
		HandshakeLimited: s.HandshakeLimited, PendingHandshakes: s.PendingHandshakes,
		HandshakeLimitedByAddr: s.HandshakeLimitedByAddr, ShakingAddrs: s.ShakingAddrs, Peers: s.Peers,
		PeersEvicted: s.PeersEvicted, PeersLimited: s.PeersLimited, TooLarge: s.TooLarge,
		SendBufferFull: s.SendBufferFull, OldProtocol: s.OldProtocol, ByesSent: s.ByesSent,
		ByesReceived: s.ByesReceived, BusyRefused: s.BusyRefused,
	}
}

// Stats returns a snapshot; it waits at most a second for the reactor (the per-peer,
// machine and channel figures are missing when it does not answer in time).
func (e *Engine) Stats() Stats {
	s := Stats{Name: e.name, Transport: e.cfg.transport, Device: e.devName, Session: e.session,
		QueueCapacity: e.cfg.recvQueue}
	// The engine's counters are read on the loop, with the rest, where the loop answers:
	// they move on the loop, so the snapshot is of one moment (a Delivered read before the
	// loop's part would lag behind the FramesReceived of the same snapshot).
	if e.loop == nil {
		e.counters(&s)
		return s
	}
	s.Reactor = reactorStatsOf(e.loop.Stats())
	s.OOB = oobStatsOf(e.node.Stats())
	s.DeviceRNRNaks = e.deviceRNRNaks()
	s.DeviceEvents = e.DeviceEvents()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	done := make(chan Stats, 1)
	if err := e.loop.SubmitWait(ctx, func() { done <- e.loopStats() }); err != nil {
		e.counters(&s) // the loop stopped: its counters no longer move
		return s
	}
	select {
	case ls := <-done:
		s.Queued, s.Sent, s.Delivered, s.Failed = ls.Queued, ls.Sent, ls.Delivered, ls.Failed
		s.SendLatency, s.DeliverLatency = ls.SendLatency, ls.DeliverLatency
		s.Peers, s.Paused, s.HeldOOB, s.OOBBusy = ls.Peers, ls.Paused, ls.HeldOOB, ls.OOBBusy
		s.DeadByProbe, s.DeadNoCredit = ls.DeadByProbe, ls.DeadNoCredit
		s.ChannelsUp, s.PeerCount, s.Limits, s.Channels = ls.ChannelsUp, ls.PeerCount, ls.Limits, ls.Channels
	case <-ctx.Done():
		e.counters(&s) // the loop did not answer in time: the counters as they are
	}
	return s
}

// counters fills s with the engine's atomic counters: sends, deliveries, failures, the
// latency histograms and the receive queue's depth.
func (e *Engine) counters(s *Stats) {
	c := &e.ctr
	s.Queued, s.Sent, s.Delivered = e.rq.len(), c.sent.Load(), c.delivered.Load()
	s.Failed = make(map[string]uint64, len(failureReasons))
	for i, r := range failureReasons {
		s.Failed[r] = c.failed[i].Load()
	}
	s.SendLatency, s.DeliverLatency = c.sendLatency.snapshot(), c.deliverLatency.snapshot()
}

// loopStats is the loop-owned part of Stats. Loop-only.
func (e *Engine) loopStats() Stats {
	ms := e.m.stats
	ms.Names, ms.Channels, ms.Unconfirmed = len(e.m.names), e.m.channels, e.m.unconfirmed
	ms.PeersUnconfirmed = e.m.unconfirmedPeers
	s := Stats{Paused: e.paused, HeldOOB: len(e.heldOOB), OOBBusy: e.oobBusy, PeerCount: len(e.m.peers),
		DeadByProbe: e.ka.deadByProbe, DeadNoCredit: e.ka.deadNoCredit,
		Limits: limitStatsOf(ms), Channels: e.ctr.closedChannels}
	e.counters(&s)
	for _, ch := range e.chans {
		s.Channels.add(channelStatsOf(ch.Stats()), true)
	}
	s.Peers = make([]PeerStats, 0, len(e.m.peers))
	for _, p := range e.m.peers {
		st := PeerStats{Peer: e.m.statsName(p), Session: p.key.session, Names: append([]string(nil), p.names...),
			State: e.m.peerState(p), Epoch: p.epoch, Sent: p.sent, Received: p.received, Duplicates: p.dups,
			Held: p.win.held, Window: windowStatsOf(p.win.stats)}
		if p.lastErr != nil {
			st.LastError = p.lastErr.Error()
		}
		if ch := e.chans[p.ch]; p.ch != 0 && ch != nil {
			s.ChannelsUp++
			st.LocalQPN, st.RemoteQPN = ch.Local().QPN, e.remote[p.ch]
			cs := channelStatsOf(ch.Stats())
			st.Channel = &cs
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

// ReactorStats are the reactor's counters (epoll wake-ups, events, submissions, busy time),
// read without waking it.
func (e *Engine) ReactorStats() ReactorStats { return reactorStatsOf(e.loop.Stats()) }
