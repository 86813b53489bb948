package notify

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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
		for _, down := range []time.Duration{0, 700 * time.Millisecond} {
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
