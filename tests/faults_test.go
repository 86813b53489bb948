package tests

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv/soft"
	"github.com/twosided/twosided/notify"
)

func counters(t *testing.T, e *notify.Engine) soft.Counters {
	t.Helper()
	c, err := soft.Default().Counters(e.Stats().Device)
	require.NoError(t, err)
	return c
}

// Short RC timers so a cut link is seen in ~100 ms instead of Mooncake's ~0.5 s.
func twoSidedOn(device string, opts ...notify.Option) []notify.Option {
	return append([]notify.Option{notify.WithDeviceFilters(device), notify.WithConnectTimeout(2 * time.Second)}, opts...)
}

// TestLinkCutFallback: the soft link between the two devices is cut mid-burst. With OOB
// fallback every notify arrives exactly once and in order; every SendNotify returns nil.
func TestLinkCutFallback(t *testing.T) {
	a := newEngine(t, notify.TransportRDMATwoSided, twoSidedOn("soft0")...)
	b := newEngine(t, notify.TransportRDMATwoSided, twoSidedOn("soft1")...)
	ctx := ctxFor(t, 60*time.Second)
	const n = 60
	got := make(chan notify.Notify, n*2)
	go func() {
		for {
			m, err := b.Recv(ctx)
			if err != nil {
				return
			}
			got <- m
		}
	}()
	for i := 0; i < n; i++ {
		if i == 20 {
			require.NoError(t, soft.Default().CutLink("soft0", "soft1"))
		}
		if i == 24 {
			require.NoError(t, soft.Default().RestoreLink("soft0", "soft1"))
		}
		require.NoError(t, a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "cut", Msg: []byte(fmt.Sprint(i))}), "notify %d", i)
	}
	for i := 0; i < n; i++ {
		m := <-got
		require.Equal(t, fmt.Sprint(i), string(m.Msg), "order or duplicate")
	}
	select {
	case m := <-got:
		t.Fatalf("delivered twice: %q", m.Msg)
	default:
	}
	require.Greater(t, counters(t, a).CutDropped, uint64(0), "the cut never dropped a packet")
	t.Logf("link cut: %d sent, %d delivered, 0 duplicates, %d dups dropped by the receiver", n, n, peerStats(t, b, a.Addr()).Duplicates)
}

// TestLinkCutNoFallback: with fallback off the caller gets a clear error, and after the link
// comes back a later notify reconnects.
func TestLinkCutNoFallback(t *testing.T) {
	a := newEngine(t, notify.TransportRDMATwoSided, twoSidedOn("soft0", notify.WithOOBFallback(false))...)
	b := newEngine(t, notify.TransportRDMATwoSided, twoSidedOn("soft1")...)
	ctx := ctxFor(t, 60*time.Second)
	require.NoError(t, a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "before"}))
	require.NoError(t, soft.Default().CutLink("soft0", "soft1"))
	err := a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "during"})
	require.Error(t, err)
	require.NoError(t, ctx.Err())
	require.NoError(t, soft.Default().RestoreLink("soft0", "soft1"))
	require.NoError(t, a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "after"}))
	names := map[string]bool{}
	for _, m := range drainN(t, ctx, b, 2) {
		names[m.Name] = true
	}
	require.True(t, names["before"] && names["after"], "got %v", names)
	require.Greater(t, peerStats(t, a, b.Addr()).Epoch, uint64(1), "no reconnect with a new epoch")
}

func drainN(t *testing.T, ctx context.Context, e *notify.Engine, n int) []notify.Notify {
	t.Helper()
	out := make([]notify.Notify, 0, n)
	for len(out) < n {
		m, err := e.Recv(ctx)
		require.NoError(t, err)
		out = append(out, m)
	}
	return out
}

// TestReceiverStopsConsuming: the receive queue fills, credits stop, the sender waits within
// its context; no RNR, nothing lost; when consumption resumes everything drains, in order.
func TestReceiverStopsConsuming(t *testing.T) {
	a := newEngine(t, notify.TransportRDMATwoSided, twoSidedOn("soft0", notify.WithRecvCount(8))...)
	b := newEngine(t, notify.TransportRDMATwoSided, twoSidedOn("soft1", notify.WithRecvCount(8), notify.WithRecvQueue(16))...)
	ctx := ctxFor(t, 60*time.Second)
	const n = 300
	var acked atomic.Int64
	errc := make(chan error, 1)
	go func() {
		for i := 0; i < n; i++ {
			if err := a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "bp", Msg: []byte(fmt.Sprint(i))}); err != nil {
				errc <- err
				return
			}
			acked.Add(1)
		}
		errc <- nil
	}()
	require.Eventually(t, func() bool { return b.Stats().Paused }, 20*time.Second, 5*time.Millisecond)
	st := b.Stats()
	require.LessOrEqual(t, st.Queued, 16+8, "queue overshot its bound plus one window")
	require.Less(t, acked.Load(), int64(n), "sender did not wait")
	for i := 0; i < n; i++ {
		m, err := b.Recv(ctx)
		require.NoError(t, err)
		require.Equal(t, fmt.Sprint(i), string(m.Msg))
	}
	require.NoError(t, <-errc)
	require.Zero(t, counters(t, a).RNRNaksRecv+counters(t, b).RNRNaksSent, "RNR happened")
	require.Zero(t, peerStats(t, b, a.Addr()).Duplicates)
}

