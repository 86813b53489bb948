package notify

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/ibv/soft"
	"github.com/twosided/twosided/oob"
)

// sentinels are the errors every error a caller sees wraps at least one of.
var sentinels = []error{ErrClosed, ErrInvalid, ErrTooLarge, ErrPeerUnreachable, ErrNoCtrlChannel, ErrLimit,
	ErrTimeout, ErrBackpressure, ErrRejected, ErrAuth, ErrPeerDead, ErrPeerUnknown, ErrDirectoryUnavailable,
	ErrNotResolved, ErrConfig}

func requireSentinel(t *testing.T, err error) {
	t.Helper()
	require.Error(t, err)
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return
		}
	}
	t.Fatalf("%v wraps no notify sentinel", err)
}

// errEngine is an engine of transport tr on a loopback port, closed when the test ends.
func errEngine(t *testing.T, tr string, opts ...Option) *Engine {
	t.Helper()
	e, err := New(append([]Option{WithListenAddr("127.0.0.1:0"), WithTransport(tr)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { closeEngine(t, e) })
	return e
}

// errCtx bounds a test's waits; a hang detector, not a timing assertion.
func errCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var transports = []string{TransportOOB, TransportRDMATwoSided}

// A peer string that is not host:port is the caller's error, named as such, on both send
// calls; it never reaches a connect.
func TestErrorPeerNotHostPort(t *testing.T) {
	e := errEngine(t, TransportOOB)
	cases := []struct{ peer, want string }{
		{"127.0.0.1", `peer: "127.0.0.1" is not host:port (missing port in address)`},
		{"::1", `peer: "::1" is not host:port (too many colons in address)`},
		{"decode-0", `peer: "decode-0" is not host:port (missing port in address); a server name needs a directory`},
		{":12001", `peer: ":12001" has no host`},
		{"127.0.0.1:0", `peer: "127.0.0.1:0": port "0" is not a number in 1..65535`},
		{"127.0.0.1:http", `port "http" is not a number`},
		{"127.0.0.1:70000", `port "70000" is not a number`},
	}
	for _, tc := range cases {
		t.Run(tc.peer, func(t *testing.T) {
			for call, err := range map[string]error{
				"SendNotify":      e.SendNotify(errCtx(t), tc.peer, Notify{Name: "n"}),
				"SendNotifyAsync": e.SendNotifyAsync(tc.peer, Notify{Name: "n"}, nil),
			} {
				require.ErrorIs(t, err, ErrInvalid, call)
				require.NotErrorIs(t, err, ErrMaybeDelivered, call)
				require.ErrorContains(t, err, "notify: invalid argument: send to "+tc.peer+": ", call)
				require.ErrorContains(t, err, tc.want, call)
				requireSentinel(t, err)
			}
		})
	}
	require.Zero(t, e.Stats().Limits.PeersUnconfirmed)
}

// A cancelled context says "canceled" and wraps context.Canceled, and still ErrTimeout
// (the caller stopped waiting): before the send, and while it waits for a handshake that a
// silent listener never answers (withdrawn: not delivered).
func TestErrorCanceled(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			e := errEngine(t, tr)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			defer ln.Close()
			silent := ln.Addr().String()

			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			before := e.SendNotify(ctx, silent, Notify{Name: "n"})

			ctx, cancel = context.WithCancel(errCtx(t))
			accepted := make(chan net.Conn, 1)
			go func() {
				c, err := ln.Accept()
				if err == nil {
					accepted <- c
					cancel() // the handshake is on its way: cancel the send waiting for it
				}
			}()
			during := e.SendNotify(ctx, silent, Notify{Name: "n"})
			select {
			case c := <-accepted:
				defer c.Close()
			case <-errCtx(t).Done():
			}
			for what, err := range map[string]error{"before": before, "during": during} {
				require.ErrorIs(t, err, context.Canceled, what)
				require.ErrorIs(t, err, ErrTimeout, what)
				require.NotErrorIs(t, err, ErrMaybeDelivered, what)
				require.True(t, strings.HasPrefix(err.Error(), "notify: canceled: send to "+silent), "%s: %v", what, err)
				require.NotContains(t, err.Error(), "timeout", what)
				requireSentinel(t, err)
			}
		})
	}
}

