package notify

import (
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/oob"
)

// TestMachineRestartTwoNamesKeepOrder: a sends a stream to b by two names of b's port
// ("localhost:b", "127.0.0.1:b", each send to either), and b restarts mid-stream: it
// closes and a new engine with a new session takes its names, at once (a reopen) or after
// a while with nobody there (a kill and restart: a's handshakes meanwhile find nobody and
// back off). b may be sending to a too. a keeps sending throughout. The new b must deliver
// a's notifies in a's send order, whichever name each went to and whichever path it took
// (refused by the new engine and sent again in the new pair, waiting on the old pair, or
// waiting on a name whose handshakes failed); nothing is delivered twice; what a saw
// acknowledged is delivered; a last batch after the restart is delivered in full.
//
// Before, the name that reached the new engine first drew the new pair's first seqs for
// its own sends while the other name's older ones still waited (behind their stragglers to
// the old pair, on the old peer entry, or in a backoff): the soak's "reorder" around a
// restarted engine (twosided soak --faults kill,reopen --seed 2002: calls started before
// the restart delivered to the new incarnation after later ones).
func TestMachineRestartTwoNamesKeepOrder(t *testing.T) {
	for _, channels := range []bool{true, false} {
		for _, down := range []time.Duration{0, 700 * time.Millisecond, 1500 * time.Millisecond, 3 * time.Second} {
			bad, example := 0, ""
			for seed := uint64(0); seed < 150; seed++ {
				if got := restartTwoNames(t, seed, channels, down, nil); got != nil {
					if bad == 0 {
						example = fmt.Sprintf("seed %d: the new b delivered %v", seed, got)
					}
					bad++
				}
			}
			require.Zero(t, bad, "channels %v, down %v: %d of 150 seeds delivered out of order at the new engine; %s", channels, down, bad, example)
		}
	}
}

// restartTwoNames runs one seed of TestMachineRestartTwoNamesKeepOrder; it returns what the
// new b delivered when that was out of order (nil: in order). trace, when set, sees the
// actions of a and of the new b from b's restart on.
func restartTwoNames(t *testing.T, seed uint64, channels bool, down time.Duration, trace func(*simEngine, mAction)) []string {
	names := []string{"localhost:b", "127.0.0.1:b"}
	rs := &restartSim{simNet: newSimNet(t, seed)}
	n := rs.simNet
	cfg := simCfg()
	cfg.channels = channels
	a := rs.add("a", 10, cfg)
	b := rs.add("b", 20, cfg, names...)
	bSends := seed%2 == 1
	var order []reqID
	i := 0
	sendA := func(k int) {
		for ; k > 0; k-- {
			order = append(order, a.send(names[n.rng.IntN(2)], "a"+strconv.Itoa(i), ""))
			i++
			for s := n.rng.IntN(3); s > 0 && rs.step(); s-- {
			}
		}
	}
	// Both names lead to b before it restarts (each sent to once).
	for k, name := range names {
		order = append(order, a.send(name, "first"+strconv.Itoa(k), ""))
	}
	rs.run(n.now.Add(time.Second / 2))
	sendA(10)
	rs.run(n.now.Add(time.Second / 2))
	if bSends {
		for k := 0; k < 5; k++ {
			b.send("a", "b"+strconv.Itoa(k), "")
		}
	}
	sendA(5)
	if trace != nil {
		a.trace = func(x mAction) { trace(a, x) }
	}
	old, fresh := rs.restart("b", 21, cfg)
	if trace != nil {
		fresh.trace = func(x mAction) { trace(fresh, x) }
	}
	if down > 0 {
		delete(rs.engines, "b") // nobody at b's names for a while
		sendA(8)
		rs.run(n.now.Add(down))
		rs.engines["b"] = fresh
	}
	if bSends {
		for k := 0; k < 5; k++ {
			fresh.send("a", "nb"+strconv.Itoa(k), "")
		}
	}
	sendA(20)
	rs.run(n.now.Add(time.Minute))
	_, _, disorder := checkAcrossRestart(t, seed, a, order, []bool{true, false}, old, fresh)
	var last []reqID
	for k := 0; k < 10; k++ {
		last = append(last, a.send(names[k%2], "last"+strconv.Itoa(k), ""))
	}
	rs.run(time.Time{})
	require.Equal(t, 10, checkDelivery(t, a, fresh, last), "seed %d", seed)
	if disorder == 0 {
		return nil
	}
	var got []string
	for _, g := range fresh.got {
		got = append(got, string(g.Msg))
	}
	return got
}

