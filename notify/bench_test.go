package notify

import (
	"context"
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
