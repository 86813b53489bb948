package oob

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/rs/zerolog"

	"github.com/twosided/twosided/reactor/limits"
)

// Config of a Node. A zero field takes its default; a value out of range is an
// ErrBadConfig error naming the field.
type Config struct {
	// ListenAddr is the host:port to listen on (default ":12001", Mooncake's
	// MC_HANDSHAKE_PORT default). Port 0 picks a free port; see Node.Addr.
	ListenAddr string
	// MaxFrame is the largest accepted frame length, counting the type byte
	// (default 1 MiB, allowed 1..128 MiB; the engine parses MC_HANDSHAKE_MAX_LENGTH).
	MaxFrame int
	// ConnectTimeout bounds a TCP connect (default 5 s, allowed 1 ms..3599 s).
	ConnectTimeout time.Duration
	// RequestTimeout bounds a request when ctx has no earlier deadline (default 10 s,
	// allowed 1 ms..1 h).
	RequestTimeout time.Duration
	// IdleTimeout bounds each wait on a peer (default 10 s, allowed 10 ms..1 h): an
	// accepted connection must send its first request, and a frame must complete, within
	// IdleTimeout (of the accept, of the frame's first byte), so neither a silent client nor
	// one that drips a byte at a time holds a connection; a reply awaited (a request in
	// flight, the hello, the authentication) must show read progress within it; a classic
	// client must close within it after the reply; with a key required, a client must
	// prove it within IdleTimeout of the accept. A fully idle persistent connection has no
	// deadline unless Keepalive is on.
	IdleTimeout time.Duration
	// Keepalive, when not 0, probes idle persistent connections: a client-side persistent
	// connection sends a Probe after Keepalive without writes (the reply is awaited like
	// any other, within IdleTimeout) and closes after 6*IdleTimeout unused, and a
	// server-side one is cut after IdleTimeout without a read. Keep it below the peers'
	// IdleTimeout (IdleTimeout/3 is what a Node did before this was an option). Default 0:
	// off, so an idle Node arms no timer and its loop never wakes; a dead peer is then
	// found by the next request to it. Allowed 0 or 1 ms..IdleTimeout/2.
	Keepalive time.Duration
	// MaxConns caps the accepted connections at once (default 4096, allowed 1..1<<20);
	// above it a new connection is closed at once.
	MaxConns int
	// MaxConnBuffer caps the bytes queued for writing on one connection (default
	// 4 MiB or 2*MaxFrame+64 KiB, whichever is larger; must be at least MaxFrame+9).
	// A connection over it is closed.
	MaxConnBuffer int
	// MaxPendingHandshakes caps the handshake requests (type Connection) handed to the
	// Handler and not answered yet, over all connections (default 64, allowed 1..65536).
	// Above it a request gets the error reply "too many pending handshakes" and its
	// connection keeps working.
	MaxPendingHandshakes int
	// Name is what this Node calls itself in the bye it sends its twosided peers when it
	// closes (at most 255 bytes; default: the bound listen address). Set it to the name
	// peers dial this Node by.
	Name string
	// MaxPendingHandshakesPerAddr caps the handshake requests from one remote IP address
	// handed to the Handler and not answered yet (default 8, allowed 1..65536). Above it a
	// request gets a refusal (ts_refuse "limit") and its connection keeps working.
	MaxPendingHandshakesPerAddr int
	// MaxOpenRequests caps the requests of one connection handed to the Handler and not
	// answered yet (default 1024, allowed 1..1<<20). One more notify is answered at once
	// with a "busy" refusal (ErrBusy at a twosided client); a one-request (Mooncake)
	// connection never reaches it.
	MaxOpenRequests int
	// MaxPeers caps the peer addresses this Node keeps client state for (a persistent
	// connection, a classic mark; default 4096, allowed 1..1<<20). Past it an entry without
	// requests in flight is evicted (its idle connection closed); when none can be, a
	// request to a new address fails with ErrLimit.
	MaxPeers int
	// AuthKey turns on pre-shared-key authentication (HMAC-SHA256 challenge-response
	// in the ts_hello exchange, both directions; see the package doc). nil: off. When
	// set it must be MinAuthKey..MaxAuthKey bytes; the Node keeps a copy.
	AuthKey []byte
	// AllowUnauthenticated, with AuthKey set, still serves peers that do not
	// authenticate (Mooncake's one-request connections, twosided peers without a key)
	// and lets this Node's requests go to peers that cannot prove the key. A peer that
	// tries and fails (a wrong key) is refused either way. Default false: with a key,
	// only peers that prove it are served or sent to.
	AllowUnauthenticated bool
	// Logger for connection-level events (default: disabled).
	Logger zerolog.Logger
}