// TestMachineHandshakeForOldEngineKeepsNewPair: a's handshake to b's name went for the
// engine that was there (session 20, whose pair had state), but a new engine (21) answered
// it: fresh, since it had no state for a when the request came. Meanwhile the new engine's
// own handshake made a's entry for it, and a's next notify went in that pair with seq 1.
// The reply says nothing of that pair: it must not be started over. Before, a took the
// reply for "the peer forgot the pair" (the handshake went while a held state: for the old
// engine) and started its seqs over at 1: the new engine, whose window had moved past 1,
// dropped a's next notifies as duplicates, acknowledged (the soak's "lost" at a reopened
// receiver).
func TestMachineHandshakeForOldEngineKeepsNewPair(t *testing.T) {
	now := time.Unix(1000, 0)
	m, kinds := directMachine(simCfg())
	m.send(now, 1, "b", "", now.Add(time.Hour), 0)
	c := kinds(aConnect)
	require.Len(t, c, 1)
	m.connected(now, "b", c[0].ch, hsResult{session: 20, token: 7, peerName: "b", ctrl: true})
	require.Len(t, kinds(aPost), 1)
	m.sendResult(now, 1, nil, false, false)
	kinds(aComplete)

	// b restarts: its channel fails, and a's next send handshakes for the old pair.
	m.chanClosed(now, c[0].ch, errors.New("peer gone"))
	kinds(aClose)
	m.send(now, 2, "b", "", now.Add(time.Hour), 0)
	c = kinds(aConnect)
	require.Len(t, c, 1)
	require.Equal(t, uint64(20), c[0].session, "the handshake goes for the old engine's pair")

	// The new engine's own handshake reaches a first; a's send goes in the new pair.
	rep := m.inbound(now, inboundHS{name: "b", session: 21, token: 9, ctrl: true})
	require.True(t, rep.fresh)
	require.NotZero(t, rep.ch)
	m.inboundUp(now, rep.ch, nil)
	posts := kinds(aPost)
	require.Len(t, posts, 1)
	require.Equal(t, uint64(1), posts[0].seq)
	m.sendResult(now, 2, nil, false, false)
	kinds(aComplete)

	// The reply to a's handshake, made by the new engine before it knew a.
	m.connected(now, "b", c[0].ch, hsResult{session: 21, token: 9, peerName: "b", ctrl: true, fresh: true})
	require.Zero(t, m.stats.PairsRestarted, "the reply to a handshake sent for the old engine restarted the new pair")
	m.send(now, 3, "b", "", now.Add(time.Hour), 0)
	posts = kinds(aPost)
	require.Len(t, posts, 1)
	require.Equal(t, uint64(2), posts[0].seq, "the pair's seqs go on")
}

