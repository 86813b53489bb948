// Package limits is the one table of twosided's limits and defaults: for each, its name,
// its environment variable (if any), its default, its allowed range and unit. Options,
// the environment parser and every layer's Config validation (notify, ctrlchannel, oob)
// check a value with the same entry, so a value accepted in one place is accepted in all.
//
// Status: an internal layer of twosided, kept importable for the benchmark and the tools
// (cmd/twosided, bench, tests). Its API may change without notice; applications use
// package notify, whose options and FromEnv check values with this table.
// docs/design.md describes how the layers fit together.
//
// It is a leaf: it imports nothing of the project, so any layer may import it. It sits
// under reactor, the bottom layer, so that oob and ctrlchannel import it downwards.
package limits

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ErrRange is wrapped by every error of this package for a value out of range; callers
// wrap it again with their own configuration sentinel.
var ErrRange = errors.New("out of range")

// ErrSyntax is wrapped by ParseEnv's error for a value that is not an integer (nor one of
// the special words); callers wrap it again with their own configuration sentinel.
var ErrSyntax = errors.New("not an integer")

// envError is ParseEnv's error: its own message, wrapping ErrRange or ErrSyntax without
// repeating the sentinel's text.
type envError struct {
	msg string
	err error
}

func (e *envError) Error() string { return e.msg }
func (e *envError) Unwrap() error { return e.err }

// Unit says how a limit's values are written.
type Unit uint8

const (
	Count    Unit = iota // a plain number
	Bytes                // a size in bytes
	Duration             // a time.Duration in nanoseconds
)

// Special is a value outside Min..Max that is still allowed, with its meaning (0 = off,
// -1 = auto); Word is also accepted from the environment.
type Special struct {
	Value int64
	Word  string
}

// Limit is one entry of the table.
type Limit struct {
	Name    string        // option / field name in the notify API, e.g. "recv_count"
	Env     string        // environment variable, "" when none
	EnvUnit time.Duration // Duration limits: the unit of the variable's integer (ms, s)
	Default int64
	Min     int64
	Max     int64
	Unit    Unit
	// OneOf, when set, lists the only values allowed in Min..Max.
	OneOf   []int64
	Special []Special
}

