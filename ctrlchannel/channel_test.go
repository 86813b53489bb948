package ctrlchannel

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/ibv/soft"
	"github.com/twosided/twosided/reactor"
)

// waitBound bounds every wait of these tests; it detects hangs, it is no timing assertion.
const waitBound = 2 * time.Minute

// recorder is an Events that keeps what it got; its fields are guarded by mu.
type recorder struct {
	mu      sync.Mutex
	got     []Delivery
	want    int
	all     chan struct{} // closed when len(got) reaches want
	closed  chan error    // gets OnClosed's error
	ordered bool          // seqs arrived strictly increasing
	last    uint64
	fences  [][3]uint64 // {notifies delivered before it, first, count}
}

func newRecorder(want int) *recorder {
	return &recorder{want: want, all: make(chan struct{}), closed: make(chan error, 1), ordered: true}
}

func (r *recorder) OnNotify(d Delivery) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if d.Seq <= r.last {
		r.ordered = false
	}
	r.last = d.Seq
	if len(r.got) < 64 || len(r.got) == r.want-1 || len(d.Msg) > 1024 {
		r.got = append(r.got, d) // keep a few, and every large one
	} else {
		r.got = append(r.got, Delivery{Seq: d.Seq})
	}
	if len(r.got) == r.want {
		close(r.all)
	}
}

func (r *recorder) OnClosed(err error) { r.closed <- err }

func (r *recorder) OnFence(session, first, count uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fences = append(r.fences, [3]uint64{uint64(len(r.got)), first, count})
}

// peerInfo is what a handshake would carry from l.
func peerInfo(l LocalInfo) PeerInfo {
	return PeerInfo{QPN: l.QPN, GID: l.GID, LID: l.LID, MTU: l.MTU, RQDepth: l.RQDepth, PSN: l.PSN,
		BufSize: l.BufSize, Extensions: l.Extensions}
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got)
}

// side is one end: a loop, a soft device and a channel.
type side struct {
	loop *reactor.Loop
	ctx  ibv.Context
	pd   ibv.PD
	ch   *Channel
	rec  *recorder
}

func onLoop(t testing.TB, l *reactor.Loop, f func()) {
	t.Helper()
	done := make(chan struct{})
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	require.NoError(t, l.SubmitWait(ctx, func() { f(); close(done) }))
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("loop did not run the function")
	}
}

func wait[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitBound):
		t.Fatalf("timed out waiting for %s", what)
	}
	var zero T
	return zero
}

func newSide(t testing.TB, p *soft.Provider, dev string, cfg Config, want int) *side {
	t.Helper()
	l, err := reactor.New(reactor.WithLogger(zerolog.Nop()))
	require.NoError(t, err)
	s := &side{loop: l, rec: newRecorder(want)}
	s.ctx, err = p.Open(dev)
	require.NoError(t, err)
	s.pd, err = s.ctx.AllocPD()
	require.NoError(t, err)
	onLoop(t, l, func() { s.ch, err = NewChannel(l, s.ctx, s.pd, cfg, s.rec) })
	require.NoError(t, err)
	t.Cleanup(func() {
		onLoop(t, l, func() { s.ch.Close(nil) })
		ctx, cancel := context.WithTimeout(context.Background(), waitBound)
		defer cancel()
		require.NoError(t, l.Stop(ctx))
		require.NoError(t, s.pd.Dealloc())
		require.NoError(t, s.ctx.Close())
	})
	return s
}

// pair connects two channels over two soft devices of one isolated provider.
func pair(t testing.TB, ca, cb Config, wantA, wantB int) (*side, *side, *soft.Provider) {
	t.Helper()
	return pairAs(t, ca, cb, wantA, wantB, nil)
}