// TestMachineRefusalDuringHandshakeKeepsPair: a's first handshake to b is on its way when
// b's own handshake makes the pair at a; a sends in it and gets b's notifies. One of a's
// notifies is refused for its token (b checked it before a's handshake reached it), which
// makes a rebind the name. Then the reply to a's first handshake comes, fresh (b made its
// state for a with it). That handshake went before a had any state for the pair: the reply
// does not say b forgot it. Before, the refusal marked the entry forgotten and any fresh
// reply restarted the pair: a's window started over at 1 while b's seqs went on, so b's
// next notifies waited for a gap timeout and were then delivered out of order.
func TestMachineRefusalDuringHandshakeKeepsPair(t *testing.T) {
	now := time.Unix(1000, 0)
	cfg := simCfg()
	cfg.channels = false
	m, kinds := directMachine(cfg)
	m.send(now, 1, "b", "", now.Add(time.Hour), 0)
	require.Len(t, kinds(aConnect), 1)

	rep := m.inbound(now, inboundHS{name: "b", session: 20, token: 7})
	require.True(t, rep.fresh)
	require.Len(t, kinds(aOOB), 1, "the send goes in the pair b's handshake made")
	p := m.peers[peerKey{session: 20}]
	for seq := uint64(1); seq <= 2; seq++ {
		code, err := m.oobArrive(now, oobArrival{session: 20, token: rep.token, seq: seq, n: Notify{Msg: []byte("from b")}})
		require.Empty(t, code, "%v", err)
	}
	require.Len(t, kinds(aDeliver), 2)

	m.sendResult(now, 1, &kindError{kind: ErrAuth, cause: errors.Join(errRebind, errors.New("ts_token"))}, false, false)
	kinds(aOOB)
	m.connected(now, "b", 0, hsResult{session: 20, token: 7, peerName: "b", fresh: true})
	require.Zero(t, m.stats.PairsRestarted, "a reply to a handshake sent before the pair had state restarted it")
	require.Same(t, p, m.peers[peerKey{session: 20}])
	code, err := m.oobArrive(now, oobArrival{session: 20, token: rep.token, seq: 3, n: Notify{Msg: []byte("from b")}})
	require.Empty(t, code, "%v", err)
	require.Len(t, kinds(aDeliver), 1, "b's next notify is delivered at once, in order")
}

// TestMachineGoodbyeKeepsWaitingName: b restarted, and the name now leads to the new engine
// while a send is still on its way to the old one (a straggler: the name's next send waits
// behind it). A goodbye for the name (the old engine's, read late) finds the new pair with
// nothing of its own in flight. Before, it forgot the pair and the name with it: the send
// that waited on the name was dropped from every list and ended only at its deadline, and
// the straggler, refused by the new engine, found no name to be sent again under.
func TestMachineGoodbyeKeepsWaitingName(t *testing.T) {
	now := time.Unix(1000, 0)
	m, kinds, _ := oobPairMachine(t, now)

	rep := m.inbound(now, inboundHS{name: "b", session: 21, token: 9})
	require.True(t, rep.fresh)
	m.send(now, 2, "b", "", now.Add(time.Hour), 0)
	require.Empty(t, kinds(aOOB), "send 2 waits behind the straggler to the old engine")

	m.peerGone(now, "b", 0)
	require.NotNil(t, m.names["b"], "the name that holds send 2 is kept")
	m.sendResult(now, 1, &kindError{kind: ErrAuth, cause: errors.Join(errRebind, errors.New("ts_to"))}, false, false)
	var sent []reqID
	for _, a := range kinds(aOOB) {
		require.Equal(t, uint64(21), a.session)
		sent = append(sent, a.req)
	}
	require.Equal(t, []reqID{1, 2}, sent, "both go to the new engine, in send order")
}