// A deadline still reads "timeout".
func TestErrorDeadlineSaysTimeout(t *testing.T) {
	e := errEngine(t, TransportOOB)
	ctx, cancel := context.WithDeadline(context.Background(), time.Unix(1, 0))
	defer cancel()
	err := e.SendNotify(ctx, "127.0.0.1:9", Notify{Name: "n"})
	require.ErrorIs(t, err, ErrTimeout)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.True(t, strings.HasPrefix(err.Error(), "notify: timeout: send to 127.0.0.1:9"), err.Error())
}

// A port where another protocol's server answers (HTTP here) is named as such, with the
// address and what it said, and the notify was not delivered. The server answers what it
// reads as a bad request at once, as net/http does to a request line it cannot parse.
func TestErrorPeerNotOOB(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var b [1]byte
				if _, err := c.Read(b[:]); err == nil {
					_, _ = io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request")
				}
			}()
		}
	}()
	addr := ln.Addr().String()
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			e := errEngine(t, tr)
			err := e.SendNotify(errCtx(t), addr, Notify{Name: "n", Msg: []byte("m")})
			require.ErrorIs(t, err, ErrPeerUnreachable)
			require.ErrorIs(t, err, oob.ErrNotOOB)
			require.NotErrorIs(t, err, ErrMaybeDelivered)
			require.ErrorContains(t, err, addr+` answered "HTTP/1.1 400 Bad Request": it is no handshake daemon`)
			require.NotContains(t, err.Error(), "frame too large")
			requireSentinel(t, err)
		})
	}
}

// A notify of exactly max_notify_size passes on both transports, whatever its bytes: text,
// binary, or bytes JSON escapes (zeros take 6 bytes each, quotes and newlines 2): over OOB
// these go as base64, and the OOB frame limit absorbs base64 and the JSON framing. One byte
// more is ErrTooLarge naming the limit, before anything is sent.
func TestErrorMaxNotifySizeBothTransports(t *testing.T) {
	for _, tr := range transports {
		for _, size := range []int{1 << 20, 64 << 10} {
			t.Run(fmt.Sprintf("%s/%d", tr, size), func(t *testing.T) {
				opts := []Option{WithMaxNotifySize(size)}
				recv, send := errEngine(t, tr, opts...), errEngine(t, tr, opts...)
				ctx := errCtx(t)
				const name = "kv"
				for _, fill := range []byte{'a', 0xff, 0x00, '"', '\n'} { // text; binary (not UTF-8); escaped text
					msg := bytes.Repeat([]byte{fill}, size-len(name))
					require.NoError(t, send.SendNotify(ctx, recv.Addr(), Notify{Name: name, Msg: msg}), "fill %#x", fill)
					n, err := recv.Recv(ctx)
					require.NoError(t, err)
					require.Equal(t, name, n.Name)
					require.True(t, bytes.Equal(msg, n.Msg), "fill %#x: the message changed on its way", fill)
				}
				err := send.SendNotify(ctx, recv.Addr(), Notify{Name: name, Msg: make([]byte, size-len(name)+1)})
				require.ErrorIs(t, err, ErrTooLarge)
				require.ErrorContains(t, err, fmt.Sprintf("name+msg is %d bytes, the maximum is %d", size+1, size))
				requireSentinel(t, err)
			})
		}
	}
}

