// Package metrics exports a notify engine's counters to Prometheus: a prometheus.Collector
// that reads Engine.Stats on each scrape. It lives beside notify so that the engine itself
// does not depend on client_golang; it owns only the translation of Stats into metrics and
// must not reach into the engine (nothing but notify's public API).
//
// Every series has a bounded label set: failure reasons and drop reasons are fixed lists,
// and per-peer series exist only with WithPeerLabels, for at most its cap of peers.
//
// Status: API (stable), as notify's.
package metrics

import (
	"sort"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/twosided/twosided/notify"
)

// Option configures a Collector.
type Option func(*Collector)

// WithPeerLabels adds per-peer series (label "peer") for at most max peers (default: none,
// engine-wide series only). A peer keeps its
// series while the engine knows it, so its counters never jump between peers; peers beyond
// the cap are counted in twosided_peers_unlabeled and only in the engine-wide series.
func WithPeerLabels(max int) Option { return func(c *Collector) { c.peerCap = max } }

// WithConstLabels adds labels to every series, e.g. {"engine": "prefill-0"} when one
// process registers several engines (default: none).
func WithConstLabels(l prometheus.Labels) Option { return func(c *Collector) { c.constLabels = l } }

// Collector is a prometheus.Collector for one engine. Safe for concurrent scrapes.
type Collector struct {
	e           *notify.Engine
	peerCap     int
	constLabels prometheus.Labels

	info, sent, failed, fallbacks, delivered, duplicates        *prometheus.Desc
	framesDropped, creditStalls, rnrNaks, rnrExceeded, wcErrs   *prometheus.Desc
	framesSent, framesRecv, channelsUp, peers, queueDepth       *prometheus.Desc
	queueCap, paused, pending, wakeups, busy                    *prometheus.Desc
	oobHandshakes, oobAuthFailed, oobConns, sendLat, deliverLat *prometheus.Desc
	peerSent, peerRecv, peerDups, peerUp, peersUnlabeled        *prometheus.Desc
	refusals, pruned, givenUp, heldOOB, oobBusy                 *prometheus.Desc
	busyAnswers, busyProbes                                     *prometheus.Desc
	devEvents, devChansFailed, devPortDown                      *prometheus.Desc
	unconfirmed, unconfirmedClosed, peersEvicted                *prometheus.Desc

	mu      sync.Mutex
	labeled map[string]struct{} // peers with series, at most peerCap
}

