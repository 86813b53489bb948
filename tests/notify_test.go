package tests

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/notify"
)

var transports = []string{notify.TransportOOB, notify.TransportRDMATwoSided}

func newEngine(t *testing.T, transport string, opts ...notify.Option) *notify.Engine {
	t.Helper()
	opts = append([]notify.Option{notify.WithTransport(transport), notify.WithListenAddr("127.0.0.1:0")}, opts...)
	e, err := notify.New(opts...)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, e.Close(ctx))
	})
	return e
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// pair is a sender engine and a way to read what its peer received: in one process the
// peer engine itself, across processes the echoes the peer process sends back.
type pair struct {
	a        *notify.Engine
	peer     string
	receive  func(ctx context.Context) (notify.Notify, error) // what the peer got
	echoName func(name string) string
}

func setups(t *testing.T, transport string) map[string]func(t *testing.T) pair {
	return map[string]func(t *testing.T) pair{
		"inproc": func(t *testing.T) pair {
			a, b := newEngine(t, transport), newEngine(t, transport)
			return pair{a: a, peer: b.Addr(), receive: b.Recv, echoName: func(n string) string { return n }}
		},
		"twoproc": func(t *testing.T) pair {
			p := startPeerProc(t, transport)
			a := newEngine(t, transport)
			return pair{a: a, peer: p.addr, receive: a.Recv, echoName: func(n string) string { return "echo:" + n }}
		},
	}
}

func forEach(t *testing.T, f func(t *testing.T, transport string, p pair)) {
	for _, tr := range transports {
		for name, mk := range setups(t, tr) {
			t.Run(tr+"/"+name, func(t *testing.T) { f(t, tr, mk(t)) })
		}
	}
}

func TestSingleNotify(t *testing.T) {
	forEach(t, func(t *testing.T, _ string, p pair) {
		ctx := ctxFor(t, 20*time.Second)
		require.NoError(t, p.a.SendNotify(ctx, p.peer, notify.Notify{Name: "kv_ready", Msg: []byte("req-42")}))
		n, err := p.receive(ctx)
		require.NoError(t, err)
		require.Equal(t, p.echoName("kv_ready"), n.Name)
		require.Equal(t, []byte("req-42"), n.Msg)
		require.NotEmpty(t, n.Peer)
	})
}

func TestBidirectional(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			a, b := newEngine(t, tr), newEngine(t, tr)
			ctx := ctxFor(t, 30*time.Second)
			const n = 200
			var wg sync.WaitGroup
			errs := make(chan error, 2)
			send := func(from, to *notify.Engine, tag string) {
				defer wg.Done()
				for i := 0; i < n; i++ {
					if err := from.SendNotify(ctx, to.Addr(), notify.Notify{Name: tag, Msg: []byte(fmt.Sprint(i))}); err != nil {
						errs <- err
						return
					}
				}
			}
			wg.Add(2)
			go send(a, b, "a2b")
			go send(b, a, "b2a")
			check := func(e *notify.Engine, tag, from string) {
				for i := 0; i < n; i++ {
					got, err := e.Recv(ctx)
					require.NoError(t, err)
					require.Equal(t, tag, got.Name)
					require.Equal(t, from, got.Peer)
					require.Equal(t, fmt.Sprint(i), string(got.Msg))
				}
			}
			check(b, "a2b", a.Addr())
			check(a, "b2a", b.Addr())
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
		})
	}
}

