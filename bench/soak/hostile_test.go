package soak

import (
	"context"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/notify"
)

// TestCutConns: a cut shuts down the connections with a listed port at either end, both
// ways, and leaves the others alone.
func TestCutConns(t *testing.T) {
	listen := func() (net.Listener, int) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(func() { l.Close() })
		return l, l.Addr().(*net.TCPAddr).Port
	}
	pair := func(l net.Listener) (net.Conn, net.Conn) {
		c, err := net.Dial("tcp", l.Addr().String())
		require.NoError(t, err)
		s, err := l.Accept()
		require.NoError(t, err)
		t.Cleanup(func() { c.Close(); s.Close() })
		return c, s
	}
	lOOB, pOOB := listen()
	lOther, _ := listen()
	c1, s1 := pair(lOOB)
	c2, s2 := pair(lOther)

	n, err := cutConns([]int{pOOB})
	require.NoError(t, err)
	require.Equal(t, 2, n, "both ends of the OOB connection (dialed and accepted) live in this process")
	for _, c := range []net.Conn{c1, s1} {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second)) // a hang guard
		_, err := c.Read(make([]byte, 1))
		require.ErrorIs(t, err, io.EOF, "a cut connection reads its end")
	}
	_, err = c2.Write([]byte("x"))
	require.NoError(t, err)
	b := make([]byte, 1)
	_ = s2.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = io.ReadFull(s2, b)
	require.NoError(t, err, "another port's connection is left alone")

	n, err = cutConns(nil)
	require.NoError(t, err)
	require.Zero(t, n)
}

// TestRefusal reads the refusals the engines write.
func TestRefusal(t *testing.T) {
	require.True(t, refusal([]byte(`{"ts_error":"auth: bad token"}`)))
	require.True(t, refusal([]byte(`{"reply_msg":"limit reached"}`)))
	require.True(t, refusal([]byte(`{"name":"n","notify_msg":""}`)))
	require.False(t, refusal([]byte(`{"name":"n","notify_msg":"success"}`)))
	require.False(t, refusal([]byte(`{"reply_msg":"success"}`)))
	require.False(t, refusal([]byte(`not json`)))
}

// TestHostileNothingForgedDelivered: each hostile variant against an engine of each
// transport, while a good peer sends: the good peer's notifies all arrive in order, and
// nothing else does but the plain Mooncake notifies the protocol delivers (named with
// HostileClassicPrefix).
func TestHostileNothingForgedDelivered(t *testing.T) {
	for _, tr := range []string{notify.TransportRDMATwoSided, notify.TransportOOB} {
		for _, variant := range hostileVariants {
			t.Run(tr+"/"+variant, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a hang guard
				defer cancel()
				open := func() *notify.Engine {
					e, err := notify.New(notify.WithListenAddr("127.0.0.1:0"), notify.WithTransport(tr),
						notify.WithProvider("soft"), notify.WithoutProcsReserve())
					require.NoError(t, err)
					t.Cleanup(func() { _ = e.Close(context.Background()) })
					return e
				}
				rcv, good := open(), open()
				var st HostileStats
				attacked := make(chan struct{})
				go func() {
					defer close(attacked)
					runHostile(ctx, variant, rcv.Addr(), []Identity{{ID: "a0e0.1", Addr: good.Addr()}},
						rand.New(rand.NewPCG(1, 2)), 300*time.Millisecond, &st)
				}()
				const n = 50
				for i := range n {
					require.NoError(t, good.SendNotify(ctx, rcv.Addr(), notify.Notify{Name: "good/" + strconv.Itoa(i)}))
				}
				<-attacked
				require.Positive(t, st.Frames.Load()+st.Conns.Load(), "the hostile client sent nothing")
				next := 0
				for next < n {
					m, err := rcv.Recv(ctx)
					require.NoError(t, err)
					switch {
					case m.Name == "good/"+strconv.Itoa(next):
						next++
					case len(m.Name) >= len(HostileClassicPrefix) && m.Name[:len(HostileClassicPrefix)] == HostileClassicPrefix:
					default:
						t.Fatalf("delivered %q (peer %s) while good/%d was next: a forged notify or a reorder", m.Name, m.Peer, next)
					}
				}
			})
		}
	}
}

// TestFreeAddrs: distinct, bindable, below the ephemeral range.
func TestFreeAddrs(t *testing.T) {
	addrs, err := freeAddrs(40, rand.New(rand.NewPCG(7, 7)))
	require.NoError(t, err)
	seen := map[string]bool{}
	for _, a := range addrs {
		require.False(t, seen[a], "%s picked twice", a)
		seen[a] = true
		_, p, err := net.SplitHostPort(a)
		require.NoError(t, err)
		n, err := strconv.Atoi(p)
		require.NoError(t, err)
		require.GreaterOrEqual(t, n, 20000)
		require.Less(t, n, 32768)
		l, err := net.Listen("tcp", a)
		require.NoError(t, err, "a picked port is free again once picked")
		l.Close()
	}
}
