// Package ctrlchannel is the per-peer control channel of twosided: the CtrlFrame v1 codec
// (byte-compatible with Mooncake's rdma_twosided ctrl_frame), the credit ledger, the
// channel state machine, and the driver that binds the machine to one RC QP and the
// reactor.
//
// Status: an internal layer of twosided, kept importable for the benchmark and the tools
// (cmd/twosided, bench, tests). Its API may change without notice; applications use
// package notify. docs/design.md describes how the layers fit together.
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
// Peer recognition (decided by the engine from the handshake, told to the channel in
// PeerInfo): a handshake reply without ctrl_channel/notify_qp_num is a peer without a
// ctrl channel (Mooncake main, or a twosided engine on the oob transport): the engine
// uses OOB only and opens no channel. A handshake with a ctrl channel but without
// ts_session is a Mooncake PR #3440 peer: PeerInfo.Legacy. A handshake with ts_session is
// a twosided peer; with ts_extensions it also gets the extension frames.
//
// Towards a legacy peer (Mooncake PR #3440):
//   - Received frames are taken with epoch 0 (PR #3440 never sets it) as well as with the
//     channel's epoch, from any session (it has one per process, not announced), with
//     seqs that restart at 1 on every channel: the engine's delivered seq is ignored and
//     duplicates are dropped only within the channel. A RECV without the MCKC magic is
//     Mooncake's phase-1 raw notify (u32 name_len, name, u32 msg_len, msg) and is
//     delivered with seq 0, as Mooncake's dispatchRecvPayload does; one that does not
//     decode is dropped.
//   - Sent frames: NOTIFY_COMPAT (epoch and seq as between twosided peers, ack_seq 0,
//     flags 0; Mooncake reads neither), CTRL_ACK keepalives and one SESSION_CLOSE from
//     Bye. Mooncake's receive path checks none of epoch, session, seq or ack_seq, and
//     ignores CTRL_ACK and SESSION_CLOSE (known types 9 and 6) before reposting the RECV.
//   - Off: credit grants and piggybacked credit (PR #3440 sends none and ignores them),
//     fragmentation (a notify above the peer's buffer fails with ErrTooLarge, never
//     truncated), NOTIFY_ID (the notify goes out without its id), FENCE (its seqs are
//     per channel), and every other extension frame. Authentication, persistent OOB
//     connections and the OOB notify fields are the oob package's; it turns them off
//     towards a classic peer by itself.
//   - Window: at most min(MaxPendingSends, notify_rq_depth) SENDs without a completion
//     (Mooncake's own sender rule). A SEND beyond the RECVs Mooncake has reposted meets
//     RNR, which rnr_retry 7 retries for ever (IB: 7 means infinite; ibv/soft does the
//     same), so nothing is lost and the sender never stalls while the peer keeps
//     reposting; a sender stuck behind a peer that stopped reposting fails by the
//     request's deadline, and a dead peer by retry_cnt × timeout.
//   - Backpressure: while this side's receive queue is full (SetPaused) its RECVs stay
//     reaped and unposted, as between twosided peers; Mooncake's SENDs then wait on RNR
//     retry without a timeout, and once its window is full its sendNotify blocks its caller
//     until this side takes notifies again. Nothing is dropped; that wait is Mooncake's
//     own behaviour towards any slow receiver.
//   - The peer does not announce its buffer size or MTU: the engine assumes Mooncake's
//     defaults (MC_RDMA_NOTIFY_BUFFER_SIZE 4096, IB MTU 4096) capped by ours; a frame of
//     exactly the peer's buffer goes out whole, one byte more fails with ErrTooLarge.
//
// A peer that is not legacy but did not set Extensions (a twosided engine with fewer
// than three RECVs) gets what a legacy peer gets, with the strict epoch and session
// checks, plus FENCE. Between two twosided peers (both set Extensions) the credit
// protocol above applies, and the extension frames (types from 64, never sent to another
// peer, dropped with DropExtension from one that did not negotiate them):
//   - NOTIFY_FRAGMENT (64): a notify whose name+msg does not fit one RECV buffer, cut
//     into pieces: u32 total, u32 offset, bytes of the NOTIFY_COMPAT payload; reassembled
//     up to MaxNotifySize.
//   - NOTIFY_ID (65): a notify with SendReq.ID (1..255 bytes): u8 id_len, id, then the
//     NOTIFY_COMPAT payload (u32 name_len, name, u32 msg_len, msg). Delivery.ID carries it.
//   - NOTIFY_ID_FRAGMENT (66): as NOTIFY_FRAGMENT, with the bytes of a NOTIFY_ID payload.
//
// # Fences and closing
//
// FENCE (type 7; Mooncake defines the type, no payload, and ignores it) has the payload
// u64 first, u64 count, header seq 0: the sender gave up on its seqs
// first..first+count-1 of this pair and will never send them, so the receiver's window
// must not wait for them. It travels in the send FIFO and reaches Events.OnFence in order
// with OnNotify. SESSION_CLOSE (type 6, no payload) is Bye's last frame: the receiver
// delivers everything before it (after its receive queue frees up, if paused) and
// closes with ErrPeerClosed; the sender closes once the frame completed, or after
// Config.ByeTimeout. Between peers that negotiated Extensions its header seq is the
// number of frames the sender of the SESSION_CLOSE received on the channel before it
// (0 towards a legacy peer): the receiver completes its own sends up to that count as
// sent, since they landed even when their (unsignaled) completions were not reaped yet,
// and fails only the rest with ErrPeerClosed. Without it, a notify delivered just before
// its peer's goodbye was reported to its caller as of unknown outcome.
//
// # Dropped frames
//
// No received frame closes the channel. A frame that cannot be used (no magic and no raw
// notify, bad version, flags, length or payload, unknown type, extension not negotiated,
// stale epoch, foreign session, duplicate seq, broken fragment) is dropped, its RECV
// reposted, counted under its reason in MachineStats (Dropped*), and logged at warn
// (duplicates at debug), at most 10 lines a second then one in a thousand. A CREDIT_GRANT
// naming one resource twice is accepted, as by Mooncake's decoder; its largest total
// applies. So every frame whose SEND completed at the sender is either delivered or
// counted and logged as dropped.
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
// one registered MR each, BufSize bytes a slot, made once the peer answered (a channel
// whose peer never answers its handshake holds only its QP and CQ); the send ring has
// MaxPendingSends slots and is the send queue's depth.
//
// The verbs that can block on a NIC (ibv_create_qp, ibv_reg_mr, and the modify to RTR,
// which on RoCE waits while the kernel resolves the peer's MAC: milliseconds, up to a
// second) need not run on the loop: Prepare (QP in INIT, CQ) and Prepared.Ready (rings
// registered, every RECV posted, RTR, RTS) run on any goroutine, and Adopt, on the loop,
// puts the CQ's completion channel in the epoll set and starts the machine; its first
// cycle reaps what arrived before. A Prepared that is not adopted is released
// (Prepared.Release). NewChannel and Channel.Connect do the same on the loop. Frames up to MaxInline bytes go inline. SENDs are
// signaled every SendSlots/4 and the newest posted SEND is always signaled, so every SEND
// is covered by a completion; a send slot (and its send-queue slot) is free only once a
// signaled completion at or after it arrived, so the send queue never overflows. RECV WRIDs
// carry the slot with bit 63 set, SEND WRIDs the frame number. The path MTU is the smaller
// of both sides' MTUs. QP attributes default to Mooncake's: min_rnr_timer 12, timeout 14,
// retry_cnt 7, rnr_retry 7, access LOCAL_WRITE, traffic class, SL and P_Key index 0, 64
// bytes of inline data (Config, or a PD that implements Defaults, changes them). The
// initial PSN is random (24 bits, crypto/rand) per channel, advertised in Local (ts_psn)
// and the QP sends from it; towards a Mooncake peer (PeerInfo.Legacy: it reads no ts_psn)
// it sends from 0, as Mooncake's QPs do. The source GID is one table entry
// (Config.GIDIndex, or ibv.SelectGID's choice): Local advertises its GID and the address
// vector's sgid_index is its index, so the two never differ. The inline size comes from
// the caps ibv_create_qp granted (QP.Cap), never from ibv_query_qp on a RESET QP.
//
// # Sequence numbers
//
// A notify's seq is assigned by the engine: strictly increasing per sending session,
// kept across a retry on another path or a reconnect with a new epoch; gaps are allowed
// (and announced with FENCE). The receiver drops a notify whose seq is not above the
// highest one it delivered from that session (seq 0 means unstamped and is always
// delivered) and every frame whose epoch is not the channel's (a legacy peer's epoch 0
// excepted). Credit frames, keepalives, fences and SESSION_CLOSE carry seq 0.
package ctrlchannel