// The table. Durations are in nanoseconds.
var (
	RecvCount       = Limit{Name: "recv_count", Env: "MC_RDMA_NOTIFY_RECV_COUNT", Default: 64, Min: 1, Max: 4096}
	BufferSize      = Limit{Name: "buffer_size", Env: "MC_RDMA_NOTIFY_BUFFER_SIZE", Default: 4096, Min: 256, Max: 65536, Unit: Bytes}
	MaxPendingSends = Limit{Name: "max_pending_sends", Env: "MC_RDMA_NOTIFY_MAX_PENDING_SENDS", Default: 64, Min: 1, Max: 4096}
	ConnectTimeout  = Limit{Name: "connect_timeout", Env: "MC_RDMA_NOTIFY_CONNECT_TIMEOUT_MS", EnvUnit: time.Millisecond,
		Default: int64(10 * time.Second), Min: int64(100 * time.Millisecond), Max: int64(600 * time.Second), Unit: Duration}
	MaxNotifySize = Limit{Name: "max_notify_size", Default: 1 << 20, Min: 1, Max: 128 << 20, Unit: Bytes}
	RecvQueue     = Limit{Name: "recv_queue", Default: 4096, Min: 1, Max: 1 << 24}
	// MTU caps the path MTU; 0 takes the port's active MTU.
	MTU      = Limit{Name: "mtu", Env: "MC_MTU", Default: 0, Min: 256, Max: 4096, Unit: Bytes, OneOf: []int64{256, 512, 1024, 2048, 4096}, Special: []Special{{0, "port"}}}
	IBPort   = Limit{Name: "ib_port", Env: "MC_IB_PORT", Default: 1, Min: 1, Max: 255}
	GIDIndex = Limit{Name: "gid_index", Env: "MC_GID_INDEX", Default: -1, Min: 0, Max: 255, Special: []Special{{-1, "auto"}}}
	// QP attributes of the ctrl channels (Mooncake's names where it has one). TrafficClass
	// and ServiceLevel go into the address vector (GRH traffic class: DSCP and ECN on
	// RoCE v2; SL: the virtual lane on IB, the PCP priority on RoCE); -1 leaves the device's
	// default (0), as Mooncake does. PKeyIndex is the QP's P_Key table index (INIT).
	// MaxInline is max_inline_data asked of ibv_create_qp (0: no inline sends); frames up to
	// what the device grants are posted inline. RetryCount (the transport retry count,
	// retry_cnt) and AckTimeout (the local ACK timeout, 4.096 µs × 2^n) bound how long a
	// SEND to a dead peer is retried: about AckTimeout × (RetryCount+1), ~0.5 s at the
	// defaults (14, 7). Mooncake's MC_RETRY_CNT counts its transfer slices' retries over
	// other paths, not a QP attribute, so the QP's has its own variable; Mooncake has no
	// variable for the ACK timeout (14 in its code).
	TrafficClass = Limit{Name: "traffic_class", Env: "MC_IB_TC", Default: -1, Min: 0, Max: 255, Special: []Special{{-1, "default"}}}
	ServiceLevel = Limit{Name: "service_level", Env: "MC_IB_SL", Default: -1, Min: 0, Max: 15, Special: []Special{{-1, "default"}}}
	PKeyIndex    = Limit{Name: "pkey_index", Env: "MC_PKEY_INDEX", Default: 0, Min: 0, Max: 65535}
	MaxInline    = Limit{Name: "max_inline", Env: "MC_MAX_INLINE", Default: 64, Min: 0, Max: 65535, Unit: Bytes}
	RetryCount   = Limit{Name: "retry_count", Env: "MC_IB_RETRY_CNT", Default: 7, Min: 1, Max: 7}
	AckTimeout   = Limit{Name: "ack_timeout", Env: "MC_IB_TIMEOUT", Default: 14, Min: 1, Max: 31}
	// ForkSafe = 1 calls ibv_fork_init before the engine's device is opened (libibverbs
	// providers only): registered memory is kept out of fork() children, for a process that
	// forks with C code or a raw fork(2) on a kernel older than 5.13. libibverbs also reads
	// its own RDMAV_FORK_SAFE (any value: on).
	ForkSafe = Limit{Name: "fork_safe", Env: "TWOSIDED_FORK_SAFE", Default: 0, Min: 0, Max: 1}
	// HandshakePort is the OOB listen port; 0 keeps the listen address given.
	HandshakePort           = Limit{Name: "handshake_port", Env: "MC_HANDSHAKE_PORT", Default: 0, Min: 1, Max: 65535, Special: []Special{{0, ""}}}
	HandshakeConnectTimeout = Limit{Name: "handshake_connect_timeout", Env: "MC_HANDSHAKE_CONNECT_TIMEOUT", EnvUnit: time.Second,
		Default: int64(5 * time.Second), Min: int64(time.Millisecond), Max: int64(3599 * time.Second), Unit: Duration}
	HandshakeMaxLength = Limit{Name: "handshake_max_length", Env: "MC_HANDSHAKE_MAX_LENGTH", Default: 1 << 20, Min: 1 << 20, Max: 128 << 20, Unit: Bytes}
	BusyPoll           = Limit{Name: "busy_poll", Default: 0, Min: 0, Max: int64(time.Second), Unit: Duration}
	AuthKeyLen         = Limit{Name: "auth_key", Default: 0, Min: 16, Max: 1024, Unit: Bytes, Special: []Special{{0, "off"}}}
	MaxChannels        = Limit{Name: "max_channels", Default: 1024, Min: 1, Max: 1 << 20}
	// Keepalive of ctrl channels; 0 = off. On by default: on hardware an idle channel whose
	// peer died learns it only by sending (notify.WithKeepalive, BenchmarkIdlePeers).
	Keepalive = Limit{Name: "keepalive", Default: int64(5 * time.Second), Min: int64(time.Millisecond), Max: int64(time.Hour), Unit: Duration, Special: []Special{{0, "off"}}}

	// OOB channel.
	OOBMaxConns             = Limit{Name: "max_conns", Default: 4096, Min: 1, Max: 1 << 20}
	OOBMaxPendingHandshakes = Limit{Name: "max_pending_handshakes", Default: 64, Min: 1, Max: 1 << 16}
	// OOBMaxPendingHandshakesPerAddr caps the handshakes one remote IP has in the Handler.
	OOBMaxPendingHandshakesPerAddr = Limit{Name: "max_pending_handshakes_per_addr", Default: 8, Min: 1, Max: 1 << 16}
	// OOBMaxPeers caps the peer addresses a Node keeps client state for.
	OOBMaxPeers = Limit{Name: "max_oob_peers", Default: 4096, Min: 1, Max: 1 << 20}
	// OOBMaxOpenRequests caps one connection's requests awaiting the Handler.
	OOBMaxOpenRequests = Limit{Name: "max_open_requests", Default: 1024, Min: 1, Max: 1 << 20}
	OOBIdleTimeout     = Limit{Name: "oob_idle_timeout", Default: int64(10 * time.Second), Min: int64(10 * time.Millisecond), Max: int64(time.Hour), Unit: Duration}
	OOBRequestTimeout  = Limit{Name: "oob_request_timeout", Default: int64(10 * time.Second), Min: int64(time.Millisecond), Max: int64(time.Hour), Unit: Duration}
	OOBMaxConnBuffer   = Limit{Name: "max_conn_buffer", Default: 4 << 20, Min: 1<<20 + 9, Max: 1 << 30, Unit: Bytes}
)