// New returns a Collector for e; register it with prometheus.Register or a Registry.
func New(e *notify.Engine, opts ...Option) *Collector {
	c := &Collector{e: e}
	for _, o := range opts {
		o(c)
	}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("twosided_"+name, help, labels, c.constLabels)
	}
	c.info = d("engine_info", "The engine: its peer name, transport and device; always 1.", "name", "transport", "device")
	c.sent = d("notifies_sent_total", "Sends (SendNotify, SendNotifyAsync) that succeeded: the peer acknowledged the notify.")
	c.failed = d("notifies_failed_total", "Sends that failed, by the error sentinel they wrap.", "reason")
	c.fallbacks = d("notify_fallbacks_total", "Sends retried over the OOB channel after their ctrl channel failed or was unavailable.")
	c.delivered = d("notifies_delivered_total", "Received notifies handed to the application, each once.")
	c.duplicates = d("notify_duplicates_dropped_total", "Received notifies dropped as duplicates of one already delivered.")
	c.framesDropped = d("frames_dropped_total", "Frames received and dropped, by reason.", "reason")
	c.creditStalls = d("credit_stalls_total", "Times a ctrl channel send found no credit and waited for the peer to return some.")
	c.rnrNaks = d("device_rnr_naks_total", "RNR NAKs received by the RDMA device's requesters (device-wide).")
	c.rnrExceeded = d("rnr_retry_exceeded_total", "Sends that failed with RNR retries exhausted.")
	c.wcErrs = d("wc_errors_total", "Work completions with an error status on the engine's ctrl channels.")
	c.framesSent = d("ctrl_frames_sent_total", "Frames posted on the engine's ctrl channels, every type.")
	c.framesRecv = d("ctrl_frames_received_total", "Frames received on the engine's ctrl channels, every type.")
	c.channelsUp = d("channels_up", "Established ctrl channels.")
	c.peers = d("peers", "Peers the engine keeps state for.")
	c.queueDepth = d("receive_queue_depth", "Received notifies not yet consumed by the application.")
	c.queueCap = d("receive_queue_capacity", "The receive queue's bound.")
	c.paused = d("receive_paused", "1 while the receive queue is full and credit return is stopped.")
	c.pending = d("sends_pending", "Sends queued or in flight on the ctrl channels.")
	c.wakeups = d("reactor_wakeups_total", "Returns of the reactor from a blocking epoll_wait.")
	c.busy = d("reactor_busy_seconds_total", "Time the reactor spent working, outside epoll_wait and busy-polling.")
	c.oobHandshakes = d("oob_handshakes_served_total", "Handshakes received on the OOB channel.")
	c.devEvents = d("device_events_total", "Async events of the RDMA device, by event: port_err, port_active, device_fatal, gid_change, other; and reopened, reopen_failed: a fatal device opened again, and tries that found it not usable yet.", "event")
	c.devChansFailed = d("device_channels_failed_total", "Ctrl channels closed at once by a PORT_ERR or DEVICE_FATAL event (their notifies go on over OOB).")
	c.devPortDown = d("device_port_down", "1 while a PORT_ERR or DEVICE_FATAL event holds: no ctrl channel is made.")
	c.oobAuthFailed = d("oob_auth_failures_total", "OOB connections refused for a wrong or missing key proof.")
	c.oobConns = d("oob_connections", "OOB connections open.", "side")
	c.refusals = d("refusals_total", "Peers, names, channels or OOB notifies refused: a limit reached or a failed proof.", "reason")
	c.pruned = d("peers_pruned_total", "Idle peers whose state the engine dropped.")
	c.unconfirmed = d("unconfirmed_channels", "Ctrl channels (QPs) made for peers' handshakes that their peer has not used yet: at most 128, 32 per source address.")
	c.unconfirmedClosed = d("unconfirmed_channels_closed_total", "Unconfirmed ctrl channels closed: evicted, past their grace, for a newer handshake past a cap; expired, after the connect timeout.", "reason")
	c.peersEvicted = d("peers_evicted_total", "Unconfirmed peer entries (made by handshakes nobody used) forgotten to make room, with the channels they held.")
	c.givenUp = d("seq_gaps_given_up_total", "Sequence numbers given up: a sender's fence or a gap timeout.")
	c.heldOOB = d("oob_notifies_held", "OOB notifies held while the receive queue is full.")
	c.oobBusy = d("oob_busy_replies_total", "OOB notifies answered busy: the receive queue was full.")
	c.busyAnswers = d("oob_sends_answered_busy_total", "Our OOB notifies that peers answered busy (each waits its turn for the peer's next answer).")
	c.busyProbes = d("oob_busy_probes_total", "OOB notifies sent again because a busy answer left nothing else of their pair on the wire.")
	c.sendLat = d("send_to_ack_seconds", "Time from a send call to its success (the peer acknowledged it).")
	c.deliverLat = d("receive_to_deliver_seconds", "Time a received notify waited in the receive queue until the application took it.")
	if c.peerCap > 0 {
		c.labeled = make(map[string]struct{}, c.peerCap)
		c.peerSent = d("peer_notifies_sent_total", "Notifies posted on the ctrl channel to a peer.", "peer")
		c.peerRecv = d("peer_notifies_received_total", "Notifies delivered from a peer (any path).", "peer")
		c.peerDups = d("peer_duplicates_dropped_total", "Duplicates dropped from a peer.", "peer")
		c.peerUp = d("peer_channel_up", "1 while the ctrl channel to a peer is established.", "peer")
		c.peersUnlabeled = d("peers_unlabeled", "Peers beyond the per-peer label cap, in engine-wide series only.")
	}
	return c
}

