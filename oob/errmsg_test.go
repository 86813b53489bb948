package oob

import (
	"context"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A client error says "oob: " once, however many sentinels it wraps, and names the peer as
// "addr: " before what failed, so that a caller that names the peer itself (notify drops
// "addr: ") still reads a sentence: not "connection oob: timeout" nor "oob: peer
// unreachable: oob: nothing sent". errors.Is finds each sentinel as before.
func TestClientErrorMessages(t *testing.T) {
	loop := newLoop(t)
	hb := newHandler()
	b := listen(t, loop, hb, Config{})
	defer hb.release()
	a := listen(t, loop, newHandler(), Config{RequestTimeout: 100 * time.Millisecond})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := ln.Addr().String()
	require.NoError(t, ln.Close())
	closed, err := Listen(loop, Config{ListenAddr: "127.0.0.1:0"}, newHandler())
	require.NoError(t, err)
	require.NoError(t, closed.Close(bg(t)))

	short := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		t.Cleanup(cancel)
		return ctx
	}
	cases := []struct {
		name, peer, want string
		err              func() error
		is               []error
	}{
		{"refused", dead, "oob: peer unreachable (nothing sent): " + dead + ": connect: connection refused",
			func() error { return a.Notify(bg(t), dead, &NotifyRequest{Name: "x"}) },
			[]error{ErrPeerUnreachable, ErrNotSent, syscall.ECONNREFUSED}},
		{"handshake deadline", b.Addr(), "oob: timeout: " + b.Addr() + ": handshake: context deadline exceeded",
			func() error {
				_, err := a.Handshake(short(), b.Addr(), &HandshakeDesc{LocalNICPath: "hold"})
				return err
			},
			[]error{ErrTimeout, context.DeadlineExceeded}},
		{"request timeout", b.Addr(), "oob: timeout: " + b.Addr() + ": notify: no reply within RequestTimeout 100ms",
			func() error { return a.Notify(bg(t), b.Addr(), &NotifyRequest{Name: "hold-1"}) },
			[]error{ErrTimeout}},
		{"rejected", b.Addr(), "oob: rejected by peer: " + b.Addr() + ": notify: no such receiver reject-me",
			func() error { return a.Notify(bg(t), b.Addr(), &NotifyRequest{Name: "reject-me"}) },
			[]error{ErrRejected}},
		{"refused (busy)", b.Addr(), "oob: " + b.Addr() + ": notify: refused (busy): handler: refused (busy): refused by test", // the test handler wraps its refusal
			func() error { return a.Notify(bg(t), b.Addr(), &NotifyRequest{Name: "refuse:busy"}) },
			[]error{ErrRejected, ErrBusy}},
		{"closed", b.Addr(), "oob: closed: " + b.Addr() + ": notify not sent",
			func() error { return closed.Notify(bg(t), b.Addr(), &NotifyRequest{Name: "x"}) },
			[]error{ErrClosed}},
		{"closed handshake", b.Addr(), "oob: closed: " + b.Addr() + ": handshake not sent",
			func() error { _, err := closed.Handshake(bg(t), b.Addr(), &HandshakeDesc{}); return err },
			[]error{ErrClosed}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.err()
			require.EqualError(t, err, tc.want)
			for _, s := range tc.is {
				require.ErrorIs(t, err, s)
			}
			// As notify shows it, the peer dropped: still once prefixed, still a sentence.
			shown := strings.ReplaceAll(err.Error(), tc.peer+": ", "")
			require.Equal(t, 1, strings.Count(shown, "oob: "), shown)
			require.True(t, strings.HasPrefix(shown, "oob: "), shown)
		})
	}

	// The sentinels, each named once, the first with its prefix.
	err = errorOf([]error{ErrPeerUnreachable, ErrTimeout, ErrNotSent}, "%s: connect not done", dead)
	require.EqualError(t, err, "oob: peer unreachable (timeout, nothing sent): "+dead+": connect not done")
	for _, s := range []error{ErrPeerUnreachable, ErrTimeout, ErrNotSent} {
		require.ErrorIs(t, err, s)
	}
	require.NotErrorIs(t, err, ErrClosed)
}
