package tests

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/notify"
)

// TestKillStalledReceiverAndRestart: a receiver whose full queue stopped credit is killed
// -9 while the sender's async sends wait for that credit, so no SEND is on the wire and no
// completion can fail; it is restarted on the same address at once. The sender must find
// the dead peer by something that needs no credit (its OOB address answers with another
// engine, or not at all), not by the keepalive's no-credit rule (15 s and more at the
// defaults): the stalled sends end, each delivered to the restarted engine or failed as the
// contract says, and the next notify reaches the restarted receiver. The time from the kill
// to that notify's acknowledgement is logged.
//
// The sender names the receiver by its address, or by a host name ("localhost:P"): the
// probe goes to a literal address of the peer whatever name it was sent to by.
func TestKillStalledReceiverAndRestart(t *testing.T) {
	t.Run("address", func(t *testing.T) { killStalledReceiverAndRestart(t, false) })
	t.Run("host name", func(t *testing.T) { killStalledReceiverAndRestart(t, true) })
}

func killStalledReceiverAndRestart(t *testing.T, hostName bool) {
	const tr = notify.TransportRDMATwoSided
	addr := freeAddr(t)
	to := addr
	if hostName {
		to = "localhost" + addr[strings.LastIndex(addr, ":"):]
	}
	first := startPeerProc(t, tr, peerAddrEnv+"="+addr, peerModeEnv+"=hold", peerQueueEnv+"=1")
	a := newEngine(t, tr) // the defaults: keepalive every 5 s, OOB fallback on
	ctx := ctxFor(t, 90*time.Second)

	// Keep 32 async sends outstanding until they stop ending: the receiver's queue is full,
	// its RECVs hold what its NIC took, and no credit comes back.
	const window = 32
	results := make(chan error, 4096)
	var done, lastEnd atomic.Int64 // lastEnd: when the latest send ended, UnixNano
	posted := 0
	stalled := func() bool {
		for _, p := range a.Stats().Peers {
			if (p.Peer == addr || p.Peer == to) && p.Channel != nil { // named as it advertised itself
				c := p.Channel
				// Only the credit kept for credit frames is left, and sends still wait.
				return p.State == "up" && c.CreditAvail <= 1 && c.InFlight == 0 && done.Load() < int64(posted)
			}
		}
		return false
	}
	require.True(t, waitUntil(30*time.Second, func() bool {
		for posted-int(done.Load()) < window && posted < cap(results) {
			require.NoError(t, a.SendNotifyAsync(to, notify.Notify{Name: "stall", Msg: []byte(fmt.Sprint("stall", posted))},
				func(err error) { lastEnd.Store(time.Now().UnixNano()); done.Add(1); results <- err }))
			posted++
		}
		return stalled()
	}), "the sends did not stall on credit: %+v", a.Stats().Peers)
	t.Logf("%d sends stalled on credit, %d posted", posted-int(done.Load()), posted)

	first.kill()
	killed := time.Now()
	second := startPeerProc(t, tr, peerAddrEnv+"="+addr, peerModeEnv+"=record")
	restarted := time.Since(killed)

	// Send until the first notify is acknowledged: sends that met the old pair's end may
	// fail (ErrAuth: the engine at the address restarted); the first acknowledged one must
	// reach the restarted engine. The overall deadline is a hang guard only.
	var next string
	for i := 0; next == ""; i++ {
		require.NoError(t, ctx.Err(), "no notify reached the restarted receiver")
		msg := fmt.Sprint("next", i)
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := a.SendNotify(sctx, to, notify.Notify{Name: "next", Msg: []byte(msg)})
		cancel()
		if err == nil {
			next = msg
		} else {
			t.Logf("%s: %v", msg, err)
		}
	}
	took := time.Since(killed)

	// Every stalled send has ended: delivered (to the restarted engine, sent again after the
	// old pair ended) or failed as a send whose peer died.
	var ok, dead int
	for range posted {
		var err error
		select {
		case err = <-results:
		case <-ctx.Done():
			t.Fatalf("%d of %d sends never ended", posted-ok-dead, posted)
		}
		switch {
		case err == nil:
			ok++
		case errors.Is(err, notify.ErrPeerDead), errors.Is(err, notify.ErrPeerUnreachable), errors.Is(err, notify.ErrAuth):
			dead++
		default:
			t.Fatalf("a stalled send ended with %v, want success, ErrPeerDead, ErrPeerUnreachable or ErrAuth", err)
		}
	}
	second.stop()
	got := second.received()
	require.Contains(t, got, next, "the restarted receiver did not get the next notify")

	st := a.Stats()
	t.Logf("after the kill: the stalled sends ended at %v, the restarted receiver listened at %v, first ack at %v (%d sends: %d delivered, %d failed; dead by probe %d, by the no-credit rule %d)",
		time.Unix(0, lastEnd.Load()).Sub(killed).Round(time.Millisecond), restarted.Round(time.Millisecond), took.Round(time.Millisecond),
		posted, ok, dead, st.DeadByProbe, st.DeadNoCredit)
	require.Zero(t, st.DeadNoCredit, "the dead receiver was found only by the keepalive's no-credit rule")
}
