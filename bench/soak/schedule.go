package soak

import (
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/twosided/twosided/bench/soak/mix"
)

// The schedule: one seed gives every stream its operations and the injector its faults,
// the same on every run. A stream's generator is seeded from the run's seed and the
// stream's ends, so the operations of a stream do not depend on how fast other streams go;
// which operations run before the soak's duration ends, and how they interleave, does.

// Fault kinds, each switchable with --faults.
const (
	FaultKill   = "kill"   // SIGKILL an agent process and restart it under the same addresses
	FaultStop   = "stop"   // SIGSTOP an agent process, SIGCONT it later
	FaultReopen = "reopen" // Close one engine mid-stream and open it again on its address
	FaultPause  = "pause"  // one engine's consumer takes nothing for a while (backpressure)
	FaultSlow   = "slow"   // one engine's consumer waits per notify
	// FaultDevice: softverbs' device faults through its control file (SOFTVERBS_CTL) for a
	// while: the port down, RTR delayed, or a share of packets dropped. Only with the verbs
	// provider on softverbs; elsewhere it is skipped.
	FaultDevice = "device"
	// FaultCut: an agent cuts every OOB TCP connection of its engines (shutdown(2) of the
	// sockets, both ways), as a reset path or a middlebox would; the engines reconnect.
	FaultCut = "cut"
	// FaultHostile: a hostile client, outside every engine, attacks one engine's OOB port
	// for a while: a flood of channel handshakes from other addresses (sessions and QPNs
	// nobody owns), notifies forged in a live engine's name (its address, invented
	// sessions, seqs and tokens), or bytes that are no protocol (garbage, huge lengths,
	// truncated frames, bad JSON, idle connections). Nothing forged may be delivered, and
	// the contract must hold for everyone else.
	FaultHostile = "hostile"
)

// AllFaults are the local faults, all on by default.
var AllFaults = []string{FaultKill, FaultStop, FaultReopen, FaultPause, FaultSlow, FaultDevice, FaultCut, FaultHostile}

// KillPaused: a kill whose agent's consumers pause first (Fault.US microseconds before).
const KillPaused = "paused"

// Hostile variants.
const (
	HostileFlood   = "flood"
	HostileForged  = "forged"
	HostileGarbage = "garbage"
)

var hostileVariants = [...]string{HostileFlood, HostileForged, HostileGarbage}

// deviceFaults: what a device fault writes to the control file, and what ends it.
var deviceFaults = [...][2]string{
	{"port=down", "port=up"},
	{"rtr_delay_ms=500", "rtr_delay_ms=0"},
	{"drop_pct=10", "drop_pct=0"},
	{"fatal=1", "fatal=0"},
}

// Consumers: how an engine's application takes its notifies.
const (
	ConsumeRecv    = "recv"    // a Recv loop
	ConsumeHandler = "handler" // WithHandler, on the reactor thread
	ConsumePoll    = "poll"    // GetNotifies in a loop
)

func seeded(seed uint64, parts ...string) *rand.Rand { return mix.Seeded(seed, parts...) }

// Mix bounds what the generators draw (package mix).
type Mix = mix.Mix

// StreamGen draws the operations of one stream (a sender engine incarnation and a target
// slot) with package mix's generator, the one the peer machines' simulation replays.
type StreamGen struct {
	g  *mix.StreamGen
	op uint64
}

// NewStreamGen seeds the generator of the stream from sender engine `from` to slot `to`.
func NewStreamGen(seed uint64, from, to string, m Mix) *StreamGen {
	return &StreamGen{g: mix.NewStreamGen(seed, from, to, m)}
}

// Next returns the stream's next operation (a CmdOp without Eng, Slot and Names, which the
// driver fills in).
func (g *StreamGen) Next() Event {
	g.op++
	o := g.g.Next()
	return Event{K: CmdOp, Op: g.op, Window: o.Window, Sends: o.Sends}
}

// Consumer draws how incarnation inc of slot takes its notifies.
func Consumer(seed uint64, slot string, inc int) string {
	return [...]string{ConsumeRecv, ConsumeHandler, ConsumePoll}[seeded(seed, "consumer", EngineID(slot, inc)).IntN(3)]
}

// Receiver draws whether engine incarnation id only receives: one in five sends nothing,
// as many receivers in a cluster do, so that a peer learns of its restart from nothing
// but the path (no handshake of its own comes to tell).
func Receiver(seed uint64, id string) bool {
	return seeded(seed, "receiver", id).IntN(5) == 0
}

// RecvQueue draws incarnation inc of slot's receive queue bound (WithRecvQueue): the
// default (0) or a short one that a paused consumer fills within a second, so that
// backpressure (credits stopped, OOB answered busy) is part of the mix.
func RecvQueue(seed uint64, slot string, inc int) int {
	return [...]int{0, 0, 256, 32}[seeded(seed, "recvqueue", EngineID(slot, inc)).IntN(4)]
}