// pairAs is pair; view changes what a's handshake says about b.
func pairAs(t testing.TB, ca, cb Config, wantA, wantB int, view func(*PeerInfo)) (*side, *side, *soft.Provider) {
	t.Helper()
	p := soft.New(soft.WithDevices(2))
	a := newSide(t, p, "soft0", ca, wantA)
	b := newSide(t, p, "soft1", cb, wantB)
	var la, lb LocalInfo
	onLoop(t, a.loop, func() { la = a.ch.Local() })
	onLoop(t, b.loop, func() { lb = b.ch.Local() })
	var errA, errB error
	legacy := false
	onLoop(t, a.loop, func() {
		pi := peerInfo(lb)
		if view != nil {
			view(&pi)
		}
		legacy = pi.Legacy
		errA = a.ch.Connect(pi, 100, 200, 1)
	})
	onLoop(t, b.loop, func() {
		pa := peerInfo(la)
		if legacy {
			pa.PSN = 0 // b plays Mooncake, which reads no ts_psn (and a sends from 0 to it)
		}
		errB = b.ch.Connect(pa, 200, 100, 1)
	})
	require.NoError(t, errA)
	require.NoError(t, errB)
	return a, b, p
}

// extConfig is a twosided peer's channel. Its ACK timeout (16: 268 ms a try, 8 tries) is
// one a starved soft device keeps: the soft provider acknowledges from goroutines of the
// test's process, which a loaded machine may not run for a second (10, 4 ms a try, let a
// healthy QP die of RETRY_EXC_ERR beside two CPU hogs and two soaks).
func extConfig() Config { return Config{Extensions: true, Timeout: 16} }

// sender sends n notifies from the loop, keeping at most window in flight, and reports
// the first error and the count of successes.
type sender struct {
	s      *side
	n      int
	next   uint64
	ok     int
	err    error
	done   chan struct{}
	msg    []byte
	name   string
	reqs   []*SendReq
	failed int
}

func startSender(t testing.TB, s *side, n, window int, name string, msg []byte) *sender {
	snd := &sender{s: s, n: n, done: make(chan struct{}), msg: msg, name: name}
	onLoop(t, s.loop, func() {
		for i := 0; i < window && i < n; i++ {
			r := &SendReq{Name: name, Msg: msg}
			r.Done = func(err error) { snd.completed(r, err) }
			snd.reqs = append(snd.reqs, r)
			snd.send(r)
		}
	})
	return snd
}

func (snd *sender) send(r *SendReq) {
	snd.next++
	r.Seq = snd.next
	snd.s.ch.Send(r)
}

func (snd *sender) completed(r *SendReq, err error) {
	if err != nil {
		snd.failed++
		if snd.err == nil {
			snd.err = err
		}
	} else {
		snd.ok++
	}
	if snd.ok+snd.failed == snd.n {
		close(snd.done)
		return
	}
	if int(snd.next) < snd.n {
		snd.send(r)
	}
}

func TestChannelSingleNotify(t *testing.T) {
	a, b, _ := pair(t, extConfig(), extConfig(), 0, 1)
	done := make(chan error, 1)
	onLoop(t, a.loop, func() {
		a.ch.Send(&SendReq{Seq: 7, Name: "req-7", Msg: []byte("done"), Done: func(err error) { done <- err }})
	})
	require.NoError(t, wait(t, done, "send completion"))
	wait(t, b.rec.all, "delivery")
	b.rec.mu.Lock()
	d := b.rec.got[0]
	b.rec.mu.Unlock()
	require.Equal(t, Delivery{Session: 100, Epoch: 1, Seq: 7, Name: "req-7", Msg: []byte("done")}, d)
	var st ChannelStats
	onLoop(t, a.loop, func() { st = a.ch.Stats() })
	require.Equal(t, uint64(1), st.NotifiesSent)
	require.Equal(t, ibv.MTU4096, st.PathMTU)
}

