package ctrlchannel

import (
	"fmt"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/ibv/soft"
	"github.com/twosided/twosided/reactor"
)

// Each channel draws a random 24-bit initial PSN, advertises it (ts_psn) and sends from it;
// the peer receives from it. Before, every channel started at PSN 0, so a stale packet of
// an earlier QP with a reused number could be taken.
func TestChannelRandomPSN(t *testing.T) {
	a, b, _ := pair(t, extConfig(), extConfig(), 0, 1)
	var la, lb LocalInfo
	var qa, qb ibv.QPAttr
	onLoop(t, a.loop, func() { la = a.ch.Local(); qa, _, _, _ = a.ch.QPAttr() })
	onLoop(t, b.loop, func() { lb = b.ch.Local(); qb, _, _, _ = b.ch.QPAttr() })
	require.Equal(t, la.PSN, qa.SqPSN, "a sends from the PSN it advertised")
	require.Equal(t, lb.PSN, qa.RqPSN, "a receives from the PSN b advertised")
	require.Equal(t, lb.PSN, qb.SqPSN)
	require.Equal(t, la.PSN, qb.RqPSN)
	snd := startSender(t, a, 1, 1, "psn", []byte("x"))
	wait(t, snd.done, "send")
	require.NoError(t, snd.err)
	wait(t, b.rec.all, "delivery")

	// Drawn per channel: eight channels do not all share one PSN, and PSNs are 24 bits.
	p := soft.New(soft.WithDevices(1))
	psns := map[uint32]bool{}
	for i := 0; i < 8; i++ {
		s := newSide(t, p, "soft0", extConfig(), 0)
		onLoop(t, s.loop, func() { psns[s.ch.Local().PSN] = true })
	}
	require.Greater(t, len(psns), 1, "every channel started at the same PSN: %v", psns)
	for psn := range psns {
		require.LessOrEqual(t, psn, uint32(1<<24-1))
	}
}

// Towards a Mooncake peer (no ts_session, no ts_psn) the channel sends from PSN 0 and
// receives from 0, as Mooncake's QPs do.
func TestChannelMooncakePeerPSNZero(t *testing.T) {
	p := soft.New(soft.WithDevices(2))
	a := newSide(t, p, "soft0", extConfig(), 0)
	b := newSide(t, p, "soft1", Config{Timeout: 10}, 0)
	var lb LocalInfo
	onLoop(t, b.loop, func() { lb = b.ch.Local() })
	pi := peerInfo(lb)
	pi.PSN, pi.Legacy = 0, true
	var err error
	var qa ibv.QPAttr
	onLoop(t, a.loop, func() {
		if err = a.ch.Connect(pi, 100, 0, 1); err == nil {
			qa, _, _, err = a.ch.QPAttr()
		}
	})
	require.NoError(t, err)
	require.Zero(t, qa.SqPSN)
	require.Zero(t, qa.RqPSN)
}

// noResetQueryPD makes QPs whose ibv_query_qp fails in RESET, as some drivers' does.
type noResetQueryPD struct{ ibv.PD }

type noResetQueryQP struct{ ibv.QP }

func (p noResetQueryPD) CreateQP(a ibv.QPInitAttr) (ibv.QP, error) {
	q, err := p.PD.CreateQP(a)
	if err != nil {
		return nil, err
	}
	return noResetQueryQP{q}, nil
}

func (q noResetQueryQP) Query() (ibv.QPAttr, ibv.QPCap, error) {
	if q.State() == ibv.QPSReset {
		return ibv.QPAttr{}, ibv.QPCap{}, fmt.Errorf("query qp in RESET: %w", ibv.ErrInvalid)
	}
	return q.QP.Query()
}

// A driver that refuses ibv_query_qp on a RESET QP does not turn inline sends off: the
// channel takes the caps create_qp granted. Before, it queried the new QP (in RESET) and,
// refused, silently sent nothing inline.
func TestChannelInlineWithoutResetQuery(t *testing.T) {
	p := soft.New(soft.WithDevices(1))
	ctx, err := p.Open("soft0")
	require.NoError(t, err)
	defer func() { require.NoError(t, ctx.Close()) }()
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	defer func() { require.NoError(t, pd.Dealloc()) }()
	l, err := reactor.New(reactor.WithLogger(zerolog.Nop()))
	require.NoError(t, err)
	defer func() { require.NoError(t, l.Stop(t.Context())) }()
	var ch *Channel
	var inline int
	var caps ibv.QPCap
	onLoop(t, l, func() {
		ch, err = NewChannel(l, ctx, noResetQueryPD{pd}, Config{MaxInline: 128}, newRecorder(0))
		if err == nil {
			_, caps, inline, err = ch.QPAttr()
		}
	})
	require.NoError(t, err)
	require.Equal(t, uint32(128), caps.MaxInlineData)
	require.Equal(t, 128, inline, "frames up to the granted max_inline_data are posted inline")
	onLoop(t, l, func() { ch.Close(nil) })
}
