package notify

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/twosided/twosided/reactor/limits"
)

// Transport names. Exactly one is installed per engine.
const (
	TransportOOB          = "oob"           // classic: notifies over the TCP OOB channel
	TransportRDMATwoSided = "rdma_twosided" // per-peer CtrlChannel on an RC QP
)

// ErrConfig is wrapped by every configuration error; the message names the field and why.
var ErrConfig = errors.New("notify: bad configuration")

// config is the engine's resolved configuration: defaults, then MC_* environment (FromEnv),
// then options.
type config struct {
	listenAddr string
	peerName   string // advertised name; default: the bound address

	transport     string
	transportSet  []string // every transport asked for by options, to detect a conflict
	notifyEnabled bool
	oobFallback   bool

	recvCount       int
	bufferSize      int
	maxPendingSends int
	connectTimeout  time.Duration
	maxNotifySize   int
	recvQueue       int

	handshakeConnectTimeout time.Duration
	handshakeMaxLength      int

	provider  string
	filters   []string
	mtu       int // bytes; 0 = port active MTU
	ibPort    int
	gidIndex  int // -1 = auto; once the device is open, the index chosen (device.go)
	qp        qpKnobs
	forkSafe  int // 1: ibv_fork_init before the device is opened
	busyPoll  time.Duration
	noCredits bool
	logger    zerolog.Logger
	onNotify  func(Notify)
	keepProcs bool // do not raise GOMAXPROCS

	authKey        []byte
	allowUnauth    bool
	maxConns       int
	maxPendingHS   int
	maxChannels    int
	oobIdleTimeout time.Duration
	keepalive      time.Duration
	peers          peerLimits
	dir            dirConfig // directory.go
	errs           []error
	dev            *deviceState // rdma_twosided: set when the device is opened (device.go)
}

func defaultConfig() config {
	return config{
		listenAddr:              "127.0.0.1:0",
		transport:               TransportOOB,
		notifyEnabled:           true,
		oobFallback:             true,
		recvCount:               int(limits.RecvCount.Default),
		bufferSize:              int(limits.BufferSize.Default),
		maxPendingSends:         int(limits.MaxPendingSends.Default),
		connectTimeout:          time.Duration(limits.ConnectTimeout.Default),
		maxNotifySize:           int(limits.MaxNotifySize.Default),
		recvQueue:               int(limits.RecvQueue.Default),
		handshakeConnectTimeout: time.Duration(limits.HandshakeConnectTimeout.Default),
		handshakeMaxLength:      int(limits.HandshakeMaxLength.Default),
		mtu:                     int(limits.MTU.Default),
		ibPort:                  int(limits.IBPort.Default),
		gidIndex:                int(limits.GIDIndex.Default),
		qp: qpKnobs{trafficClass: int(limits.TrafficClass.Default), serviceLevel: int(limits.ServiceLevel.Default),
			pkeyIndex: int(limits.PKeyIndex.Default), maxInline: int(limits.MaxInline.Default),
			retryCount: int(limits.RetryCount.Default), ackTimeout: int(limits.AckTimeout.Default)},
		logger:      zerolog.Nop(),
		maxChannels: int(limits.MaxChannels.Default),
		keepalive:   time.Duration(limits.Keepalive.Default),
	}
}

func (c *config) fail(field string, format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf("%w: %s: %s", ErrConfig, field, fmt.Sprintf(format, args...)))
}

// isOOBLimit: the OOB layer's entries, where notify's 0 means "the OOB default".
func isOOBLimit(l *limits.Limit) bool {
	return l == &limits.OOBMaxConns || l == &limits.OOBMaxPendingHandshakes || l == &limits.OOBIdleTimeout
}

// parseBool accepts the spellings Mooncake's getenv helpers accept.
func parseBool(s string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "1", "true", "yes", "on", "y", "t":
		return true, nil
	case "0", "false", "no", "off", "n", "f":
		return false, nil
	}
	return false, fmt.Errorf("%q is not a boolean (use 1/0, true/false, yes/no, on/off)", s)
}

