package ctrlchannel

import (
	"testing"
	"time"
)

// BenchmarkMachineNotify is the pure machine's cost per notify, both ends, credit included.
func BenchmarkMachineNotify(b *testing.B) {
	nw := connect(b, extParams(64), extParams(64))
	a := &lean{m: nw.a.m, scratch: make([]byte, 256), wcs: make([]uint64, 0, 64)}
	r := &lean{m: nw.b.m, scratch: make([]byte, 256), wcs: make([]uint64, 0, 64), peer: a}
	a.peer = r
	req := &SendReq{Name: "bench", Msg: make([]byte, 64)}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		req.Seq = uint64(i + 1)
		a.m.Submit(t0, req)
		a.run()
	}
}

// BenchmarkChannelOneWay streams 64-byte notifies over two soft devices with up to 64 in
// flight; allocs/op includes the soft provider's and the reactor's.
func BenchmarkChannelOneWay(b *testing.B) {
	cfg := extConfig()
	a, rcv, _ := pair(b, cfg, cfg, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	snd := startSender(b, a, b.N, 64, "n", make([]byte, 64-1-8))
	<-snd.done
	<-rcv.rec.all
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "notifies/s")
}