// All lists every entry, for tests and documentation.
func All() []*Limit {
	return []*Limit{&RecvCount, &BufferSize, &MaxPendingSends, &ConnectTimeout, &MaxNotifySize, &RecvQueue,
		&MTU, &IBPort, &GIDIndex, &TrafficClass, &ServiceLevel, &PKeyIndex, &MaxInline, &RetryCount, &AckTimeout,
		&ForkSafe, &HandshakePort, &HandshakeConnectTimeout, &HandshakeMaxLength, &BusyPoll,
		&AuthKeyLen, &MaxChannels, &Keepalive, &OOBMaxConns, &OOBMaxPendingHandshakes,
		&OOBMaxPendingHandshakesPerAddr, &OOBMaxPeers, &OOBMaxOpenRequests, &OOBIdleTimeout, &OOBRequestTimeout, &OOBMaxConnBuffer}
}

// Allowed reports whether v is in range (or one of the special values).
func (l *Limit) Allowed(v int64) bool {
	for _, s := range l.Special {
		if v == s.Value {
			return true
		}
	}
	if v < l.Min || v > l.Max {
		return false
	}
	if len(l.OneOf) == 0 {
		return true
	}
	for _, o := range l.OneOf {
		if v == o {
			return true
		}
	}
	return false
}

// Check returns nil when v is allowed, else an ErrRange error naming field (the caller's
// name for the value: an option, a Config field) and the range.
func (l *Limit) Check(field string, v int64) error {
	if l.Allowed(v) {
		return nil
	}
	return fmt.Errorf("%s: %s %w %s", field, l.format(v), ErrRange, l.Range())
}

// CheckDuration is Check for a time.Duration field.
func (l *Limit) CheckDuration(field string, d time.Duration) error { return l.Check(field, int64(d)) }

