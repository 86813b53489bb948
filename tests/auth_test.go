package tests

import (
	"encoding/binary"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/notify"
)

var psk = []byte("0123456789abcdef-twosided-test-key")

// With a key set, an unauthenticated peer can neither open a ctrl channel nor inject a
// notify; a peer with the key can.
func TestAuthenticatedEngines(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			var got atomic.Int64
			srv := newEngine(t, tr, notify.WithOOBAuthKey(psk), notify.WithHandler(func(notify.Notify) { got.Add(1) }))
			good := newEngine(t, tr, notify.WithOOBAuthKey(psk))
			bad := newEngine(t, tr, notify.WithConnectTimeout(time.Second))
			wrong := newEngine(t, tr, notify.WithOOBAuthKey([]byte("another-key-of-enough-length")), notify.WithConnectTimeout(time.Second))
			ctx := ctxFor(t, 20*time.Second)
			require.NoError(t, good.SendNotify(ctx, srv.Addr(), notify.Notify{Name: "ok"}))
			require.Error(t, bad.SendNotify(ctx, srv.Addr(), notify.Notify{Name: "inject"}))
			require.Error(t, wrong.SendNotify(ctx, srv.Addr(), notify.Notify{Name: "inject"}))
			require.Eventually(t, func() bool { return got.Load() == 1 }, 10*time.Second, time.Millisecond)
			for _, p := range srv.Stats().Peers {
				if p.Peer == bad.Addr() || p.Peer == wrong.Addr() {
					require.NotEqual(t, "up", p.State, "an unauthenticated peer opened a ctrl channel")
				}
			}
			require.Equal(t, int64(1), got.Load(), "an unauthenticated notify was delivered")
		})
	}
}

// A Mooncake classic notify (one connection, no hello) is refused with a key set, unless
// unauthenticated peers are explicitly allowed.
func TestAuthMooncakeClassic(t *testing.T) {
	var got atomic.Int64
	h := notify.WithHandler(func(notify.Notify) { got.Add(1) })
	strict := newEngine(t, notify.TransportOOB, notify.WithOOBAuthKey(psk), h)
	open := newEngine(t, notify.TransportOOB, notify.WithOOBAuthKey(psk), notify.WithAllowUnauthenticated(true), h)
	require.NotContains(t, mooncakeNotify(t, strict.Addr()), `"notify_msg":"success"`)
	require.Contains(t, mooncakeNotify(t, open.Addr()), `"notify_msg":"success"`)
	require.Eventually(t, func() bool { return got.Load() == 1 }, 10*time.Second, time.Millisecond)
}

// mooncakeNotify sends one notify as Mooncake's classic client does and returns the reply.
func mooncakeNotify(t *testing.T, addr string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(5*time.Second)))
	body := []byte(`{"name":"mc","notify_msg":"hello"}`)
	frame := binary.LittleEndian.AppendUint64(nil, uint64(len(body)+1))
	frame = append(append(frame, 2), body...)
	_, err = c.Write(frame)
	require.NoError(t, err)
	var hdr [9]byte
	_, err = io.ReadFull(c, hdr[:])
	require.NoError(t, err)
	require.Equal(t, byte(2), hdr[8], "the reply carries the request's type")
	reply := make([]byte, binary.LittleEndian.Uint64(hdr[:8])-1)
	_, err = io.ReadFull(c, reply)
	require.NoError(t, err)
	return string(reply)
}
