// Package soft is twosided's software RC provider: a faithful stand-in for an RDMA NIC that
// carries reliable-connected SEND/RECV traffic over TCP, so that every layer above ibv can be
// tested, and run across processes or hosts, without RDMA hardware.
//
// Status: an internal layer of twosided, kept importable for the benchmark and the tools
// (cmd/twosided, bench, tests). Its API may change without notice; applications use
// package notify. docs/design.md describes how the layers fit together.
//
// It owns the provider "soft" (registered in init, configured from the environment), the
// devices soft0, soft1, … (and an optional phantom device whose port is DOWN), their TCP
// listeners and connections, and the NIC logic: PSNs, cumulative ACKs, RNR NAKs, retransmit
// and RNR timers, queue and completion semantics. It must not import any other twosided
// package but ibv, and it never touches the consumer's goroutines: the consumer sees queues,
// CQs and non-blocking eventfds only.
//
// # Configuration
//
// The registered provider reads TWOSIDED_SOFT_DEVICES (number of devices, default 2),
// TWOSIDED_SOFT_ADDR (TCP listen address of every device, default 127.0.0.1:0; port 0 picks a
// free port per device, a fixed port p gives device i port p+i) and TWOSIDED_SOFT_PHANTOM
// (1/true adds soft_phantom) and TWOSIDED_SOFT_INPROC (default 1; 0 sends traffic between
// devices of this process through TCP too) on every GetDeviceList and Open; a bad value is an
// error naming the variable. New builds an isolated provider from options, for tests.
//
// # In-process delivery
//
// Between two devices of one provider, packets by default skip the socket: the goroutine
// that posted them places them at the peer after releasing its locks (as a NIC's internal
// loopback would), with the same PSN/ACK/NAK logic, faults and counters. This removes the
// reader-thread wake-up from the path. Devices of other processes are always reached over TCP.
//
// # Progress: who reads the sockets
//
// By default the soft NIC makes progress on the consumer's thread (manual progress, as UCX's
// tcp transport and libfabric's FI_PROGRESS_MANUAL do). Each device keeps its connections'
// sockets in one epoll set, the progress set. Every completion channel's Fd is an epoll fd
// holding the channel's eventfd, and one channel of the device at a time, the holder, holds
// the progress set too: its fd is readable when an event is queued or a socket holds
// packets, the others' when an event is queued. The first channel holds it; the first
// channel whose consumer waits on it (calls GetEvent) takes it from a holder whose consumer
// never did, or whose packets the backstop had to read; a closing holder hands it to a
// channel whose consumer waits. One holder per device, not the progress set in every
// channel's fd: each socket then has one wake-up path to the sets consumers block on, where
// the kernel caps nested paths (50 under a reactor: the 51st channel of a process failed),
// and a packet wakes one consumer, not one per channel. GetEvent with no queued event, and
// Poll of an empty CQ, first read every readable socket without blocking, place the SENDs,
// answer them (one cumulative ACK per QP per batch) and push the CQEs, firing the channels
// of every CQ they complete (the holder's consumer works for all, as a NIC raises events);
// an event raised during GetEvent's own progress costs no eventfd write. A reactor asleep
// on the holder thus wakes once per batch of packets, and the packets are handled on its
// thread: no NIC thread wakes between the wire and the CQ. With several consumers of one
// device in a process (engines with in-process delivery off), a packet for another
// consumer's CQ costs that consumer one eventfd wake-up after the holder's. With the reactor's
// borrowed turns (reactor.Loop.Exec, Poll, ExecWait) that thread is whichever runs the
// loop's turn: the loop's own, or a SendNotify caller's that waits as the loop, so a reply
// wakes the caller directly, as a reply to a blocking read wakes its reader.
//
// Doorbells. A consumer that calls its CQ's Flush once per turn (reactor.Flusher: the
// reactor does, at the end of every loop iteration) gets its device's writes deferred to
// that Flush: the SENDs its PostSends queue and the ACKs its progress owes leave together,
// one write per connection per turn, so the ACK of a request travels with the handler's
// reply. A consumer that never calls Flush gets a write per PostSend, as before; the
// backstop writes what a consumer left queued if it stops calling Flush.
//
// Every connection keeps one NIC goroutine, a backstop, because RC peers need ACKs whether
// or not the consumer looks. While no consumer attends the device (no CQ armed on a
// channel, no poll in the last 200 µs) it sleeps on the socket and reads every packet itself,
// as the provider's NIC threads always did (WithNICThread(true) or TWOSIDED_SOFT_NIC_THREAD=1
// keep that model for every packet). While a consumer attends, it leaves the socket alone and
// wakes once a period (2 ms, doubling to 8 ms while the consumer keeps reading) as long as
// traffic flows; if the consumer read nothing for a whole period it reads what waits, then
// sleeps on the socket again. An idle connection costs no wake-ups.
//
// Timing that differs from hardware: (1) a completion channel's fd may turn readable with
// no event (a socket holds packets, e.g. an ACK); GetEvent then does the receive work and
// answers ErrWouldBlock (verbs consumers must already accept spurious wake-ups); (2) while
// the consumer attends but is busy elsewhere, a packet waits up to 2-16 ms for the backstop
// (hardware answers in microseconds whatever the host does), so a requester with a short
// local ACK timeout may retransmit; the duplicate is ACKed, not placed twice; (3) the first
// packet after 2 ms of silence wakes the backstop beside the consumer once. rnr_retry 7
// retries without limit, as IB specifies (testRNRRetryForever).
//
// A remote device that is gone. When a connection ends from the far side, the device dials
// the remote again (at once, after 200 ms and after 1 s, since a killed process's listener
// may outlive its connection by a moment); a refused dial means the remote device is gone.
// Every QP connected to it that has no SEND in flight then fails like an exhausted retry
// once its retry budget (timeout × (retry_cnt+1), at least 1 s) passed with no packet from
// the peer: its RECVs (and SENDs posted meanwhile) complete with WR_FLUSH_ERR and it enters
// ERR; Counters.PathsLost counts them. A QP with a SEND in flight keeps the hardware rule
// (RETRY_EXC_ERR from its ACK timer). Hardware would tell an idle QP nothing: the end of the
// TCP connection stands for the link going down, so a killed peer is reclaimed in ~1–2.5 s
// without traffic or keepalives.
//
// # Fault hooks
//
// CutLink/CutPath/DelayLink/RestoreLink, KillDevice, SetPortState, SetGIDTable,
// RaiseAsyncEvent, SetRTRHook (a modify to RTR that blocks, as RoCE's address resolution
// can), InjectWC,
// DeviceCounters and Provider.Counters let tests break what a NIC or a network would break.
//
// # GID encoding
//
// A soft device's GID is the IPv4-mapped IPv6 form of its listen address with the TCP port in
// the first two bytes (big-endian): bytes 0..1 port, 2..9 zero, 10..11 0xffff, 12..15 the IPv4
// address. 127.0.0.1:12345 is 3039:0000:0000:0000:0000:ffff:7f00:0001. LID is 0 and the link
// layer is Ethernet (as RoCE), so RTR needs a global address vector (AHAttr.IsGlobal, DGID).
// An unspecified listen IP (0.0.0.0) is advertised as 127.0.0.1.
//
// A port's GID table has that one GID at index 0 (RoCE v2) by default. WithGIDTable(
// GIDTableMLX5) or TWOSIDED_SOFT_GID_TABLE=mlx5 gives it mlx5's shape on an IPv4 netdev
// instead: 0 RoCE v1 and 1 RoCE v2 of a link-local fe80:: GID, 2 RoCE v1 and 3 RoCE v2 of the
// device's GID. RTR then checks the address vector as the kernel's RoCE resolution does: the
// sgid_index must name an entry, of the DGID's address family (IPv4 or not), else EINVAL.
// SetGIDTable changes an open device's table and raises EventGIDChange; RaiseAsyncEvent
// raises any event (SetPortState raises PORT_ERR and PORT_ACTIVE).
//
// # Wire format
//
// One TCP connection per pair of devices (the first to send dials) multiplexes all their QPs.
// The dialer first sends a HELLO packet carrying its GID; then both ends exchange packets,
// each a 24-byte little-endian header followed by the payload:
//
//	0  u8  opcode      1 SEND, 2 SEND_WITH_IMM, 3 ACK, 4 NAK, 5 HELLO
//	1  u8  syndrome    NAK: 1 RNR, 2 PSN sequence error, 3 invalid request, 4 remote operation error
//	2  u8  rnr timer   NAK RNR: the responder's min_rnr_timer (IB encoding)
//	3  u8  flags       bit 0 solicited event
//	4  u32 dest QPN    HELLO: magic 0x54464f53 ("SOFT")
//	8  u32 source QPN  HELLO: version 1
//	12 u32 PSN         24 bits used
//	16 u32 immediate   SEND_WITH_IMM
//	20 u32 payload length (HELLO: 16, the GID)
//
// A message is one packet and one PSN whatever its size (TCP segments it). ACKs are
// cumulative (the PSN of the newest message placed) and coalesced: a responder answers once
// per QP per batch of packets read.
//
// # Timers
//
// The local ACK timeout (4.096 µs × 2^timeout) fires between one and two periods after the
// last forward progress, never sooner than 500 µs; min_rnr_timer follows the IB table.
package soft