// TestLatencySmoke is the seed's latency smoke: 32 warm-up notifies, then 2000 sequential
// ones. It logs ops/s and average µs; it asserts no timing.
func TestLatencySmoke(t *testing.T) {
	forEach(t, func(t *testing.T, tr string, p pair) {
		ctx := ctxFor(t, 60*time.Second)
		const warm, count = 32, 2000
		done := make(chan error, 1)
		go func() { // consume, so the receive queue never fills
			for i := 0; i < warm+count; i++ {
				if _, err := p.receive(ctx); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
		msg := []byte("latency-smoke-payload")
		for i := 0; i < warm; i++ {
			require.NoError(t, p.a.SendNotify(ctx, p.peer, notify.Notify{Name: "warm", Msg: msg}))
		}
		start := time.Now()
		for i := 0; i < count; i++ {
			require.NoError(t, p.a.SendNotify(ctx, p.peer, notify.Notify{Name: "smoke", Msg: msg}))
		}
		el := time.Since(start)
		require.NoError(t, <-done)
		t.Logf("%s: %d sequential notifies in %v: %.0f ops/s, %.1f µs average",
			t.Name(), count, el.Round(time.Millisecond), float64(count)/el.Seconds(), float64(el.Microseconds())/count)
	})
}

func TestBurstContentAndOrder(t *testing.T) {
	forEach(t, func(t *testing.T, _ string, p pair) {
		ctx := ctxFor(t, 30*time.Second)
		const n = 128
		errc := make(chan error, 1)
		go func() {
			for i := 0; i < n; i++ {
				msg := []byte(fmt.Sprintf("burst-%03d-%s", i, string(make([]byte, i))))
				if err := p.a.SendNotify(ctx, p.peer, notify.Notify{Name: "burst", Msg: msg}); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
		for i := 0; i < n; i++ {
			got, err := p.receive(ctx)
			require.NoError(t, err)
			require.Equal(t, p.echoName("burst"), got.Name)
			require.Equal(t, fmt.Sprintf("burst-%03d-%s", i, string(make([]byte, i))), string(got.Msg))
		}
		require.NoError(t, <-errc)
	})
}

// unreachable is a port nobody listens on.
const unreachable = "127.0.0.1:1"

// boundedErr asserts that err is an error of the engine, not the outer context's deadline:
// the engine's own bound (connect timeout) ended the call.
func boundedErr(t *testing.T, outer context.Context, err error) {
	t.Helper()
	require.Error(t, err)
	require.NoError(t, outer.Err(), "the call outlived the engine's bound: %v", err)
}

func TestUnreachablePeer(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			a := newEngine(t, tr, notify.WithConnectTimeout(500*time.Millisecond))
			outer := ctxFor(t, 20*time.Second)
			boundedErr(t, outer, a.SendNotify(outer, unreachable, notify.Notify{Name: "x"}))
		})
	}
}

func TestConcurrentUnreachable(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			a := newEngine(t, tr, notify.WithConnectTimeout(500*time.Millisecond))
			outer := ctxFor(t, 20*time.Second)
			var wg sync.WaitGroup
			errs := make([]error, 8)
			for i := range errs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[i] = a.SendNotify(outer, unreachable, notify.Notify{Name: "x", Msg: []byte{byte(i)}})
				}()
			}
			wg.Wait()
			for _, err := range errs {
				boundedErr(t, outer, err)
			}
		})
	}
}

func TestPeerDestroyed(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr+"/inproc", func(t *testing.T) {
			a := newEngine(t, tr, notify.WithConnectTimeout(time.Second))
			b, err := notify.New(notify.WithTransport(tr), notify.WithListenAddr("127.0.0.1:0"))
			require.NoError(t, err)
			ctx := ctxFor(t, 20*time.Second)
			require.NoError(t, a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "before"}))
			_, err = b.Recv(ctx)
			require.NoError(t, err)
			require.NoError(t, b.Close(ctx))
			outer := ctxFor(t, 20*time.Second)
			boundedErr(t, outer, a.SendNotify(outer, b.Addr(), notify.Notify{Name: "after"}))
		})
		t.Run(tr+"/twoproc", func(t *testing.T) {
			p := startPeerProc(t, tr)
			a := newEngine(t, tr, notify.WithConnectTimeout(time.Second))
			ctx := ctxFor(t, 20*time.Second)
			require.NoError(t, a.SendNotify(ctx, p.addr, notify.Notify{Name: "before"}))
			_, err := a.Recv(ctx)
			require.NoError(t, err)
			p.kill()
			outer := ctxFor(t, 20*time.Second)
			boundedErr(t, outer, a.SendNotify(outer, p.addr, notify.Notify{Name: "after"}))
		})
	}
}

