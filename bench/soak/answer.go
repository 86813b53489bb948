package soak

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twosided/twosided/notify"
)

// A handler's answers. An incarnation whose consumer is the handler may answer what it
// takes (Answering, AnswerGen): from inside the handler, on the engine's loop thread, it
// calls SendNotifyAsync to the engine whose notify it took, by one of that engine's names,
// so that the engine's send from a handler (run in the handler's turn when nothing is
// queued before it) meets every fault. The answers of one incarnation to one slot are a
// stream of their own: its calls are numbered in the order the handler made them (the
// payload is the call number), several may be out at once, and the checker judges it as
// any stream (start before the call, result from done, deliver where it lands). Its
// order is judged within it, not against the scheduled stream of the same pair, whose
// calls another goroutine makes meanwhile.

// maxAnswersOut bounds an incarnation's answers without a result: at it (a peer stopped,
// or its queue full) a notify is not answered, and no call is reported.
const maxAnswersOut = 64

// answerer makes one incarnation's answers.
type answerer struct {
	ae *agentEngine
	// mu guards the draws and the call numbers. The handler takes it, and holds it across
	// no call into the engine; nothing that waits for the loop takes it.
	mu            sync.Mutex
	g             *AnswerGen
	s             map[string]uint64 // by target slot: the last answer's call number
	out           atomic.Int32      // answers without a result
	none          chan struct{}     // a token each time out drops to 0 (closed waits on it)
	made, skipped atomic.Uint64     // answers made; notifies not answered at the bound
}

func newAnswerer(ae *agentEngine) *answerer {
	return &answerer{ae: ae, g: NewAnswerGen(ae.a.spec.Seed, ae.id), s: map[string]uint64{}, none: make(chan struct{}, 1)}
}

// answer answers delivery ev (a notify the handler took) when the draw says so. Handler
// only: on the loop thread, it waits for nothing the loop does (its event lines are queued
// for the writer, the bound is an atomic).
func (an *answerer) answer(ev Event) {
	if ev.K != KindDeliver || ev.Bad != "" || ev.Answer {
		return // answers are not answered
	}
	slot := slotOf(ev.From)
	names := an.ae.a.spec.Names[slot]
	if slot == an.ae.slot || len(names) == 0 {
		return
	}
	an.mu.Lock()
	sd, ok := an.g.Next(len(names)) // drawn for every notify, whatever the bound: a draw per delivery
	if ok && an.out.Load() >= maxAnswersOut {
		an.skipped.Add(1)
		ok = false
	}
	if ok {
		an.s[slot]++
		sd.P = an.s[slot]
	}
	an.mu.Unlock()
	if !ok {
		return
	}
	an.out.Add(1)
	an.made.Add(1)
	a := an.ae.a
	msg := make([]byte, sd.Size)
	FillPayload(msg, sd.P)
	n := notify.Notify{Name: AnswerName(an.ae.id, sd.P, sd.P, sd.Size), Msg: msg}
	if sd.ID {
		n.ID = "answer/" + strconv.FormatUint(sd.P, 10) // never one of the scheduled calls' ids
	}
	c := &answerCall{an: an, slot: slot, s: sd.P}
	a.out.put(Event{K: KindStart, Eng: an.ae.id, Slot: slot, S: c.s, P: c.s, From: ev.From, Answer: true})
	c.watch = a.calls.addAnswer(an.ae.id, slot, fmt.Sprintf("answer %d (SendNotifyAsync from the handler)", c.s), asyncBound)
	err := an.ae.e.SendNotifyAsync(names[sd.Name], n, c.done)
	c.returned.Store(true)
	if err != nil { // refused at once: done is never called
		c.finish(err)
	}
}

// answerCall is one answer under way.
type answerCall struct {
	an       *answerer
	slot     string
	s        uint64
	watch    uint64 // its entry in the agent's call watch
	returned atomic.Bool
	resolved atomic.Bool
}

// done is the answer's SendNotifyAsync callback: on the loop thread, after the call
// returned (the engine's word; a done that runs before is reported).
func (c *answerCall) done(err error) {
	if !c.returned.Load() {
		c.an.ae.a.out.put(Event{K: KindEarlyDone, Eng: c.an.ae.id, Slot: c.slot, S: c.s, P: c.s, Answer: true,
			Err: "done ran before SendNotifyAsync returned"})
	}
	c.finish(err)
}

func (c *answerCall) finish(err error) {
	a := c.an.ae.a
	ev := resultEvent(c.an.ae.id, c.slot, c.s, c.s, err)
	ev.Answer = true
	a.out.put(ev)
	if c.resolved.Swap(true) {
		return // a second result: reported, the checker counts it
	}
	a.calls.done(c.watch)
	if c.an.out.Add(-1) == 0 {
		select {
		case c.an.none <- struct{}{}:
		default:
		}
	}
}

// closed runs once the engine's Close returned: every answer has its result then (Close
// ends what is pending with ErrClosed, and no handler runs after it), unless Close was cut
// short and the engine stops in the background; then it waits, within the bound of an
// async send, for the results to come, so that the agent does not exit before them.
func (an *answerer) closed() {
	if an.out.Load() > 0 {
		bound := time.NewTimer(asyncBound)
		for wait := true; wait && an.out.Load() > 0; {
			select {
			case <-an.none:
			case <-bound.C:
				wait = false
			}
		}
		bound.Stop()
	}
	an.ae.a.log("%s: answered %d notifies from its handler (one in %d drawn), %d not at the bound of %d without a result, %d still without one",
		an.ae.id, an.made.Load(), an.g.Every(), an.skipped.Load(), maxAnswersOut, an.out.Load())
}
