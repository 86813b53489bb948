// Package oob is the TCP out-of-band channel of twosided: the Mooncake handshake-daemon
// framing, the handshake RPC (JSON type Connection), notify over TCP (type Notify) and
// liveness probes (type Probe), served and dialed on the engine's reactor.
//
// It owns the OOB listener and every OOB TCP connection, all registered in the reactor's
// one epoll set: accepts, non-blocking connects, reads and writes run on the loop
// goroutine; other goroutines submit requests and wait for replies with a context. It must
// not touch queue pairs, completion queues or the ctrl-channel state: a handshake is handed
// to the Handler and answered with what the Handler returns.
//
// # Wire format
//
// A frame is Mooncake's writeString/readString: a u64 little-endian length that counts the
// type byte, one type byte (Connection=0, Metadata=1, Notify=2, Probe=3), then JSON text.
// A length of 0 or above Config.MaxFrame is answered with an error reply and the connection
// is closed; the server keeps serving other connections. A reply carries the request's type
// byte (Connection when the request had none, i.e. a zero length). An error reply is
//
//	{"name":"","notify_msg":"","reply_msg":"<reason>","ts_error":"<reason>"}
//
// so that a Mooncake reader of either kind sees a failure (empty notify_msg, non-empty
// reply_msg).
//
// # Classic and persistent connections
//
// Mooncake opens one TCP connection per request: connect, write, read the reply, close. The
// server accepts exactly that; after replying on such a connection it shuts down its write
// side and closes when the client does (or after Config.IdleTimeout).
//
// Between two twosided nodes a connection is persistent and multiplexed: the client's first
// frame on a new connection is a Probe carrying {"ts_hello":1}. A twosided server answers
// {"ts_hello":1} and keeps the connection; after that every request and reply carries
// "ts_id" (u64) and replies are matched by id, many in flight. Any other answer (a Mooncake
// server replies to a probe without ts_hello and closes) marks the peer as classic, and
// requests to it use one connection per request; a classic mark is re-probed after a minute.
// A Mooncake peer therefore never sees a field or a frame sequence it does not know.
//
// # Notify JSON
//
// Request {"name":..., "notify_msg":...}; twosided peers may add "ts_id", "ts_from" (the
// sender's listen host:port), "ts_session", "ts_epoch", "ts_seq" so the receiver drops
// duplicates across paths. notify_msg is a JSON string: when Msg is not valid UTF-8 and the
// peer is known to be twosided, Msg travels base64 (standard, padded) in "ts_msg_b64" and
// notify_msg is "". To a Mooncake peer the bytes go raw inside the JSON string, with only
// '"', '\\' and control bytes escaped; JsonCpp keeps such bytes as they are.
// Reply {"name":"","notify_msg":"success"}; an empty notify_msg means rejected.
//
// # Handshake JSON
//
// Mooncake fields local_nic_path, peer_nic_path, qp_num (array of u32), local_lid (u16),
// local_gid (colon hex), reply_msg (non-empty = error) are always written; ctrl-channel
// fields ctrl_channel, notify_qp_num, notify_rq_depth (1..65535) and the twosided
// extensions ts_mtu, ts_psn, ts_session, ts_epoch, ts_buf_size, ts_extensions, ts_peer are
// written only when set. Decoding is strict: a wrong-typed or out-of-range field is an
// error naming the field; unknown fields are skipped.
//
// # Timeouts and limits
//
// Every wait is bounded: ConnectTimeout cuts a connect still in progress; a request waits
// for its reply until ctx ends or RequestTimeout passes; IdleTimeout cuts a connection that
// made no read progress (half a frame and a stall, a half-open persistent connection, a
// classic client that never closes). An idle persistent client connection sends a keepalive
// Probe {"ts_id":N} after IdleTimeout/3 without writes, so two nodes with the same
// IdleTimeout keep it open; it is dropped after 6*IdleTimeout unused. MaxConns caps the
// accepted connections; MaxConnBuffer caps the bytes queued for writing on one connection
// (reads are bounded by MaxFrame). A request is never retried by this package: a broken
// connection fails what was in flight on it with ErrPeerUnreachable, and the caller (which
// numbers notifies for dedup) decides.
//
// # Buffers and allocation
//
// Reads go into one loop-wide buffer; a frame that spans reads is completed in the
// connection's Parser. Bytes the socket does not take are queued in a gnet
// elastic.RingBuffer and flushed on Writable. Sending a notify on a persistent connection
// allocates nothing per message (the request is copied into a pooled call); serving one
// allocates its Msg (the Handler keeps it) and the reply closure.
package oob