// The message of an unknown outcome names the attempt that may have landed when a later
// one failed otherwise, so that "connection refused" and "may have been delivered" do not
// read as a contradiction.
func TestErrorAttemptThatMayHaveLanded(t *testing.T) {
	completion := errors.New("completion error: transport retry counter exceeded")
	refused := fmt.Errorf("%w: 10.0.0.2:12001: connect: %w", oob.ErrPeerUnreachable, syscall.ECONNREFUSED)
	type try struct {
		path  string
		err   error
		maybe bool
	}
	cases := []struct {
		name      string
		tries     []try
		kind      error
		maybe     bool // the last attempt's own
		want      string
		wantMaybe bool
	}{
		{
			name:      "channel may have landed, OOB refused",
			tries:     []try{{"rdma_twosided", completion, true}, {"oob", refused, false}},
			kind:      ErrPeerUnreachable,
			want:      "notify: peer unreachable: send to 10.0.0.2:12001: attempt 1 over rdma_twosided may have landed (completion error: transport retry counter exceeded); attempt 2 over oob failed: oob: peer unreachable: connect: connection refused [outcome unknown: the notify may have been delivered]",
			wantMaybe: true,
		},
		{
			name:      "the last attempt is the one that may have landed",
			tries:     []try{{"oob", refused, false}, {"rdma_twosided", completion, true}},
			kind:      ErrPeerUnreachable,
			maybe:     true,
			want:      "notify: peer unreachable: send to 10.0.0.2:12001 (rdma_twosided): completion error: transport retry counter exceeded [outcome unknown: the notify may have been delivered]",
			wantMaybe: true,
		},
		{
			name:  "nothing may have landed",
			tries: []try{{"oob", refused, false}},
			kind:  ErrPeerUnreachable,
			want:  "notify: peer unreachable: send to 10.0.0.2:12001 (oob): oob: peer unreachable: connect: connection refused",
		},
		{
			name:      "the first of two that may have landed is named",
			tries:     []try{{"rdma_twosided", completion, true}, {"rdma_twosided", completion, true}, {"oob", refused, false}},
			kind:      ErrPeerUnreachable,
			want:      "attempt 1 over rdma_twosided may have landed (completion error: transport retry counter exceeded); attempt 3 over oob failed: ",
			wantMaybe: true,
		},
		{
			name:      "closed after an attempt that may have landed",
			tries:     []try{{"rdma_twosided", completion, true}},
			kind:      ErrClosed,
			want:      "notify: engine closed: send to 10.0.0.2:12001: attempt 1 over rdma_twosided may have landed (completion error: transport retry counter exceeded); attempt 2 failed: engine closing [outcome unknown",
			wantMaybe: true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var l attemptLog
			for _, tr := range tc.tries {
				l.record(tr.path, tr.err, tr.maybe)
			}
			last := tc.tries[len(tc.tries)-1]
			var err error
			if tc.kind == ErrClosed {
				l.record("", nil, false) // the close ends the send
				err = l.sendErr(ErrClosed, "10.0.0.2:12001", "", errors.New("engine closing"), true)
			} else {
				err = l.sendErr(tc.kind, "10.0.0.2:12001", last.path, last.err, tc.maybe)
			}
			require.Contains(t, err.Error(), tc.want)
			require.Equal(t, tc.wantMaybe, errors.Is(err, ErrMaybeDelivered))
			require.ErrorIs(t, err, tc.kind)
			if last.err != nil && tc.kind != ErrClosed {
				require.ErrorIs(t, err, last.err, "the last attempt's cause is in the chain")
			}
			requireSentinel(t, err)
		})
	}
}

// Close with a context already done closes at once: its error says "canceled" (or
// "timeout"), wraps ErrTimeout and the context's error, and names each step cut short
// once; a second Close returns nil.
func TestErrorCloseCutShort(t *testing.T) {
	for _, tc := range []struct {
		name string
		ctx  func() context.Context
		head string
		is   error
	}{
		{"canceled", func() context.Context {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx
		}, "notify: canceled: close cut short, the engine stops in the background", context.Canceled},
		{"deadline", func() context.Context {
			ctx, cancel := context.WithDeadline(context.Background(), time.Unix(1, 0))
			t.Cleanup(cancel)
			return ctx
		}, "notify: timeout: close cut short, the engine stops in the background", context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recv, err := New(WithListenAddr("127.0.0.1:0"), WithTransport(TransportRDMATwoSided))
			require.NoError(t, err)
			t.Cleanup(func() { closeEngine(t, recv) })
			e, err := New(WithListenAddr("127.0.0.1:0"), WithTransport(TransportRDMATwoSided))
			require.NoError(t, err)
			require.NoError(t, e.SendNotify(errCtx(t), recv.Addr(), Notify{Name: "n"}))
			err = e.Close(tc.ctx())
			if err == nil {
				return // every step finished before it looked at its context
			}
			require.ErrorIs(t, err, ErrTimeout)
			require.ErrorIs(t, err, tc.is)
			require.True(t, strings.HasPrefix(err.Error(), tc.head), err.Error())
			require.Equal(t, 1, strings.Count(err.Error(), tc.is.Error()), err.Error())
			requireSentinel(t, err)
			require.NoError(t, e.Close(tc.ctx()))
		})
	}
	require.NoError(t, closeErr(context.Background(), []error{nil, nil}))
	err := closeErr(context.Background(), []error{nil, errors.New("directory: unregister: etcd down")})
	require.EqualError(t, err, "notify: close: directory: unregister: etcd down")
	require.NotErrorIs(t, err, ErrTimeout)
}

