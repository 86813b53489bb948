package soak

import (
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/notify"
)

// TestStalledOn: a channel to the watched engine (by either of its names) that is up with
// no credit but the reserve, nothing in flight and sends waiting is a stall; a channel
// with credit, with a SEND on the wire, with nothing waiting, not up, or to another
// engine is not.
func TestStalledOn(t *testing.T) {
	names := []string{"127.0.0.1:4000", "localhost:4000"}
	peer := func(name string, state string, c *notify.ChannelStats) notify.PeerStats {
		return notify.PeerStats{Peer: name, State: state, Names: []string{name}, Channel: c}
	}
	dry := &notify.ChannelStats{CreditAvail: 1, InFlight: 0, Pending: 7}
	for name, tc := range map[string]struct {
		p    notify.PeerStats
		want bool
	}{
		"dry":                  {peer("127.0.0.1:4000", "up", dry), true},
		"dry, by localhost":    {peer("localhost:4000", "up", dry), true},
		"dry, an alias":        {notify.PeerStats{Peer: "10.0.0.1:4000", State: "up", Names: []string{"localhost:4000"}, Channel: dry}, true},
		"no credit at all":     {peer("127.0.0.1:4000", "up", &notify.ChannelStats{Pending: 1}), true},
		"credit left":          {peer("127.0.0.1:4000", "up", &notify.ChannelStats{CreditAvail: 2, Pending: 7}), false},
		"a SEND on the wire":   {peer("127.0.0.1:4000", "up", &notify.ChannelStats{CreditAvail: 1, InFlight: 1, Pending: 7}), false},
		"nothing waits":        {peer("127.0.0.1:4000", "up", &notify.ChannelStats{CreditAvail: 1}), false},
		"not up":               {peer("127.0.0.1:4000", "connecting", dry), false},
		"no channel":           {peer("127.0.0.1:4000", "oob", nil), false},
		"another engine's":     {peer("127.0.0.1:4001", "up", dry), false},
		"another host, a port": {peer("10.0.0.1:4000", "up", dry), false},
	} {
		t.Run(name, func(t *testing.T) {
			what, ok := stalledOn(notify.Stats{Peers: []notify.PeerStats{peer("127.0.0.1:5000", "up", dry), tc.p}}, names)
			require.Equal(t, tc.want, ok, what)
			if ok {
				require.Contains(t, what, "in flight")
			}
		})
	}
}

type fakeRun struct{ sigs []syscall.Signal }

func (f *fakeRun) Signal(s syscall.Signal) error { f.sigs = append(f.sigs, s); return nil }
func (f *fakeRun) Device(string) error           { return nil }
func (f *fakeRun) Wait() error                   { return nil }

