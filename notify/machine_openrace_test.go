package notify

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMachineOpenRaceTwoNamesKeepsOrder: c sends m1 to 127.0.0.1:a, then m2 and m3 to
// localhost:a (two names of engine a), while a opens its own pair to c; all OOB. At a,
// c's localhost:a handshake comes first and makes a's entry for c; c's 127.0.0.1:a one,
// without proof, is answered too with the pair's token (c has not proved the pair: for all
// a knows, its first reply was cut). Whatever order the replies, a's handshake and the
// notifies then take (seeded), a delivers m1 m2 m3 in order, c gets q1, nobody's token is
// refused and no pair is started over. (Before a answered proof-less handshakes of an
// unproved pair, a refused this one, and the same order had to come from a's open-race
// "busy" answer to m1.)
func TestMachineOpenRaceTwoNamesKeepsOrder(t *testing.T) {
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
			require.Len(t, n.events, pending, "seed %d", seed)
		}
		order := []reqID{c.send("127.0.0.1:a", "m1", "")} // event 0: c's handshake via 127.0.0.1:a
		order = append(order, c.send("localhost:a", "m2", ""))
		order = append(order, c.send("localhost:a", "m3", "")) // event 1: via localhost:a
		q := a.send("127.0.0.1:c", "q1", "")                   // event 2: a's handshake via 127.0.0.1:c
		require.Len(t, n.events, 3)
		fire(1, 3) // at a: c's localhost:a handshake makes a's entry for c; its reply (3) goes back
		require.Len(t, a.m.peers, 1)
		fire(0, 3) // at a: c's 127.0.0.1:a handshake, answered with the same token (reply: 3)
		require.Zero(t, a.m.stats.AuthRefused, "seed %d", seed)
		require.Len(t, a.m.peers, 1, "seed %d", seed)
		n.run()
		require.Equal(t, 3, checkDelivery(t, c, a, order), "seed %d", seed)
		require.Equal(t, 1, checkDelivery(t, a, c, []reqID{q}), "seed %d", seed)
		require.Zero(t, a.m.stats.AuthRefused+c.m.stats.AuthRefused, "seed %d: a token was refused", seed)
		require.Zero(t, c.m.stats.PairsRestarted+a.m.stats.PairsRestarted, "seed %d: a live pair was started over", seed)
	}
}

// TestMachineOpenRaceLostReplyKeepsToken: c sends m0 to localhost:a, m1 to 127.0.0.1:a
// (two names of engine a), then m2 and m3 to localhost:a, while a opens its own pair to
// c; all OOB. m0 proves c's pair at a, so c's proof-less 127.0.0.1:a handshake is refused
// there; c takes a's handshake (an open race), but that handshake ends without its reply
// (a timeout at a), so the token it offered is never a's. c must go on presenting the
// token a's reply gave it: before, it took the offered one, a refused m1 for it, and
// every later handshake of c's for want of proof: m1, m2, m3 failed ErrAuth, and the pair
// stayed locked. All four are delivered, in order.
func TestMachineOpenRaceLostReplyKeepsToken(t *testing.T) {
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
		order := []reqID{c.send("localhost:a", "m0", "")}      // event 0: c's handshake via localhost:a
		order = append(order, c.send("127.0.0.1:a", "m1", "")) // event 1: via 127.0.0.1:a
		order = append(order, c.send("localhost:a", "m2", ""))
		order = append(order, c.send("localhost:a", "m3", ""))
		a.send("127.0.0.1:c", "q1", "") // event 2: a's handshake via 127.0.0.1:c
		require.Len(t, n.events, 3)
		fire(0, 3) // at a: c's localhost:a handshake (reply: 3)
		fire(2, 3) // at c: its reply; m0 goes over OOB (3)
		fire(2, 3) // at a: m0, delivered: c proved the pair (its answer: 3)
		fire(0, 3) // at a: c's 127.0.0.1:a handshake, refused for want of proof (3)
		require.EqualValues(t, 1, a.m.stats.AuthRefused, "seed %d", seed)
		fire(0, 3)              // at c: a's handshake, taken (an open race), with a's token (reply: 3)
		n.events = n.events[:2] // a's handshake gets no reply: it times out at a
		a.m.connected(n.now, "127.0.0.1:c", 0, hsResult{err: errors.New("timeout")})
		a.perform()
		n.run()
		require.Equal(t, 4, checkDelivery(t, c, a, order), "seed %d", seed)
		require.EqualValues(t, 1, a.m.stats.AuthRefused, "seed %d: a refused c's token", seed)
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