// sentAndDelivered waits until snd's sends ended, requires that none failed, and waits
// (bounded) until b received all n, failing with both sides' stats.
func sentAndDelivered(t *testing.T, a, b *side, snd *sender, n int) {
	t.Helper()
	wait(t, snd.done, "sends")
	var err error
	onLoop(t, a.loop, func() { err = snd.err })
	require.NoError(t, err, "a send failed")
	select {
	case <-b.rec.all:
	case <-time.After(waitBound):
		var sa, sb ChannelStats
		onLoop(t, a.loop, func() { sa = a.ch.Stats() })
		onLoop(t, b.loop, func() { sb = b.ch.Stats() })
		t.Fatalf("timed out waiting for deliveries: %d of %d delivered; sender %+v; receiver %+v", b.rec.count(), n, sa, sb)
	}
}

func TestChannelBurstInOrder(t *testing.T) {
	const n = 1000
	a, b, _ := pair(t, extConfig(), extConfig(), 0, n)
	snd := startSender(t, a, n, 64, "burst", []byte("0123456789"))
	sentAndDelivered(t, a, b, snd, n)
	b.rec.mu.Lock()
	defer b.rec.mu.Unlock()
	require.True(t, b.rec.ordered)
	require.Equal(t, uint64(n), b.rec.last)
}

func TestChannelLargeNotifyFragmented(t *testing.T) {
	// 75 fragments take long under -race on a loaded machine: an ACK timeout of 4 ms
	// (extConfig) retried 7 times is not enough there; 268 ms is.
	cfg := extConfig()
	cfg.Timeout = 16
	a, b, _ := pair(t, cfg, cfg, 0, 2)
	big := make([]byte, 300<<10)
	for i := range big {
		big[i] = byte(i*31 + i>>8)
	}
	done := make(chan error, 2)
	onLoop(t, a.loop, func() {
		a.ch.Send(&SendReq{Seq: 1, Name: "large", Msg: big, Done: func(err error) { done <- err }})
		a.ch.Send(&SendReq{Seq: 2, Name: "small", Msg: []byte("after"), Done: func(err error) { done <- err }})
	})
	require.NoError(t, wait(t, done, "large send"))
	require.NoError(t, wait(t, done, "small send"))
	wait(t, b.rec.all, "deliveries")
	b.rec.mu.Lock()
	got := b.rec.got
	b.rec.mu.Unlock()
	require.Equal(t, "large", got[0].Name)
	require.True(t, bytes.Equal(big, got[0].Msg), "reassembled byte for byte")
	require.Equal(t, "after", string(got[1].Msg))
	var st ChannelStats
	onLoop(t, a.loop, func() { st = a.ch.Stats() })
	require.Greater(t, st.FragmentsSent, uint64(300<<10)/4096)
}

func TestChannelTooLarge(t *testing.T) {
	cfg := extConfig()
	cfg.MaxNotifySize = 64 << 10
	a, _, _ := pair(t, cfg, extConfig(), 0, 0)
	done := make(chan error, 1)
	onLoop(t, a.loop, func() {
		a.ch.Send(&SendReq{Seq: 1, Name: "x", Msg: make([]byte, 64<<10), Done: func(err error) { done <- err }})
	})
	err := wait(t, done, "send completion")
	require.ErrorIs(t, err, ErrTooLarge)
	require.ErrorContains(t, err, "MaxNotifySize")
}

func TestChannelPeerClosedFailsPendingSends(t *testing.T) {
	a, b, _ := pair(t, extConfig(), extConfig(), 0, 0)
	onLoop(t, b.loop, func() { b.ch.Close(errors.New("test: peer goes away")) })
	require.ErrorIs(t, wait(t, b.rec.closed, "peer OnClosed"), ErrClosed)

	done := make(chan error, 8)
	onLoop(t, a.loop, func() {
		for i := 1; i <= 8; i++ {
			a.ch.Send(&SendReq{Seq: uint64(i), Name: "n", Msg: []byte("m"), Done: func(err error) { done <- err }})
		}
	})
	for i := 0; i < 8; i++ {
		err := wait(t, done, "failed send")
		require.Error(t, err)
		require.ErrorIs(t, err, ErrClosed)
		require.ErrorIs(t, err, ErrPeerError)
	}
	err := wait(t, a.rec.closed, "OnClosed")
	require.ErrorIs(t, err, ErrPeerError)
	var wcErr *ibv.WCError
	require.ErrorAs(t, err, &wcErr)
	require.Equal(t, ibv.WCRetryExcErr, wcErr.Status)

	late := make(chan error, 1)
	onLoop(t, a.loop, func() { a.ch.Send(&SendReq{Seq: 9, Done: func(err error) { late <- err }}) })
	require.ErrorIs(t, wait(t, late, "send after close"), ErrClosed)
}

