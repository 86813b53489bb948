package notify

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// This file adds scenarios to the simulator of machine_test.go: which path a simultaneous
// open took (through the engines' trace hook), stragglers of a replaced channel, and a
// peer that restarts while a handshake to it is in flight.

// chanKey is a channel's rank between two channels of one pair: the higher (epoch,
// initiator session) wins on both sides (peerMachine's doc, wins).
type chanKey struct{ epoch, initiator uint64 }

func (k chanKey) beats(o chanKey) bool {
	if k.epoch != o.epoch {
		return k.epoch > o.epoch
	}
	return k.initiator > o.initiator
}

// pathTrace records, through the trace hook, the handshakes each engine started with a
// channel and the channels it closed as superseded.
type pathTrace struct {
	opened     map[*simEngine]map[chanID]chanKey // initiator's channel id -> its rank
	superseded map[*simEngine]map[chanID]bool
}

func tracePaths(es ...*simEngine) *pathTrace {
	pt := &pathTrace{opened: map[*simEngine]map[chanID]chanKey{}, superseded: map[*simEngine]map[chanID]bool{}}
	for _, e := range es {
		e := e
		pt.opened[e], pt.superseded[e] = map[chanID]chanKey{}, map[chanID]bool{}
		e.trace = func(a mAction) {
			switch a.kind {
			case aConnect:
				if a.ch != 0 {
					pt.opened[e][a.ch] = chanKey{a.epoch, e.m.local}
				}
			case aClose:
				if errors.Is(a.err, errSuperseded) {
					pt.superseded[e][a.ch] = true
				}
			}
		}
	}
	return pt
}

// established lists the channels whose handshake was accepted, so both ends had one:
// the initiator's link has a remote end.
func (pt *pathTrace) established(e *simEngine) map[chanID]chanKey {
	out := map[chanID]chanKey{}
	for id, k := range pt.opened[e] {
		if l := e.links[id]; l != nil && l.remote != nil {
			out[id] = k
		}
	}
	return out
}

// TestMachineSimultaneousOpenPath: a (session 10) and b (session 20) send to each other
// before either knows the other, so both handshakes, each with a channel of epoch 1, are in
// flight at once. Per seed, the trace says which channels came up at both ends, and the
// test asserts which one the pair ended on: the highest (epoch, initiator) among them, the
// same channel at both ends. When both opens came up, that is b's (the tie at epoch 1 is
// broken by the higher initiator session), and a's was closed as superseded. When only one
// came up, the other was refused, and the refusal must agree with the rule: a may refuse
// b's handshake only for its proof (auth: a already heard from b on a's channel, so the
// open race is over), never as superseded; b may refuse a's as superseded or for its
// proof. Every path occurs across the seeds (asserted), and everything acknowledged is
// delivered once and in order whichever ran. Checked at the first quiet point, before
// time passes.
func TestMachineSimultaneousOpenPath(t *testing.T) {
	const N = 30
	paths := map[string]int{}
	for seed := uint64(0); seed < 300; seed++ {
		n := newSimNet(t, seed)
		a := n.add("a", 10, simCfg())
		b := n.add("b", 20, simCfg())
		pt := tracePaths(a, b)
		var ab, ba []reqID
		for i := 0; i < N; i++ {
			ab = append(ab, a.send("b", "a"+strconv.Itoa(i), ""))
			ba = append(ba, b.send("a", "b"+strconv.Itoa(i), ""))
		}
		require.Len(t, pt.opened[a], 1, "seed %d", seed)
		require.Len(t, pt.opened[b], 1, "seed %d", seed)
		var aOpen, bOpen chanID
		for id, k := range pt.opened[a] {
			aOpen = id
			require.Equal(t, chanKey{1, 10}, k, "seed %d: a first handshake", seed)
		}
		for id, k := range pt.opened[b] {
			bOpen = id
			require.Equal(t, chanKey{1, 20}, k, "seed %d: b first handshake", seed)
		}
		// Until quiet, without letting time pass: time would expire an inbound channel its
		// peer has not used yet (an idle pair's traffic may all have gone over OOB while the
		// channels came up), which is not what this test is about.
		for n.step() {
		}

		// The channel both ends use.
		pa, pb := a.m.peers[peerKey{session: 20}], b.m.peers[peerKey{session: 10}]
		require.NotNil(t, pa, "seed %d", seed)
		require.NotNil(t, pb, "seed %d", seed)
		require.NotZero(t, pa.ch, "seed %d", seed)
		require.NotZero(t, pb.ch, "seed %d", seed)
		ca, cb := a.m.chans[pa.ch], b.m.chans[pb.ch]
		require.Equal(t, chanKey{ca.epoch, ca.initiator}, chanKey{cb.epoch, cb.initiator}, "seed %d: the ends rank their channel differently", seed)
		require.Equal(t, pb.ch, a.links[pa.ch].remote.id, "seed %d: the two ends use different channels", seed)
		final := chanKey{ca.epoch, ca.initiator}

		// Which opens came up at both ends, and the winner among them by the rule.
		est := map[chanKey]bool{}
		var best chanKey
		for _, e := range []*simEngine{a, b} {
			for _, k := range pt.established(e) {
				est[k] = true
				if k.beats(best) {
					best = k
				}
			}
		}
		require.NotEmpty(t, est, "seed %d: no channel came up", seed)
		require.Equal(t, best, final, "seed %d: channels up at both ends %v; the pair ended on %v", seed, est, final)

		aUp, bUp := est[chanKey{1, 10}], est[chanKey{1, 20}]
		switch {
		case aUp && bUp:
			// The tie-break ran: b's channel won on both sides, a's was superseded.
			paths["both up: b's (higher session) won"]++
			require.Equal(t, chanKey{1, 20}, final, "seed %d", seed)
			require.True(t, pt.superseded[a][aOpen] || pt.superseded[b][a.links[aOpen].remote.id],
				"seed %d: a's channel lost but was not closed as superseded", seed)
			require.True(t, a.links[aOpen].dead && a.links[aOpen].remote.dead, "seed %d: the losing channel is still open", seed)
			require.False(t, pt.superseded[b][bOpen], "seed %d: b closed its own winning channel", seed)
		case aUp:
			// a refused b's handshake: never as superseded (b's ranks higher), only for its
			// proof (a had already heard from b on a's channel: the open race was over).
			paths["only a's came up (b's refused: auth)"]++
			require.Equal(t, chanKey{1, 10}, final, "seed %d", seed)
			require.Nil(t, b.links[bOpen], "seed %d", seed)
			require.Equal(t, uint64(1), a.m.stats.AuthRefused, "seed %d: b's handshake was refused, not for its proof", seed)
			require.Zero(t, a.m.stats.Superseded, "seed %d: b's (1,20) refused as superseded by a's (1,10)", seed)
		case bUp:
			// b refused a's handshake: superseded (b's channel was up and ranks higher), or
			// for its proof.
			require.Equal(t, chanKey{1, 20}, final, "seed %d", seed)
			require.Nil(t, a.links[aOpen], "seed %d", seed)
			switch {
			case b.m.stats.Superseded == 1 && b.m.stats.AuthRefused == 0:
				paths["only b's came up (a's refused: superseded)"]++
			case b.m.stats.AuthRefused == 1 && b.m.stats.Superseded == 0:
				paths["only b's came up (a's refused: auth)"]++
			default:
				t.Fatalf("seed %d: a's handshake failed, neither superseded nor auth: %+v", seed, b.m.stats)
			}
		default:
			paths["a later channel"]++
		}
		if final.epoch > 1 {
			paths["ended on a reconnect"]++
		}
		require.Equal(t, 1, a.m.channels, "seed %d", seed)
		require.Equal(t, 1, b.m.channels, "seed %d", seed)

		n.run()
		require.Equal(t, N, checkDelivery(t, a, b, ab), "seed %d", seed)
		require.Equal(t, N, checkDelivery(t, b, a, ba), "seed %d", seed)
	}
	t.Logf("paths over 300 seeds: %v", paths)
	for _, p := range []string{"both up: b's (higher session) won", "only a's came up (b's refused: auth)",
		"only b's came up (a's refused: superseded)", "only b's came up (a's refused: auth)"} {
		require.NotZero(t, paths[p], "no schedule took the path %q", p)
	}
}

