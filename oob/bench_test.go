package oob

import (
	"context"
	"io"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

// benchPair: a client node and a server node on two loops (two locked OS threads), as two
// engines in two processes would run.
func benchPair(b *testing.B) (*Node, *Node) {
	la, lb := newLoop(b), newLoop(b)
	a := listen(b, la, nopHandler{}, Config{})
	s := listen(b, lb, nopHandler{}, Config{})
	return a, s
}

type nopHandler struct{}

func (nopHandler) HandleNotify(req *NotifyRequest, reply NotifyReply) { reply.Send(nil) }
func (nopHandler) HandleHandshake(req *HandshakeDesc, reply func(resp *HandshakeDesc, err error)) {
	reply(req, nil)
}

// BenchmarkNotifyRoundTrip: one notify and its reply, persistent multiplexed connection
// vs Mooncake-style connection per notify, in the same run.
func BenchmarkNotifyRoundTrip(b *testing.B) {
	a, s := benchPair(b)
	ctx := context.Background()
	req := &NotifyRequest{Name: "bench", Msg: []byte("0123456789abcdef0123456789abcdef"), From: a.Addr(), Session: 1, Epoch: 1}
	b.Run("floor-net.Conn-pingpong", func(b *testing.B) {
		// Same bytes over a plain Go TCP connection, goroutines parked on the netpoller.
		fr := appendNotifyRequest(nil, req, reqMeta{id: 1, hasID: true, twosided: true}, true)
		rep := appendNotifyReply(nil, reqMeta{id: 1, hasID: true, twosided: true}, nil)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(b, err)
		defer ln.Close()
		done := make(chan struct{})
		go func() {
			defer close(done)
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			buf := make([]byte, len(fr))
			for {
				if _, err := io.ReadFull(c, buf); err != nil {
					return
				}
				if _, err := c.Write(rep); err != nil {
					return
				}
			}
		}()
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(b, err)
		buf := make([]byte, len(rep))
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, err := c.Write(fr); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		c.Close()
		<-done
	})
	b.Run("persistent", func(b *testing.B) {
		require.NoError(b, a.Notify(ctx, s.Addr(), req))
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			req.Seq++
			if err := a.Notify(ctx, s.Addr(), req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("classic", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			req.Seq++
			if err := a.NotifyClassic(ctx, s.Addr(), req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("persistent-one-loop", func(b *testing.B) {
		// Client and server node on one loop: one locked thread instead of two.
		loop := newLoop(b)
		a1 := listen(b, loop, nopHandler{}, Config{})
		s1 := listen(b, loop, nopHandler{}, Config{})
		require.NoError(b, a1.Notify(ctx, s1.Addr(), req))
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			req.Seq++
			if err := a1.Notify(ctx, s1.Addr(), req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("persistent-parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			r := *req
			for pb.Next() {
				if err := a.Notify(ctx, s.Addr(), &r); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// BenchmarkAuth: the per-notify cost with a key (authenticated once per connection), and
// the cost of opening an authenticated connection (hello, proof, first notify).
func BenchmarkAuth(b *testing.B) {
	ctx := context.Background()
	req := &NotifyRequest{Name: "bench", Msg: []byte("0123456789abcdef0123456789abcdef")}
	b.Run("persistent-notify", func(b *testing.B) {
		a := listen(b, newLoop(b), nopHandler{}, Config{AuthKey: keyA})
		s := listen(b, newLoop(b), nopHandler{}, Config{AuthKey: keyA})
		require.NoError(b, a.Notify(ctx, s.Addr(), req))
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := a.Notify(ctx, s.Addr(), req); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, key := range [][]byte{nil, keyA} {
		name := "open-connection-no-key"
		if key != nil {
			name = "open-connection-key"
		}
		b.Run(name, func(b *testing.B) {
			s := listen(b, newLoop(b), nopHandler{}, Config{AuthKey: key})
			loop := newLoop(b)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				a, err := Listen(loop, Config{ListenAddr: "127.0.0.1:0", AuthKey: key}, nopHandler{})
				if err != nil {
					b.Fatal(err)
				}
				if err := a.Notify(ctx, s.Addr(), req); err != nil {
					b.Fatal(err)
				}
				if err := a.Close(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