func rnrNaks(t *testing.T, s *side) uint64 {
	c, err := soft.DeviceCounters(s.ctx)
	require.NoError(t, err)
	return c.RNRNaksSent
}

// oneWay sends n 64-byte notifies from a to b as fast as the channel takes them.
func oneWay(t *testing.T, ca, cb Config, n int) (*side, *side) {
	// A burst of this size on a loaded machine leaves the soft device's threads starved for
	// longer than extConfig's ACK timeout (2^10 × 4.096 µs, 7 retries: ~30 ms), and the QP
	// dies of RETRY_EXC_ERR though its peer is alive; these tests are about RNR, not about
	// the retry budget: 2^18 × 4.096 µs (~1 s) a try.
	ca.Timeout, cb.Timeout = max(ca.Timeout, 18), max(cb.Timeout, 18)
	a, b, _ := pair(t, ca, cb, 0, n)
	snd := startSender(t, a, n, ca.MaxPendingSends, "n", make([]byte, 64-1-8))
	sentAndDelivered(t, a, b, snd, n)
	b.rec.mu.Lock()
	require.True(t, b.rec.ordered)
	b.rec.mu.Unlock()
	return a, b
}

func TestChannelOneWayNoRNR(t *testing.T) {
	n := 100_000
	if testing.Short() {
		n = 20_000
	}
	cfg := extConfig()
	cfg.RecvCount = 64
	cfg.MaxPendingSends = 256 // more sends queued than the peer has RECVs: credit must hold them back
	a, b := oneWay(t, cfg, cfg, n)
	require.Zero(t, rnrNaks(t, b), "credit flow control: the sender never outran the posted RECVs")
	var sa, sb ChannelStats
	onLoop(t, a.loop, func() { sa = a.ch.Stats() })
	onLoop(t, b.loop, func() { sb = b.ch.Stats() })
	require.Equal(t, uint64(n), sa.NotifiesSent)
	require.Equal(t, uint64(n), sb.Delivered)
	require.Positive(t, sb.GrantsSent)
	require.Zero(t, sb.CreditOverruns)
	t.Logf("A: %d frames, %d grants, %d credit waits; B: %d grants", sa.FramesSent, sa.GrantsSent, sa.CreditWaits, sb.GrantsSent)
}

func TestChannelDisableCreditsHitsRNR(t *testing.T) {
	cfg := extConfig()
	cfg.RecvCount = 64
	cfg.MaxPendingSends = 256
	cfg.DisableCredits = true
	cfg.MinRNRTimer = 1 // retry RNR quickly: this test counts them, it does not wait them out
	_, b := oneWay(t, cfg, cfg, 20_000)
	require.Positive(t, rnrNaks(t, b), "without credit the same burst runs into RNR: the check above can fail")
}

