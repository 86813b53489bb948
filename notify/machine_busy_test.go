package notify

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// busyErr is an OOB "busy" answer as the driver maps it (oobKind).
func busyErr() error {
	return &kindError{kind: ErrBackpressure, cause: errors.Join(errPeerBusy, errors.New("receive queue full"))}
}

// TestMachineBusyPacedByAnswers: n notifies on the wire over OOB to a peer whose queue is
// full, all answered "busy". The tries that follow are at most one per answer or per
// tick, not one per notify: the answered ones wait in seq order, only the head is tried
// while nothing else is on the wire, and each success lets the next ones go, in seq order.
// None fails. Before, every busy notify came back to the machine only at its deadline
// (the driver retried each on a timer of its own, up to 50 ms apart), and a busy answer
// given to the machine failed the send.
func TestMachineBusyPacedByAnswers(t *testing.T) {
	const n = 200
	now := time.Unix(1000, 0)
	cfg := simCfg()
	cfg.channels = false
	m, _, first := oobSendMachine(t, cfg, now)
	seqOf := map[reqID]uint64{1: first.seq}
	ready := func() (sent []mAction, done []mAction) {
		for _, a := range m.ready() {
			switch a.kind {
			case aOOB:
				sent = append(sent, a)
				seqOf[a.req] = a.seq
			case aComplete:
				done = append(done, a)
			}
		}
		return sent, done
	}
	for id := reqID(2); id <= n; id++ {
		m.send(now, id, "b", "", now.Add(time.Minute), 0)
	}
	sent, _ := ready()
	require.Len(t, sent, n-1, "not paced before a busy answer")

	// Every notify answered busy: one try in all (the head, when nothing else is left).
	tries := 0
	for id := reqID(1); id <= n; id++ {
		m.sendResult(now, id, busyErr(), false, false)
		s, done := ready()
		require.Empty(t, done, "a busy answer fails no send")
		tries += len(s)
	}
	require.Equal(t, 1, tries, "%d busy answers: one try, the head", n)
	p := m.peers[peerKey{session: 20}]
	require.Equal(t, 1, p.oobOut)

	// The head answered busy again, and again: one try per wait, the wait doubling to 50 ms.
	head := reqID(1)
	var waits []time.Duration
	for i := 0; i < 12; i++ {
		m.sendResult(now, head, busyErr(), false, false)
		s, done := ready()
		require.Empty(t, done)
		require.Empty(t, s, "a head answered busy twice in a row waits")
		start := now
		for k := 0; ; k++ {
			require.Less(t, k, 100, "the head never went again")
			now = now.Add(time.Millisecond)
			m.tick(now)
			s, _ = ready()
			require.LessOrEqual(t, len(s), 1, "at most one try per tick")
			if len(s) == 1 {
				require.Equal(t, head, s[0].req, "the head, with its seq")
				break
			}
		}
		waits = append(waits, now.Sub(start))
	}
	require.Equal(t, time.Millisecond, waits[0])
	require.Equal(t, 50*time.Millisecond, waits[len(waits)-1])

	// The peer takes the head: the next go in seq order, a few per answer, until all are
	// delivered; no more than n tries for the n-1 left.
	order := []uint64{seqOf[head]}
	onWire := []reqID{head}
	total := 0
	for len(onWire) > 0 {
		id := onWire[0]
		onWire = onWire[1:]
		m.sendResult(now, id, nil, false, false)
		s, done := ready()
		require.Len(t, done, 1)
		require.NoError(t, done[0].err)
		require.LessOrEqual(t, len(s), 2, "at most two tries per answer")
		for _, a := range s {
			order = append(order, a.seq)
			onWire = append(onWire, a.req)
		}
		total += len(s)
	}
	require.Equal(t, n-1, total, "each notify left sent once")
	for i := 1; i < len(order); i++ {
		require.Greater(t, order[i], order[i-1], "sent again in seq order")
	}
	require.Zero(t, p.oobOut)
	require.Empty(t, p.parked)
	require.Zero(t, p.oobCap, "the pacing ends once nothing waits")
	require.Equal(t, uint64(n+12), m.stats.BusyAnswers)
}