// machineDeliveries performs nothing: it returns what m handed to the application since
// the last call, in order (the other actions are the driver's and are dropped).
func machineDeliveries(m *peerMachine) []string {
	var out []string
	for {
		acts := m.ready()
		if len(acts) == 0 {
			return out
		}
		for _, a := range acts {
			if a.kind == aDeliver {
				out = append(out, string(a.n.Msg))
			}
		}
	}
}

// TestMachineStragglers: what an old channel, an old epoch or an OOB retry delivers late,
// after the pair moved to a new channel, is dropped or delivered exactly once, and never
// out of the per-peer seq order.
//
// The receiving machine b is driven directly, so the late arrivals the simulator cannot
// make (it closes a replaced channel's frames at once) come in any order RC allows: a's
// seqs 1..k went on channel C1; C2 (epoch 2) replaced C1; the C1 frames that were not
// reaped before the replacement arrive afterwards (the drain), in their order but
// interleaved with C2's frames; the C1 sends a did not see acknowledged are reposted on
// C2 with their seqs (so some seqs arrive on both), interleaved with new seqs k+1..N;
// some seqs also come over OOB (a fallback that raced the repost); a stale handshake of
// epoch 1 comes in the middle; and after C1 is closed, copies of old frames still come.
func TestMachineStragglers(t *testing.T) {
	t.Run("old channel frames, reposts and OOB copies, seeded", func(t *testing.T) {
		const N = 40
		dupTotal := 0
		for seed := uint64(0); seed < 500; seed++ {
			rng := rand.New(rand.NewPCG(seed, 17))
			tok := uint64(0)
			b := newPeerMachine(20, simCfg(), func() uint64 { tok++; return 0xb000 + tok })
			now := time.Unix(1000, 0)
			msg := func(seq uint64) Notify { return Notify{Msg: []byte("s" + strconv.FormatUint(seq, 10))} }
			var got []string
			arrivals := 0
			// check: what was delivered so far is s1, s2, ... with no gap, no repeat.
			check := func(what string) {
				t.Helper()
				got = append(got, machineDeliveries(b)...)
				for i, g := range got {
					require.Equal(t, "s"+strconv.Itoa(i+1), g, "seed %d after %s: delivered %v", seed, what, got)
				}
			}
			onChan := func(ch chanID, seq uint64, what string) {
				arrivals++
				b.chanArrival(now, ch, seq, "", msg(seq))
				check(fmt.Sprintf("%s seq %d", what, seq))
			}

			rep1 := b.inbound(now, inboundHS{name: "a", session: 10, token: 0xa1, epoch: 1, ctrl: true})
			require.Empty(t, rep1.refuse, "seed %d", seed)
			b.inboundUp(now, rep1.ch, nil)
			c1, proof := rep1.ch, rep1.token

			k := uint64(5 + rng.IntN(30))     // seqs 1..k went on C1
			j := uint64(rng.IntN(int(k) + 1)) // C1 frames 1..j arrive at b; j+1..k are lost with C1
			j0 := uint64(rng.IntN(int(j) + 1))
			for s := uint64(1); s <= j0; s++ { // reaped before the replacement
				onChan(c1, s, "C1 before the replacement")
			}

			rep2 := b.inbound(now, inboundHS{name: "a", session: 10, token: 0xa1, proof: proof, epoch: 2, ctrl: true})
			require.Empty(t, rep2.refuse, "seed %d", seed)
			b.inboundUp(now, rep2.ch, nil)
			c2 := rep2.ch
			p := b.peers[peerKey{session: 10}]
			require.Equal(t, c2, p.ch, "seed %d: C2 replaced C1", seed)
			check("the replacement")

			// C2's stream: a's unacknowledged C1 sends (every lost one, some that arrived)
			// reposted, interleaved with the new seqs, each list in its own order.
			var repost []uint64
			for s := uint64(1); s <= k; s++ {
				if s > j || (s > j0 && rng.IntN(3) == 0) {
					repost = append(repost, s)
				}
			}
			var c2q []uint64
			next := k + 1
			for len(repost) > 0 || next <= N {
				if len(repost) > 0 && (next > N || rng.IntN(2) == 0) {
					c2q, repost = append(c2q, repost[0]), repost[1:]
				} else {
					c2q = append(c2q, next)
					next++
				}
			}
			c1q := []uint64{}
			for s := j0 + 1; s <= j; s++ {
				c1q = append(c1q, s)
			}
			var oob []uint64
			for s := uint64(1); s <= N; s++ {
				if rng.IntN(6) == 0 {
					oob = append(oob, s)
				}
			}
			rng.Shuffle(len(oob), func(x, y int) { oob[x], oob[y] = oob[y], oob[x] })
			staleAt := rng.IntN(len(c1q) + len(c2q) + len(oob) + 1)

			for step := 0; len(c1q)+len(c2q)+len(oob) > 0; step++ {
				if step == staleAt {
					// A handshake of the old epoch, late: refused, C2 stays.
					rep := b.inbound(now, inboundHS{name: "a", session: 10, token: 0xa1, proof: proof, epoch: 1, ctrl: true})
					require.Equal(t, refuseSuperseded, rep.refuse, "seed %d: a stale handshake", seed)
					require.Equal(t, c2, p.ch, "seed %d: a stale handshake replaced the channel", seed)
				}
				switch r := rng.IntN(3); {
				case r == 0 && len(c1q) > 0:
					onChan(c1, c1q[0], "a C1 straggler")
					c1q = c1q[1:]
				case r == 1 && len(c2q) > 0:
					onChan(c2, c2q[0], "C2")
					c2q = c2q[1:]
				case len(oob) > 0:
					arrivals++
					s := oob[0]
					oob = oob[1:]
					code, err := b.oobArrive(now, oobArrival{session: 10, token: proof, to: 20, seq: s, from: "a", n: msg(s)})
					require.Empty(t, code, "seed %d: OOB copy of seq %d refused: %v", seed, s, err)
					check(fmt.Sprintf("an OOB copy of seq %d", s))
				}
				now = now.Add(time.Microsecond)
			}
			require.Len(t, got, N, "seed %d: delivered %v", seed, got)
			require.Zero(t, p.win.held, "seed %d", seed)
			require.Equal(t, c2, p.ch, "seed %d", seed)

			// C1 is closed now (its drain is over); copies of its frames that still come are
			// dropped, and so are late OOB copies of delivered seqs.
			b.chanClosed(now, c1, errSuperseded)
			for s := uint64(1); s <= k; s++ {
				onChan(c1, s, "a C1 frame after its close")
			}
			arrivals++
			code, err := b.oobArrive(now, oobArrival{session: 10, token: proof, to: 20, seq: 1, from: "a", n: msg(1)})
			require.Empty(t, code, "seed %d: %v", seed, err)
			check("a late OOB copy")
			require.Len(t, got, N, "seed %d", seed)
			require.Equal(t, uint64(N), p.received, "seed %d", seed)
			require.Equal(t, uint64(N), p.win.stats.Delivered, "seed %d", seed)
			// Every arrival but the frames of the closed C1 (ignored) and the N that
			// delivered was counted a duplicate.
			require.Equal(t, uint64(arrivals-int(k)-N), p.dups, "seed %d", seed)
			dupTotal += int(p.dups)
		}
		require.NotZero(t, dupTotal)
	})

	t.Run("a handshake reply of an older epoch", func(t *testing.T) {
		tok := uint64(0)
		a := newPeerMachine(10, simCfg(), func() uint64 { tok++; return 0xa000 + tok })
		now := time.Unix(1000, 0)
		a.send(now, 1, "b", "", now.Add(time.Hour), 0)
		var x chanID // a's first handshake
		for _, act := range a.ready() {
			if act.kind == aConnect {
				x = act.ch
				require.Equal(t, uint64(1), act.epoch)
			}
		}
		require.NotZero(t, x)
		a.connected(now, "b", x, hsResult{session: 20, token: 0xb1, ctrl: true, peerName: "b"})
		a.sendResult(now, 1, nil, false, false) // s1 went on X
		a.ready()
		p := a.peers[peerKey{session: 20}]
		require.Equal(t, x, p.ch)

		// a reconnects (epoch 2, channel Y) ...
		a.connectName(now, a.names["b"], p)
		var y chanID
		for _, act := range a.ready() {
			if act.kind == aConnect {
				y = act.ch
				require.Equal(t, uint64(2), act.epoch)
			}
		}
		require.NotZero(t, y)
		// ... while b's own handshake of epoch 3 arrives and wins: Z replaces X.
		rep := a.inbound(now, inboundHS{name: "b", session: 20, token: 0xb1, proof: p.tokenIn[0], epoch: 3, ctrl: true})
		require.NotEqual(t, refuseAuth, rep.refuse) // accepted (without a channel: this engine opens none)
		a.inboundUp(now, rep.ch, nil)
		z := rep.ch
		require.Equal(t, z, p.ch)
		a.ready()
		a.send(now, 2, "b", "", now.Add(time.Hour), 0)
		var posted []mAction
		for _, act := range a.ready() {
			if act.kind == aPost {
				posted = append(posted, act)
			}
		}
		require.Len(t, posted, 1)
		require.Equal(t, z, posted[0].ch)
		require.Equal(t, uint64(2), posted[0].seq)

		// The reply to a's epoch-2 handshake comes late: Y loses to Z, and is closed.
		a.connected(now, "b", y, hsResult{session: 20, token: 0xb1, ctrl: true, peerName: "b", epoch: 3})
		var closedY bool
		for _, act := range a.ready() {
			switch act.kind {
			case aClose:
				require.Equal(t, y, act.ch, "only the straggler's channel is closed")
				require.ErrorIs(t, act.err, errSuperseded)
				closedY = true
			case aPost:
				t.Fatalf("a send was posted again: %+v", act)
			}
		}
		require.True(t, closedY)
		require.Equal(t, z, p.ch, "a straggling reply replaced the winning channel")
		a.send(now, 3, "b", "", now.Add(time.Hour), 0)
		for _, act := range a.ready() {
			if act.kind == aPost {
				require.Equal(t, z, act.ch)
				require.Equal(t, uint64(3), act.seq, "seqs continue in order on the winner")
			}
		}
	})
}