// Defaults.
// Defaults, from the limits table (reactor/limits).
const (
	DefaultListenAddr = ":12001"
)

var (
	DefaultConnectTimeout = time.Duration(limits.HandshakeConnectTimeout.Default)
	DefaultRequestTimeout = time.Duration(limits.OOBRequestTimeout.Default)
	DefaultIdleTimeout    = time.Duration(limits.OOBIdleTimeout.Default)
	DefaultMaxConns       = int(limits.OOBMaxConns.Default)
	// DefaultMaxPendingHandshakes is Config.MaxPendingHandshakes' default.
	DefaultMaxPendingHandshakes = int(limits.OOBMaxPendingHandshakes.Default)
)

func (c Config) withDefaults() (Config, error) {
	if c.ListenAddr == "" {
		c.ListenAddr = DefaultListenAddr
	}
	if _, _, err := net.SplitHostPort(c.ListenAddr); err != nil {
		return c, fmt.Errorf("%w: ListenAddr %q: %v", ErrBadConfig, c.ListenAddr, err)
	}
	if len(c.Name) > MaxFromLen {
		return c, fmt.Errorf("%w: Name: %d bytes, at most %d", ErrBadConfig, len(c.Name), MaxFromLen)
	}
	var errs []error
	intField := func(name string, l *limits.Limit, v *int) {
		if *v == 0 {
			*v = int(l.Default)
		}
		if err := l.Check(name, int64(*v)); err != nil {
			errs = append(errs, fmt.Errorf("%w: %w", ErrBadConfig, err))
		}
	}
	durField := func(name string, l *limits.Limit, v *time.Duration) {
		if *v == 0 {
			*v = time.Duration(l.Default)
		}
		if err := l.CheckDuration(name, *v); err != nil {
			errs = append(errs, fmt.Errorf("%w: %w", ErrBadConfig, err))
		}
	}
	intField("MaxFrame", &limits.HandshakeMaxLength, &c.MaxFrame)
	durField("ConnectTimeout", &limits.HandshakeConnectTimeout, &c.ConnectTimeout)
	durField("RequestTimeout", &limits.OOBRequestTimeout, &c.RequestTimeout)
	durField("IdleTimeout", &limits.OOBIdleTimeout, &c.IdleTimeout)
	intField("MaxConns", &limits.OOBMaxConns, &c.MaxConns)
	intField("MaxPendingHandshakes", &limits.OOBMaxPendingHandshakes, &c.MaxPendingHandshakes)
	intField("MaxPendingHandshakesPerAddr", &limits.OOBMaxPendingHandshakesPerAddr, &c.MaxPendingHandshakesPerAddr)
	intField("MaxPeers", &limits.OOBMaxPeers, &c.MaxPeers)
	intField("MaxOpenRequests", &limits.OOBMaxOpenRequests, &c.MaxOpenRequests)
	if err := errors.Join(errs...); err != nil {
		return c, err
	}
	// Keepalive and MaxConnBuffer are bounded by other fields.
	if c.Keepalive != 0 && (c.Keepalive < time.Millisecond || c.Keepalive > c.IdleTimeout/2) {
		return c, fmt.Errorf("%w: Keepalive %v out of range 0 (off) or %v..%v (IdleTimeout/2)", ErrBadConfig, c.Keepalive, time.Millisecond, c.IdleTimeout/2)
	}
	if c.MaxConnBuffer == 0 {
		c.MaxConnBuffer = max(int(limits.OOBMaxConnBuffer.Default), 2*c.MaxFrame+64<<10)
	}
	if c.MaxConnBuffer < c.MaxFrame+HeaderSize || c.MaxConnBuffer > int(limits.OOBMaxConnBuffer.Max) {
		return c, fmt.Errorf("%w: MaxConnBuffer %d out of range %d (MaxFrame+9)..%d", ErrBadConfig, c.MaxConnBuffer, c.MaxFrame+HeaderSize, limits.OOBMaxConnBuffer.Max)
	}
	if c.AuthKey != nil {
		if len(c.AuthKey) < MinAuthKey || len(c.AuthKey) > MaxAuthKey {
			return c, fmt.Errorf("%w: AuthKey: %d bytes, want %d..%d (nil turns authentication off)", ErrBadConfig, len(c.AuthKey), MinAuthKey, MaxAuthKey)
		}
		c.AuthKey = append([]byte(nil), c.AuthKey...)
	}
	return c, nil
}