// Range describes the allowed values, e.g. "256..65536 bytes", "one of 256, 512 (or 0 = port)".
func (l *Limit) Range() string {
	var b strings.Builder
	if len(l.OneOf) > 0 {
		b.WriteString("one of ")
		for i, o := range l.OneOf {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(l.format(o))
		}
	} else {
		b.WriteString(l.format(l.Min) + ".." + l.format(l.Max))
	}
	for _, s := range l.Special {
		b.WriteString(" (or " + l.format(s.Value))
		if s.Word != "" {
			b.WriteString(" = " + s.Word)
		}
		b.WriteString(")")
	}
	return b.String()
}

func (l *Limit) format(v int64) string {
	switch l.Unit {
	case Duration:
		return time.Duration(v).String()
	case Bytes:
		return strconv.FormatInt(v, 10) + " B"
	}
	return strconv.FormatInt(v, 10)
}

// ParseEnv parses the value s of l.Env: an integer (in EnvUnit for a duration) or a
// special word. The result is in l's unit and allowed exactly when the same value given
// as an option is. An error names the variable and the values it accepts, as a user
// types them (EnvRange); it wraps ErrSyntax for a value that is not an integer, ErrRange
// for one out of range.
func (l *Limit) ParseEnv(s string) (int64, error) {
	s = strings.TrimSpace(s)
	for _, sp := range l.Special {
		if sp.Word != "" && strings.EqualFold(s, sp.Word) {
			return sp.Value, nil
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) { // an integer, past int64
			return 0, l.envRangeError(s)
		}
		return 0, &envError{fmt.Sprintf("%s: %q is not an integer (want %s)", l.Env, s, l.EnvRange()), ErrSyntax}
	}
	if l.Unit == Duration && l.EnvUnit > 0 {
		if v > int64(1<<63-1)/int64(l.EnvUnit) || v < -int64(1<<63-1)/int64(l.EnvUnit) {
			return 0, l.envRangeError(s)
		}
		v *= int64(l.EnvUnit)
	}
	if !l.Allowed(v) {
		return 0, l.envRangeError(s)
	}
	return v, nil
}

// envRangeError: the integer s of l.Env is not allowed.
func (l *Limit) envRangeError(s string) error {
	if len(l.OneOf) > 0 {
		return &envError{fmt.Sprintf("%s: %s is not one of %s", l.Env, s, l.EnvRange()), ErrRange}
	}
	return &envError{fmt.Sprintf("%s: %s is out of range (want %s)", l.Env, s, l.EnvRange()), ErrRange}
}

// EnvRange describes the values l.Env accepts as a user types them: integers in the
// variable's unit and the special words, e.g. "0–255 or auto", "100–600000 ms",
// "256, 512, 1024, 2048, 4096, or port". A special value without a word is given as its
// integer.
func (l *Limit) EnvRange() string {
	step := int64(1)
	if l.Unit == Duration && l.EnvUnit > 0 {
		step = int64(l.EnvUnit)
	}
	var items []string
	if len(l.OneOf) > 0 {
		for _, o := range l.OneOf {
			items = append(items, strconv.FormatInt(o/step, 10))
		}
	} else {
		// The integers whose value in l's unit is within Min..Max.
		lo, hi := l.Min/step, l.Max/step
		if lo*step < l.Min {
			lo++
		}
		if hi*step > l.Max {
			hi--
		}
		r := strconv.FormatInt(lo, 10) + "–" + strconv.FormatInt(hi, 10)
		switch {
		case l.Unit == Bytes:
			r += " bytes"
		case l.Unit == Duration && l.EnvUnit > 0:
			r += " " + strings.TrimPrefix(l.EnvUnit.String(), "1")
		}
		items = append(items, r)
	}
	for _, sp := range l.Special {
		if sp.Word != "" {
			items = append(items, sp.Word)
		} else {
			items = append(items, strconv.FormatInt(sp.Value/step, 10))
		}
	}
	switch len(items) {
	case 1:
		return items[0]
	case 2:
		return items[0] + " or " + items[1]
	}
	return strings.Join(items[:len(items)-1], ", ") + ", or " + items[len(items)-1]
}
