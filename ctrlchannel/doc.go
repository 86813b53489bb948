// Package ctrlchannel is the per-peer control channel of twosided: the CtrlFrame v1 codec
// (byte-compatible with Mooncake's rdma_twosided ctrl_frame), the credit ledger, the
// channel state machine, and the driver that binds the machine to one RC QP and the
// reactor.
//
// The package owns the frame format, flow control, in-order delivery with duplicate and
// stale-epoch dropping, and fragmentation of large notifies. It must not touch sockets,
// the OOB channel, handshakes, environment variables or the engine's path choice: the
// engine (package notify) exchanges LocalInfo/PeerInfo out of band, assigns sessions,
// epochs and seqs, and decides about fallback.
//
// # Layers
//
// The codec (frame.go, payload.go) and the credit Ledger are plain functions and values.
// Machine is the protocol core: a pure state machine in the style of etcd/raft's
// Step/Ready. Events go in (Submit, RecvWC, SendWC, FailWC, Repost, Tick, Connected,
// SetPaused, Close); actions come out of Ready (post RECV, post SEND, deliver, complete a
// request, set the timer, close). It makes no syscalls, starts no goroutines, takes no
// locks and never reads the clock: time is an argument. Channel is the driver: it owns
// the QP, the CQ and the two registered rings, runs on the reactor's loop and performs the
// machine's actions.
//
// # Credit flow control
//
// Every frame consumes one RECV the peer posted. The receiver counts the RECVs it has
// posted in this epoch, a cumulative total that starts at its notify_rq_depth, and tells
// the sender that total: in the ack_seq field of every frame it sends (piggyback), or in
// an explicit CREDIT_GRANT frame (resource RequestSlots) once a quarter of the peer's data
// window has been reposted without an outgoing frame to carry it. The total only counts
// RECVs reaped and reposted, so the sender never has more SENDs in flight than RECVs the
// peer has posted and RNR does not happen in steady state. One RECV of the peer's ring is
// kept in reserve for credit frames: notifies may use at most notify_rq_depth-1, so two
// peers that both send at full rate can always still tell each other about credit. When
// the receiver sees the sender's credit down to that reserve it returns what it has
// reposted, but only when that is worth the RECV the grant costs the peer: some data
// RECVs, or at least two RECVs consumed by the peer's own credit frames. A grant that would
// only hand back the RECV of the peer's last grant is never sent, so credit frames cannot
// answer each other one for one and an idle exchange of grants dies out. Credit flow
// control needs notify_rq_depth ≥ 3 on both sides.
//
// # Mooncake peers and extensions
//
// A peer that did not set the Extensions feature bit in the handshake (a Mooncake
// engine) only ever gets NOTIFY_COMPAT frames and CTRL_ACK keepalives, with ack_seq 0. Mooncake never returns
// credit for notify RECVs, so towards such a peer the window is Mooncake's own rule: at
// most min(MaxPendingSends, notify_rq_depth) SENDs without a completion; a transient RNR
// is then retried by the QP (rnr_retry 7). Between two twosided peers (both set
// Extensions) the credit protocol above applies, and notifies whose name+msg do not fit
// one RECV buffer are cut into NOTIFY_FRAGMENT frames (type 64, a twosided extension: u32
// total, u32 offset, bytes of the NOTIFY_COMPAT payload), reassembled up to MaxNotifySize.
// Towards a Mooncake peer such a notify fails with ErrTooLarge; it is never truncated.
//
// # Keepalive
//
// An idle channel learns that its peer died only when it next sends. Keepalive makes it
// send: when nothing arrived since the previous call and no SEND is in flight, it posts
// one signaled CTRL_ACK (header only, seq 0). Mooncake ignores CTRL_ACK and reposts the
// RECV, so the frame goes to every peer; a CREDIT_GRANT would instead be applied to a
// Mooncake engine's own credit ledger. The receiver consumes it without delivering
// anything and returns its RECV like a grant's. Towards a twosided peer a keepalive takes
// one credit and so never meets a missing RECV; it needs no data credit, but it takes the
// RECV kept in reserve for credit frames only when it returns at least two RECVs, as a
// grant would: two peers spending their reserves on keepalives that return nothing could
// no longer grant each other anything (the random-schedule tests find such deadlocks).
// A live peer that is not paused always returns credit before the sender is down to its
// reserve, so an idle channel can always probe; one at its reserve sends no keepalive
// that round (KeepalivesNoCredit) — its peer owes it a grant, and if that peer died
// before granting, the sends waiting for credit fail by their deadlines instead. A dead
// peer fails the keepalive's SEND with RETRY_EXC_ERR after timeout×retry_cnt and the
// channel closes with ErrPeerError.
//
// # Driver
//
// One RC QP per peer with one CQ for both queues, on its own completion channel watched by
// the reactor (reactor.WatchCQ: reap, Repost, arm). The send ring and the receive ring are
// one registered MR each, BufSize bytes a slot; the send ring has MaxPendingSends slots
// and is the send queue's depth. Frames up to MaxInline bytes go inline. SENDs are
// signaled every SendSlots/4 and the newest posted SEND is always signaled, so every SEND
// is covered by a completion; a send slot (and its send-queue slot) is free only once a
// signaled completion at or after it arrived, so the send queue never overflows. RECV WRIDs
// carry the slot with bit 63 set, SEND WRIDs the frame number. The path MTU is the smaller
// of both sides' MTUs. QP attributes default to Mooncake's: min_rnr_timer 12, timeout 14,
// retry_cnt 7, rnr_retry 7, PSNs 0, access LOCAL_WRITE.
//
// # Sequence numbers
//
// A notify's seq is assigned by the engine: strictly increasing per sending session,
// kept across a retry on another path or a reconnect with a new epoch; gaps are allowed.
// The receiver drops a notify whose seq is not above the highest one it delivered from
// that session (seq 0 means unstamped and is always delivered) and every frame whose epoch
// is not the channel's. Credit frames carry seq 0.
package ctrlchannel