// fromEnv applies the MC_* variables of DESIGN.md. lookup is os.LookupEnv in production.
func (c *config) fromEnv(lookup func(string) (string, bool)) {
	boolVar := func(name string, dst *bool) {
		if s, ok := lookup(name); ok && s != "" {
			v, err := parseBool(s)
			if err != nil {
				c.fail(name, "%v", err)
				return
			}
			*dst = v
		}
	}
	// limitVar parses l.Env with the table entry the options are checked with.
	limitVar := func(l *limits.Limit, set func(int64)) {
		if s, ok := lookup(l.Env); ok && strings.TrimSpace(s) != "" {
			v, err := l.ParseEnv(s)
			if err != nil {
				c.errs = append(c.errs, fmt.Errorf("%w: %w", ErrConfig, err))
				return
			}
			set(v)
		}
	}
	setInt := func(dst *int) func(int64) { return func(v int64) { *dst = int(v) } }
	setDur := func(dst *time.Duration) func(int64) { return func(v int64) { *dst = time.Duration(v) } }
	var useTwoSided bool
	boolVar("MC_USE_RDMA_TWOSIDED", &useTwoSided)
	if useTwoSided {
		c.transport = TransportRDMATwoSided
	}
	boolVar("MC_RDMA_NOTIFY_ENABLED", &c.notifyEnabled)
	boolVar("MC_RDMA_NOTIFY_OOB_FALLBACK", &c.oobFallback)
	limitVar(&limits.RecvCount, setInt(&c.recvCount))
	limitVar(&limits.BufferSize, setInt(&c.bufferSize))
	limitVar(&limits.MaxPendingSends, setInt(&c.maxPendingSends))
	limitVar(&limits.ConnectTimeout, setDur(&c.connectTimeout))
	if s, ok := lookup("MC_TE_FILTERS"); ok && strings.TrimSpace(s) != "" {
		c.filters = nil
		for _, f := range strings.Split(s, ",") {
			if f = strings.TrimSpace(f); f != "" {
				c.filters = append(c.filters, f)
			}
		}
	}
	limitVar(&limits.MTU, setInt(&c.mtu))
	limitVar(&limits.IBPort, setInt(&c.ibPort))
	limitVar(&limits.GIDIndex, setInt(&c.gidIndex))
	limitVar(&limits.TrafficClass, setInt(&c.qp.trafficClass))
	limitVar(&limits.ServiceLevel, setInt(&c.qp.serviceLevel))
	limitVar(&limits.PKeyIndex, setInt(&c.qp.pkeyIndex))
	limitVar(&limits.MaxInline, setInt(&c.qp.maxInline))
	limitVar(&limits.RetryCount, setInt(&c.qp.retryCount))
	limitVar(&limits.AckTimeout, setInt(&c.qp.ackTimeout))
	limitVar(&limits.ForkSafe, setInt(&c.forkSafe))
	limitVar(&limits.HandshakePort, func(port int64) {
		if port != 0 {
			c.listenAddr = "0.0.0.0:" + strconv.FormatInt(port, 10)
		}
	})
	limitVar(&limits.HandshakeConnectTimeout, setDur(&c.handshakeConnectTimeout))
	limitVar(&limits.HandshakeMaxLength, setInt(&c.handshakeMaxLength))
	if path, ok := lookup("TWOSIDED_OOB_AUTH_KEY_FILE"); ok && path != "" {
		key, err := os.ReadFile(path)
		if err != nil {
			c.fail("TWOSIDED_OOB_AUTH_KEY_FILE", "%v", err)
		} else {
			c.authKey = []byte(strings.TrimSpace(string(key)))
		}
	}
	boolVar("TWOSIDED_OOB_ALLOW_UNAUTHENTICATED", &c.allowUnauth)
}

