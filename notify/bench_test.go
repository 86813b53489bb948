package notify

import (
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

// BenchmarkSendNotify: sequential notifies between two engines in one process, delivered
// to a handler on the receiver's reactor thread.
func BenchmarkSendNotify(b *testing.B) {
	for _, tr := range []string{TransportOOB, TransportRDMATwoSided} {
		for _, spin := range []time.Duration{0, 50 * time.Microsecond} {
			b.Run(tr+"/busypoll="+spin.String(), func(b *testing.B) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				got := make(chan struct{}, 1)
				recv, err := New(WithTransport(tr), WithBusyPoll(spin), WithHandler(func(Notify) {}))
				if err != nil {
					b.Fatal(err)
				}
				defer recv.Close(ctx)
				send, err := New(WithTransport(tr), WithBusyPoll(spin))
				if err != nil {
					b.Fatal(err)
				}
				defer send.Close(ctx)
				_ = got
				n := Notify{Name: "bench", Msg: make([]byte, 64)}
				for i := 0; i < 100; i++ {
					if err := send.SendNotify(ctx, recv.Addr(), n); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if err := send.SendNotify(ctx, recv.Addr(), n); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkSendNotifyAsync: pipelined one-way 64 B notifies, 256 in flight, between two
// engines in one process, on each transport. Reported: notifies/s, and over OOB the
// notifies the receiver answered busy (each costs the sender a retry pause).
func BenchmarkSendNotifyAsync(b *testing.B) {
	for _, tr := range []string{TransportRDMATwoSided, TransportOOB} {
		b.Run(tr, func(b *testing.B) { benchAsync(b, tr) })
	}
}

func benchAsync(b *testing.B, tr string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	recv, err := New(WithTransport(tr), WithHandler(func(Notify) {}), WithRecvCount(256))
	if err != nil {
		b.Fatal(err)
	}
	defer recv.Close(ctx)
	send, err := New(WithTransport(tr), WithMaxPendingSends(512), WithRecvCount(256))
	if err != nil {
		b.Fatal(err)
	}
	defer send.Close(ctx)
	n := Notify{Name: "bench", Msg: make([]byte, 64)}
	if err := send.SendNotify(ctx, recv.Addr(), n); err != nil {
		b.Fatal(err)
	}
	const window = 256
	slots := make(chan struct{}, window)
	var failed atomic.Int64
	done := func(err error) {
		if err != nil {
			failed.Add(1)
		}
		<-slots
	}
	busy0 := recv.Stats().OOB.BusyRefused + recv.Stats().OOBBusy
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		slots <- struct{}{}
		if err := send.SendNotifyAsync(recv.Addr(), n, done); err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; i < window; i++ {
		slots <- struct{}{}
	}
	b.StopTimer()
	if failed.Load() > 0 {
		b.Fatalf("%d sends failed", failed.Load())
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "notifies/s")
	st := recv.Stats()
	b.ReportMetric(float64(st.OOB.BusyRefused+st.OOBBusy-busy0)/float64(b.N), "busy/n")
}

// allocPair is two engines in one process: send notifies recv, whose handler signals got.
func allocPair(t *testing.T, transport string) (send, recv *Engine, got chan struct{}) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	got = make(chan struct{}, 1)
	recv, err := New(WithTransport(transport), WithHandler(func(Notify) { got <- struct{}{} }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = recv.Close(ctx) })
	send, err = New(WithTransport(transport))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = send.Close(ctx) })
	// Connected, warm: the channel exists and the pools are full.
	for i := 0; i < 50; i++ {
		if err := send.SendNotify(ctx, recv.Addr(), Notify{Name: "warm", Msg: make([]byte, 64)}); err != nil {
			t.Fatal(err)
		}
		<-got
	}
	return send, recv, got
}

// Allocations of one notify's whole hot path in one process: SendNotifyAsync on the
// caller, the sender's loop (post, completion, callback) and the receiver's loop (progress,
// delivery to the handler). Both engines live in this process, so AllocsPerRun (which
// counts every goroutine's allocations) sees both sides.
func TestSendNotifyAsyncAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	for _, tr := range []string{TransportRDMATwoSided, TransportOOB} {
		t.Run(tr, func(t *testing.T) {
			send, recv, got := allocPair(t, tr)
			n := Notify{Name: "alloc", Msg: make([]byte, 64)}
			peer := recv.Addr()
			completed := make(chan error, 1)
			done := func(err error) { completed <- err }
			allocs := testing.AllocsPerRun(500, func() {
				if err := send.SendNotifyAsync(peer, n, done); err != nil {
					panic(err)
				}
				<-got
				if err := <-completed; err != nil {
					panic(err)
				}
			})
			t.Logf("%s: %.2f allocations per notify (send + delivery)", tr, allocs)
			if allocs > maxHotPathAllocs {
				t.Fatalf("%.2f allocations per notify, at most %d", allocs, maxHotPathAllocs)
			}
		})
	}
}

// maxHotPathAllocs bounds what one notify allocates, sender and receiver together, on
// either transport (go test -memprofile): nothing. The machine's actions are double-
// buffered (ready), its reqEntry comes from a free list refilled between events, a peer's
// waiters keep their array, and the receiver's copy of the message is carved from a shared
// chunk (reactor.Slab: one allocation per 16 KiB of small messages), 6 -> 3 -> 1 -> 0 for
// rdma_twosided. Over OOB the engine's send (oobSend) and the node's call (with its timer
// and callbacks) come from loop-only free lists, and the receiver answers through a
// NotifyReply value instead of a closure: 9 -> 0. The caller's side and the hand-offs
// allocate nothing (TestSendNotifyAsyncCallAllocs).
const maxHotPathAllocs = 0

// SendNotifyAsync itself allocates nothing: measured while the sender's loop is held, so
// that no loop work runs during the calls; then the loop is released and every send
// completes.
func TestSendNotifyAsyncCallAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	send, recv, got := allocPair(t, TransportRDMATwoSided)
	n := Notify{Name: "alloc", Msg: make([]byte, 64)}
	peer := recv.Addr()
	const runs = 100
	completed := make(chan error, runs+1)
	done := func(err error) { completed <- err }
	// held runs f while the sender's loop is held, then lets the held sends complete.
	held := func(sends int, f func()) {
		stopped, release := make(chan struct{}), make(chan struct{})
		if err := send.loop.Submit(func() { close(stopped); <-release }); err != nil {
			t.Fatal(err)
		}
		<-stopped
		f()
		close(release)
		for i := 0; i < sends; i++ {
			if err := <-completed; err != nil {
				t.Fatal(err)
			}
			<-got
		}
	}
	// First fill the pool with as many reqs as the measure holds in flight.
	held(runs+1, func() {
		for i := 0; i < runs+1; i++ {
			if err := send.SendNotifyAsync(peer, n, done); err != nil {
				t.Fatal(err)
			}
		}
	})
	var allocs float64
	held(runs+1, func() { // AllocsPerRun calls once more to warm up
		allocs = testing.AllocsPerRun(runs, func() {
			if err := send.SendNotifyAsync(peer, n, done); err != nil {
				panic(err)
			}
		})
	})
	t.Logf("SendNotifyAsync: %.2f allocations per call", allocs)
	if allocs != 0 {
		t.Fatalf("SendNotifyAsync allocated %.2f times per call", allocs)
	}
}

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

// SendNotify's Waiters (one eventfd each) are pooled by the engine and released by Close,
// with concurrent callers and a cancelled one among them.
func TestSendNotifyWaitersReleased(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	before := openFDs(t)
	func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		recv, err := New(WithTransport(TransportRDMATwoSided), WithHandler(func(Notify) {}))
		if err != nil {
			t.Fatal(err)
		}
		send, err := New(WithTransport(TransportRDMATwoSided))
		if err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, 4)
		for g := 0; g < 4; g++ {
			go func() {
				var err error
				for i := 0; i < 20 && err == nil; i++ {
					err = send.SendNotify(ctx, recv.Addr(), Notify{Name: "w", Msg: []byte("x")})
				}
				errs <- err
			}()
		}
		for g := 0; g < 4; g++ {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
		gone, cancelGone := context.WithCancel(ctx)
		cancelGone()
		if err := send.SendNotify(gone, recv.Addr(), Notify{Name: "w"}); !errors.Is(err, ErrTimeout) {
			t.Errorf("cancelled send: %v, want ErrTimeout", err)
		}
		if send.waitReqs.free == nil {
			t.Error("no SendNotify req came back to the pool")
		}
		_ = send.Close(ctx)
		_ = recv.Close(ctx)
	}()
	if after := openFDs(t); after != before {
		t.Fatalf("%d fds open before the engines, %d after Close", before, after)
	}
}