func TestChannelPausedReceiverBackpressure(t *testing.T) {
	const n = 300
	cfg := extConfig()
	cfg.RecvCount = 16
	cfg.MaxPendingSends = 512
	a, b, _ := pair(t, cfg, cfg, 0, n)
	onLoop(t, b.loop, func() { b.ch.SetPaused(true) })
	snd := startSender(t, a, n, n, "n", []byte("m"))
	// The receiver holds its data window; the sender waits for credit with the rest queued.
	require.Eventually(t, func() bool {
		var held int
		onLoop(t, b.loop, func() { held = b.ch.Stats().Held })
		return held == cfg.RecvCount-1
	}, waitBound, time.Millisecond)
	var sa ChannelStats
	onLoop(t, a.loop, func() { sa = a.ch.Stats() })
	require.Positive(t, sa.CreditWaits)
	require.GreaterOrEqual(t, sa.Pending, n-(cfg.RecvCount-1))
	require.Zero(t, b.rec.count(), "paused: nothing delivered")

	onLoop(t, b.loop, func() { b.ch.SetPaused(false) })
	wait(t, snd.done, "sends")
	wait(t, b.rec.all, "deliveries")
	b.rec.mu.Lock()
	require.True(t, b.rec.ordered)
	b.rec.mu.Unlock()
	require.Zero(t, rnrNaks(t, b), "backpressure through credit, not RNR")
}

func TestChannelDeadlineBeforePosted(t *testing.T) {
	p := soft.New(soft.WithDevices(1))
	a := newSide(t, p, "soft0", extConfig(), 0)
	done := make(chan error, 1)
	onLoop(t, a.loop, func() { // not connected: the request can only wait
		a.ch.Send(&SendReq{Seq: 1, Name: "n", Deadline: time.Now().Add(20 * time.Millisecond),
			Done: func(err error) { done <- err }})
	})
	require.ErrorIs(t, wait(t, done, "deadline"), context.DeadlineExceeded)
}

func TestChannelConfigRejected(t *testing.T) {
	tests := []struct {
		field string
		cfg   Config
	}{
		{"RecvCount", Config{RecvCount: 5000}},
		{"BufSize", Config{BufSize: 100}},
		{"MaxPendingSends", Config{MaxPendingSends: -1}},
		{"MTU", Config{MTU: 9}},
		{"RetryCnt", Config{RetryCnt: 8}},
		{"RecvCount", Config{RecvCount: 2, Extensions: true}},
	}
	p := soft.New(soft.WithDevices(1))
	ctx, err := p.Open("soft0")
	require.NoError(t, err)
	defer func() { require.NoError(t, ctx.Close()) }()
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	defer func() { require.NoError(t, pd.Dealloc()) }()
	l, err := reactor.New(reactor.WithLogger(zerolog.Nop()))
	require.NoError(t, err)
	defer func() { require.NoError(t, l.Stop(context.Background())) }()
	for _, tc := range tests {
		var err error
		onLoop(t, l, func() { _, err = NewChannel(l, ctx, pd, tc.cfg, newRecorder(0)) })
		require.ErrorIs(t, err, ErrConfig)
		require.ErrorContains(t, err, tc.field)
	}
	_, err = NewChannel(l, ctx, pd, Config{}, newRecorder(0))
	require.ErrorIs(t, err, reactor.ErrNotInLoop)
}

func TestChannelPathMTUIsMinOfBothSides(t *testing.T) {
	cb := extConfig()
	cb.MTU = ibv.MTU1024
	a, b, _ := pair(t, extConfig(), cb, 0, 0)
	var ma, mb ibv.MTU
	onLoop(t, a.loop, func() { ma = a.ch.Stats().PathMTU })
	onLoop(t, b.loop, func() { mb = b.ch.Stats().PathMTU })
	require.Equal(t, ibv.MTU1024, ma, "the peer's smaller MTU wins")
	require.Equal(t, ibv.MTU1024, mb)
}

