package soak

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func streamOps(seed uint64, n int) []Event {
	g := NewStreamGen(seed, "a0e0.1", "a1e0", Mix{MaxSize: 1 << 20, MaxWindow: 32})
	out := make([]Event, n)
	for i := range out {
		out[i] = g.Next()
	}
	return out
}

func TestStreamGenIsSeeded(t *testing.T) {
	a, b := streamOps(7, 500), streamOps(7, 500)
	require.Equal(t, a, b, "one seed, one schedule")
	require.NotEqual(t, a, streamOps(8, 500))
	other := NewStreamGen(7, "a0e0.2", "a1e0", Mix{MaxSize: 1 << 20, MaxWindow: 32}).Next()
	require.NotEqual(t, a[0], other, "each stream has its own sequence")

	// The mix covers what it promises.
	var sync, window, ids, retries, short, zero, big, names [2]int
	var p uint64
	for _, op := range a {
		if op.Window == 1 {
			sync[0]++
		} else {
			window[0]++
			require.Len(t, op.Sends, op.Window)
		}
		for _, s := range op.Sends {
			p++
			require.Equal(t, p, s.P, "payloads are numbered in order")
			require.LessOrEqual(t, s.Size, 1<<20)
			if s.ID {
				ids[0]++
				require.Positive(t, s.Retries)
			} else {
				require.Zero(t, s.Retries, "only a send with an ID is retried")
			}
			if s.DeadlineMS < 1000 {
				short[0]++
			}
			if s.Size == 0 {
				zero[0]++
			}
			if s.Size > 64<<10 {
				big[0]++
			}
			names[s.Name]++
			retries[0] += s.Retries
		}
	}
	for what, n := range map[string]int{"sync": sync[0], "window": window[0], "id": ids[0], "retries": retries[0],
		"short deadline": short[0], "empty": zero[0], "over 64 KiB": big[0], "first name": names[0], "second name": names[1]} {
		require.Positive(t, n, what)
	}
}

func TestStreamGenOneName(t *testing.T) {
	g := NewStreamGen(7, "a0e0.1", "a1e0", Mix{MaxSize: 100, MaxWindow: 4, OneName: true})
	for range 200 {
		op := g.Next()
		require.LessOrEqual(t, op.Window, 4)
		for _, s := range op.Sends {
			require.Zero(t, s.Name)
			require.LessOrEqual(t, s.Size, 100)
		}
	}
}

func TestFaultGen(t *testing.T) {
	draw := func(kinds []string) []Fault {
		g := NewFaultGen(3, kinds, 3, 2, 1000)
		var out []Fault
		for range 300 {
			f, ok := g.Next()
			require.True(t, ok)
			out = append(out, f)
		}
		return out
	}
	a := draw(AllFaults)
	require.Equal(t, a, draw([]string{FaultHostile, FaultCut, FaultDevice, FaultSlow, FaultPause, FaultReopen, FaultStop, FaultKill}), "the order of --faults does not matter")
	seen := map[string]int{}
	for _, f := range a {
		seen[f.Kind]++
		require.Less(t, f.Agent, 3)
		ag, e, err := ParseSlot(f.Slot)
		require.NoError(t, err)
		require.Equal(t, f.Agent, ag)
		require.Less(t, e, 2)
		require.GreaterOrEqual(t, f.AfterMS, 500)
	}
	require.Len(t, seen, len(AllFaults))
	for _, f := range a {
		if f.Kind == FaultDevice {
			require.NotEmpty(t, f.Device)
			require.NotEmpty(t, f.End)
		}
		if f.Kind == FaultHostile {
			require.Contains(t, hostileVariants, f.Variant)
			require.Positive(t, f.MS)
		}
	}
	for _, f := range draw([]string{FaultStop}) {
		require.Equal(t, FaultStop, f.Kind)
	}
	_, ok := NewFaultGen(3, nil, 3, 2, 1000).Next()
	require.False(t, ok)
}

func TestParseFaults(t *testing.T) {
	all, err := ParseFaults("all")
	require.NoError(t, err)
	require.Equal(t, AllFaults, all)
	none, err := ParseFaults("none")
	require.NoError(t, err)
	require.Empty(t, none)
	two, err := ParseFaults("kill, stop,kill")
	require.NoError(t, err)
	require.Equal(t, []string{FaultKill, FaultStop}, two)
	_, err = ParseFaults("kill,flood")
	require.ErrorContains(t, err, "unknown fault flood")
}

func TestConsumerIsSeeded(t *testing.T) {
	seen := map[string]bool{}
	for inc := 1; inc <= 30; inc++ {
		c := Consumer(1, "a0e0", inc)
		require.Equal(t, c, Consumer(1, "a0e0", inc))
		seen[c] = true
	}
	require.Len(t, seen, 3, "every consumer is drawn")
}

func TestAnswersAreSeeded(t *testing.T) {
	answering := 0
	for inc := 1; inc <= 200; inc++ {
		ok := Answering(1, "a0e0", inc)
		require.Equal(t, ok, Answering(1, "a0e0", inc))
		if ok {
			answering++
			require.Equal(t, ConsumeHandler, Consumer(1, "a0e0", inc), "only a handler answers")
			require.False(t, Receiver(1, EngineID("a0e0", inc)), "a receiver only sends nothing")
		}
	}
	require.Positive(t, answering)

	const takes = 2000
	draw := func(id string) (int, []Send) { // the answers to takes notifies
		g := NewAnswerGen(1, id)
		var out []Send
		for range takes {
			if sd, ok := g.Next(2); ok {
				out = append(out, sd)
			}
		}
		return g.Every(), out
	}
	_, a := draw("a0e0.1")
	_, again := draw("a0e0.1")
	require.Equal(t, a, again, "one seed, one answer sequence")
	shares := map[int]bool{}
	var made, ids, zero, over64, names [2]int
	for inc := 1; inc <= 30; inc++ {
		every, a := draw(EngineID("a0e0", inc))
		shares[every] = true
		for _, sd := range a {
			require.LessOrEqual(t, sd.Size, MaxAnswerSize)
			require.Less(t, sd.Name, 2)
			names[sd.Name]++
			if sd.ID {
				ids[0]++
			}
			if sd.Size == 0 {
				zero[0]++
			}
			if sd.Size > 64 {
				over64[0]++
			}
		}
		require.InDelta(t, takes/every, len(a), float64(takes/every)/2+10, "a share of about one in %d", every)
		made[0] += len(a)
	}
	require.Equal(t, map[int]bool{1: true, 4: true, 16: true}, shares, "every share is drawn")
	for what, n := range map[string]int{"answers": made[0], "with an id": ids[0], "empty": zero[0], "over 64 B": over64[0],
		"first name": names[0], "second name": names[1]} {
		require.Positive(t, n, what)
	}
	g := NewAnswerGen(1, "a0e0.1")
	for range 200 {
		if sd, ok := g.Next(1); ok {
			require.Zero(t, sd.Name, "one name")
		}
	}
}