// TestMachineStaleGoodbyeKeepsNewPair: b restarted on its address and its new engine's
// handshake reached a first; the old engine's goodbye, read after it (a loaded reactor
// serving the old connection late), carries the old session and leaves the new pair
// alone. Before goodbyes carried their session, it forgot the new pair: a's next handshake
// to b then lacked the proof b's new engine had issued, and was refused (ErrAuth) until
// that engine forgot a too.
func TestMachineStaleGoodbyeKeepsNewPair(t *testing.T) {
	now := time.Unix(1000, 0)
	m, kinds, _ := oobPairMachine(t, now)
	m.sendResult(now, 1, nil, false, false)
	require.Len(t, kinds(aComplete), 1)

	m.inbound(now, inboundHS{name: "b", session: 21, token: 9})
	m.send(now, 2, "b", "", now.Add(time.Hour), 0)
	sent := kinds(aOOB)
	require.Len(t, sent, 1)
	require.Equal(t, uint64(21), sent[0].session, "the name leads to the new engine")
	m.sendResult(now, 2, nil, false, false)
	require.Len(t, kinds(aComplete), 1)

	m.peerGone(now, "b", 20) // the old engine's goodbye, read late
	m.send(now, 3, "b", "", now.Add(time.Hour), 0)
	acts := m.ready()
	require.Empty(t, filterKind(acts, aConnect), "the new pair was kept: no handshake")
	sent = filterKind(acts, aOOB)
	require.Len(t, sent, 1)
	require.Equal(t, uint64(21), sent[0].session)
	require.Equal(t, uint64(1), m.stats.StaleByes)
	m.sendResult(now, 3, nil, false, false)
	require.Len(t, kinds(aComplete), 1)

	m.peerGone(now, "b", 21) // the new engine's own goodbye: its pair goes
	m.send(now, 4, "b", "", now.Add(time.Hour), 0)
	require.Len(t, kinds(aConnect), 1, "b is handshaken again")
	require.Equal(t, uint64(1), m.stats.StaleByes)
}

// TestMachineUnreachableOldEngineHoldsNewName: b was killed (a's sends to it by
// "127.0.0.1:b" found nobody there) and came back with a new session. a's next send by
// that name still goes to the old pair, where the new engine will refuse it; a later send
// by "localhost:b", a name a had not bound yet, reaches the new engine by its own
// handshake. It must wait for the older one: refused and sent again in the new pair, that
// one goes first. Before, the later send drew the new pair's first seq at once (the soak:
// one name's calls delivered after the other's later ones, at a restarted engine).
func TestMachineUnreachableOldEngineHoldsNewName(t *testing.T) {
	now := time.Unix(1000, 0)
	cfg := simCfg()
	cfg.channels = false
	m, kinds := directMachine(cfg)
	const x, y = "127.0.0.1:b", "localhost:b"
	m.send(now, 1, x, "", now.Add(time.Hour), 0)
	require.Len(t, kinds(aConnect), 1)
	m.connected(now, x, 0, hsResult{session: 20, token: 7, peerName: "b"})
	require.Len(t, kinds(aOOB), 1)
	m.sendResult(now, 1, nil, false, false)
	kinds(aComplete)

	m.send(now, 2, x, "", now.Add(time.Hour), 0) // b is down
	require.Len(t, kinds(aOOB), 1)
	m.sendResult(now, 2, errors.New("connection refused"), false, false)
	kinds(aComplete)

	m.send(now, 3, x, "", now.Add(time.Hour), 0) // b is back, as another engine
	old := kinds(aOOB)
	require.Len(t, old, 1)
	require.Equal(t, uint64(20), old[0].session)
	m.send(now, 4, y, "", now.Add(time.Hour), 0)
	require.Len(t, kinds(aConnect), 1)
	m.connected(now, y, 0, hsResult{session: 21, token: 9, peerName: "b", fresh: true})
	require.Empty(t, kinds(aOOB), "send 4 waits for send 3, still with the old pair")

	m.sendResult(now, 3, &kindError{kind: ErrAuth, cause: errors.Join(errRebind, errors.New("ts_to"))}, false, false)
	require.Len(t, kinds(aConnect), 1)
	m.connected(now, x, 0, hsResult{session: 21, token: 9, peerName: "b"})
	var sent []reqID
	for _, a := range kinds(aOOB) {
		require.Equal(t, uint64(21), a.session)
		sent = append(sent, a.req)
	}
	require.Equal(t, []reqID{3, 4}, sent, "sent in the new pair in send order")
}