func TestChannelMooncakePeer(t *testing.T) {
	const n = 500
	mooncake := Config{Timeout: 16} // no Extensions: Mooncake's view of the channel (ACK timeout: extConfig)
	a, b, _ := pair(t, extConfig(), mooncake, 0, n)
	snd := startSender(t, a, n, 64, "n", []byte("m"))
	wait(t, snd.done, "sends")
	wait(t, b.rec.all, "deliveries")
	done := make(chan error, 1)
	onLoop(t, a.loop, func() {
		a.ch.Send(&SendReq{Seq: n + 1, Name: "big", Msg: make([]byte, 8000), Done: func(err error) { done <- err }})
	})
	require.ErrorIs(t, wait(t, done, "large send"), ErrTooLarge, "a Mooncake peer cannot reassemble: an error, never a truncation")
	var sa ChannelStats
	onLoop(t, a.loop, func() { sa = a.ch.Stats() })
	require.Zero(t, sa.GrantsSent, "a Mooncake peer only gets NOTIFY_COMPAT frames")
	require.Zero(t, sa.FragmentsSent)
}

// TestChannelLegacyReceiverNeverGrants: over the soft provider, a receiver that never
// grants credit nor piggybacks ack_seq (Mooncake PR #3440, played by a channel without
// Extensions) and stops reposting for a while: the sender towards it meets RNR, which
// rnr_retry 7 retries for ever; when the receiver reposts again every notify is
// delivered once and in order, and every send completes. Nothing stalls, nothing is lost.
func TestChannelLegacyReceiverNeverGrants(t *testing.T) {
	const n = 3000
	ca := extConfig()
	ca.MaxPendingSends = 128
	mooncake := Config{Timeout: 10, RecvCount: 8, MinRNRTimer: 1}
	a, b, _ := pairAs(t, ca, mooncake, 0, n, func(pi *PeerInfo) { pi.Legacy = true })
	onLoop(t, b.loop, func() { b.ch.SetPaused(true) })
	snd := startSender(t, a, n, 128, "", []byte("m")) // an empty name, as Mooncake allows
	require.Eventually(t, func() bool { return rnrNaks(t, b) > 0 }, waitBound, time.Millisecond,
		"the sender went past the posted RECVs")
	var sa ChannelStats
	onLoop(t, a.loop, func() { sa = a.ch.Stats() })
	require.LessOrEqual(t, sa.InFlight, int(mooncake.RecvCount), "at most notify_rq_depth SENDs without completion")
	require.Zero(t, sa.GrantsSent)
	onLoop(t, b.loop, func() { b.ch.SetPaused(false) })
	wait(t, snd.done, "sends")
	wait(t, b.rec.all, "deliveries")
	onLoop(t, a.loop, func() { require.NoError(t, snd.err) })
	b.rec.mu.Lock()
	require.True(t, b.rec.ordered)
	require.Equal(t, "", b.rec.got[0].Name)
	b.rec.mu.Unlock()
	onLoop(t, a.loop, func() { sa = a.ch.Stats() })
	require.Zero(t, sa.RNRRetryExceeded)
	require.Zero(t, sa.GrantsSent+sa.FragmentsSent)
}

// TestChannelByeAndFence: over the soft provider, a fence reaches the peer's OnFence in
// order, and Bye closes both ends: the peer with ErrPeerClosed after every notify.
func TestChannelByeAndFence(t *testing.T) {
	const n = 200
	cfg := extConfig()
	cfg.MaxPendingSends = 256
	a, b, _ := pair(t, cfg, cfg, 0, n)
	done := make(chan error, n)
	onLoop(t, a.loop, func() {
		for i := 1; i <= n; i++ {
			if i == 101 {
				require.NoError(t, a.ch.Fence(101, 5))
			}
			seq := uint64(i)
			if i > 100 {
				seq += 5
			}
			a.ch.Send(&SendReq{Seq: seq, Name: "n", Msg: []byte("m"), ID: fmt.Sprint("id", seq), Done: func(err error) { done <- err }})
		}
		a.ch.Bye()
	})
	for i := 0; i < n; i++ {
		require.NoError(t, wait(t, done, "send"))
	}
	wait(t, b.rec.all, "deliveries")
	require.ErrorIs(t, wait(t, b.rec.closed, "peer closed"), ErrPeerClosed)
	require.ErrorIs(t, wait(t, a.rec.closed, "closed"), ErrClosed)
	b.rec.mu.Lock()
	defer b.rec.mu.Unlock()
	require.True(t, b.rec.ordered)
	require.Equal(t, [][3]uint64{{100, 101, 5}}, b.rec.fences)
	require.Equal(t, "id1", b.rec.got[0].ID)
}