// TestCloseWithSendsInFlight: every call ends with success or ErrClosed.
func TestCloseWithSendsInFlight(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			a, err := notify.New(notify.WithTransport(tr), notify.WithListenAddr("127.0.0.1:0"))
			require.NoError(t, err)
			b := newEngine(t, tr)
			ctx := ctxFor(t, 30*time.Second)
			require.NoError(t, a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "warm"}))
			var wg sync.WaitGroup
			var ok, closed atomic.Int64
			var other sync.Map
			for g := 0; g < 8; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 200; i++ {
						err := a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "x"})
						switch {
						case err == nil:
							ok.Add(1)
						case errors.Is(err, notify.ErrClosed):
							closed.Add(1)
							return
						default:
							other.Store(err.Error(), true)
							return
						}
					}
				}()
			}
			require.Eventually(t, func() bool { return ok.Load() > 50 }, 20*time.Second, time.Millisecond)
			require.NoError(t, a.Close(ctx))
			wg.Wait()
			other.Range(func(k, _ any) bool { t.Errorf("neither success nor ErrClosed: %v", k); return true })
			t.Logf("%d succeeded, %d ErrClosed", ok.Load(), closed.Load())
		})
	}
}

// TestNoRNRWithCredits: 200 000 one-way 64-byte notifies (16 senders) with rq depth 64 never
// hit RNR; a tenth of that burst with credits off does — proof that the check can fail. The
// count is what the check needs (each sender wraps the 64-deep ring ~200 times), not a rate:
// the deadline is a hang guard for a loaded machine under -race.
func TestNoRNRWithCredits(t *testing.T) {
	count := 200_000
	if testing.Short() {
		count = 20_000
	}
	var firstErr atomic.Value // of the last run: what stopped a sender
	run := func(t *testing.T, count int, slow bool, opts ...notify.Option) (rnr uint64, sent int) {
		a := newEngine(t, notify.TransportRDMATwoSided, twoSidedOn("soft0", append(opts, notify.WithRecvCount(64), notify.WithOOBFallback(false))...)...)
		var delivered atomic.Int64
		b := newEngine(t, notify.TransportRDMATwoSided, twoSidedOn("soft1", append(opts, notify.WithRecvCount(64),
			notify.WithHandler(func(notify.Notify) {
				if slow {
					for end := time.Now().Add(20 * time.Microsecond); time.Now().Before(end); {
					}
				}
				delivered.Add(1)
			}))...)...)
		ctx := ctxFor(t, 10*time.Minute)
		before := counters(t, b).RNRNaksSent
		msg := make([]byte, 64)
		var wg sync.WaitGroup
		var okCount atomic.Int64
		const senders = 16
		for g := 0; g < senders; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < count/senders; i++ {
					if err := a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "n", Msg: msg}); err != nil {
						firstErr.CompareAndSwap(nil, err.Error())
						return // without credits a QP may die of RNR: that is the point
					}
					okCount.Add(1)
				}
			}()
		}
		wg.Wait()
		return counters(t, b).RNRNaksSent - before, int(okCount.Load())
	}
	t.Run("credits", func(t *testing.T) {
		rnr, sent := run(t, count, false)
		require.Equal(t, count/16*16, sent, "a sender stopped on: %v", firstErr.Load())
		require.Zero(t, rnr, "RNR NAKs with credit flow control")
		t.Logf("%d one-way 64 B notifies, rq depth 64: %d RNR NAKs", sent, rnr)
	})
	t.Run("no-credits", func(t *testing.T) {
		// Without credits, a receiver slower than its sender is what hits RNR.
		rnr, sent := run(t, count/10, true, notify.WithCreditsDisabled())
		require.Greater(t, rnr, uint64(0), "without credits the burst should hit RNR")
		t.Logf("credits off: %d RNR NAKs, %d notifies acked", rnr, sent)
	})
}
