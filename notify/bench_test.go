package notify

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
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
// rdma_twosided engines in one process.
func BenchmarkSendNotifyAsync(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	recv, err := New(WithTransport(TransportRDMATwoSided), WithHandler(func(Notify) {}), WithRecvCount(256))
	if err != nil {
		b.Fatal(err)
	}
	defer recv.Close(ctx)
	send, err := New(WithTransport(TransportRDMATwoSided), WithMaxPendingSends(512), WithRecvCount(256))
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
}