// TestChannelDropCountedAndLogged: frames whose SENDs completed at the sender but that the
// receiver cannot use (here fragments from a sender that wrongly believes the receiver
// negotiated Extensions) are counted by reason and logged at warn; the channel stays up
// and delivers the next notify.
func TestChannelDropCountedAndLogged(t *testing.T) {
	var log bytes.Buffer                                 // written on b's loop, read there too
	cb := Config{Timeout: 10, Logger: zerolog.New(&log)} // no Extensions
	a, b, _ := pairAs(t, extConfig(), cb, 0, 1, func(pi *PeerInfo) { pi.Extensions = true })
	done := make(chan error, 2)
	onLoop(t, a.loop, func() {
		a.ch.Send(&SendReq{Seq: 1, Name: "big", Msg: make([]byte, 6000), Done: func(err error) { done <- err }})
		a.ch.Send(&SendReq{Seq: 2, Name: "small", Msg: []byte("m"), Done: func(err error) { done <- err }})
	})
	require.NoError(t, wait(t, done, "fragmented send"), "the SENDs completed: the peer's NIC took them")
	require.NoError(t, wait(t, done, "small send"))
	wait(t, b.rec.all, "the small notify")
	var sb ChannelStats
	var out string
	onLoop(t, b.loop, func() { sb, out = b.ch.Stats(), log.String() })
	require.Equal(t, uint64(2), sb.DroppedExtension, "both fragments counted")
	require.Equal(t, uint64(1), sb.Delivered)
	require.Equal(t, sb.FramesReceived, sb.Delivered+sb.Dropped(), "every frame delivered or counted as dropped")
	require.Equal(t, 2, strings.Count(out, `"level":"warn"`), out)
	require.Contains(t, out, `"reason":"extension-not-negotiated"`)
	require.Contains(t, out, "frame dropped")
	b.rec.mu.Lock()
	require.Equal(t, "small", b.rec.got[0].Name)
	b.rec.mu.Unlock()
}

// TestChannelByeCrossingDelivered: b streams notifies at a while a says goodbye. Every
// notify whose SEND completed at b is delivered at a: a's channel drains its QP (ERR,
// then the CQ reaped) before it closes, whether its SESSION_CLOSE completed or its
// deadline passed (ByeTimeout short, b's RECVs busy). However the race falls, the rule
// holds; closing at once lost such notifies.
func TestChannelByeCrossingDelivered(t *testing.T) {
	const n = 400
	cfg := extConfig()
	cfg.MaxPendingSends = 512
	for _, bye := range []time.Duration{time.Millisecond, time.Second} {
		ca := cfg
		ca.ByeTimeout = bye
		a, b, _ := pair(t, ca, cfg, n, 0)
		done := make(chan error, n)
		onLoop(t, b.loop, func() {
			for i := 1; i <= n; i++ {
				b.ch.Send(&SendReq{Seq: uint64(i), Name: "n", Msg: []byte("m"), Done: func(err error) { done <- err }})
			}
		})
		onLoop(t, a.loop, func() { a.ch.Bye() })
		acked := 0
		for i := 0; i < n; i++ {
			if wait(t, done, "send") == nil {
				acked++
			}
		}
		require.ErrorIs(t, wait(t, a.rec.closed, "a closed"), ErrClosed)
		a.rec.mu.Lock()
		got := len(a.rec.got)
		a.rec.mu.Unlock()
		require.GreaterOrEqual(t, got, acked, "bye timeout %v: %d notifies acknowledged at b, %d delivered at a", bye, acked, got)
	}
}