// Answering draws whether incarnation inc of slot answers from its handler: three in four
// of the incarnations whose consumer is the handler and that send (a receiver only sends
// nothing, answers included).
func Answering(seed uint64, slot string, inc int) bool {
	id := EngineID(slot, inc)
	return Consumer(seed, slot, inc) == ConsumeHandler && !Receiver(seed, id) && seeded(seed, "answering", id).IntN(4) != 0
}

// MaxAnswerSize bounds an answer's message: answers are small.
const MaxAnswerSize = 512

// AnswerGen draws, notify by notify in the order its handler takes them, what an answering
// incarnation does with each: whether it answers, and the answer. Each incarnation draws
// its share once: every notify (an echo), one in four, or one in sixteen.
type AnswerGen struct {
	r     *rand.Rand
	every int
}

// NewAnswerGen seeds the answers of engine incarnation id.
func NewAnswerGen(seed uint64, id string) *AnswerGen {
	r := seeded(seed, "answers", id)
	return &AnswerGen{r: r, every: [...]int{1, 4, 16}[r.IntN(3)]}
}

// Every is the incarnation's share: it answers one notify in Every.
func (g *AnswerGen) Every() int { return g.every }

// Next draws what the handler does with the next notify it takes from a sender with names
// names: ok says whether it answers; the answer's Size (0 to MaxAnswerSize, mostly up to
// 64 B), ID (half of them carry a Notify.ID) and Name (which of the names). P, Retries and
// DeadlineMS are not drawn: an answer is SendNotifyAsync (the engine's 30 s), never retried.
func (g *AnswerGen) Next(names int) (sd Send, ok bool) {
	if g.r.IntN(g.every) != 0 {
		return Send{}, false
	}
	sd.Size = g.r.IntN(65)
	if g.r.IntN(4) == 0 {
		sd.Size = g.r.IntN(MaxAnswerSize + 1)
	}
	sd.ID = g.r.IntN(2) == 0
	sd.Name = g.r.IntN(max(names, 1))
	return sd, true
}

// Fault is one injection: Kind on Agent (kill, stop) or on engine Slot (reopen, pause,
// slow), lasting MS milliseconds (stop, pause; the time down for kill) or US microseconds
// per notify (slow); the next one comes AfterMS later.
type Fault struct {
	Kind string
	// Device, End: the control file's line that starts a device fault, and the one that
	// ends it.
	Device, End string
	// Variant: what a hostile client does (flood, forged, garbage).
	Variant string
	Agent   int
	Slot    string
	MS, US  int
	AfterMS int
}

// FaultGen draws the fault schedule of a run.
type FaultGen struct {
	r       *rand.Rand
	kinds   []string
	agents  int
	engines int
	everyMS int
}

// NewFaultGen seeds the injector: kinds (a subset of AllFaults; none: no faults) on
// agents×engines slots, one every everyMS on average.
func NewFaultGen(seed uint64, kinds []string, agents, engines, everyMS int) *FaultGen {
	k := slices.Clone(kinds)
	slices.Sort(k)
	return &FaultGen{r: seeded(seed, "faults"), kinds: k, agents: agents, engines: engines, everyMS: max(everyMS, 1)}
}

// Next draws the next fault; ok is false when no kind is on.
func (g *FaultGen) Next() (f Fault, ok bool) {
	if len(g.kinds) == 0 {
		return Fault{}, false
	}
	f.Kind = g.kinds[g.r.IntN(len(g.kinds))]
	f.Agent = g.r.IntN(g.agents)
	f.Slot = SlotName(f.Agent, g.r.IntN(g.engines))
	switch f.Kind {
	case FaultKill:
		f.MS = g.r.IntN(1500)
		if g.r.IntN(3) == 0 {
			// Killed while it applies backpressure: its consumers pause first, long enough
			// for short queues to fill and credits to stop.
			f.Variant, f.US = KillPaused, 1000*(500+g.r.IntN(1500))
		}
	case FaultStop:
		f.MS = 100 + g.r.IntN(2000)
	case FaultPause:
		f.MS = 100 + g.r.IntN(3000)
	case FaultSlow:
		f.US = 100 + g.r.IntN(5000)
		f.MS = 500 + g.r.IntN(3000)
	case FaultDevice:
		d := deviceFaults[g.r.IntN(len(deviceFaults))]
		f.Device, f.End = d[0], d[1]
		f.MS = 200 + g.r.IntN(2000)
	case FaultHostile:
		f.Variant = hostileVariants[g.r.IntN(len(hostileVariants))]
		f.MS = 200 + g.r.IntN(2000)
	}
	f.AfterMS = g.everyMS/2 + g.r.IntN(g.everyMS)
	return f, true
}

// ParseFaults reads a --faults list: "all", "none" or kinds separated by commas.
func ParseFaults(s string) ([]string, error) {
	switch s {
	case "all", "":
		return slices.Clone(AllFaults), nil
	case "none":
		return nil, nil
	}
	var out []string
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		if !slices.Contains(AllFaults, k) {
			return nil, &faultError{k}
		}
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out, nil
}

type faultError struct{ kind string }

func (e *faultError) Error() string {
	return "--faults: unknown fault " + strings.TrimSpace(e.kind) + " (want all, none or a list of " + strings.Join(AllFaults, ",") + ")"
}