// validate checks what options may have set and returns every error found, joined.
func (c *config) validate() error {
	if len(c.transportSet) > 0 {
		first := c.transportSet[0]
		for _, t := range c.transportSet[1:] {
			if t != first {
				c.fail("transport", "both %q and %q requested: exactly one transport per engine", first, t)
				break
			}
		}
		c.transport = first
	}
	switch c.transport {
	case TransportOOB, TransportRDMATwoSided:
	default:
		c.fail("transport", "%q: want %q or %q", c.transport, TransportOOB, TransportRDMATwoSided)
	}
	if c.authKey != nil && len(c.authKey) == 0 {
		c.fail("auth_key", "0 bytes: want %s", limits.AuthKeyLen.Range())
	}
	for _, f := range []struct {
		l *limits.Limit
		v int64
	}{
		{&limits.RecvCount, int64(c.recvCount)},
		{&limits.BufferSize, int64(c.bufferSize)},
		{&limits.MaxPendingSends, int64(c.maxPendingSends)},
		{&limits.ConnectTimeout, int64(c.connectTimeout)},
		{&limits.MaxNotifySize, int64(c.maxNotifySize)},
		{&limits.RecvQueue, int64(c.recvQueue)},
		{&limits.MTU, int64(c.mtu)},
		{&limits.IBPort, int64(c.ibPort)},
		{&limits.GIDIndex, int64(c.gidIndex)},
		{&limits.TrafficClass, int64(c.qp.trafficClass)},
		{&limits.ServiceLevel, int64(c.qp.serviceLevel)},
		{&limits.PKeyIndex, int64(c.qp.pkeyIndex)},
		{&limits.MaxInline, int64(c.qp.maxInline)},
		{&limits.RetryCount, int64(c.qp.retryCount)},
		{&limits.AckTimeout, int64(c.qp.ackTimeout)},
		{&limits.ForkSafe, int64(c.forkSafe)},
		{&limits.HandshakeConnectTimeout, int64(c.handshakeConnectTimeout)},
		{&limits.HandshakeMaxLength, int64(c.handshakeMaxLength)},
		{&limits.BusyPoll, int64(c.busyPoll)},
		{&limits.AuthKeyLen, int64(len(c.authKey))},
		{&limits.MaxChannels, int64(c.maxChannels)},
		{&limits.Keepalive, int64(c.keepalive)},
		// 0 leaves the OOB layer's default (the same table entry).
		{&limits.OOBMaxConns, int64(c.maxConns)},
		{&limits.OOBMaxPendingHandshakes, int64(c.maxPendingHS)},
		{&limits.OOBIdleTimeout, int64(c.oobIdleTimeout)},
	} {
		if f.v == 0 && isOOBLimit(f.l) {
			continue
		}
		if err := f.l.Check(f.l.Name, f.v); err != nil {
			c.errs = append(c.errs, fmt.Errorf("%w: %w", ErrConfig, err))
		}
	}
	if c.listenAddr == "" {
		c.fail("listen_addr", "empty")
	}
	c.errs = append(c.errs, c.peers.validate()...)
	return errors.Join(c.errs...)
}

// Option configures an Engine. Options are applied after the environment (FromEnv).
type Option func(*config)

// WithListenAddr sets the OOB listener address, e.g. "127.0.0.1:0" (default 127.0.0.1:0;
// FromEnv: 0.0.0.0:MC_HANDSHAKE_PORT when set). Its bound host:port is the engine's peer name.
func WithListenAddr(addr string) Option { return func(c *config) { c.listenAddr = addr } }

// WithPeerName sets the name this engine gives peers (the host:port they dial back, the
// notifies' Peer). By default it is the bound listen address, with an unspecified host
// (0.0.0.0, ::) replaced by the machine's host name, as Mooncake names servers.
func WithPeerName(name string) Option { return func(c *config) { c.peerName = name } }

// WithTransport selects "oob" (classic; the default) or "rdma_twosided". Asking for both is
// an error.
func WithTransport(name string) Option {
	return func(c *config) {
		for _, t := range strings.Split(name, ",") {
			c.transportSet = append(c.transportSet, strings.TrimSpace(t))
		}
	}
}

// WithOOBFallback sets whether a notify that cannot go over RDMA goes over OOB (default true).
func WithOOBFallback(on bool) Option { return func(c *config) { c.oobFallback = on } }

// WithRecvCount sets the RECV ring depth per channel, the advertised notify_rq_depth (default
// 64; 1..4096; below 3 the channel carries no fragments).
func WithRecvCount(n int) Option { return func(c *config) { c.recvCount = n } }

// WithBufferSize sets the bytes per RECV buffer, the largest frame (default 4096; 256..65536).
func WithBufferSize(n int) Option { return func(c *config) { c.bufferSize = n } }

// WithMaxPendingSends bounds queued plus in-flight sends per peer (default 64; 1..4096).
func WithMaxPendingSends(n int) Option { return func(c *config) { c.maxPendingSends = n } }

// WithConnectTimeout bounds a channel connect and its handshake (default 10 s; 100ms..600s).
func WithConnectTimeout(d time.Duration) Option { return func(c *config) { c.connectTimeout = d } }