// dropReasons are the reasons of twosided_frames_dropped_total: the ctrl channel's, in
// ctrlchannel.DropReason order, and the OOB channel's malformed requests.
var dropReasons = []string{"bad_magic", "decode", "unknown_type", "stale_epoch", "foreign_session",
	"duplicate", "extension", "fragment", "too_large", "oob_bad_frame"}

// deviceEvents are the events of twosided_device_events_total.
var deviceEvents = []string{"port_err", "port_active", "device_fatal", "gid_change", "other", "reopened", "reopen_failed"}

// refusalReasons are the reasons of twosided_refusals_total.
var refusalReasons = []string{"peer_limit", "name_limit", "channel_limit", "auth", "oob", "unconfirmed_busy"}

// Describe sends every Desc the Collector may send.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.info, c.sent, c.failed, c.fallbacks, c.delivered, c.duplicates,
		c.framesDropped, c.creditStalls, c.rnrNaks, c.rnrExceeded, c.wcErrs,
		c.framesSent, c.framesRecv, c.channelsUp, c.peers, c.queueDepth,
		c.queueCap, c.paused, c.pending, c.wakeups, c.busy,
		c.oobHandshakes, c.oobAuthFailed, c.oobConns, c.sendLat, c.deliverLat,
		c.refusals, c.pruned, c.givenUp, c.heldOOB, c.oobBusy, c.busyAnswers, c.busyProbes,
		c.devEvents, c.devChansFailed, c.devPortDown,
		c.unconfirmed, c.unconfirmedClosed, c.peersEvicted,
	} {
		ch <- d
	}
	if c.peerCap > 0 {
		for _, d := range []*prometheus.Desc{c.peerSent, c.peerRecv, c.peerDups, c.peerUp, c.peersUnlabeled} {
			ch <- d
		}
	}
}

// Collect reads one Stats snapshot and sends it as metrics.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.e.Stats()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(c.info, 1, s.Name, s.Transport, s.Device)
	counter(c.sent, s.Sent)
	for _, r := range notify.FailureReasons() {
		counter(c.failed, s.Failed[r], r)
	}
	counter(c.fallbacks, s.Limits.Fallbacks)
	counter(c.delivered, s.Delivered)
	counter(c.duplicates, s.Limits.Duplicates)
	ct := &s.Channels
	for i, v := range []uint64{ct.DroppedBadMagic, ct.DroppedDecode, ct.DroppedUnknownType, ct.DroppedStaleEpoch,
		ct.DroppedForeignSession, ct.DroppedDuplicate, ct.DroppedExtension, ct.DroppedFragment, ct.DroppedTooLarge, s.OOB.BadFrames} {
		counter(c.framesDropped, v, dropReasons[i])
	}
	l := &s.Limits
	for i, v := range []uint64{l.PeersRefused, l.NamesRefused, l.ChannelsRefused, l.AuthRefused, l.OOBRefused, l.UnconfirmedRefused} {
		counter(c.refusals, v, refusalReasons[i])
	}
	counter(c.pruned, l.PeersPruned)
	gauge(c.unconfirmed, float64(l.Unconfirmed))
	counter(c.unconfirmedClosed, l.UnconfirmedEvicted, "evicted")
	counter(c.unconfirmedClosed, l.UnconfirmedExpired, "expired")
	counter(c.peersEvicted, l.PeersEvicted)
	counter(c.givenUp, l.GivenUp)
	gauge(c.heldOOB, float64(s.HeldOOB))
	counter(c.oobBusy, s.OOBBusy)
	counter(c.busyAnswers, l.BusyAnswers)
	counter(c.busyProbes, l.BusyProbes)
	counter(c.creditStalls, ct.CreditWaits)
	counter(c.rnrNaks, s.DeviceRNRNaks)
	counter(c.rnrExceeded, ct.RNRRetryExceeded)
	counter(c.wcErrs, ct.WCErrors)
	counter(c.framesSent, ct.FramesSent)
	counter(c.framesRecv, ct.FramesReceived)
	gauge(c.channelsUp, float64(s.ChannelsUp))
	gauge(c.peers, float64(s.PeerCount))
	gauge(c.queueDepth, float64(s.Queued))
	gauge(c.queueCap, float64(s.QueueCapacity))
	gauge(c.paused, boolFloat(s.Paused))
	gauge(c.pending, float64(ct.Pending))
	counter(c.wakeups, s.Reactor.Wakeups)
	ch <- prometheus.MustNewConstMetric(c.busy, prometheus.CounterValue, s.Reactor.Busy.Seconds())
	counter(c.oobHandshakes, s.OOB.HandshakeServed)
	counter(c.oobAuthFailed, s.OOB.AuthFailed)
	gauge(c.oobConns, float64(s.OOB.ServerConns), "server")
	gauge(c.oobConns, float64(s.OOB.ClientConns), "client")
	de := c.e.DeviceEvents()
	for i, v := range []uint64{de.PortErr, de.PortActive, de.DeviceFatal, de.GIDChange, de.Other, de.Reopened, de.ReopenFailed} {
		counter(c.devEvents, v, deviceEvents[i])
	}
	counter(c.devChansFailed, de.ChannelsFailed)
	gauge(c.devPortDown, boolFloat(de.PortDown))
	ch <- histogram(c.sendLat, &s.SendLatency)
	ch <- histogram(c.deliverLat, &s.DeliverLatency)
	if c.peerCap > 0 {
		c.collectPeers(ch, s.Peers)
	}
}

