package ctrlchannel

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMachineRandomSchedules drives two machines with random schedules: frames land,
// completions come back late, reposts happen at random points, receivers pause and
// resume, both sides submit. Whatever the schedule: no RNR, every notify delivered once
// and in order, every send completed, and the network goes quiet (no endless grants).
func TestMachineRandomSchedules(t *testing.T) { randomSchedules(t, false) }

// TestMachineRandomSchedulesWithKeepalives: the same, with Keepalive called at random
// points; once quiet, rounds of keepalives on both sides change none of it.
func TestMachineRandomSchedulesWithKeepalives(t *testing.T) { randomSchedules(t, true) }

func randomSchedules(t *testing.T, keepalives bool) {
	for seed := uint64(1); seed <= 300; seed++ {
		rq := 3 + int(seed%6)
		t.Run(fmt.Sprintf("seed%d-rq%d", seed, rq), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 42))
			pa, pb := extParams(rq), extParams(rq)
			pa.SendSlots = 2 + rng.IntN(16)
			pb.SendSlots = 2 + rng.IntN(16)
			nw := connect(t, pa, pb)
			const n = 120
			nodes := [2]*node{nw.a, nw.b}
			var wcs [2][]uint64 // completions not yet delivered to the sender
			sent := [2]int{}
			landOne := func(i int) bool {
				from, to := nodes[i], nodes[1-i]
				if len(from.wire) == 0 {
					return false
				}
				require.NotEmpty(t, to.posted, "RNR: frame found no posted RECV")
				f := from.wire[0]
				from.wire = from.wire[1:]
				slot := to.posted[0]
				to.posted = to.posted[1:]
				delete(to.isPosted, slot)
				c := copy(to.recvBufs[slot], f.data)
				to.m.RecvWC(t0, slot, to.recvBufs[slot][:c])
				to.apply()
				if f.signaled {
					wcs[i] = append(wcs[i], f.wrid)
				}
				return true
			}
			for step := 0; step < 20000; step++ {
				i := rng.IntN(2)
				x := nodes[i]
				if keepalives && rng.IntN(10) == 0 {
					x.m.Keepalive()
					x.apply()
					continue
				}
				switch r := rng.IntN(100); {
				case r < 25 && sent[i] < n:
					sent[i]++
					x.submit(uint64(sent[i]), x.name, fmt.Sprint(sent[i]))
				case r < 60:
					landOne(i)
				case r < 80:
					x.repost()
				case r < 95:
					if len(wcs[i]) > 0 {
						x.m.SendWC(wcs[i][0])
						wcs[i] = wcs[i][1:]
						x.apply()
					}
				default:
					x.m.SetPaused(t0, !x.m.paused)
					x.apply()
				}
			}
			for i, x := range nodes {
				for sent[i] < n {
					sent[i]++
					x.submit(uint64(sent[i]), x.name, fmt.Sprint(sent[i]))
				}
				x.m.SetPaused(t0, false)
				x.apply()
			}
			settle := func() {
				quiet := false
				for step := 0; step < 100000 && !quiet; step++ {
					moved := false
					for i, x := range nodes {
						moved = landOne(i) || moved
						for _, w := range wcs[i] {
							x.m.SendWC(w)
						}
						wcs[i] = wcs[i][:0]
						x.apply()
						before := len(x.posted)
						x.repost()
						moved = moved || len(x.posted) != before
					}
					quiet = !moved && len(nw.a.wire) == 0 && len(nw.b.wire) == 0
				}
				require.True(t, quiet, "the network never went quiet")
			}
			settle()
			if keepalives {
				var before [2]MachineStats
				for i, x := range nodes {
					before[i] = x.m.Stats()
				}
				for round := 0; round < 30; round++ {
					for _, x := range nodes {
						x.m.Keepalive()
						x.apply()
					}
					settle()
				}
				for i, x := range nodes {
					s := x.m.Stats()
					require.Equal(t, before[i].KeepalivesNoCredit, s.KeepalivesNoCredit, "%s: a quiet live channel always has credit for a keepalive", x.name)
					require.Greater(t, s.KeepalivesSent+s.KeepalivesReceived, before[i].KeepalivesSent+before[i].KeepalivesReceived+15, "%s", x.name)
				}
			}
			for i, x := range nodes {
				other := nodes[1-i]
				require.Len(t, x.got, n)
				for k, d := range x.got {
					require.Equal(t, uint64(k+1), d.seq)
					require.Equal(t, other.name, d.name)
				}
				require.Len(t, x.done, n)
				for _, err := range x.done {
					require.NoError(t, err)
				}
				require.Zero(t, x.m.Stats().CreditOverruns)
			}
		})
	}
}