func TestClosedEngine(t *testing.T) {
	e, err := notify.New(notify.WithListenAddr("127.0.0.1:0"))
	require.NoError(t, err)
	ctx := ctxFor(t, 10*time.Second)
	require.NoError(t, e.Close(ctx))
	require.ErrorIs(t, e.SendNotify(ctx, "127.0.0.1:9", notify.Notify{Name: "x"}), notify.ErrClosed)
	_, err = e.Recv(ctx)
	require.True(t, errors.Is(err, notify.ErrClosed))
}

func TestBadInput(t *testing.T) {
	a := newEngine(t, notify.TransportOOB, notify.WithMaxNotifySize(1024))
	ctx := ctxFor(t, 10*time.Second)
	require.ErrorIs(t, a.SendNotify(ctx, "", notify.Notify{Name: "x"}), notify.ErrInvalid)
	// An empty name is valid (Mooncake sends and accepts it); an oversized id is not.
	require.ErrorIs(t, a.SendNotify(ctx, "127.0.0.1:9", notify.Notify{}), notify.ErrPeerUnreachable)
	require.ErrorIs(t, a.SendNotify(ctx, "127.0.0.1:9", notify.Notify{Name: "x", ID: strings.Repeat("i", 256)}), notify.ErrInvalid)
	require.ErrorIs(t, a.SendNotify(nil, "127.0.0.1:9", notify.Notify{Name: "x"}), notify.ErrInvalid) //nolint:staticcheck // a nil ctx is an error, not a panic
	_, err := a.Recv(nil)                                                                             //nolint:staticcheck
	require.ErrorIs(t, err, notify.ErrInvalid)
	err = a.SendNotify(ctx, "127.0.0.1:9", notify.Notify{Name: "x", Msg: make([]byte, 2000)})
	require.ErrorIs(t, err, notify.ErrTooLarge)
	_, err = notify.New(notify.WithTransport("oob"), notify.WithTransport("rdma_twosided"))
	require.ErrorIs(t, err, notify.ErrConfig)
}

// TestSimultaneousOpen: both ends connect to each other at once; it ends with exactly one
// channel, the same one seen from both sides.
func TestSimultaneousOpen(t *testing.T) {
	for round := 0; round < 5; round++ {
		// No OOB fallback: both first notifies must go over the one channel.
		a := newEngine(t, notify.TransportRDMATwoSided, notify.WithOOBFallback(false))
		b := newEngine(t, notify.TransportRDMATwoSided, notify.WithOOBFallback(false))
		ctx := ctxFor(t, 30*time.Second)
		var wg sync.WaitGroup
		var errA, errB error
		wg.Add(2)
		go func() { defer wg.Done(); errA = a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "a"}) }()
		go func() { defer wg.Done(); errB = b.SendNotify(ctx, a.Addr(), notify.Notify{Name: "b"}) }()
		wg.Wait()
		require.NoError(t, errA)
		require.NoError(t, errB)
		// Traffic both ways settles any straggling handshake.
		require.NoError(t, a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "a2"}))
		require.NoError(t, b.SendNotify(ctx, a.Addr(), notify.Notify{Name: "b2"}))
		pa, pb := peerStats(t, a, b.Addr()), peerStats(t, b, a.Addr())
		require.Equal(t, "up", pa.State)
		require.Equal(t, "up", pb.State)
		require.NotZero(t, pa.LocalQPN)
		require.Equal(t, pa.LocalQPN, pb.RemoteQPN, "a and b use different channels")
		require.Equal(t, pb.LocalQPN, pa.RemoteQPN, "a and b use different channels")
		for _, e := range []*notify.Engine{a, b} {
			names := map[string]int{}
			for i := 0; i < 2; i++ {
				n, err := e.Recv(ctx)
				require.NoError(t, err)
				names[n.Name]++
			}
			require.Len(t, names, 2)
		}
	}
}

