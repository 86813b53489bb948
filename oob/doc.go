// Package oob is the TCP out-of-band channel of twosided: the Mooncake handshake-daemon
// framing, the handshake RPC (JSON type Connection), notify over TCP (type Notify) and
// liveness probes (type Probe), served and dialed on the engine's reactor.
//
// Status: an internal layer of twosided, kept importable for the benchmark and the tools
// (cmd/twosided, bench, tests). Its API may change without notice; applications use
// package notify. docs/design.md describes how the layers fit together.
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
// type byte, one type byte (Connection=0, Metadata=1, Notify=2, Probe=3), then JSON text
// (between two twosided Nodes a notify may also be a compact binary frame, type 0x82).
// A length of 0 or above Config.MaxFrame is answered with an error reply and the connection
// is closed; the server keeps serving other connections. A reply carries the request's type
// byte (Connection when the request had none, i.e. a zero length). An error reply is
//
//	{"name":"","notify_msg":"","reply_msg":"<reason>","ts_error":"<reason>"}
//
// so that a Mooncake reader of either kind sees a failure (empty notify_msg, non-empty
// reply_msg).
//
// Mooncake's older daemon protocol wrote no type byte: the length counts the JSON text only.
// Like Mooncake's readString, a frame whose first byte after the length is above 3 (here
// 4..127: '{' or whitespace) is such a frame; it is served as a Connection request and
// answered without a type byte.
//
// # Classic and persistent connections
//
// Mooncake opens one TCP connection per request: connect, write, read the reply, close. The
// server accepts exactly that; after replying on such a connection it shuts down its write
// side and closes when the client does (or after Config.IdleTimeout).
//
// Between two twosided nodes a connection is persistent and multiplexed: the client's first
// frame on a new connection is a Probe carrying {"ts_hello":1}. A twosided server answers
// {"ts_hello":1,...} (its frame limit, its offer of compact notifies, see below) and keeps
// the connection; after that every request and reply carries
// "ts_id" (u64) and replies are matched by id, many in flight. Any other answer (a Mooncake
// server replies to a probe without ts_hello and closes) marks the peer as classic, and
// requests to it use one connection per request; a classic mark is re-probed after a minute.
// A Mooncake peer therefore never sees a field or a frame sequence it does not know.
//
// # Authentication
//
// With Config.AuthKey set, a persistent connection is authenticated in both directions
// by an HMAC-SHA256 challenge-response on a pre-shared key, folded into the hello:
//
//	client → server  Probe {"ts_hello":1,"ts_nonce":Nc}
//	server → client  Probe {"ts_hello":1,"ts_auth":"hmac-sha256","ts_nonce":Ns,
//	                        "ts_auth_required":true,"ts_mac":MAC('S')}
//	client → server  Probe {"ts_id":N,"ts_mac":MAC('C')}
//	server → client  Probe {"ts_id":N}, or the error reply "authentication failed"
//
// MAC(d) = HMAC-SHA256(AuthKey, "twosided oob auth v1" || 0x00 || d || Nc || Ns), where d
// is the byte 'C' (the client proves) or 'S' (the server proves), and Nc, Ns are 16 random
// bytes (crypto/rand) drawn fresh by each side for each connection; nonces and MACs travel
// as hex. Proofs are compared in constant time. Because each side's proof covers the other
// side's fresh nonce, a recorded exchange replayed on a new connection fails, and because
// the direction is in the MAC, a server's proof reflected back is no client proof. The
// client checks the server's proof before sending its own, so a Node with a different key
// stops at the second message with ErrAuth. Requests wait until the server accepts the
// proof: one extra round trip per connection, none per request. ts_auth_required is sent
// when the server does not serve unauthenticated peers; ts_mac in the second message only
// when the client sent a nonce.
//
// A server with a key and AllowUnauthenticated false hands no Notify and no Connection
// request to the Handler on a connection whose client has not proved the key: such a
// request (a Mooncake one-request connection, a twosided peer without a key, or one that
// skipped the proof) gets the error reply "authentication required" and the connection is
// closed; a wrong proof gets "authentication failed". Probes are answered either way (they
// carry nothing), but until its client proves the key a server connection takes frames of
// at most 64 KiB (a larger request is refused from its header, "authentication required",
// without buffering its body) and is closed once IdleTimeout has passed since the accept. With AllowUnauthenticated such peers are served as without a key; a
// wrong proof is still refused. On the client side, a Node with a key and
// AllowUnauthenticated false refuses with ErrAuth the peers that cannot prove the key: a
// twosided peer without a key, a Mooncake peer, and any one-request connection
// (NotifyClassic). A Node without a key that meets ts_auth_required fails with ErrAuth.
//
// This authenticates the peer when a connection opens. It neither encrypts nor protects
// the integrity of later frames: an attacker on the path can read them, or relay a fresh
// exchange between two honest nodes and inject frames afterwards. Where that matters, run
// the OOB channel on a trusted network or in a tunnel. A Mooncake peer sees ts_nonce in the
// hello only when this Node has a key, and ignores it.
//
// # Notify JSON
//
// Request {"name":..., "notify_msg":...}; twosided peers may add "ts_id", "ts_from" (the
// sender's listen host:port), "ts_session", "ts_epoch", "ts_seq" so the receiver drops
// duplicates across paths. notify_msg is a JSON string: when the peer is known to be twosided
// and Msg is not valid UTF-8, or its escaped form would be longer than base64's (quotes,
// backslashes, control bytes), Msg travels base64 (standard, padded) in "ts_msg_b64" and
// notify_msg is "", so any Msg within the notify size limit fits the frame limit. To a Mooncake peer the bytes go raw inside the JSON string, with only
// '"', '\\' and control bytes escaped; JsonCpp keeps such bytes as they are.
// Reply {"name":"","notify_msg":"success"}; an empty notify_msg means rejected.
//
// Further twosided members, sent to twosided peers only and decoded strictly: "ts_token"
// (u64, the pair's secret from its handshake), "ts_to" (u64, the session the sender believes
// the receiver runs, 0 = unknown), "ts_nid" (the caller's idempotency id, at most 255 bytes),
// "ts_skip_from" and "ts_skip_n" (u64s, together: the sender gave up these seqs). ts_from is
// at most 255 bytes. A refusal reply may add "ts_refuse", a typed code (RefuseBusy, ...: 1..32
// bytes of a-z and '_'); the client's error then wraps a *RefusedError, ErrRejected and the
// code's sentinel (ErrBusy, ErrLimit, ErrAuth, ErrNoCtrl, ErrPeerClosed, ErrInvalid, ErrStale).
// A Handler sends one by replying with an error that is or wraps a *RefusedError.
//
// # Compact notify frames
//
// A twosided server's hello reply carries "ts_compact":1: it takes the compact form of a
// Notify, type byte 0x82 (0x80 | Notify), and answers one in kind. A client that reads the
// offer sends every notify of that connection so; one that does not (an earlier version)
// ignores the member and sends JSON, which the server still takes. The compact form carries
// the members above in fixed little-endian fields, with no escaping and no base64:
//
//	request  u64 ts_id, ts_session, ts_epoch, ts_seq, ts_token, ts_to, ts_skip_from, ts_skip_n;
//	         u8 len(ts_from), u8 len(ts_nid), u32 len(name); ts_from, ts_nid, name; the msg
//	reply    u64 ts_id, u8 status (0 success, 1 rejected);
//	         rejected: u8 len(ts_refuse), u16 len(ts_error), ts_refuse, ts_error
//
// A zero field is an absent member. The decoder checks the lengths against the body and
// ts_skip_from/ts_skip_n as the JSON decoder does. A compact frame on a connection that
// did not say hello, or before a required key was proved, gets the JSON error reply and
// the connection closes; so does one that cannot be read. A Mooncake peer never says
// hello and so never sees the form.
//
// # Handshake JSON
//
// Mooncake fields local_nic_path, peer_nic_path, qp_num (array of u32), local_lid (u16),
// local_gid (colon hex), reply_msg (non-empty = error) are always written; ctrl-channel
// fields ctrl_channel, notify_qp_num, notify_rq_depth (1..65535) and the twosided
// extensions ts_mtu, ts_psn, ts_session, ts_epoch, ts_buf_size, ts_extensions, ts_peer,
// ts_token, ts_refuse, ts_refuse_cause (a typed cause beside the code: CauseDevice) and ts_to
// are written only when set, and only toward twosided peers
// (toward Mooncake a refusal is its reply_msg text). Decoding is strict: a wrong-typed or out-of-range field is an
// error naming the field; unknown fields are skipped.
//
// # Timeouts and limits
//
// Every wait is bounded, and only a wait has a deadline: ConnectTimeout cuts a connect
// still in progress; a request waits for its reply until ctx ends or RequestTimeout
// passes; IdleTimeout cuts an accepted connection that sends no request, a frame not
// complete IdleTimeout after its first byte (a stall or a slow drip, one byte at a time),
// a connection awaiting a reply (a request in flight, the hello, the authentication) with
// no read progress (a half-open peer), a classic client that does not close after the
// reply, and, with a required key, a client that has not proved it IdleTimeout after the
// accept. Each connection has one reactor timer, armed only while one of these applies. A
// fully idle persistent connection (no partial frame, nothing in flight, authenticated
// where required) has none, so an idle Node arms no timer and its loop sleeps through
// (zero wake-ups); a dead peer is found by the next request to it.
//
// Config.Keepalive (default 0, off) makes idle persistent connections probe: a client
// connection sends a Probe {"ts_id":N} after Keepalive without writes and is dropped after
// 6*IdleTimeout unused; a server connection is cut after IdleTimeout without a read. A
// request is never retried by this package: a broken connection fails what was in flight
// on it with ErrPeerUnreachable, and the caller (which numbers notifies for dedup) decides.
//
// Limits, each a Config field with a default from the one table of limits (reactor/limits):
// MaxConns caps the accepted connections (one more gets an error reply naming max_conns,
// with ts_refuse "limit", and is closed; a twosided client returns ErrLimit); MaxFrame caps a frame (a longer one gets an error reply and
// its connection is closed); MaxConnBuffer caps the bytes queued for writing on one
// connection (over it the connection is closed); MaxPendingHandshakes caps the Connection
// requests handed to the Handler and not answered yet, over all connections (one more gets
// the reply_msg "too many pending handshakes" and its connection keeps serving), and
// MaxPendingHandshakesPerAddr those from one remote IP; MaxPeers caps the peer addresses a
// client keeps state for (an idle entry is evicted; an unreachable peer leaves none). A
// peer over a limit costs only its own request or connection; Stats counts each case, and
// each limit hit or flood is logged at warn, at most once per reason per second with a count.
//
// A request is measured as it goes on the wire: a twosided server says its frame limit in
// its hello reply ("ts_max_frame"); toward a peer that does not, the limit is 1 MiB
// (Mooncake's default and minimum). A request whose encoded frame (after JSON escaping or
// base64) is longer fails alone with ErrTooLarge before it is sent; so does one that would
// run the connection's write queue over MaxConnBuffer (ErrLimit). Other requests on the
// connection are not touched.
//
// # Closing
//
// Close sends a bye, Probe {"ts_bye":1,"ts_from":name,"ts_session":s} (SetName, else
// Config.Name, else the bound address; SetSession, left out when 0), on every twosided
// persistent connection (either direction), then closes. The peer closes that connection at once, fails what was in flight on it with ErrPeerUnreachable and ErrPeerClosed, and,
// when its Handler implements PeerGoneHandler, calls HandlePeerGone. A Mooncake peer never
// gets a bye (it has no persistent connection).
//
// # Buffers and allocation
//
// Reads go into one loop-wide buffer; a frame that spans reads is completed in the
// connection's Parser; one read takes every frame that arrived. Writes are batched per
// connection and reactor turn: the replies to every request of a read, and the requests
// the turn's callbacks send, leave in one write once the turn's queued work has run (a
// batch past 64 KiB, or a frame that large, is written at once). Bytes the socket does
// not take are queued in a gnet elastic.RingBuffer and flushed on Writable. Sending a notify on a persistent connection
// allocates nothing per message (the request is copied into a pooled call); serving one
// allocates its Msg (the Handler keeps it) and the reply closure.
package oob