// TestMachineClosingPeerNameHolds: a's handshake by "localhost:b" reached b as it closed
// (the OOB node's ErrPeerClosed): the name backs off, and the send a makes to it meanwhile
// waits. A later send by another name of b's port that reaches the engine now there must
// wait for it: the name met an engine, it is not an address nobody serves. Before, it held
// nothing during its backoff and the later send went first (the short soak of make test:
// a reopened receiver delivered one name's calls after the other's later ones).
func TestMachineClosingPeerNameHolds(t *testing.T) {
	now := time.Unix(1000, 0)
	cfg := simCfg()
	cfg.channels = false
	m, kinds := directMachine(cfg)
	const y, z = "localhost:b", "127.0.0.1:b"
	m.send(now, 1, y, "", now.Add(time.Hour), 0)
	require.Len(t, kinds(aConnect), 1)
	closing := &kindError{kind: ErrPeerUnreachable, cause: fmt.Errorf("%w: %w: the peer closed", oob.ErrPeerUnreachable, oob.ErrPeerClosed)}
	m.connected(now, y, 0, hsResult{err: closing})
	require.Len(t, kinds(aComplete), 1)

	m.send(now, 2, y, "", now.Add(time.Hour), 0) // waits for the next handshake (backoff)
	m.send(now, 3, z, "", now.Add(time.Hour), 0)
	require.Len(t, kinds(aConnect), 1)
	m.connected(now, z, 0, hsResult{session: 21, token: 9, peerName: "b", fresh: true})
	require.Empty(t, kinds(aOOB), "send 3 waits for send 2, older, on a name of the same port")

	m.tick(now.Add(time.Second))
	require.Len(t, kinds(aConnect), 1)
	m.connected(now.Add(time.Second), y, 0, hsResult{session: 21, token: 9, peerName: "b"})
	sent := oobReqs(kinds(aOOB))
	require.Equal(t, []reqID{2, 3}, sent)
}

// TestMachineLostConnectionNameHolds: a handshake via one name of a peer that another name
// already reaches fails on a connection made and then lost before the answer (cut, reset):
// someone was there, so the name's next sends, waiting for its next handshake, hold the
// later sends to that peer by the other name (in the engine, the soak's `cut` fault
// delivered them out of order: the name counted as an address nobody serves).
func TestMachineLostConnectionNameHolds(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		hold bool
	}{
		{"connection lost", fmt.Errorf("%w: localhost:b: connection closed by peer", oob.ErrPeerUnreachable), true},
		{"connection reset", fmt.Errorf("%w: localhost:b: read: %w", oob.ErrPeerUnreachable, errors.New("connection reset by peer")), true},
		{"nobody listening", fmt.Errorf("%w: %w: localhost:b: connect: connection refused", oob.ErrPeerUnreachable, oob.ErrNotSent), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Unix(1000, 0)
			cfg := simCfg()
			cfg.channels = false
			m, kinds := directMachine(cfg)
			const y, z = "localhost:b", "127.0.0.1:b"
			reachByZ(t, m, kinds, now)

			m.send(now, 2, y, "", now.Add(time.Hour), 0)
			require.Len(t, kinds(aConnect), 1)
			m.connected(now, y, 0, hsResult{err: &kindError{kind: ErrPeerUnreachable, cause: tc.err}})
			require.Len(t, kinds(aComplete), 1, "the send whose handshake failed fails")

			m.send(now, 3, y, "", now.Add(time.Hour), 0) // waits for y's next handshake (backoff)
			m.send(now, 4, z, "", now.Add(time.Hour), 0)
			early := kinds(aOOB)
			if !tc.hold {
				require.Len(t, early, 1, "a name nobody serves holds nothing")
				return
			}
			require.Empty(t, early, "send 4 waits for send 3, older, on a name of the same port")
			m.tick(now.Add(time.Second))
			require.Len(t, kinds(aConnect), 1)
			m.connected(now.Add(time.Second), y, 0, hsResult{session: 21, token: 9, peerName: "b"})
			sent := oobReqs(kinds(aOOB))
			require.Equal(t, []reqID{3, 4}, sent)
		})
	}
}