// TestDriverKillsAtStall: the paused kill waits for a stall; the first sender that reports
// one has the receiver killed at once (restarted without delay), a second report is
// ignored, and once the receiver's new engine is up, that sender's pair with it is judged
// by StallBound while the other pairs keep RecoveryBound. The times are set an hour back,
// so that nothing depends on how fast the test runs.
func TestDriverKillsAtStall(t *testing.T) {
	seed := uint64(1)
	for Receiver(seed, "a0e0.1") || Receiver(seed, "a1e0.2") {
		seed++
	}
	d := &driver{
		cfg: Config{Seed: seed, RecoveryBound: 2 * time.Hour, StallBound: time.Minute, Transports: []string{notify.TransportRDMATwoSided}},
		c:   NewChecker(), addrs: map[string]string{"a0e0": "127.0.0.1:4000", "a1e0": "127.0.0.1:4001"},
		incs: map[string]int{}, live: map[string]string{}, tr: map[string]string{}, streams: map[streamKey]*driverStream{},
		faults: map[string]int{}, restarts: map[string]time.Time{}, reach: map[reachPair]time.Time{},
		stallWatch: map[int]int{}, stallKills: map[string][]string{}, stallReach: map[reachPair]bool{},
	}
	runs := []*fakeRun{{}, {}}
	for i, slot := range []string{"a0e0", "a1e0"} {
		d.agents = append(d.agents, &agentProc{idx: i, gen: 1, run: runs[i], alive: true, slots: []string{slot}, in: make(chan []byte, 1024)})
		d.incs[slot] = 1
		d.step(Event{K: KindBegin, Slot: slot, Inc: 1})
		d.handle(agentMsg{agent: i, gen: 1, ev: Event{K: KindUp, Eng: EngineID(slot, 1), Slot: slot, Addr: d.addrs[slot]}})
	}
	d.running = true

	// No watch on agent 0: its stall report kills nothing.
	d.stalled(Event{K: KindStalled, Eng: "a1e0.1", Slot: "a0e0", Err: "x"})
	require.Empty(t, runs[0].sigs)

	victim := d.agents[1]
	victim.downMS = 700
	d.stallWatch[1] = victim.gen
	d.stalled(Event{K: KindStalled, Eng: "a0e0.1", Slot: "a1e0", Err: "peer 127.0.0.1:4001: credit 1, 0 in flight, 5 waiting"})
	require.Equal(t, []syscall.Signal{syscall.SIGKILL}, runs[1].sigs)
	require.False(t, victim.alive)
	require.Zero(t, victim.downMS, "restarted at once")
	require.Equal(t, 1, d.stalledKills)
	d.stalled(Event{K: KindStalled, Eng: "a0e0.1", Slot: "a1e0", Err: "again"})
	require.Len(t, runs[1].sigs, 1, "killed once")
	// Until the pair is judged, its sender is neither killed nor stopped.
	d.inject(Fault{Kind: FaultKill, Agent: 0, Slot: "a0e0"})
	d.inject(Fault{Kind: FaultStop, Agent: 0, Slot: "a0e0", MS: 100})
	require.Empty(t, runs[0].sigs)

	// The restart: incarnation 2 comes up.
	victim.gen, victim.alive, victim.in = 2, true, make(chan []byte, 1024)
	d.incs["a1e0"] = 2
	d.step(Event{K: KindBegin, Slot: "a1e0", Inc: 2})
	d.handle(agentMsg{agent: 1, gen: 2, ev: Event{K: KindUp, Eng: "a1e0.2", Slot: "a1e0", Addr: d.addrs["a1e0"]}})
	stalledPair, back := reachPair{"a0e0", "a1e0"}, reachPair{"a1e0", "a0e0"}
	require.True(t, d.stallReach[stalledPair])
	require.False(t, d.stallReach[back])
	require.Contains(t, d.reach, back)

	hourAgo := time.Now().Add(-time.Hour)
	d.reach[stalledPair], d.reach[back] = hourAgo, hourAgo
	d.judgeRecovery()
	require.Equal(t, 1, d.c.Violations[VSlowRecovery], "%+v", d.c.Details)
	require.Contains(t, d.c.Details[0].Detail, "waited for credit")
	require.NotContains(t, d.reach, stalledPair)
	require.Contains(t, d.reach, back, "judged by RecoveryBound, not yet past")
	require.False(t, d.stallHeld(0), "judged: its sender may be killed again")

	// An ack of the other pair ends its wait and is counted in the reach figures.
	d.handle(agentMsg{agent: 1, gen: 2, ev: Event{K: KindStart, Eng: "a1e0.2", Slot: "a0e0", S: 1, P: 1}})
	d.handle(agentMsg{agent: 1, gen: 2, ev: Event{K: KindResult, Eng: "a1e0.2", Slot: "a0e0", S: 1, P: 1, Class: ClassOK}})
	require.NotContains(t, d.reach, back)
	require.Len(t, d.reachTimes, 1)
	require.Empty(t, d.stallTimes)

	// An ack that comes past the pair's bound is judged when it comes (while the run winds
	// down, no tick judges).
	d.reach[stalledPair], d.stallReach[stalledPair] = hourAgo, true
	d.handle(agentMsg{agent: 0, gen: 1, ev: Event{K: KindStart, Eng: "a0e0.1", Slot: "a1e0", S: 1, P: 1}})
	d.handle(agentMsg{agent: 0, gen: 1, ev: Event{K: KindResult, Eng: "a0e0.1", Slot: "a1e0", S: 1, P: 1, Class: ClassOK}})
	require.Equal(t, 2, d.c.Violations[VSlowRecovery], "%+v", d.c.Details)
	require.Len(t, d.stallTimes, 1)
	require.Empty(t, d.reach)
	require.Empty(t, d.stallReach)
}