// BenchmarkIdlePeers: the idle cost of keepalive. One hub with a ctrl channel to each of
// 100 peers (engines in this process), nothing sent for a 10 s window; keepalive off, at
// the default and at 1 s, side by side in one run. Reported per second of idle: the hub's
// reactor wake-ups, all 101 engines' wake-ups, keepalive frames sent (all engines) and the
// process's CPU time. Each iteration is one 10 s window.
func BenchmarkIdlePeers(b *testing.B) {
	const peers, window = 100, 10 * time.Second
	for _, ka := range []struct {
		name string
		opt  []Option
	}{{"keepalive=off", []Option{WithKeepalive(0)}}, {"keepalive=default", nil}, {"keepalive=1s", []Option{WithKeepalive(time.Second)}}} {
		b.Run(ka.name, func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			hub, err := New(append([]Option{WithTransport(TransportRDMATwoSided), WithHandler(func(Notify) {}),
				WithMaxChannels(2 * peers)}, ka.opt...)...)
			if err != nil {
				b.Fatal(err)
			}
			defer hub.Close(ctx)
			engines := []*Engine{hub}
			for i := 0; i < peers; i++ {
				e, err := New(append([]Option{WithTransport(TransportRDMATwoSided)}, ka.opt...)...)
				if err != nil {
					b.Fatal(err)
				}
				defer e.Close(ctx)
				if err := e.SendNotify(ctx, hub.Addr(), Notify{Name: "up"}); err != nil {
					b.Fatal(err)
				}
				engines = append(engines, e)
			}
			if up := hub.Stats().ChannelsUp; up != peers {
				b.Fatalf("%d channels up at the hub, want %d", up, peers)
			}
			wakeups := func() (hubW, all, kas uint64) {
				for i, e := range engines {
					st := e.Stats()
					all += st.Reactor.Wakeups
					kas += st.Channels.KeepalivesSent
					if i == 0 {
						hubW = st.Reactor.Wakeups
					}
				}
				return
			}
			h0, a0, k0 := wakeups()
			c0 := cpuTime()
			t0 := time.Now()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				time.Sleep(window)
			}
			b.StopTimer()
			secs := time.Since(t0).Seconds()
			h1, a1, k1 := wakeups()
			b.ReportMetric(float64(h1-h0)/secs, "hub-wakeups/s")
			b.ReportMetric(float64(a1-a0)/secs, "all-wakeups/s")
			b.ReportMetric(float64(k1-k0)/secs, "keepalives/s")
			b.ReportMetric(float64(cpuTime()-c0)/float64(time.Millisecond)/secs, "cpu-ms/s")
			if up := hub.Stats().ChannelsUp; up != peers {
				b.Fatalf("%d channels up at the hub after the idle window, want %d", up, peers)
			}
		})
	}
}