// WithMaxNotifySize bounds name+msg of one notify (default 1 MiB).
func WithMaxNotifySize(n int) Option { return func(c *config) { c.maxNotifySize = n } }

// WithRecvQueue bounds the received-notify queue (default 4096); when it is full, credits stop
// and senders wait (backpressure), nothing is dropped. It holds at most the bound plus one
// channel's RECV ring (what a channel's NIC acknowledged before the pause reached it).
func WithRecvQueue(n int) Option { return func(c *config) { c.recvQueue = n } }

// WithProvider forces an ibv provider ("soft" or "verbs"; default: none forced, a device
// with an active port of a real provider first, else the soft one).
func WithProvider(name string) Option { return func(c *config) { c.provider = name } }

// WithDeviceFilters restricts device choice to these names (as MC_TE_FILTERS; default: any).
func WithDeviceFilters(names ...string) Option {
	return func(c *config) { c.filters = append([]string(nil), names...) }
}

// WithMTU caps the path MTU in bytes (as MC_MTU; default: the port's active MTU); the
// channel uses min of both sides.
func WithMTU(bytes int) Option { return func(c *config) { c.mtu = bytes } }

// qpKnobs are the ctrl channels' QP attributes (the limits table's TrafficClass …
// AckTimeout entries); -1 in trafficClass and serviceLevel leaves the device's default.
type qpKnobs struct {
	trafficClass, serviceLevel, pkeyIndex, maxInline, retryCount, ackTimeout int
}

// WithTrafficClass sets the traffic class of the ctrl channels' address vectors (as
// MC_IB_TC, 0..255; on RoCE v2 the DSCP in its upper six bits and ECN in its lower two),
// so that control traffic can ride a lossless class. -1 (the default) leaves 0.
func WithTrafficClass(tc int) Option { return func(c *config) { c.qp.trafficClass = tc } }

// WithServiceLevel sets the service level of the ctrl channels' address vectors (as
// MC_IB_SL, 0..15: the virtual lane on InfiniBand, the priority on RoCE). -1 (the default)
// leaves 0.
func WithServiceLevel(sl int) Option { return func(c *config) { c.qp.serviceLevel = sl } }

// WithPKeyIndex sets the ctrl channels' P_Key index (as MC_PKEY_INDEX, 0..65535; default 0),
// for a partitioned InfiniBand fabric. Both ends need an index of the same partition.
func WithPKeyIndex(i int) Option { return func(c *config) { c.qp.pkeyIndex = i } }

// WithMaxInline sets the max_inline_data the ctrl channels ask of their QPs (as
// MC_MAX_INLINE, 0..65535 bytes; default 64; 0: no inline sends). Frames up to what the
// device grants are posted inline; a device that cannot grant the size asked refuses the
// QP, and the peer's notifies then go over OOB.
func WithMaxInline(n int) Option { return func(c *config) { c.qp.maxInline = n } }

// WithRetryCount sets the ctrl channels' transport retry count, retry_cnt (1..7; default 7;
// environment MC_IB_RETRY_CNT). With WithAckTimeout it bounds how long a SEND to a peer
// that stopped answering is retried before the channel fails: about the ACK timeout ×
// (count+1).
func WithRetryCount(n int) Option { return func(c *config) { c.qp.retryCount = n } }

// WithAckTimeout sets the ctrl channels' local ACK timeout in IB's encoding, 4.096 µs ×
// 2^n (1..31; default 14, ~67 ms, as Mooncake; environment MC_IB_TIMEOUT). Lower values find
// a dead peer sooner (n=10: ~4 ms per try) at the risk of retries on a congested fabric.
func WithAckTimeout(n int) Option { return func(c *config) { c.qp.ackTimeout = n } }

// WithForkSafe(true) makes the engine call ibv_fork_init before it opens its RDMA device
// (environment TWOSIDED_FORK_SAFE=1; default off): libibverbs then keeps registered memory
// out of fork() children, so a child's copy-on-write pages never replace pages the NIC
// writes into. It matters only for a process that calls fork(2) itself (C code, a raw
// syscall) on a kernel older than 5.13; Go's os/exec shares no memory with its child. It
// must take effect before any memory is registered in the process: an engine whose call
// comes too late fails New with ErrConfig. The soft provider needs nothing. libibverbs also
// honours its own RDMAV_FORK_SAFE variable.
func WithForkSafe(on bool) Option {
	return func(c *config) {
		c.forkSafe = 0
		if on {
			c.forkSafe = 1
		}
	}
}

