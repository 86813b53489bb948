package notify

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMachineOpenRaceTwoNamesKeepsOrder: c sends m1 to 127.0.0.1:a, then m2 and m3 to
// localhost:a (two names of engine a), while a opens its own pair to c; all OOB. At a,
// c's localhost:a handshake comes first and makes a's entry for c; c's 127.0.0.1:a one is
// then refused for want of proof, so at c that name joins the entry a's own handshake made,
// and m1 goes at once with the token a's handshake issued, before a has its reply (which
// makes that token the pair's there). a must not refuse m1 as a pair it does not know:
// before, it did ("auth"), c took the pair for forgotten (rebind), started it over when
// localhost:a's reply came (fresh), and sent m2 and m3 in the new pair before m1, which
// waited for 127.0.0.1:a's next handshake: a delivered m2 m3 m1, all three acknowledged
// (TestMachineSoakMix, seed 4). Now a answers "busy" while its handshake to a name of c's
// port is on its way; c sends m1 again, with its seq, as its pacing allows, and m2 and m3
// follow it. The schedule up to m1's answer is fixed; the rest is seeded.
func TestMachineOpenRaceTwoNamesKeepsOrder(t *testing.T) {
	cfg := simCfg()
	cfg.channels = false
	for seed := uint64(0); seed < 50; seed++ {
		n := newSimNet(t, seed)
		a := n.add("a", 10, cfg, "127.0.0.1:a", "localhost:a")
		c := n.add("c", 30, cfg, "127.0.0.1:c", "localhost:c")
		// fire runs the pending event i (events are posted in order: the script names them
		// by position) and checks how many are pending after it (-1: any).
		fire := func(i, pending int) {
			t.Helper()
			f := n.events[i]
			n.events = append(n.events[:i], n.events[i+1:]...)
			f()
			if pending >= 0 {
				require.Len(t, n.events, pending, "seed %d", seed)
			}
		}
		order := []reqID{c.send("127.0.0.1:a", "m1", "")} // event 0: c's handshake via 127.0.0.1:a
		order = append(order, c.send("localhost:a", "m2", ""))
		order = append(order, c.send("localhost:a", "m3", "")) // event 1: via localhost:a
		q := a.send("127.0.0.1:c", "q1", "")                   // event 2: a's handshake via 127.0.0.1:c
		require.Len(t, n.events, 3)
		fire(1, 3) // at a: c's localhost:a handshake makes a's entry for c; its reply (3) goes back
		require.Len(t, a.m.peers, 1)
		fire(0, 3) // at a: c's 127.0.0.1:a handshake is refused for want of proof (reply: 3)
		require.EqualValues(t, 1, a.m.stats.AuthRefused)
		fire(0, 3) // at c: a's handshake makes c's entry for a, with a's token (reply: 3)
		fire(1, 3) // at c: the refusal; 127.0.0.1:a joins a's entry, m1 goes over OOB (3)
		p := c.m.peers[peerKey{session: 10}]
		require.NotNil(t, p)
		require.Equal(t, p, c.m.names["127.0.0.1:a"].peer)
		fire(2, 3)                           // at a: m1, before a's handshake has its reply; its answer goes back (3)
		refused := a.m.stats.AuthRefused - 1 // m1, for its token
		fire(2, -1)                          // at c: m1's answer
		fire(0, -1)                          // at c: localhost:a's reply, fresh
		n.run()
		require.Equal(t, 3, checkDelivery(t, c, a, order), "seed %d", seed)
		require.Equal(t, 1, checkDelivery(t, a, c, []reqID{q}), "seed %d", seed)
		require.Zero(t, refused, "seed %d: a refused m1's token", seed)
		require.NotZero(t, c.m.stats.BusyAnswers, "seed %d: m1 was not asked for again", seed)
		require.Zero(t, c.m.stats.PairsRestarted, "seed %d: c started a live pair over", seed)
	}
}

