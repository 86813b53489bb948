package notify

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv/soft"
)

// slowRTR makes every modify to RTR on a soft device block until release is called (or
// bounded passed): a RoCE RTR waiting for the kernel's address resolution. entered gets one
// value per RTR that started.
type slowRTR struct {
	entered chan struct{}
	free    chan struct{}
	freed   atomic.Bool
}

func newSlowRTR(t *testing.T, dev string) *slowRTR {
	s := &slowRTR{entered: make(chan struct{}, 16), free: make(chan struct{})}
	require.NoError(t, soft.Default().SetRTRHook(dev, func() {
		s.entered <- struct{}{}
		select {
		case <-s.free:
		case <-time.After(bounded):
		}
	}))
	t.Cleanup(func() {
		s.release()
		_ = soft.Default().SetRTRHook(dev, nil)
	})
	return s
}

func (s *slowRTR) release() {
	if s.freed.CompareAndSwap(false, true) {
		close(s.free)
	}
}

// A connect whose RTR blocks (on the side that started it, or on the side that answers)
// stalls no other peer of either engine: the verbs run on a connect worker. Engines a, b
// and c on soft0, soft1, soft2; a↔b and b↔c have channels; then a sends to c with the
// RTR of a's (or c's) device held. While it is held, 20 notifies a→b and 20 b→c are
// delivered over their channels, and the send to c is still waiting (the RTR holds it);
// once released, it is delivered over a new channel. Before, NewChannel and Connect ran on
// the reactor: the held RTR stopped that engine's loop, and its other peers' notifies with
// it.
func TestSlowRTRStallsNoOtherPeer(t *testing.T) {
	for _, tc := range []struct{ name, slow string }{{"initiator", "soft0"}, {"responder", "soft2"}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(soft.EnvDevices, "6")
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			t.Cleanup(cancel)
			opts := []Option{WithProvider("soft"), WithTransport(TransportRDMATwoSided), WithOOBFallback(false), WithKeepalive(0)}
			eng := func(dev string) *Engine {
				e, err := New(append(opts, WithDeviceFilters(dev))...)
				require.NoError(t, err)
				t.Cleanup(func() { require.NoError(t, e.Close(ctx)) })
				return e
			}
			a, b, c := eng("soft0"), eng("soft1"), eng("soft2")
			sendRecv(t, ctx, a, b, "a-b up")
			sendRecv(t, ctx, b, c, "b-c up")

			slow := newSlowRTR(t, tc.slow)
			slowEngine := map[string]*Engine{"soft0": a, "soft2": c}[tc.slow]
			toC := make(chan error, 1)
			require.NoError(t, a.SendNotifyAsync(c.Addr(), Notify{Name: "to-c"}, func(err error) { toC <- err }))
			select {
			case <-slow.entered:
			case <-time.After(bounded):
				t.Fatal("the connect to c never reached RTR")
			}
			require.Equal(t, 1, slowEngine.cfg.dev.workers.inFlight(), "the channel is being made on a worker")

			const n = 20
			for i := 0; i < n; i++ {
				sendRecv(t, ctx, a, b, fmt.Sprintf("a-b %d", i))
				sendRecv(t, ctx, b, c, fmt.Sprintf("b-c %d", i))
			}
			select {
			case err := <-toC:
				t.Fatalf("the send to c ended while its RTR was held: %v", err)
			default:
			}
			require.Equal(t, 1, slowEngine.cfg.dev.workers.inFlight(), "the RTR is still held")
			require.Equal(t, 1, a.Stats().ChannelsUp, "a: only its channel to b")
			require.Equal(t, 2, b.Stats().ChannelsUp)

			slow.release()
			select {
			case err := <-toC:
				require.NoError(t, err)
			case <-time.After(bounded):
				t.Fatal("the send to c did not end after the RTR was released")
			}
			got, err := c.Recv(ctx)
			require.NoError(t, err)
			require.Equal(t, "to-c", got.Name)
			require.Equal(t, 2, a.Stats().ChannelsUp, "a: its channels to b and c")
			require.Zero(t, c.Stats().OOB.NotifyServed, "nothing went over OOB")
			require.Eventually(t, func() bool {
				return a.cfg.dev.workers.inFlight() == 0 && c.cfg.dev.workers.inFlight() == 0
			}, bounded, time.Millisecond)
		})
	}
}

// An engine closed while one of its channels is being made (its RTR held) waits for the
// worker, bounded, and leaves nothing behind: the worker releases the channel once the
// RTR returns and the device closes after it (goleak checks the goroutines; the soft
// PD's Dealloc refuses while a QP or an MR is left, and closeDevice logs nothing then).
func TestCloseWhileRTRHeld(t *testing.T) {
	t.Setenv(soft.EnvDevices, "6")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts := []Option{WithProvider("soft"), WithTransport(TransportRDMATwoSided), WithOOBFallback(false), WithKeepalive(0)}
	recv, err := New(append(opts, WithDeviceFilters("soft4"))...)
	require.NoError(t, err)
	defer func() { require.NoError(t, recv.Close(ctx)) }()
	send, err := New(append(opts, WithDeviceFilters("soft3"))...)
	require.NoError(t, err)
	slow := newSlowRTR(t, "soft3")
	done := make(chan error, 1)
	require.NoError(t, send.SendNotifyAsync(recv.Addr(), Notify{Name: "never"}, func(err error) { done <- err }))
	select {
	case <-slow.entered:
	case <-time.After(bounded):
		t.Fatal("the connect never reached RTR")
	}
	closed := make(chan error, 1)
	go func() { closed <- send.Close(ctx) }()
	select {
	case err := <-done:
		require.ErrorIs(t, err, ErrClosed)
	case <-time.After(bounded):
		t.Fatal("Close did not end the send")
	}
	require.Equal(t, 1, send.cfg.dev.workers.inFlight(), "Close waits for the held RTR")
	slow.release()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(bounded):
		t.Fatal("Close did not return")
	}
	require.Zero(t, send.cfg.dev.workers.inFlight())
}