// WithBusyPoll spins up to d before sleeping (default 0: never): a SendNotify caller on its
// completion, and the reactor while none of its callers spins, before epoll_wait.
func WithBusyPoll(d time.Duration) Option { return func(c *config) { c.busyPoll = d } }

// WithLogger sets the engine's logger (default: nothing is logged).
func WithLogger(l zerolog.Logger) Option { return func(c *config) { c.logger = l } }

// WithHandler delivers each notify by calling h on the engine's reactor thread instead of
// queueing it for Recv/GetNotifies (the default, without a handler): the lowest-latency path. h must not block. "The reactor
// thread" is the loop's turn: usually the loop's own thread, sometimes a SendNotify caller's
// that borrowed the turn while it waits (reactor.Loop.ExecWait); calls are never concurrent
// with each other or with the engine's other callbacks, but do not rely on one OS thread.
func WithHandler(h func(Notify)) Option { return func(c *config) { c.onNotify = h } }

// WithoutProcsReserve keeps GOMAXPROCS as it is. By default the first engine of a process
// raises it to NumCPU+2 (unless the GOMAXPROCS variable is set); see procs.go for why.
func WithoutProcsReserve() Option { return func(c *config) { c.keepProcs = true } }

// WithOOBAuthKey turns on authentication of the OOB channel with a pre-shared key (default: off)
// (HMAC-SHA256 challenge-response when a connection opens, both ways; 16..1024 bytes).
// With a key, unauthenticated peers — Mooncake's included — can neither open a ctrl channel
// nor inject a notify, unless WithAllowUnauthenticated(true). Environment:
// TWOSIDED_OOB_AUTH_KEY_FILE names a file holding the key.
func WithOOBAuthKey(key []byte) Option {
	return func(c *config) { c.authKey = append([]byte(nil), key...) }
}

// WithAllowUnauthenticated lets Mooncake-compatible unauthenticated peers in even with a key
// set (default false; environment TWOSIDED_OOB_ALLOW_UNAUTHENTICATED).
func WithAllowUnauthenticated(on bool) Option { return func(c *config) { c.allowUnauth = on } }

// WithMaxConns bounds the OOB connections the listener accepts (default 4096).
func WithMaxConns(n int) Option { return func(c *config) { c.maxConns = n } }

// WithMaxPendingHandshakes bounds handshakes being served at once (default 64): beyond it a
// peer gets "too many pending handshakes" and retries or falls back.
func WithMaxPendingHandshakes(n int) Option { return func(c *config) { c.maxPendingHS = n } }

// WithMaxChannels bounds the ctrl channels this engine holds (default 1024); a handshake
// beyond it is refused with an error naming the limit.
func WithMaxChannels(n int) Option { return func(c *config) { c.maxChannels = n } }

// WithOOBIdleTimeout sets how long a half-open or silent OOB connection may stall before it
// is cut (default 10 s).
func WithOOBIdleTimeout(d time.Duration) Option { return func(c *config) { c.oobIdleTimeout = d } }

// WithKeepalive sends a keepalive ctrl frame on every idle channel each interval d
// (default 5 s), so a vanished peer is declared dead within about 2·d plus the QP's retry
// time (~0.5 s with Mooncake's QP attributes) even without traffic. The two ends of a
// channel probe at opposite half-steps of a wall-clock grid shared by every engine, so one
// probe per interval crosses a channel and an idle engine's wake-ups follow the interval,
// not its number of peers (BenchmarkIdlePeers: 100 idle peers at the default cost the hub
// ~2.2 wake-ups/s). 0 sends none: an idle
// engine then never wakes, and on hardware a peer that died while idle is found only when
// a notify is next sent to it.
func WithKeepalive(d time.Duration) Option { return func(c *config) { c.keepalive = d } }

// WithCreditsDisabled switches credit flow control off (default: on). Test only: it exists
// so a test can show that without credits a burst does hit RNR.
func WithCreditsDisabled() Option { return func(c *config) { c.noCredits = true } }

func envLookup(name string) (string, bool) { return os.LookupEnv(name) }
