package notify

import (
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/oob"
)

// TestStarveStateRound: starveState.round declares a channel's peer dead only after
// starveDeadAfter (or three intervals, when longer) of rounds that each ran on time and
// each found the channel still without credit. A round that ran late (our own loop
// stalled) restarts the count, whatever its clock says, and so does a round in which
// credit came back; a late round never declares death by itself.
func TestStarveStateRound(t *testing.T) {
	const iv = 100 * time.Millisecond
	t0 := time.Unix(5000, 0)

	t.Run("on-time starvation declares death at starveDeadAfter", func(t *testing.T) {
		var s starveState
		nc := uint64(0)
		for i := 0; ; i++ {
			now := t0.Add(time.Duration(i) * iv)
			nc++
			dead := s.round(now, nc, iv, false)
			if now.Sub(t0) < starveDeadAfter {
				require.False(t, dead, "round %d (%v into starvation)", i, now.Sub(t0))
				continue
			}
			require.True(t, dead, "round %d: starved on time for %v", i, now.Sub(t0))
			require.Equal(t, t0, s.since, "starvation counted from its first round")
			require.Equal(t, int(starveDeadAfter/iv), i)
			break
		}
	})

	t.Run("a long interval needs three of them", func(t *testing.T) {
		const long = 2 * time.Second // 3*long = 6 s > starveDeadAfter
		var s starveState
		require.False(t, s.round(t0, 1, long, false))
		require.False(t, s.round(t0.Add(long), 2, long, false))
		require.False(t, s.round(t0.Add(2*long), 3, long, false), "4 s")
		require.False(t, s.round(t0.Add(5*time.Second+time.Millisecond), 4, long, false), "5 s < 3 intervals")
		require.True(t, s.round(t0.Add(3*long), 5, long, false), "6 s = 3 intervals")
	})

	t.Run("a late round restarts the count", func(t *testing.T) {
		var s starveState
		nc := uint64(1)
		require.False(t, s.round(t0, nc, iv, false))
		// Starved on time for 4.9 s.
		at := t0
		for at.Sub(t0) < starveDeadAfter-iv {
			at = at.Add(iv)
			nc++
			require.False(t, s.round(at, nc, iv, false))
		}
		// Our loop stalls 700 ms: the next round is late, long past starveDeadAfter since
		// the first starved round, and still without credit. Not dead: the peer could not
		// have answered while we did not run.
		at = at.Add(700 * time.Millisecond)
		nc++
		require.False(t, s.round(at, nc, iv, true), "a late round declared a peer dead")
		require.True(t, s.since.IsZero(), "a late round must restart the count")
		// The count starts again at the next on-time round.
		restart := at.Add(iv)
		for at = restart; at.Sub(restart) < starveDeadAfter; at = at.Add(iv) {
			nc++
			require.False(t, s.round(at, nc, iv, false), "%v after the restart", at.Sub(restart))
		}
		nc++
		require.True(t, s.round(at, nc, iv, false), "starved on time for starveDeadAfter after the stall")
	})

	t.Run("a late round alone, however late, is never death", func(t *testing.T) {
		var s starveState
		require.False(t, s.round(t0, 1, iv, false))
		require.False(t, s.round(t0.Add(time.Hour), 2, iv, true))
		require.False(t, s.round(t0.Add(time.Hour+iv), 3, iv, false), "first on-time round after it only starts the count")
	})

	t.Run("credit returned restarts the count", func(t *testing.T) {
		var s starveState
		require.False(t, s.round(t0, 1, iv, false))
		require.False(t, s.round(t0.Add(3*time.Second), 2, iv, false))
		require.False(t, s.round(t0.Add(3*time.Second+iv), 2, iv, false), "counter unchanged: credit came back")
		require.True(t, s.since.IsZero())
		require.False(t, s.round(t0.Add(6*time.Second), 3, iv, false), "starved again: the count starts over")
		require.False(t, s.round(t0.Add(10*time.Second), 4, iv, false))
		require.True(t, s.round(t0.Add(11*time.Second), 5, iv, false))
	})

	// The case: a live peer, keepalive 100 ms, and a local loop that stalls 700 ms
	// every so often. Seeded schedules of rounds: each round is on time or late (after a
	// stall), and finds credit returned or not. Against a model that states the rule
	// directly (dead iff the current run of on-time starved rounds spans
	// max(starveDeadAfter, 3*interval)), and: a peer is never declared dead unless such a
	// run exists.
	t.Run("seeded schedules against the rule", func(t *testing.T) {
		deaths, saved := 0, 0
		for seed := uint64(0); seed < 400; seed++ {
			rng := rand.New(rand.NewPCG(seed, 7))
			iv := []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 1 * time.Second, 3 * time.Second}[seed%4]
			bound := max(starveDeadAfter, 3*iv)
			stallEvery := 2 + rng.IntN(80) // rounds between two stalls of our loop
			stallsOften := time.Duration(stallEvery)*iv <= bound
			var s starveState
			nc := uint64(0)
			now := t0
			var runStart, naiveStart time.Time // first starved round of the current run: on time / ignoring lateness
			seedDeaths, naiveDeaths := 0, 0
			for i := 0; i < 600; i++ {
				late := i > 0 && i%stallEvery == 0
				if late {
					now = now.Add(iv + 700*time.Millisecond + time.Duration(rng.IntN(3000))*time.Millisecond)
				} else {
					now = now.Add(iv)
				}
				starved := rng.IntN(100) < 97
				if starved {
					nc++
				}
				dead := s.round(now, nc, iv, late)
				var want bool
				switch {
				case !starved || late:
					runStart = time.Time{}
				case runStart.IsZero():
					runStart = now
				default:
					want = now.Sub(runStart) >= bound
				}
				switch {
				case !starved:
					naiveStart = time.Time{}
				case naiveStart.IsZero():
					naiveStart = now
				case now.Sub(naiveStart) >= bound:
					naiveDeaths++
					naiveStart = time.Time{}
				}
				require.Equal(t, want, dead, "seed %d round %d (interval %v, late %v, starved %v)", seed, i, iv, late, starved)
				if late {
					require.False(t, dead, "seed %d round %d: a stalled local loop declared a peer dead", seed, i)
				}
				if dead {
					seedDeaths++
					s = starveState{noCredit: nc} // the channel is closed; a new one starts fresh
					runStart = time.Time{}
				}
			}
			if stallsOften {
				// Our loop stalls more often than the bound: every run of on-time rounds is
				// shorter than it, so the peer is never declared dead.
				require.Zero(t, seedDeaths, "seed %d: stalls every %d rounds of %v", seed, stallEvery, iv)
				if naiveDeaths > 0 {
					saved++ // a rule that ignored lateness would have declared it dead
				}
			}
			deaths += seedDeaths
		}
		// Both outcomes occur across the schedules, so the checks above mean something.
		require.NotZero(t, deaths, "no schedule starved long enough on time")
		require.NotZero(t, saved, "no schedule in which lateness is what kept the peer alive")
	})
}

