// The order in which the peer machine visits its tables where a visit acts: entries by
// their making, channels and requests by id, names by name. Go's maps iterate in a random
// order; a loop over one that emits actions or changes state would make one input give
// different action sequences, and runs of the simulation (or a fuzz input) would not
// reproduce. Those loops (tick, closeAll, hintPort, readvertised) visit a sorted snapshot
// instead and skip what an earlier visit of the same loop removed. They run on timers and
// handshakes, not per notify.

package notify

import (
	"cmp"
	"maps"
	"slices"
)

// peersInOrder: the peer entries, oldest first.
func (m *peerMachine) peersInOrder() []*peerEntry {
	ps := slices.Collect(maps.Values(m.peers))
	slices.SortFunc(ps, func(a, b *peerEntry) int { return cmp.Compare(a.pair, b.pair) })
	return ps
}

// chansInOrder: the channels by id.
func (m *peerMachine) chansInOrder() []*chanEntry {
	cs := slices.Collect(maps.Values(m.chans))
	slices.SortFunc(cs, func(a, b *chanEntry) int { return cmp.Compare(a.id, b.id) })
	return cs
}

// reqsInOrder: the request ids, oldest first.
func (m *peerMachine) reqsInOrder() []reqID { return slices.Sorted(maps.Keys(m.reqs)) }

// namesInOrder: the name entries by name.
func (m *peerMachine) namesInOrder() []*nameEntry {
	ns := slices.Collect(maps.Values(m.names))
	slices.SortFunc(ns, func(a, b *nameEntry) int { return cmp.Compare(a.name, b.name) })
	return ns
}