// TestMachineLostConnectionTwiceHoldsNothing: a name whose handshakes lose their connection
// twice in a row holds nothing after the second (another host's engine may share the port:
// it is not made to wait out each backoff of an address whose connections keep ending).
// The pair by z is idle here (nothing for a connect timeout, 1 s in simCfg, before the
// second failure); a live one makes the name hold (TestMachineLostConnectionsSiblingLiveHolds).
func TestMachineLostConnectionTwiceHoldsNothing(t *testing.T) {
	now := time.Unix(1000, 0)
	cfg := simCfg()
	cfg.channels = false
	m, kinds := directMachine(cfg)
	const y, z = "localhost:b", "127.0.0.1:b"
	lost := &kindError{kind: ErrPeerUnreachable, cause: fmt.Errorf("%w: localhost:b: connection closed by peer", oob.ErrPeerUnreachable)}
	reachByZ(t, m, kinds, now)

	m.send(now, 2, y, "", now.Add(time.Hour), 0)
	require.Len(t, kinds(aConnect), 1)
	m.connected(now, y, 0, hsResult{err: lost})
	m.send(now, 3, y, "", now.Add(time.Hour), 0)
	m.send(now, 4, z, "", now.Add(time.Hour), 0)
	require.Empty(t, kinds(aOOB), "after the first lost connection, send 4 waits for send 3")

	now = now.Add(time.Second) // the pair by z idle for a connect timeout
	m.tick(now)
	require.Len(t, kinds(aConnect), 1)
	require.False(t, m.liveSibling(now, m.names[y]), "the pair by z counts as idle")
	m.connected(now, y, 0, hsResult{err: lost}) // the second in a row: send 3 fails, 4 goes
	require.Equal(t, []reqID{4}, oobReqs(kinds(aOOB)))
	m.send(now, 5, y, "", now.Add(time.Hour), 0)
	m.send(now, 6, z, "", now.Add(time.Hour), 0)
	require.Equal(t, []reqID{6}, oobReqs(kinds(aOOB)), "a name whose connections keep ending holds nothing")
}

// TestMachineLostConnectionsSiblingLiveHolds: as TestMachineLostConnectionTwiceHoldsNothing,
// but the pair that the other name of the port leads to is alive (it just acknowledged a
// notify): a name whose connections end again and again (the soak's cuts) still holds the
// later sends to that pair, and is tried again within 200 ms instead of waiting out its
// backoff. Before, its sends waited up to 8 s holding nothing while the other name's later
// sends were delivered first (the soak on the soft provider: 7 acknowledged out of order).
func TestMachineLostConnectionsSiblingLiveHolds(t *testing.T) {
	now := time.Unix(1000, 0)
	cfg := simCfg()
	cfg.channels = false
	m, kinds := directMachine(cfg)
	const y, z = "localhost:b", "127.0.0.1:b"
	lost := &kindError{kind: ErrPeerUnreachable, cause: fmt.Errorf("%w: localhost:b: write: broken pipe", oob.ErrPeerUnreachable)}
	reachByZ(t, m, kinds, now)
	next := reqID(10)
	for round := 0; round < 6; round++ {
		m.send(now, next, y, "", now.Add(time.Hour), 0)
		connects := len(kinds(aConnect))
		m.send(now, next+1, z, "", now.Add(time.Hour), 0)
		require.Empty(t, kinds(aOOB), "round %d: the send by z waits for the older one by y", round)
		if round == 0 {
			require.Equal(t, 1, connects)
		} else {
			require.Zero(t, connects, "round %d: y backs off", round)
			now = now.Add(200 * time.Millisecond)
			m.tick(now)
			require.Len(t, kinds(aConnect), 1, "round %d: y is tried again within 200 ms", round)
		}
		m.connected(now, y, 0, hsResult{err: lost})
		acts := m.ready()
		require.Len(t, filterKind(acts, aComplete), 1, "round %d: y's send fails with its handshake", round)
		require.Equal(t, []reqID{next + 1}, oobReqs(acts), "round %d", round)
		m.sendResult(now, next+1, nil, false, false) // the pair by z stays alive
		kinds(aComplete)
		next += 2
	}
}

