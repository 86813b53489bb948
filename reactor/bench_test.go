package reactor

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/ibv/soft"
)

// reportLatency sorts the samples (ns) and reports p50 and p99.
func reportLatency(b *testing.B, lat []int64) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2]), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100]), "p99-ns")
}

// Submit from another goroutine → the func starts on the loop. One submission in flight,
// so the loop is asleep in epoll_wait (or spinning, with busy poll) when it arrives.
func benchSubmitLatency(b *testing.B, opts ...Option) {
	l := newLoop(b, opts...)
	lat := make([]int64, b.N)
	done := make(chan struct{}, 1)
	var start int64
	var i int
	f := func() {
		lat[i] = l.mono() - start
		done <- struct{}{}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i = 0; i < b.N; i++ {
		start = l.mono()
		if err := l.Submit(f); err != nil {
			b.Fatal(err)
		}
		<-done
	}
	b.StopTimer()
	reportLatency(b, lat)
	b.ReportMetric(float64(l.Stats().Wakeups)/float64(b.N), "wakeups/op")
}

func BenchmarkSubmitLatency(b *testing.B) { benchSubmitLatency(b) }

func BenchmarkSubmitLatencyBusyPoll(b *testing.B) {
	benchSubmitLatency(b, WithBusyPoll(50*time.Microsecond))
}

// Many producers, SubmitWait: throughput of the ring and the coalesced wake-up.
func BenchmarkSubmitParallel(b *testing.B) {
	l := newLoop(b)
	f := func() {}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := l.SubmitWait(context.Background(), f); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	st := l.Stats()
	b.ReportMetric(float64(st.SubmitEvents)/float64(b.N), "eventfd-wakes/op")
}

// latencyHandler measures CQE landed → HandleWC; the WRID carries the landing time.
type latencyHandler struct {
	l    *Loop
	lat  []int64
	i    *int
	done chan struct{}
}

func (h latencyHandler) HandleWC(wcs []ibv.WC) {
	for _, wc := range wcs {
		h.lat[*h.i] = h.l.mono() - int64(wc.WRID)
		h.done <- struct{}{}
	}
}
func (latencyHandler) Repost() {}

func benchCQLatency(b *testing.B, cq ibv.CQ, land func(ibv.WC), opts ...Option) {
	l := newLoop(b, opts...)
	var i int
	h := latencyHandler{l: l, lat: make([]int64, b.N), i: &i, done: make(chan struct{}, 1)}
	var err error
	onLoop(b, l, func() { _, err = l.WatchCQ(cq, h) })
	if err != nil {
		b.Fatal(err)
	}
	onLoop(b, l, func() {})
	b.ReportAllocs()
	b.ResetTimer()
	for i = 0; i < b.N; i++ {
		land(ibv.WC{WRID: uint64(l.mono())})
		<-h.done
	}
	b.StopTimer()
	reportLatency(b, h.lat)
	st := l.Stats()
	b.ReportMetric(float64(st.CQEvents)/float64(b.N), "cq-events/op")
	b.ReportMetric(float64(st.Wakeups)/float64(b.N), "wakeups/op")
}

func benchFakeCQLatency(b *testing.B, opts ...Option) {
	ch, err := newFakeChannel()
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	cq := newFakeCQ(ch)
	benchCQLatency(b, cq, cq.land, opts...)
}

func benchSoftCQLatency(b *testing.B, opts ...Option) {
	ctx, err := soft.New(soft.WithDevices(1)).Open("soft0")
	if err != nil {
		b.Fatal(err)
	}
	defer ctx.Close()
	ch, err := ctx.CreateCompChannel()
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Close()
	cq, err := ctx.CreateCQ(256, ch)
	if err != nil {
		b.Fatal(err)
	}
	defer cq.Destroy()
	benchCQLatency(b, cq, func(wc ibv.WC) {
		if err := soft.InjectWC(cq, wc); err != nil {
			b.Error(err)
		}
	}, opts...)
}

// A CQE landed by another goroutine ("the NIC") → channel event → HandleWC on the loop.
func BenchmarkCQLatency(b *testing.B)     { benchFakeCQLatency(b) }
func BenchmarkSoftCQLatency(b *testing.B) { benchSoftCQLatency(b) }

func BenchmarkCQLatencyBusyPoll(b *testing.B) {
	benchFakeCQLatency(b, WithBusyPoll(50*time.Microsecond))
}

func BenchmarkSoftCQLatencyBusyPoll(b *testing.B) {
	benchSoftCQLatency(b, WithBusyPoll(50*time.Microsecond))
}

// The cost of the loop-only check every loop-only method makes (a gettid).
func BenchmarkInLoop(b *testing.B) {
	l := newLoop(b)
	b.ReportAllocs()
	for b.Loop() {
		_ = l.InLoop()
	}
}

// Timer.Reset on the loop (a keepalive pushed back per message).
func BenchmarkTimerReset(b *testing.B) {
	l := newLoop(b)
	b.ReportAllocs()
	onLoop(b, l, func() {
		tm := l.AfterFunc(time.Hour, func() {})
		for i := 0; i < b.N; i++ {
			tm.Reset(time.Hour)
		}
	})
}
