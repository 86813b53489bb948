// Package notify sends and receives notifies — a name and a message — between processes,
// over RDMA two-sided SEND/RECV (transport "rdma_twosided") or TCP (transport "oob", the
// default), wire-compatible with Mooncake's Transfer Engine.
//
// Status: API (stable).
//
// Create an Engine with New (options only) or FromEnv (the MC_* environment, then
// options). Its listener's host:port (Addr) is its peer name; with WithMetadata and
// WithServerName it is also found by a server name in etcd. Send with SendNotify (returns
// once the peer engine has the notify, bounded by ctx) or SendNotifyAsync (never blocks;
// done is called once on the reactor thread). Receive with Recv or GetNotifies, or with
// WithHandler on the reactor thread. Close with a deadline.
//
// Delivery contract: nil means the peer engine has the notify and hands it to its
// application once, in order per pair of engines (a receiver that crashes first loses what
// it held: its receive queue and what its channels held). Every error wraps one sentinel
// (use errors.Is); one that also wraps ErrMaybeDelivered leaves the outcome unknown (at
// most once): retry with the same Notify.ID. Any other error means not delivered. Every
// wait is bounded; a full receive queue stops senders (backpressure) instead of dropping.
// A notify above the peer's size limit (announced in its handshake) is refused with
// ErrTooLarge before it is sent.
//
// All methods are safe for concurrent use. Callbacks (WithHandler, SendNotifyAsync's
// done) run one at a time in the engine's reactor turn and must not block; they may call
// SendNotifyAsync but not SendNotify. docs/design.md describes the internals.
package notify
