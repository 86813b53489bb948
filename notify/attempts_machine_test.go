package notify

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/oob"
)

// A send whose post on its channel ended in a completion error (it may have landed) and
// whose OOB fallback was then refused (nothing written) ends "unknown", and its message
// names the attempt that may have landed and why the last one failed.
func TestMachineUnknownOutcomeNamesTheAttempt(t *testing.T) {
	var seed uint64 = 1
	m := newPeerMachine(10, simCfg(), func() uint64 { seed++; return seed })
	now := time.Unix(1000, 0)
	find := func(kind mActKind) mAction {
		t.Helper()
		for _, a := range m.ready() {
			if a.kind == kind {
				return a
			}
		}
		t.Fatalf("no action %d", kind)
		return mAction{}
	}
	m.send(now, 1, "10.0.0.2:12001", "", now.Add(time.Hour), 5)
	c := find(aConnect)
	require.NotZero(t, c.ch)
	m.connected(now, "10.0.0.2:12001", c.ch, hsResult{session: 20, token: 0xb1, ctrl: true, peerName: "10.0.0.2:12001"})
	p := find(aPost)
	require.EqualValues(t, 1, p.req)
	m.sendResult(now, 1, errors.New("completion error: transport retry counter exceeded"), true, false)
	o := find(aOOB)
	require.EqualValues(t, 1, o.req)
	m.chanClosed(now, c.ch, errors.New("the QP went to the error state")) // after its flushed sends
	refused := fmt.Errorf("%w: 10.0.0.2:12001: connect: %w", oob.ErrPeerUnreachable, syscall.ECONNREFUSED)
	m.sendResult(now, 1, oobKind(refused), false, false)
	done := find(aComplete)
	require.ErrorIs(t, done.err, ErrMaybeDelivered)
	require.ErrorIs(t, done.err, ErrPeerUnreachable)
	require.ErrorIs(t, done.err, syscall.ECONNREFUSED)
	require.Equal(t, "notify: peer unreachable: send to 10.0.0.2:12001: attempt 1 over rdma_twosided may have landed "+
		"(completion error: transport retry counter exceeded); attempt 2 over oob failed: oob: peer unreachable: connect: "+
		"connection refused [outcome unknown: the notify may have been delivered]", done.err.Error())
}

// A handshake refused "superseded" (the peer's entry has a channel of a later epoch) or for
// a channel limit may still say the peer's state for the pair is fresh: its entry was made
// for us anew, or by a third party claiming our session, and kept no state. The reply's
// token is the one we send under next, so the pair starts over then, as for an accepting
// fresh reply (the third case); kept, our seqs would go on past a window that expects 1
// and wait there for the gap timeout.
func TestMachineFreshRefusalRestartsPair(t *testing.T) {
	for _, refuse := range []string{refuseSuperseded, refuseLimit, ""} {
		t.Run(fmt.Sprintf("refuse=%q", refuse), func(t *testing.T) {
			var seed uint64 = 1
			m := newPeerMachine(10, simCfg(), func() uint64 { seed++; return seed })
			now := time.Unix(1000, 0)
			acts := func(kind mActKind) []mAction {
				var out []mAction
				for _, a := range m.ready() {
					if a.kind == kind {
						out = append(out, a)
					}
				}
				return out
			}
			m.send(now, 1, "b", "", now.Add(time.Hour), 5)
			c := acts(aConnect)
			require.Len(t, c, 1)
			m.connected(now, "b", c[0].ch, hsResult{session: 20, token: 0xb1, ctrl: true, peerName: "b"})
			require.Len(t, acts(aPost), 1)
			m.sendResult(now, 1, nil, true, false)
			m.chanClosed(now, c[0].ch, errors.New("the QP went to the error state"))
			m.ready()
			m.send(now, 2, "b", "", now.Add(time.Hour), 5)
			c = acts(aConnect)
			require.Len(t, c, 1)
			require.EqualValues(t, 0xb1, c[0].proof)
			m.connected(now, "b", c[0].ch, hsResult{session: 20, token: 0xb2, refuse: refuse, ctrl: true, peerName: "b", fresh: true})
			require.EqualValues(t, 1, m.stats.PairsRestarted, "the peer's state starts at 1: so does ours")
			p := m.peers[peerKey{session: 20}]
			require.NotNil(t, p)
			require.EqualValues(t, 0xb2, p.tokenOut)
		})
	}
}