// oobReqs is the requests of OOB sends among acts, in order.
func oobReqs(acts []mAction) []reqID {
	var out []reqID
	for _, a := range acts {
		if a.kind == aOOB {
			out = append(out, a.req)
		}
	}
	return out
}

// reachByZ makes m's pair with engine b (session 21) by its name "127.0.0.1:b": send 1, its
// handshake, its OOB send acknowledged.
func reachByZ(t *testing.T, m *peerMachine, kinds func(mActKind) []mAction, now time.Time) {
	t.Helper()
	m.send(now, 1, "127.0.0.1:b", "", now.Add(time.Hour), 0)
	require.Len(t, kinds(aConnect), 1)
	m.connected(now, "127.0.0.1:b", 0, hsResult{session: 21, token: 9, peerName: "b", fresh: true})
	require.Len(t, kinds(aOOB), 1)
	m.sendResult(now, 1, nil, false, false)
	kinds(aComplete)
}

// TestMachineHintDuringHandshakeKept: a name whose handshakes found nobody (an engine
// restarting at the address) retries; while that handshake is out, another name of the
// same port reaches the new engine (hinted). The handshake out then fails too, as it went
// before the engine was up: the hint must outlive it, so the name's next sends go at once
// and hold the later sends by the other name. Before, the failure cleared the hint: they
// waited out the name's backoff holding nothing, and the other name's later sends were
// delivered first (the soak on softverbs, after a reopen: 18 acknowledged out of order).
func TestMachineHintDuringHandshakeKept(t *testing.T) {
	now := time.Unix(1000, 0)
	cfg := simCfg()
	cfg.channels = false
	m, kinds := directMachine(cfg)
	const y, z = "localhost:b", "127.0.0.1:b"
	refused := &kindError{kind: ErrPeerUnreachable, cause: fmt.Errorf("%w: %w: localhost:b: connect: connection refused", oob.ErrPeerUnreachable, oob.ErrNotSent)}

	m.send(now, 1, y, "", now.Add(time.Hour), 0)
	require.Len(t, kinds(aConnect), 1)
	m.connected(now, y, 0, hsResult{err: refused}) // nobody there yet
	require.Len(t, kinds(aComplete), 1)

	now = now.Add(time.Second) // past the backoff
	m.send(now, 2, y, "", now.Add(time.Hour), 0)
	require.Len(t, kinds(aConnect), 1, "y's second handshake")
	m.send(now, 3, z, "", now.Add(time.Hour), 0)
	require.Len(t, kinds(aConnect), 1, "z's handshake")
	m.connected(now, z, 0, hsResult{session: 21, token: 9, peerName: "b", fresh: true}) // the new engine answers z
	require.Empty(t, kinds(aOOB), "send 3 waits for send 2's handshake (hinted)")
	m.connected(now, y, 0, hsResult{err: refused}) // y's handshake went before the engine was up
	acts := m.ready()
	require.Len(t, filterKind(acts, aComplete), 1, "send 2, whose handshake failed, fails")
	require.Equal(t, []reqID{3}, oobReqs(acts))
	m.sendResult(now, 3, nil, false, false)
	kinds(aComplete)

	m.send(now, 4, y, "", now.Add(time.Hour), 0)
	require.Len(t, kinds(aConnect), 1, "an engine answered on y's port: y's next handshake goes at once")
	m.send(now, 5, z, "", now.Add(time.Hour), 0)
	require.Empty(t, kinds(aOOB), "send 5 waits for send 4, older, on a name of the same port")
	m.connected(now, y, 0, hsResult{session: 21, token: 9, peerName: "b"})
	require.Equal(t, []reqID{4, 5}, oobReqs(kinds(aOOB)))
}