// collectPeers sends the per-peer series of the labeled peers, labeling new peers while
// there is room and forgetting peers the engine no longer knows.
func (c *Collector) collectPeers(ch chan<- prometheus.Metric, peers []notify.PeerStats) {
	c.mu.Lock()
	defer c.mu.Unlock()
	known := make(map[string]struct{}, len(peers))
	for _, p := range peers {
		known[p.Peer] = struct{}{}
	}
	for p := range c.labeled {
		if _, ok := known[p]; !ok {
			delete(c.labeled, p)
		}
	}
	// New peers get the free labels in name order, so the choice does not depend on map order.
	sort.Slice(peers, func(i, j int) bool { return peers[i].Peer < peers[j].Peer })
	unlabeled := 0
	for _, p := range peers {
		if _, ok := c.labeled[p.Peer]; !ok {
			if len(c.labeled) >= c.peerCap {
				unlabeled++
				continue
			}
			c.labeled[p.Peer] = struct{}{}
		}
		ch <- prometheus.MustNewConstMetric(c.peerSent, prometheus.CounterValue, float64(p.Sent), p.Peer)
		ch <- prometheus.MustNewConstMetric(c.peerRecv, prometheus.CounterValue, float64(p.Received), p.Peer)
		ch <- prometheus.MustNewConstMetric(c.peerDups, prometheus.CounterValue, float64(p.Duplicates), p.Peer)
		ch <- prometheus.MustNewConstMetric(c.peerUp, prometheus.GaugeValue, boolFloat(p.State == "up"), p.Peer)
	}
	ch <- prometheus.MustNewConstMetric(c.peersUnlabeled, prometheus.GaugeValue, float64(unlabeled))
}

// histogram turns a notify.Histogram (per-bucket counts) into Prometheus' cumulative form.
func histogram(d *prometheus.Desc, h *notify.Histogram) prometheus.Metric {
	buckets := make(map[float64]uint64, len(h.Bounds))
	var cum uint64
	for i, b := range h.Bounds {
		cum += h.Counts[i]
		buckets[b.Seconds()] = cum
	}
	return prometheus.MustNewConstHistogram(d, h.Count, h.Sum.Seconds(), buckets)
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