// TestMachineRebindHoldsOtherNames: as TestMachineOpenRaceTwoNamesKeepsOrder, but a's
// handshake to c ends without its reply (a timeout at a), so the token c has from it is
// never a's: a refuses m1 for it, rightly, and c takes 127.0.0.1:a for a name whose engine
// it must ask again (rebind). m2 and m3, sent after m1 to localhost:a, must still be
// delivered after it.
func TestMachineRebindHoldsOtherNames(t *testing.T) {
	cfg := simCfg()
	cfg.channels = false
	for seed := uint64(0); seed < 50; seed++ {
		n := newSimNet(t, seed)
		a := n.add("a", 10, cfg, "127.0.0.1:a", "localhost:a")
		c := n.add("c", 30, cfg, "127.0.0.1:c", "localhost:c")
		fire := func(i, pending int) {
			t.Helper()
			f := n.events[i]
			n.events = append(n.events[:i], n.events[i+1:]...)
			f()
			if pending >= 0 {
				require.Len(t, n.events, pending, "seed %d", seed)
			}
		}
		order := []reqID{c.send("127.0.0.1:a", "m1", "")}
		order = append(order, c.send("localhost:a", "m2", ""))
		order = append(order, c.send("localhost:a", "m3", ""))
		a.send("127.0.0.1:c", "q1", "")
		fire(1, 3)              // at a: c's localhost:a handshake (reply: 3)
		fire(0, 3)              // at a: c's 127.0.0.1:a handshake, refused for want of proof (3)
		fire(0, 3)              // at c: a's handshake makes c's entry for a (reply: 3)
		n.events = n.events[:2] // a's handshake gets no reply: it times out at a
		a.m.connected(n.now, "127.0.0.1:c", 0, hsResult{err: errors.New("timeout")})
		a.perform()
		fire(1, 2)  // at c: the refusal; m1 goes over OOB with a's token (2)
		fire(1, 2)  // at a: m1, refused for that token (its answer: 2)
		fire(1, -1) // at c: m1's answer: c asks 127.0.0.1:a again
		fire(0, -1) // at c: localhost:a's reply
		n.run()
		require.Equal(t, 3, checkDelivery(t, c, a, order), "seed %d", seed)
	}
}

// TestMachineFallbackWaitsBehindUnknownName: c sends m1 to localhost:b, whose first
// handshake is on its way, then m2 to 127.0.0.1:b, another name of b, while b opens its own
// pair to c (channels on, OOB fallback). b refuses c's 127.0.0.1:b handshake for want of
// proof (it knows c's session from the localhost:b one), so at c m2 waits for the pair,
// which b's handshake then gives a channel and a token; the channel is cut at once. m2 must
// not go over OOB before m1 has its seq: before, the fallback (the name backing off after
// its refusal, failPeerWaiters) sent it without asking whether an older send waited for a
// name of b's port, and b delivered m2 before m1 (TestMachineSoakMix, seed 683).
func TestMachineFallbackWaitsBehindUnknownName(t *testing.T) {
	for seed := uint64(0); seed < 50; seed++ {
		n := newSimNet(t, seed)
		b := n.add("b", 20, simCfg(), "127.0.0.1:b", "localhost:b")
		c := n.add("c", 30, simCfg(), "127.0.0.1:c", "localhost:c")
		fire := func(i, pending int) {
			t.Helper()
			f := n.events[i]
			n.events = append(n.events[:i], n.events[i+1:]...)
			f()
			require.Len(t, n.events, pending, "seed %d", seed)
		}
		// Events 0, 1: c's handshakes via localhost:b and 127.0.0.1:b; 2: b's via 127.0.0.1:c.
		order := []reqID{c.send("localhost:b", "m1", "")}
		order = append(order, c.send("127.0.0.1:b", "m2", ""))
		q := b.send("127.0.0.1:c", "q1", "")
		fire(0, 3) // at b: c's localhost:b handshake (reply: 3)
		fire(0, 3) // at b: c's 127.0.0.1:b one, refused for want of proof (reply: 3)
		fire(2, 3) // at c: the refusal; m2 waits for the pair (its channel's close: 3)
		fire(0, 3) // at c: b's handshake: the pair's channel and token (reply: 3)
		p := c.m.peers[peerKey{session: 20}]
		require.NotNil(t, p)
		require.NotZero(t, p.ch, "seed %d", seed)
		id := p.ch // cut: the channel ends before anything went on it
		c.closeLink(id)
		c.m.chanClosed(n.now, id, errors.New("cut"))
		c.perform()
		n.run()
		require.Equal(t, 2, checkDelivery(t, c, b, order), "seed %d", seed)
		require.Equal(t, 1, checkDelivery(t, b, c, []reqID{q}), "seed %d", seed)
	}
}