// restartSim is a simNet whose engines can restart. A restart is the engine behind a name
// closing (closeAll: what its window holds is delivered, its channels are closed, its
// peers see their ends fail) and a new engine, with a new session, taking the name at
// once. The old simEngine keeps what it delivered; its machine is replaced by an empty one
// with the old session, so what still reaches it (an OOB notify or a handshake reply
// already on its way, a frame) meets an engine that knows nothing, as a process that
// exited would answer nothing and the one now at its address refuses the old pair.
type restartSim struct {
	*simNet
	dead []*simEngine
}

func (rs *restartSim) restart(name string, session uint64, cfg machineConfig) (old, fresh *simEngine) {
	old = rs.engines[name]
	old.m.closeAll(sendErr(ErrClosed, name, "", errors.New("engine closed"), false))
	old.perform()
	tok := uint64(0)
	old.m = newPeerMachine(old.m.local, cfg, func() uint64 { tok++; return old.m.local<<20 + tok })
	old.timerAt = time.Time{}
	rs.dead = append(rs.dead, old)
	fresh = rs.add(name, session, cfg)
	rs.sweep()
	return old, fresh
}

// sweep is what the drivers would learn from their NICs: every link of a dead engine is
// dead, even one a handshake reply still made for it after it closed (its QP is gone), and
// its peer's end fails; a link an engine set up towards a QP that was already gone (the
// handshake reply outran the close) fails at its owner, who is told.
func (rs *restartSim) sweep() {
	for _, e := range rs.dead {
		for _, id := range sortedLinks(e) {
			l := e.links[id]
			if l.dead {
				continue
			}
			l.dead = true
			if r := l.remote; r != nil && !r.dead {
				rs.post(func() {
					r.local.closeLink(r.id)
					r.local.m.chanClosed(rs.now, r.id, errors.New("peer closed"))
					r.local.perform()
				})
			}
		}
	}
	names := make([]string, 0, len(rs.engines))
	for name := range rs.engines {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		e := rs.engines[name]
		for _, id := range sortedLinks(e) {
			if e.links[id].dead && !e.closedCh[id] {
				e.closeLink(id)
			}
		}
	}
}

