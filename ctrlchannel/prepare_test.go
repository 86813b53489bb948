package ctrlchannel

import (
	"context"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/ibv/soft"
	"github.com/twosided/twosided/reactor"
)

// devSide is a loop and an open soft device, for channels made with Prepare and Adopt.
type devSide struct {
	loop *reactor.Loop
	ctx  ibv.Context
	pd   ibv.PD
	rec  *recorder
	ch   *Channel
}

// newDevSide opens dev; its cleanup closes the channel (if any), stops the loop and
// deallocates the PD, which fails while an MR or a QP is left (the leak check).
func newDevSide(t *testing.T, p *soft.Provider, dev string, want int) *devSide {
	t.Helper()
	l, err := reactor.New(reactor.WithLogger(zerolog.Nop()))
	require.NoError(t, err)
	s := &devSide{loop: l, rec: newRecorder(want)}
	s.ctx, err = p.Open(dev)
	require.NoError(t, err)
	s.pd, err = s.ctx.AllocPD()
	require.NoError(t, err)
	t.Cleanup(func() {
		onLoop(t, l, func() {
			if s.ch != nil {
				s.ch.Close(nil)
			}
		})
		ctx, cancel := context.WithTimeout(context.Background(), waitBound)
		defer cancel()
		require.NoError(t, l.Stop(ctx))
		require.NoError(t, s.pd.Dealloc(), "a QP or an MR was left behind")
		require.NoError(t, s.ctx.Close())
	})
	return s
}

// Prepare and Ready run off the loop (here on the test's goroutine); Adopt hands the channel
// to the loop. A frame the peer sends after our RTR and before Adopt lands in a RECV that
// Ready posted and is delivered by the watch's first cycle.
func TestPrepareReadyAdopt(t *testing.T) {
	prov := soft.New(soft.WithDevices(2))
	a := newDevSide(t, prov, "soft0", 0)
	b := newDevSide(t, prov, "soft1", 2)
	pa, err := Prepare(a.ctx, a.pd, extConfig())
	require.NoError(t, err)
	pb, err := Prepare(b.ctx, b.pd, extConfig())
	require.NoError(t, err)
	require.NoError(t, pb.Ready(peerInfo(pa.Local())))
	require.NoError(t, pa.Ready(peerInfo(pb.Local())))
	require.Error(t, pa.Ready(peerInfo(pb.Local())), "Ready runs once")

	onLoop(t, a.loop, func() { a.ch, err = Adopt(a.loop, pa, a.rec, 100, 200, 1) })
	require.NoError(t, err)
	done := make(chan error, 2)
	onLoop(t, a.loop, func() {
		a.ch.Send(&SendReq{Seq: 1, Name: "early", Done: func(err error) { done <- err }})
	})
	// b is not adopted: nothing reaps its CQ, yet its RECVs are posted, so the SEND lands.
	require.NoError(t, wait(t, done, "the SEND to a channel not yet adopted"))
	require.Zero(t, b.rec.count())

	onLoop(t, b.loop, func() { b.ch, err = Adopt(b.loop, pb, b.rec, 200, 100, 1) })
	require.NoError(t, err)
	onLoop(t, a.loop, func() {
		a.ch.Send(&SendReq{Seq: 2, Name: "late", Done: func(err error) { done <- err }})
	})
	require.NoError(t, wait(t, done, "the SEND to the adopted channel"))
	wait(t, b.rec.all, "both deliveries")
	b.rec.mu.Lock()
	defer b.rec.mu.Unlock()
	require.Equal(t, "early", b.rec.got[0].Name)
	require.Equal(t, "late", b.rec.got[1].Name)
	require.True(t, b.rec.ordered)
}

// A preparation that is abandoned at any step releases everything it holds: the PD
// deallocates at the end (newDevSide's cleanup) only when no QP or MR is left.
func TestPreparedReleaseLeavesNothing(t *testing.T) {
	prov := soft.New(soft.WithDevices(2))
	a := newDevSide(t, prov, "soft0", 0)
	b := newDevSide(t, prov, "soft1", 0)
	peer, err := Prepare(b.ctx, b.pd, extConfig())
	require.NoError(t, err)
	defer peer.Release()
	pi := peerInfo(peer.Local())

	t.Run("new", func(t *testing.T) {
		p, err := Prepare(a.ctx, a.pd, extConfig())
		require.NoError(t, err)
		p.Release()
		p.Release() // a second call does nothing
	})
	t.Run("ready", func(t *testing.T) {
		p, err := Prepare(a.ctx, a.pd, extConfig())
		require.NoError(t, err)
		require.NoError(t, p.Ready(pi))
		p.Release()
	})
	t.Run("ready failed", func(t *testing.T) {
		p, err := Prepare(a.ctx, a.pd, extConfig())
		require.NoError(t, err)
		bad := pi
		bad.QPN = 0
		require.ErrorIs(t, p.Ready(bad), ErrConfig)
		p.Release()
	})
	t.Run("adopt off the loop", func(t *testing.T) {
		p, err := Prepare(a.ctx, a.pd, extConfig())
		require.NoError(t, err)
		require.NoError(t, p.Ready(pi))
		_, err = Adopt(a.loop, p, a.rec, 1, 2, 1)
		require.ErrorIs(t, err, reactor.ErrNotInLoop)
	})
	t.Run("adopt before ready", func(t *testing.T) {
		p, err := Prepare(a.ctx, a.pd, extConfig())
		require.NoError(t, err)
		onLoop(t, a.loop, func() { _, err = Adopt(a.loop, p, a.rec, 1, 2, 1) })
		require.ErrorIs(t, err, ErrConfig)
		p.Release() // spent by Adopt: nothing happens
	})
	t.Run("prepare failed", func(t *testing.T) {
		_, err := Prepare(a.ctx, a.pd, Config{GIDIndex: 200})
		require.ErrorIs(t, err, ibv.ErrGIDIndex)
	})
	t.Run("adopted and closed", func(t *testing.T) {
		p, err := Prepare(a.ctx, a.pd, extConfig())
		require.NoError(t, err)
		require.NoError(t, p.Ready(pi))
		var ch *Channel
		onLoop(t, a.loop, func() { ch, err = Adopt(a.loop, p, a.rec, 1, 2, 1) })
		require.NoError(t, err)
		p.Release() // the channel owns it now: nothing happens
		onLoop(t, a.loop, func() { ch.Close(nil) })
		wait(t, a.rec.closed, "OnClosed")
	})
}