// Recv with a cancelled context says "canceled" and wraps ErrTimeout and context.Canceled,
// as a send does; a deadline still reads "timeout".
func TestRecvCanceled(t *testing.T) {
	e, err := New(WithListenAddr("127.0.0.1:0"))
	require.NoError(t, err)
	defer func() { require.NoError(t, e.Close(context.Background())) }()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = e.Recv(ctx)
	require.ErrorIs(t, err, ErrTimeout)
	require.ErrorIs(t, err, context.Canceled)
	require.True(t, strings.HasPrefix(err.Error(), "notify: canceled: recv"), err.Error())
	dctx, dcancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer dcancel()
	_, err = e.Recv(dctx)
	require.ErrorIs(t, err, ErrTimeout)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.True(t, strings.HasPrefix(err.Error(), "notify: timeout: recv"), err.Error())
}

// A provider's bad configuration is why no device opens: New fails with ErrConfig, once
// prefixed, on one line, naming the variable. The soft provider reads its variables at
// every GetDeviceList (no cache), so t.Setenv reaches it.
func TestErrorProviderConfig(t *testing.T) {
	cases := []struct{ value, want string }{
		{"0", "notify: bad configuration: rdma_twosided: soft provider: TWOSIDED_SOFT_DEVICES = 0: must be 1..64"},
		{"x", `notify: bad configuration: rdma_twosided: soft provider: TWOSIDED_SOFT_DEVICES = "x": not an integer`},
	}
	for _, tc := range cases {
		t.Run(tc.value, func(t *testing.T) {
			t.Setenv(soft.EnvDevices, tc.value)
			e, err := New(WithListenAddr("127.0.0.1:0"), WithTransport(TransportRDMATwoSided), WithProvider("soft"))
			if e != nil {
				closeEngine(t, e)
			}
			require.EqualError(t, err, tc.want)
			require.ErrorIs(t, err, ErrConfig)
			require.ErrorIs(t, err, soft.ErrConfig)
			require.ErrorIs(t, err, ibv.ErrNoDevice)
			requireSentinel(t, err)
		})
	}
	// Other reasons stay one line, each provider's error prefixed with its name once.
	t.Run("filters", func(t *testing.T) {
		e, err := New(WithListenAddr("127.0.0.1:0"), WithTransport(TransportRDMATwoSided), WithProvider("soft"),
			WithDeviceFilters("nope"))
		if e != nil {
			closeEngine(t, e)
		}
		require.EqualError(t, err, "notify: bad configuration: rdma_twosided: no RDMA device; MC_TE_FILTERS [nope] matched no device with an active port")
		require.ErrorIs(t, err, ibv.ErrNoDevice)
		require.ErrorIs(t, err, ErrConfig)
		requireSentinel(t, err)
	})
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("%w: TWOSIDED_SOFT_DEVICES = 0", soft.ErrConfig), "soft: bad configuration: TWOSIDED_SOFT_DEVICES = 0"},
		{fmt.Errorf("%w: ibv_get_device_list: no device found", ibv.ErrNoDevice), "soft: no RDMA device: ibv_get_device_list: no device found"},
		{errors.New("softer: x"), "soft: softer: x"},
	} {
		err := ibv.ProviderError("soft", tc.err)
		require.EqualError(t, err, tc.want)
		require.ErrorIs(t, err, tc.err)
	}
}

// An OOB cause reads once prefixed in a send's error, the peer named once: "oob: peer
// unreachable (nothing sent): connect: ..." (it was "oob: peer unreachable: oob: nothing
// sent: ..."), on both transports.
func TestErrorOOBCauseOncePrefixed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := ln.Addr().String()
	require.NoError(t, ln.Close())
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			e := errEngine(t, tr)
			err := e.SendNotify(errCtx(t), dead, Notify{Name: "n"})
			require.EqualError(t, err, "notify: peer unreachable: send to "+dead+
				" (handshake): oob: peer unreachable (nothing sent): connect: connection refused")
			require.ErrorIs(t, err, ErrPeerUnreachable)
			require.ErrorIs(t, err, oob.ErrPeerUnreachable)
			require.ErrorIs(t, err, oob.ErrNotSent)
			require.ErrorIs(t, err, syscall.ECONNREFUSED)
			require.NotErrorIs(t, err, ErrMaybeDelivered)
		})
	}
}