// sortedLinks is e's link ids in order, so the events a sweep posts do not depend on map
// iteration.
func sortedLinks(e *simEngine) []chanID {
	ids := make([]chanID, 0, len(e.links))
	for id := range e.links {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func (rs *restartSim) step() bool {
	ok := rs.simNet.step()
	rs.sweep()
	return ok
}

// run is simNet.run with the sweep after each event, and with timers due before until
// only (zero: all).
func (rs *restartSim) run(until time.Time) { rs.simNet.runWith(until, rs.sweep) }

// checkAcrossRestart: every send of from (in order) completed; one acknowledged was
// delivered exactly once, at one of the incarnations; one that failed without "maybe" was
// delivered nowhere; nothing was delivered twice (at one incarnation or across both); and
// each incarnation whose ordered flag is set delivered in send order. It returns the
// acknowledged count, the count delivered at each incarnation and how many were delivered
// out of order at an incarnation not checked for it.
func checkAcrossRestart(t *testing.T, seed uint64, from *simEngine, order []reqID, ordered []bool, incs ...*simEngine) (acked int, delivered []int, disorder int) {
	t.Helper()
	where := map[string]int{} // msg -> incarnation
	pos := map[string]int{}
	delivered = make([]int, len(incs))
	for k, inc := range incs {
		for i, g := range inc.got {
			m := string(g.Msg)
			if w, dup := where[m]; dup {
				t.Fatalf("seed %d: %s delivered twice (at %d and %d)", seed, m, w, k)
			}
			where[m], pos[m] = k, i
		}
	}
	last := make([]int, len(incs))
	for i := range last {
		last[i] = -1
	}
	for _, id := range order {
		msg := from.posted[id]
		err, done := from.results[id]
		require.True(t, done, "seed %d: %s never completed (hangs)", seed, msg)
		k, ok := where[msg]
		if err == nil {
			acked++
			require.True(t, ok, "seed %d: %s acknowledged but delivered nowhere", seed, msg)
		} else if !errors.Is(err, ErrMaybeDelivered) {
			require.False(t, ok, "seed %d: %s failed (%v) yet was delivered", seed, msg, err)
		}
		if ok {
			delivered[k]++
			if pos[msg] < last[k] {
				require.False(t, ordered[k], "seed %d: %s delivered out of order at incarnation %d", seed, msg, k)
				disorder++
			}
			last[k] = max(last[k], pos[msg])
		}
	}
	return acked, delivered, disorder
}

// TestMachineRestartMidConnect: b restarts (closes; a new engine with a new session takes
// its name) while a's handshake to it is in flight: before the request reached b, after
// b accepted it but before the reply reached a, just after a connected with its first
// sends on the wire, or during a reconnect of an established pair under traffic; b may
// also be sending to a (its own handshake in flight), and b's QP may die just before, so
// a's sends fall back to OOB and b's window holds some behind a gap when it closes. Per seed: every send of a completes
// (nothing hangs); what a saw acknowledged was delivered exactly once, by the old b or the
// new one; what failed without "maybe" was delivered nowhere; sends that were still
// waiting for a path when b restarted reached only the new b; the old b delivered in a's
// order; the old b's own sends are none lost or doubled; a ends with one channel, to the
// new b, and a last batch after the restart is delivered in full and in order; the new b
// delivers a's sends in a's order too, including those that straddled the restart
// (refused by it, sent again in the new pair: 83 of 400 seeds reordered them before the
// machine held a name's sends behind its stragglers, see TestMachineRestartRebindKeepsOrder).
func TestMachineRestartMidConnect(t *testing.T) { restartMidConnect(t, true) }

func restartMidConnect(t *testing.T, newOrder bool) {
	cases := map[string]int{}
	var totAcked, totOld, totNew, totFailed, totMaybe, totDisorder, seedsDisorder int
	for seed := uint64(0); seed < 400; seed++ {
		rs := &restartSim{simNet: newSimNet(t, seed)}
		n := rs.simNet
		cfg := simCfg()
		a := rs.add("a", 10, cfg)
		b := rs.add("b", 20, cfg)
		reconnect := seed%4 == 3
		bSends := seed%2 == 1
		var order, fromOld []reqID
		i := 0
		sendA := func(k int) {
			for ; k > 0; k-- {
				order = append(order, a.send("b", "a"+strconv.Itoa(i), ""))
				i++
			}
		}
		if reconnect {
			sendA(5)
			rs.run(n.now.Add(time.Second / 2)) // no idle time passes: the pair stays up
			pa := a.m.peers[peerKey{session: 20}]
			require.NotZero(t, pa.ch, "seed %d", seed)
			a.m.connectName(n.now, a.m.names["b"], pa) // a reconnects: epoch 2, with proof
			a.perform()
		}
		sendA(1 + n.rng.IntN(8))
		if bSends {
			for k := 0; k < 5; k++ {
				fromOld = append(fromOld, b.send("a", "old-b"+strconv.Itoa(k), ""))
			}
		}
		// Run up to a few events of the handshake, then restart b.
		for k := n.rng.IntN(4); k > 0 && a.m.names["b"].connecting && rs.step(); k-- {
		}
		connecting := a.m.names["b"].connecting
		pb := b.m.peers[peerKey{session: 10}]
		if seed%3 == 2 && pb != nil && pb.ch != 0 {
			// b's QP dies first: a's sends on it fall back to OOB, whose notifies reach b in
			// any order, so b's window may hold some behind a gap when it closes.
			b.closeLink(pb.ch)
			b.perform()
			for k := n.rng.IntN(12); k > 0 && rs.step(); k-- {
			}
			if pb.win.held > 0 {
				cases["restart with notifies held behind a gap"]++
			}
		}
		accepted := pb != nil && pb.ch != 0
		var waiting []reqID // sends of a with no path yet
		for id, r := range a.m.reqs {
			if r.ch == 0 && !r.oob {
				waiting = append(waiting, id)
			}
		}
		switch {
		case reconnect && connecting:
			cases["restart during a reconnect"]++
		case !connecting:
			cases["restart just after connecting"]++
		case accepted:
			cases["restart after b accepted, before the reply"]++
		default:
			cases["restart before the request reached b"]++
		}
		old, fresh := rs.restart("b", 21, cfg)

		// More sends to the name, while a finds out.
		for k := 0; k < 10; k++ {
			sendA(1)
			for s := n.rng.IntN(4); s > 0 && rs.step(); s-- {
			}
		}
		// Every timer but the idle pruning (peerIdle) runs: connect timeouts, awaited
		// peers, backoffs, gap timeouts, the no-ctrl retry. (Pruning an idle pair before
		// the last batch is TestMachineIdlePairNotLockedOut's case, tested there.)
		mc := a.m.cfg // with its defaults
		horizon := n.now.Add(mc.peerIdle / 2)
		require.Greater(t, mc.peerIdle/2, max(mc.gapTimeout, mc.connectTimeout, mc.noCtrlRetry, mc.limitBackoff))
		rs.run(horizon)

		acked, del, disorder := checkAcrossRestart(t, seed, a, order, []bool{true, newOrder}, old, fresh)
		totAcked += acked
		totOld += del[0]
		totNew += del[1]
		for _, id := range order {
			if err := a.results[id]; err != nil {
				totFailed++
				if errors.Is(err, ErrMaybeDelivered) {
					totMaybe++
				}
			}
		}
		totDisorder += disorder
		if disorder > 0 {
			seedsDisorder++
		}
		for _, id := range waiting {
			if a.results[id] == nil {
				msg := a.posted[id]
				found := false
				for _, g := range fresh.got {
					found = found || string(g.Msg) == msg
				}
				require.True(t, found, "seed %d: %s waited at the restart and was acknowledged, but not by the new engine", seed, msg)
			}
		}
		if bSends {
			checkDelivery(t, old, a, fromOld) // the old b's own sends: closed, none lost or doubled
		}

		// The pair with the new engine works: the name leads to it, over one channel, and
		// everything is delivered in order.
		var last []reqID
		for k := 0; k < 10; k++ {
			last = append(last, a.send("b", "last"+strconv.Itoa(k), ""))
		}
		rs.run(time.Time{})
		require.Equal(t, 10, checkDelivery(t, a, fresh, last), "seed %d", seed)
		ne := a.m.names["b"]
		require.NotNil(t, ne, "seed %d", seed)
		require.NotNil(t, ne.peer, "seed %d", seed)
		require.Equal(t, uint64(21), ne.peer.key.session, "seed %d: the name still leads to the old engine", seed)
		require.Equal(t, 1, a.m.channels, "seed %d: channels of a", seed)
		require.Zero(t, fresh.m.peers[peerKey{session: 10}].win.held, "seed %d", seed)
	}
	t.Logf("cases: %v; a's sends: %d acknowledged, %d failed (%d of them \"maybe delivered\"); delivered: %d by the old b, %d by the new; "+
		"%d delivered out of order by the new b, in %d of 400 seeds", cases, totAcked, totFailed, totMaybe, totOld, totNew, totDisorder, seedsDisorder)
	for _, c := range []string{"restart during a reconnect", "restart just after connecting",
		"restart after b accepted, before the reply", "restart before the request reached b",
		"restart with notifies held behind a gap"} {
		require.NotZero(t, cases[c], "no schedule took the case %q", c)
	}
	require.NotZero(t, totOld, "no seed had the old b deliver anything")
	require.NotZero(t, totFailed, "no seed failed a send: the restart never hit one in flight")
}

// TestMachineRestartRebindKeepsOrder: b restarts (it closes, and a new engine with a new
// session takes its name) between two batches of a's notifies over OOB. Each notify of the
// second batch is refused by the new engine (ts_to names the old session: "auth", not
// delivered), and the machine sends it again through a new handshake (rebind, in
// sendResult). The refusals come back in any order; the sends are sent again in send
// order, because the name's sends wait until every straggler to the old pair is answered
// (markStragglers, releaseStragglers). Before, rebind queued them in refusal order and all
// 50 seeds delivered the acknowledged notifies out of order (seed 0: m2 m9 m6 m4 m5 m7 m0
// m1 m3 m8). OOB-only engines; TestMachineRestartMidConnect covers channels.
func TestMachineRestartRebindKeepsOrder(t *testing.T) {
	cfg := simCfg()
	cfg.channels = false
	bad, example := 0, ""
	for seed := uint64(0); seed < 50; seed++ {
		n := newSimNet(t, seed)
		a := n.add("a", 10, cfg)
		b := n.add("b", 20, cfg)
		first := []reqID{a.send("b", "first", "")}
		for n.step() { // no idle time passes: a keeps the pair
		}
		require.Equal(t, 1, checkDelivery(t, a, b, first))
		b.m.closeAll(sendErr(ErrClosed, "b", "", errors.New("closed"), false))
		b.perform()
		fresh := n.add("b", 21, cfg)
		var order []reqID
		for i := 0; i < 10; i++ {
			order = append(order, a.send("b", "m"+strconv.Itoa(i), ""))
		}
		n.run()
		var got []string
		seen := map[string]bool{}
		for _, g := range fresh.got {
			require.False(t, seen[string(g.Msg)], "seed %d: %s delivered twice", seed, g.Msg)
			seen[string(g.Msg)] = true
			got = append(got, string(g.Msg))
		}
		for _, id := range order {
			require.NoError(t, a.results[id], "seed %d", seed)
			require.True(t, seen[a.posted[id]], "seed %d: %s acknowledged, not delivered", seed, a.posted[id])
		}
		for i, g := range got {
			if g != "m"+strconv.Itoa(i) {
				if bad == 0 {
					example = fmt.Sprintf("seed %d: sent m0..m9, all 10 acknowledged, the new engine delivered %v", seed, got)
				}
				bad++
				break
			}
		}
	}
	require.Zero(t, bad, "%d of 50 seeds delivered acknowledged notifies out of order; %s", bad, example)
}

// TestMachineIdlePairNotLockedOut: a handshake whose channel its initiator never uses (the
// one send that asked for it was withdrawn before the reply) must not leave b with a peer
// entry for a that is never forgotten. Before, b's tick expired the unconfirmed channel
// after its peer loop ran, so no idle-prune deadline was armed for the entry and b's timer
// stopped; a forgot the pair after peerIdle, and from then on a's handshakes carried no
// proof for a session b still knew: b refused them (auth) for good. Now the expiry arms the
// entry's prune. (Seen first in TestMachineRestartMidConnect, seed 391.)
func TestMachineIdlePairNotLockedOut(t *testing.T) {
	n := newSimNet(t, 12)
	a := n.add("a", 10, simCfg())
	b := n.add("b", 20, simCfg())
	w := a.send("b", "withdrawn", "")
	require.True(t, a.m.cancel(n.now, w, errors.New("ctx done")))
	a.perform()
	n.run() // the channel expires unused (connectTimeout); a forgets the pair (peerIdle)
	require.Empty(t, a.m.peers, "a forgot the idle pair")
	require.Zero(t, b.m.channels)
	t.Logf("b still holds %d peer entries; b's timer armed: %v", len(b.m.peers), !b.timerAt.IsZero())

	// Much later, a sends again.
	n.now = n.now.Add(time.Hour)
	var order []reqID
	for i := 0; i < 3; i++ {
		order = append(order, a.send("b", "later"+strconv.Itoa(i), ""))
	}
	n.run()
	for _, id := range order {
		require.NoError(t, a.results[id], "%s: a can no longer reach b (b refused %d handshakes for proof)", a.posted[id], b.m.stats.AuthRefused)
	}
	require.Equal(t, 3, checkDelivery(t, a, b, order))
}

// TestMachineOldPairFenceDropped: a fence over OOB gives up seqs of one pair; its answer
// comes after the peer had forgotten the pair and both sides started a new one at seq 1
// (restartPair). The answer is dropped: refenced on the new pair (its token now the new
// one) it skipped the new pair's notifies of the same numbers, acknowledged yet never
// delivered (found by FuzzMachineHostileInput).
func TestMachineOldPairFenceDropped(t *testing.T) {
	now := time.Unix(1000, 0)
	cfg := simCfg()
	cfg.channels = false
	m, kinds, _ := oobSendMachine(t, cfg, now)
	m.sendResult(now, 1, errors.New("timed out"), false, true) // given up: fenced
	f := kinds(aFence)
	require.Len(t, f, 1)
	old := m.peers[peerKey{session: 20}]
	require.Equal(t, old.pair, f[0].pair)

	// The peer forgot the pair; a new handshake restarts it.
	m.restartPair(now, old)
	p := m.peers[peerKey{session: 20}]
	require.NotSame(t, old, p)
	p.tokenOut = 8
	m.fenceResult(now, 20, f[0].first, f[0].count, 7, f[0].pair,
		&kindError{kind: ErrAuth, cause: errors.New("ts_token: not issued by this engine")})
	require.Empty(t, kinds(aFence), "the old pair's fence is not sent on the new pair")
	require.Zero(t, p.seqs.unresolved())
	m.tick(now.Add(time.Minute))
	require.Empty(t, kinds(aFence))
}

// TestMachineRefusedFenceBacksOff: a fence the peer refuses over OOB (busy, unreachable)
// is sent again after a wait that doubles from fenceRetry up to limitBackoff, one try per
// wait: never at once, which made a refusing peer and its sender trade fences as fast as
// they could answer (found by FuzzMachineHostileInput). A peer that no longer knows the
// pair, or one silent for a gap timeout, has nobody waiting for the seqs: the fence is
// dropped, counted, and the seqs resolved.
func TestMachineRefusedFenceBacksOff(t *testing.T) {
	for _, end := range []string{"forgotten", "silent"} {
		t.Run(end, func(t *testing.T) {
			now := time.Unix(1000, 0)
			cfg := simCfg()
			cfg.channels = false
			cfg.gapTimeout = 2 * time.Minute
			m, kinds, _ := oobSendMachine(t, cfg, now)
			m.sendResult(now, 1, errors.New("timed out"), false, true) // given up: fenced
			f := kinds(aFence)
			require.Len(t, f, 1)
			require.Equal(t, [2]uint64{1, 1}, [2]uint64{f[0].first, f[0].count})
			p := m.peers[peerKey{session: 20}]
			require.NotNil(t, p)

			busy := &kindError{kind: ErrBackpressure, cause: errors.New("busy")}
			start := now
			wait := cfg.fenceRetry
			if wait == 0 {
				wait = 50 * time.Millisecond // the default
			}
			var waits []time.Duration
			for now.Sub(start) < time.Minute {
				m.fenceResult(now, 20, 1, 1, 7, p.pair, busy)
				require.Empty(t, kinds(aFence), "a refused fence is not sent again at once")
				m.tick(now.Add(p.fenceWait - time.Millisecond))
				require.Empty(t, kinds(aFence), "nor before its wait")
				waits = append(waits, p.fenceWait)
				now = now.Add(p.fenceWait)
				m.tick(now)
				require.Len(t, kinds(aFence), 1, "one try per wait")
			}
			require.Equal(t, wait, waits[0])
			for i := 1; i < len(waits); i++ {
				require.Equal(t, min(2*waits[i-1], 5*time.Second), waits[i], "the wait doubles up to limitBackoff")
			}
			require.Equal(t, uint64(1), p.seqs.unresolved())
			switch end {
			case "forgotten":
				m.fenceResult(now, 20, 1, 1, 7, p.pair, &kindError{kind: ErrAuth, cause: errors.Join(errRebind, errors.New("unknown token"))})
			case "silent":
				now = p.lastActive.Add(cfg.gapTimeout)
				m.fenceResult(now, 20, 1, 1, 7, p.pair, busy)
			}
			require.Zero(t, p.seqs.unresolved(), "nobody waits for the seq: resolved")
			require.Equal(t, uint64(1), m.stats.FencesDropped)
			m.tick(now.Add(time.Minute))
			require.Empty(t, kinds(aFence))
		})
	}
}

// TestMachineStaleRefusalKeepsPair: an OOB try refused because the peer no longer knows
// the token it carried, when a handshake has renewed the pair while the try was on its way,
// is about the old pair: the notify goes again in the current pair (its token, its seq),
// and the pair is not torn down. Tearing it down locked the sender out (its next handshake,
// without the proof, was refused by a receiver that knew the pair) while the receiver held
// a later seq behind the unsent ones (found by FuzzMachineHostileInput, input f8716173 in
// its corpus).
func TestMachineStaleRefusalKeepsPair(t *testing.T) {
	now := time.Unix(1000, 0)
	m, kinds, sent := oobPairMachine(t, now)
	require.Equal(t, uint64(7), sent.token)
	p := m.peers[peerKey{session: 20}]
	// The peer handshakes with us meanwhile (it forgot the pair): a new token.
	rep := m.inbound(now, inboundHS{name: "b", session: 20, token: 9, proof: p.tokenIn[0]})
	require.NotEqual(t, refuseAuth, rep.refuse) // accepted (without a channel: this engine opens none)
	m.ready()
	require.Equal(t, uint64(9), p.tokenOut)

	m.sendResult(now, 1, &kindError{kind: ErrAuth, cause: errors.Join(errRebind, errors.New("ts_token unknown"))}, false, false)
	acts := m.ready()
	var again []mAction
	for _, a := range acts {
		require.NotEqual(t, aConnect, a.kind, "the current pair stands: no new handshake")
		require.NotEqual(t, aComplete, a.kind, "not failed")
		if a.kind == aOOB {
			again = append(again, a)
		}
	}
	require.Len(t, again, 1)
	require.Equal(t, uint64(9), again[0].token, "sent again with the current token")
	require.Equal(t, sent.seq, again[0].seq, "with its seq")
	require.Equal(t, uint64(9), p.tokenOut)
	m.sendResult(now, 1, nil, false, false)
	for _, a := range m.ready() {
		if a.kind == aComplete {
			require.NoError(t, a.err)
		}
	}

	// A refusal of the current token does rebind: a new handshake.
	m.send(now, 2, "b", "", now.Add(time.Hour), 0)
	require.Len(t, kinds(aOOB), 1)
	m.sendResult(now, 2, &kindError{kind: ErrAuth, cause: errors.Join(errRebind, errors.New("ts_token unknown"))}, false, false)
	require.Len(t, kinds(aConnect), 1)
	require.Zero(t, p.tokenOut)
}

// TestMachineOneSidedForget: the receiver forgets an idle pair (its prune) that the sender
// keeps, and the sender sends again. The receiver's new entry starts its window at 1,
// while the sender's seqs were past 9 000: the channel refused them beyond the window and
// dropped them, acknowledged (5 of 5 lost), and below the window they waited for a gap
// timeout. The receiver's reply now says its state is fresh (ts_fresh) and the sender starts
// the pair over: everything is delivered in order, both ways.
func TestMachineOneSidedForget(t *testing.T) {
	for seed := uint64(0); seed < 20; seed++ {
		n := newSimNet(t, seed)
		cfg := simCfg()
		cfg.window = 8192
		a := n.add("a", 10, cfg)
		b := n.add("b", 20, cfg)
		var ab, ba []reqID
		for i := 0; i < 9000; i++ {
			ab = append(ab, a.send("b", "ab"+strconv.Itoa(i), ""))
			if i%50 == 0 {
				ba = append(ba, b.send("a", "ba"+strconv.Itoa(i), ""))
			}
			if i%100 == 99 {
				n.run()
			}
		}
		n.run()
		require.Equal(t, len(ab), checkDelivery(t, a, b, ab), "seed %d", seed)
		require.Equal(t, len(ba), checkDelivery(t, b, a, ba), "seed %d", seed)
		pa := a.m.peers[peerKey{session: 20}]
		a.closeLink(pa.ch)
		n.run()
		pb := b.m.peers[peerKey{session: 10}]
		require.NotNil(t, pb, "seed %d", seed)
		require.Zero(t, pb.ch, "seed %d", seed)
		b.m.forget(pb.key, pb) // b's idle prune; a keeps its entry
		for i := 0; i < 5; i++ {
			ab = append(ab, a.send("b", "after"+strconv.Itoa(i), ""))
			for k := n.rng.IntN(3); k > 0 && n.step(); k-- {
			}
		}
		n.run()
		for i := 0; i < 5; i++ {
			ba = append(ba, b.send("a", "back"+strconv.Itoa(i), ""))
		}
		n.run()
		require.Equal(t, len(ab), checkDelivery(t, a, b, ab), "seed %d", seed)
		require.Equal(t, len(ba), checkDelivery(t, b, a, ba), "seed %d", seed)
		require.Equal(t, uint64(1), a.m.stats.PairsRestarted, "seed %d", seed)
		w := b.m.peers[peerKey{session: 10}].win.stats
		require.Zero(t, w.Refused+w.GapsTimedOut, "seed %d: %+v", seed, w)
	}
}

// directMachine is a machine of session 10 driven by hand: kinds returns the actions of
// one kind among those ready (the others are dropped).
// oobSendMachine is a directMachine (cfg without channels) whose send 1 to "b" went over
// OOB once b (session 20) answered the handshake with token 7; it returns that aOOB.
func oobSendMachine(t *testing.T, cfg machineConfig, now time.Time) (*peerMachine, func(mActKind) []mAction, mAction) {
	t.Helper()
	m, kinds := directMachine(cfg)
	m.send(now, 1, "b", "", now.Add(time.Hour), 0)
	require.Len(t, kinds(aConnect), 1)
	m.connected(now, "b", 0, hsResult{session: 20, token: 7, peerName: "b"})
	sent := kinds(aOOB)
	require.Len(t, sent, 1)
	return m, kinds, sent[0]
}

// oobPairMachine: a machine without channels whose first send to b went over OOB to b's
// engine of session 20.
func oobPairMachine(t *testing.T, now time.Time) (*peerMachine, func(mActKind) []mAction, mAction) {
	t.Helper()
	cfg := simCfg()
	cfg.channels = false
	m, kinds, first := oobSendMachine(t, cfg, now)
	require.Equal(t, uint64(20), first.session)
	return m, kinds, first
}

func directMachine(cfg machineConfig) (*peerMachine, func(mActKind) []mAction) {
	tok := uint64(100)
	m := newPeerMachine(10, cfg, func() uint64 { tok++; return tok })
	return m, func(k mActKind) []mAction { return filterKind(m.ready(), k) }
}

// filterKind is the actions of kind k among acts.
func filterKind(acts []mAction, k mActKind) []mAction {
	var out []mAction
	for _, a := range acts {
		if a.kind == k {
			out = append(out, a)
		}
	}
	return out
}