func peerStats(t *testing.T, e *notify.Engine, peer string) notify.PeerStats {
	t.Helper()
	for _, p := range e.Stats().Peers {
		if p.Peer == peer {
			return p
		}
	}
	t.Fatalf("%s has no peer %s", e.Addr(), peer)
	return notify.PeerStats{}
}

func contextWithTimeout(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(parent, d)
}

// TestAsyncEchoFromHandler: a handler answers each notify with SendNotifyAsync on the
// reactor thread; every answer arrives, in order, and every done reports success.
func TestAsyncEchoFromHandler(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			var self atomic.Pointer[notify.Engine]
			var doneOK, doneErr atomic.Int64
			b := newEngine(t, tr, notify.WithHandler(func(n notify.Notify) {
				err := self.Load().SendNotifyAsync(n.Peer, notify.Notify{Name: "echo", Msg: n.Msg}, func(err error) {
					if err != nil {
						doneErr.Add(1)
						return
					}
					doneOK.Add(1)
				})
				if err != nil {
					doneErr.Add(1)
				}
			}))
			self.Store(b)
			a := newEngine(t, tr)
			ctx := ctxFor(t, 30*time.Second)
			const n = 300
			for i := 0; i < n; i++ {
				require.NoError(t, a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "ping", Msg: []byte(fmt.Sprint(i))}))
			}
			for i := 0; i < n; i++ {
				m, err := a.Recv(ctx)
				require.NoError(t, err)
				require.Equal(t, "echo", m.Name)
				require.Equal(t, fmt.Sprint(i), string(m.Msg))
			}
			require.Eventually(t, func() bool { return doneOK.Load() == n }, 10*time.Second, time.Millisecond)
			require.Zero(t, doneErr.Load())
		})
	}
}

// TestSendNotifyFromHandler: the blocking call on the reactor thread is refused with a
// clear error instead of deadlocking.
func TestSendNotifyFromHandler(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			var self atomic.Pointer[notify.Engine]
			errc := make(chan error, 1)
			b := newEngine(t, tr, notify.WithHandler(func(n notify.Notify) {
				errc <- self.Load().SendNotify(context.Background(), n.Peer, notify.Notify{Name: "nope"})
			}))
			self.Store(b)
			a := newEngine(t, tr)
			ctx := ctxFor(t, 20*time.Second)
			require.NoError(t, a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "ping"}))
			err := <-errc
			require.ErrorIs(t, err, notify.ErrInvalid)
			require.ErrorContains(t, err, "SendNotifyAsync")
		})
	}
}

// TestMixedTransports: an rdma_twosided engine sending to an oob-only engine falls back to
// OOB, and after the first refusal stops asking for a ctrl channel on every notify.
func TestMixedTransports(t *testing.T) {
	a := newEngine(t, notify.TransportRDMATwoSided)
	b := newEngine(t, notify.TransportOOB)
	ctx := ctxFor(t, 20*time.Second)
	for i := 0; i < 5; i++ {
		require.NoError(t, a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "mixed", Msg: []byte(fmt.Sprint(i))}))
	}
	for i := 0; i < 5; i++ {
		m, err := b.Recv(ctx)
		require.NoError(t, err)
		require.Equal(t, fmt.Sprint(i), string(m.Msg))
	}
	require.Equal(t, uint64(1), b.Stats().OOB.HandshakeServed, "a handshake per notify")
	require.Contains(t, peerStats(t, a, b.Addr()).LastError, "no ctrl channel")
}
