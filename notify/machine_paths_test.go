package notify

import (
	"errors"
	"strconv"
	"testing"

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
// broken by the higher initiator session) and a's was closed as superseded; when only one
// came up (the other was refused), it is that one. Both paths occur across the seeds, and
// everything acknowledged is delivered once and in order either way.
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
		n.run()

		require.Equal(t, N, checkDelivery(t, a, b, ab), "seed %d", seed)
		require.Equal(t, N, checkDelivery(t, b, a, ba), "seed %d", seed)

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
			// b's handshake was refused (a had already heard from b on a's channel): a's
			// channel is the pair's, and b never had a second one.
			paths["only a's came up"]++
			require.Equal(t, chanKey{1, 10}, final, "seed %d", seed)
			require.Nil(t, b.links[bOpen], "seed %d", seed)
		case bUp:
			paths["only b's came up"]++
			require.Equal(t, chanKey{1, 20}, final, "seed %d", seed)
			require.Nil(t, a.links[aOpen], "seed %d", seed)
		default:
			paths["a later channel"]++
		}
		if final.epoch > 1 {
			paths["ended on a reconnect"]++
		}
		require.Equal(t, 1, a.m.channels, "seed %d", seed)
		require.Equal(t, 1, b.m.channels, "seed %d", seed)
	}
	t.Logf("paths over 300 seeds: %v", paths)
	require.NotZero(t, paths["both up: b's (higher session) won"], "the tie-break never ran")
}
