// Package mix draws the soak's operations: the seeded mix of sends one stream (a sender
// engine and a target) makes. It is pure (no I/O, no clock, no engine), so that the same
// seed drives both `twosided soak`'s processes and the peer machines' deterministic
// simulation in the notify package's tests: a violation the soak finds replays there.
package mix

import (
	"hash/fnv"
	"math/rand/v2"
	"strings"
)

// Seeded returns a generator for seed and the parts that name its use (a stream's ends,
// "faults", ...): the same parts, the same numbers, on every run.
func Seeded(seed uint64, parts ...string) *rand.Rand {
	h := fnv.New64a()
	_, _ = h.Write([]byte(strings.Join(parts, "\x00")))
	return rand.New(rand.NewPCG(seed, h.Sum64()))
}

// Mix bounds what the generators draw.
type Mix struct {
	// MaxSize: the largest message, name excluded (the engines' limit less the name).
	MaxSize int
	// MaxWindow: the largest SendNotifyAsync window.
	MaxWindow int
	// OneName: every send uses the target's first name (host:port); otherwise each send
	// picks host:port or localhost:port, two names of one peer that share its order.
	OneName bool
}

// Send is one notify of an op.
type Send struct {
	P    uint64 `json:"p"`
	Size int    `json:"n,omitempty"`
	// Name picks Names[Name] for the first try; each retry takes the next name.
	Name int `json:"name,omitempty"`
	// ID: the notify carries Notify.ID, so a maybe-delivered result is retried.
	ID      bool `json:"id,omitempty"`
	Retries int  `json:"r,omitempty"`
	// DeadlineMS bounds each SendNotify call (SendNotifyAsync has the engine's 30 s).
	DeadlineMS int `json:"dl,omitempty"`
}

// Op is one operation of a stream: Sends one by one with SendNotify (Window 1), or
// SendNotifyAsync Window at a time.
type Op struct {
	Window int
	Sends  []Send
}

// StreamGen draws the operations of one stream: SendNotify one by one or SendNotifyAsync
// windows, sizes from 0 to MaxSize, either name of the target, Notify.ID on most sends
// (those are retried with it when the result is unknown), short deadlines now and then.
type StreamGen struct {
	r   *rand.Rand
	mix Mix
	p   uint64
}

// NewStreamGen seeds the generator of the stream from sender `from` to target `to`.
func NewStreamGen(seed uint64, from, to string, m Mix) *StreamGen {
	m.MaxWindow = max(m.MaxWindow, 1)
	return &StreamGen{r: Seeded(seed, "stream", from, to), mix: m}
}

// size draws a message size: mostly small, some a few RECV buffers, rarely up to the limit.
func (g *StreamGen) size() int {
	var n int
	switch x := g.r.IntN(100); {
	case x < 45:
		n = g.r.IntN(65)
	case x < 75:
		n = 65 + g.r.IntN(4096-64)
	case x < 93:
		n = 4096 + g.r.IntN(60<<10)
	case x < 99:
		n = 64<<10 + g.r.IntN(192<<10)
	default:
		n = g.r.IntN(g.mix.MaxSize + 1)
	}
	return min(n, g.mix.MaxSize)
}

// Next returns the stream's next operation; payload numbers (Send.P) count from 1 over the
// stream.
func (g *StreamGen) Next() Op {
	op := Op{Window: 1}
	n := 1
	switch x := g.r.IntN(100); {
	case x < 55: // one SendNotify
	case x < 70: // a run of SendNotify
		n = 2 + g.r.IntN(7)
	default: // a SendNotifyAsync window
		op.Window = 1 + g.r.IntN(g.mix.MaxWindow)
		n = op.Window
	}
	for range n {
		g.p++
		s := Send{P: g.p, Size: g.size(), Name: g.r.IntN(2), ID: g.r.IntN(100) < 85, DeadlineMS: 2000 + g.r.IntN(8000)}
		if g.r.IntN(100) < 10 {
			s.DeadlineMS = 20 + g.r.IntN(500)
		}
		if s.ID {
			s.Retries = 1 + g.r.IntN(3)
		}
		if g.mix.OneName {
			s.Name = 0
		}
		op.Sends = append(op.Sends, s)
	}
	return op
}