// TestStarveStateDryStep: a channel found dry (no credit, nothing on the wire, sends
// waiting) at a half-step has its peer probed over OOB, one probe at a time, and again at
// every dry half-step after. Nothing here depends on the keepalive's own rounds, its
// no-credit count, or frames the peer sent before it died.
func TestStarveStateDryStep(t *testing.T) {
	var s starveState
	require.False(t, s.dryStep(false), "credit, or nothing waiting: no probe")
	require.True(t, s.dryStep(true), "dry: probed at once")
	s.probing = true
	require.False(t, s.dryStep(true), "one probe at a time")
	s.probing = false
	require.True(t, s.dryStep(true), "still dry: probed again")
	s.since = time.Time{}
	require.True(t, s.dryStep(true), "whatever the no-credit rule's count")
}

// TestProbeFinding: only an answer that shows the engine of the pair gone declares it dead:
// a refused connection (nobody listens), a refusal for the pair's token (another engine at
// the address), a closing peer. An answer, a timeout, a busy or broken connection prove
// nothing, and the channel is left to the no-credit rule.
func TestProbeFinding(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		dead bool
	}{
		{"answered", nil, false},
		{"refused connection", fmt.Errorf("%w (%w): 127.0.0.1:1: connect: %w", oob.ErrPeerUnreachable, oob.ErrNotSent, syscall.ECONNREFUSED), true},
		{"another engine", fmt.Errorf("oob: notify: %w", &oob.RefusedError{Code: oob.RefuseAuth, Msg: "ts_to: not this engine's session"}), true},
		{"closing", &oob.RefusedError{Code: oob.RefuseClosed}, true},
		{"timeout", fmt.Errorf("%w: no reply within RequestTimeout", oob.ErrTimeout), false},
		{"busy", &oob.RefusedError{Code: oob.RefuseBusy}, false},
		{"broken connection", fmt.Errorf("%w: read: %w", oob.ErrPeerUnreachable, syscall.ECONNRESET), false},
		{"limit", &oob.RefusedError{Code: oob.RefuseLimit}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.dead, probeFinding(c.err) != "", "probeFinding(%v) = %q", c.err, probeFinding(c.err))
		})
	}
}

// TestLiteralName: the probe goes to a literal address of the peer, whichever of its names
// came first; a peer known only by host names is not probed (resolving would block the
// loop).
func TestLiteralName(t *testing.T) {
	for _, tc := range []struct {
		names []string
		adv   string
		want  string
	}{
		{[]string{"localhost:7", "127.0.0.1:7"}, "", "127.0.0.1:7"},
		{[]string{"127.0.0.1:7", "localhost:7"}, "", "127.0.0.1:7"},
		{[]string{"[::1]:7"}, "", "[::1]:7"},
		{[]string{"node1:7"}, "10.0.0.1:7", "10.0.0.1:7"},
		{[]string{"node1:7"}, "node1:7", ""},
		{nil, "", ""},
	} {
		require.Equal(t, tc.want, literalName(&peerEntry{names: tc.names, adv: tc.adv}), "names %v, advertised %q", tc.names, tc.adv)
	}
}
