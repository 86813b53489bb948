package reactor

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/ibv/soft"
)

// hookCQ puts a provider hook into a soft CQ's ReqNotify, before the real arm. Its channel
// maps the soft CQ that GetEvent returns back to the wrapper the loop watches.
type hookCQ struct {
	ibv.CQ
	ch        *hookChannel
	beforeArm func() // loop goroutine only
}

func (h *hookCQ) ReqNotify(solicitedOnly bool) error {
	if f := h.beforeArm; f != nil {
		f()
	}
	return h.CQ.ReqNotify(solicitedOnly)
}

func (h *hookCQ) Channel() ibv.CompChannel { return h.ch }

type hookChannel struct {
	ibv.CompChannel
	inner ibv.CQ
	outer *hookCQ
}

func (c *hookChannel) GetEvent() (ibv.CQ, error) {
	cq, err := c.CompChannel.GetEvent()
	if err == nil && cq == c.inner {
		return c.outer, nil
	}
	return cq, err
}

func newSoftCQ(t *testing.T) (ibv.CQ, *hookCQ) {
	t.Helper()
	ctx, err := soft.New(soft.WithDevices(1)).Open("soft0")
	require.NoError(t, err)
	ch, err := ctx.CreateCompChannel()
	require.NoError(t, err)
	cq, err := ctx.CreateCQ(64, ch)
	require.NoError(t, err)
	t.Cleanup(func() {
		// Destroy refuses a CQ with unacknowledged events: this checks the loop's acks.
		require.NoError(t, cq.Destroy())
		require.NoError(t, ch.Close())
		require.NoError(t, ctx.Close())
	})
	h := &hookCQ{CQ: cq}
	h.ch = &hookChannel{CompChannel: ch, inner: cq, outer: h}
	return cq, h
}

// TestCQNoLostWakeupBetweenPollAndArm on the soft provider: soft.InjectWC lands a CQE from
// inside ReqNotify, before the arm. Fails with the poll after arm removed (checked).
func TestSoftCQNoLostWakeupBetweenPollAndArm(t *testing.T) {
	l := newLoop(t)
	cq, h := newSoftCQ(t)
	rec := &recorder{handled: make(chan uint64, 16)}
	w := watch(t, l, h, rec)

	var once sync.Once
	var injectErr error
	onLoop(t, l, func() {
		h.beforeArm = func() { once.Do(func() { injectErr = soft.InjectWC(cq, ibv.WC{WRID: 2}) }) }
	})
	require.NoError(t, soft.InjectWC(cq, ibv.WC{WRID: 1})) // armed: fires the channel
	require.Equal(t, uint64(1), recv(t, rec.handled))
	var got []uint64
	onLoop(t, l, func() { got = rec.got() })
	require.NoError(t, injectErr)
	require.Equal(t, []uint64{1, 2}, got, "lost wake-up: the CQE that landed between the last poll and the arm was not handled")
	require.Equal(t, uint64(2), recv(t, rec.handled))

	// Armed again: the next CQE wakes the sleeping loop.
	require.NoError(t, soft.InjectWC(cq, ibv.WC{WRID: 3}))
	require.Equal(t, uint64(3), recv(t, rec.handled))
	require.Equal(t, uint64(2), l.Stats().CQEvents)

	var err error
	onLoop(t, l, func() { err = w.Close() })
	require.NoError(t, err)
}

// After Stop with an event pending on a watched channel, the CQ can be destroyed: the loop
// holds no event it got without acknowledging it (soft's Destroy refuses otherwise).
func TestSoftStopAcksEvents(t *testing.T) {
	l, err := New(quiet)
	require.NoError(t, err)
	cq, h := newSoftCQ(t)
	rec := &recorder{}
	watch(t, l, h, rec)
	var errs [2]error
	onLoop(t, l, func() {
		errs[0] = soft.InjectWC(cq, ibv.WC{WRID: 1}) // event queued, not yet got
		errs[1] = l.Stop(t.Context())
	})
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	recv(t, l.Done())
}