// TestMachineBusyNewSendsWaitTheirTurn: while the peer answers busy, a new send draws its
// seq and waits behind the parked ones (no seq overtakes another), and a parked notify
// whose deadline passes fails "not delivered" with ErrBackpressure, its seq fenced.
func TestMachineBusyNewSendsWaitTheirTurn(t *testing.T) {
	now := time.Unix(1000, 0)
	cfg := simCfg()
	cfg.channels = false
	m, kinds, first := oobSendMachine(t, cfg, now)
	m.send(now, 2, "b", "", now.Add(time.Minute), 0)
	second := kinds(aOOB)
	require.Len(t, second, 1)
	m.sendResult(now, 2, busyErr(), false, false) // 1 is still on the wire
	m.send(now, 3, "b", "", now.Add(time.Second), 0)
	require.Empty(t, kinds(aOOB), "waits behind 2")
	m.sendResult(now, 1, nil, false, false)
	s := kinds(aOOB)
	require.NotEmpty(t, s)
	require.Equal(t, second[0].seq, s[0].seq, "2 first, with its seq")
	if len(s) > 1 {
		require.Greater(t, s[1].seq, s[0].seq)
	}
	_ = first

	// 3 still parked (the cap is 1) at its deadline: withdrawn, not delivered, fenced.
	p := m.peers[peerKey{session: 20}]
	if len(p.parked) == 1 {
		now = now.Add(time.Second)
		m.tick(now)
		var done, fences []mAction
		for _, a := range m.ready() {
			switch a.kind {
			case aComplete:
				done = append(done, a)
			case aFence:
				fences = append(fences, a)
			}
		}
		require.Len(t, done, 1)
		require.Equal(t, reqID(3), done[0].req)
		require.ErrorIs(t, done[0].err, ErrBackpressure)
		require.NotErrorIs(t, done[0].err, ErrMaybeDelivered)
		require.Len(t, fences, 1, "its seq is fenced")
		require.Empty(t, p.parked)
	}
}

// TestMachineOOBHold: a receiver whose queue is full holds maxHeldOOB OOB notifies; past
// that it holds one more per known pair that has none held (its token must check), and
// answers the rest busy.
func TestMachineOOBHold(t *testing.T) {
	now := time.Unix(1000, 0)
	m, _ := directMachine(simCfg())
	rep := m.inbound(now, inboundHS{name: "a", session: 30, token: 5})
	require.Empty(t, rep.refuse)
	m.ready()
	p := m.peers[peerKey{session: 30}]
	require.NotNil(t, p)
	tok := p.tokenIn[0]

	hold, pair := m.oobHold(30, tok, 3)
	require.True(t, hold, "under the bound")
	require.Equal(t, p.pair, pair)
	m.oobTaken(30, pair)
	require.Zero(t, p.heldOOB)

	hold, _ = m.oobHold(99, 1, maxHeldOOB)
	require.False(t, hold, "an unknown session past the bound")
	hold, _ = m.oobHold(30, tok+1, maxHeldOOB)
	require.False(t, hold, "a wrong token past the bound")
	hold, pair = m.oobHold(30, tok, maxHeldOOB)
	require.True(t, hold, "the pair's first held one past the bound")
	hold, _ = m.oobHold(30, tok, maxHeldOOB+1)
	require.False(t, hold, "its second")
	m.oobTaken(30, pair)
	hold, _ = m.oobHold(30, tok, maxHeldOOB)
	require.True(t, hold, "taken: it has none held again")
}

func TestMergeRanges(t *testing.T) {
	require.Equal(t, []seqRange{{1, 5}, {8, 1}}, mergeRanges([]seqRange{{4, 2}, {1, 1}, {8, 1}, {2, 2}, {3, 1}}))
	require.Equal(t, []seqRange{{7, 1}}, mergeRanges([]seqRange{{7, 1}}))
}
