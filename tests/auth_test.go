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
	return rawRequest(t, addr, 2, `{"name":"mc","notify_msg":"hello"}`)
}

// TestHandshakeBogusQPN: a Connection request naming a QPN (and GID) that exists nowhere,
// and malformed ones, get a reply and cost the engine nothing: good peers keep being served.
func TestHandshakeBogusQPN(t *testing.T) {
	srv := newEngine(t, notify.TransportRDMATwoSided, notify.WithKeepalive(50*time.Millisecond))
	good := newEngine(t, notify.TransportRDMATwoSided)
	ctx := ctxFor(t, 20*time.Second)
	bodies := []string{
		`{"local_nic_path":"10.9.9.9:1@ghost","peer_nic_path":"__ctrl__","qp_num":[],"local_lid":0,` +
			`"local_gid":"3039:0000:0000:0000:0000:ffff:7f00:0001","ctrl_channel":true,"notify_qp_num":999999,"notify_rq_depth":64}`,
		`{"local_nic_path":"x@y","peer_nic_path":"__ctrl__","ctrl_channel":true,"notify_qp_num":5,"notify_rq_depth":0}`,
		`{"local_nic_path":"x@y","peer_nic_path":"__ctrl__","ctrl_channel":true,"notify_qp_num":5,"notify_rq_depth":70000}`,
		`{"local_nic_path":"x@y","ctrl_channel":"yes"}`,
		`{"local_nic_path":"x@y","ctrl_channel":true,"notify_qp_num":5,"notify_rq_depth":8,"local_gid":"zz"}`,
	}
	for _, b := range bodies {
		reply := rawRequest(t, srv.Addr(), 0, b)
		require.NotEmpty(t, reply)
		require.NoError(t, good.SendNotify(ctx, srv.Addr(), notify.Notify{Name: "still-served"}))
	}
	// The channel to the ghost QPN dies at its first keepalive (RETRY_EXC_ERR).
	require.Eventually(t, func() bool {
		for _, p := range srv.Stats().Peers {
			if p.Peer == "10.9.9.9:1" && p.State == "up" {
				return false
			}
		}
		return true
	}, 15*time.Second, 5*time.Millisecond)
}

// rawRequest sends one Mooncake-framed request of type typ and returns the reply's JSON.
func rawRequest(t *testing.T, addr string, typ byte, body string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(5*time.Second)))
	frame := binary.LittleEndian.AppendUint64(nil, uint64(len(body)+1))
	frame = append(append(frame, typ), body...)
	_, err = c.Write(frame)
	require.NoError(t, err)
	var hdr [9]byte
	_, err = io.ReadFull(c, hdr[:])
	require.NoError(t, err)
	require.Equal(t, typ, hdr[8], "the reply carries the request's type")
	reply := make([]byte, binary.LittleEndian.Uint64(hdr[:8])-1)
	_, err = io.ReadFull(c, reply)
	require.NoError(t, err)
	return string(reply)
}