// cpuTime is the process's user+system CPU time.
func cpuTime() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkSendNotifyWindow: pipelined one-way 64 B notifies from 256 goroutines, each
// with one SendNotify in flight (the bench's pipelined pump for a transport without
// SendNotifyAsync chains), between two engines in one process.
func BenchmarkSendNotifyWindow(b *testing.B) {
	for _, tr := range []string{TransportRDMATwoSided, TransportOOB} {
		b.Run(tr, func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			recv, err := New(WithTransport(tr), WithHandler(func(Notify) {}))
			if err != nil {
				b.Fatal(err)
			}
			defer recv.Close(ctx)
			send, err := New(WithTransport(tr), WithMaxPendingSends(512))
			if err != nil {
				b.Fatal(err)
			}
			defer send.Close(ctx)
			n := Notify{Name: "bench", Msg: make([]byte, 64)}
			if err := send.SendNotify(ctx, recv.Addr(), n); err != nil {
				b.Fatal(err)
			}
			const window = 256
			var next, failed atomic.Int64
			var wg sync.WaitGroup
			b.ReportAllocs()
			b.ResetTimer()
			for w := 0; w < window; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for next.Add(1) <= int64(b.N) {
						if err := send.SendNotify(ctx, recv.Addr(), n); err != nil {
							failed.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			if failed.Load() > 0 {
				b.Fatalf("%d sends failed", failed.Load())
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "notifies/s")
		})
	}
}
