package soak

import (
	"fmt"
	"sort"
)

// Violation kinds.
const (
	// VLost: a send returned nil and its notify was never delivered, and no incarnation of
	// its target that could have held it was killed.
	VLost = "lost"
	// VDuplicate: a payload delivered twice to one target (a call delivered twice, or a retry
	// with the same Notify.ID delivered beside its original).
	VDuplicate = "duplicate"
	// VReorder: a pair delivered a call after a later call of the same sender.
	VReorder = "reorder"
	// VDeliveredAfterFailure: a call whose send failed without ErrMaybeDelivered was delivered.
	VDeliveredAfterFailure = "delivered_after_failure"
	// VCorrupt: a payload arrived with another size or other bytes, or a name not the soak's.
	VCorrupt = "corrupt"
	// VHang: a call or a Close did not return within its bound.
	VHang = "hang"
	// VCrash: an agent exited on its own (an engine crashed it) or could not start again.
	VCrash = "crash"
	// VNoResult: a call of a sender that was never killed never returned.
	VNoResult = "no_result"
	// VPhantom: a delivery of a call its sender (never killed) did not make.
	VPhantom = "phantom"
	// VDoubleResult: a call returned twice (a SendNotifyAsync done called twice).
	VDoubleResult = "double_result"
	// VLeak: an agent's goroutines, fds or memory did not come back near their baseline
	// once the run's operations ended.
	VLeak = "leak"
	// VLostPastBound: more acknowledged notifies were lost with a killed receiver than it
	// could hold (its receive queue, a RECV ring per channel, and the deliveries its agent
	// had not yet written when it died).
	VLostPastBound = "lost_past_bound"
	// VSlowRecovery: a restarted engine was not reached (a notify to it acknowledged)
	// within the recovery bound of its coming up.
	VSlowRecovery = "slow_recovery"
	// VEarlyDone: the done of a SendNotifyAsync made from a handler (an answer) ran before
	// the call returned.
	VEarlyDone = "early_done"
)

// Allowance kinds: what the contract allows, counted.
const (
	// ALostReceiverKilled: an acknowledged notify not delivered whose target incarnation
	// may have been the one killed (README: a receiver crash loses what it held).
	ALostReceiverKilled = "lost_receiver_killed"
	// AUnreportedStart: a delivery of a call whose start line died with its killed sender.
	AUnreportedStart = "unreported_start_sender_killed"
	// ANewIncarnation: a payload delivered by one incarnation of its target and, retried
	// with the same Notify.ID after an unknown outcome, again by a later one: ids live in
	// the receiving engine's memory, and a reopened or restarted engine is a new peer.
	ANewIncarnation = "redelivered_to_new_incarnation"
)

// Bounds of what the checker keeps.
const (
	keepCalls   = 8192 // resolved calls kept per stream behind the newest
	historyLen  = 48   // events kept per stream for a report
	scheduleLen = 64   // parent actions kept for a report
	maxDetails  = 20   // violations reported in full (and the first of each kind past them)
	numKinds    = 16   // at least the number of violation kinds: past maxDetails, one detail of each
)

// Violation is one breach of the contract, with what led to it.
type Violation struct {
	Kind   string `json:"kind"`
	Step   uint64 `json:"step"`
	Stream string `json:"stream"` // "<sender engine> -> <target slot>"
	Detail string `json:"detail"`
	// History: the stream's last events (its operations among them); Schedule: the last
	// faults, begins, kills and closes of the run, each "step N: ...".
	History  []string `json:"history,omitempty"`
	Schedule []string `json:"schedule,omitempty"`
	// First: the stream's first events, when it had more than History keeps (a new
	// engine's first contact); ScheduleAtFirst: the schedule as it stood at its first.
	First           []string `json:"first,omitempty"`
	ScheduleAtFirst []string `json:"schedule_at_first,omitempty"`
}

// Checker judges a soak's history. Feed it every event with Step in the order the parent
// reads or makes them, then call Finish once. It does no I/O and reads no clock.
type Checker struct {
	step    uint64
	slots   map[string]map[int]*incarnation
	streams map[streamKey]*stream
	bySend  map[string][]streamKey // sender engine -> its streams
	pairs   map[pairKey]uint64     // (sender engine, receiver engine) -> last call delivered
	sched   ring

	// Counts. Held: the killed incarnations whose losses were held to their bound (their
	// agent's count of deliveries known), with the notifies they lost and the largest
	// share of a bound one of them used, in percent.
	Calls, Acked, Maybe, Failed, Delivered, Checked uint64
	Answers                                         AnswerStats // the answer streams' share of those (Engines: the driver's)
	Held                                            HeldStats
	mostUsed                                        float64 // Held.MostUsed, unrounded
	Violations                                      map[string]int
	Allowances                                      map[string]int
	Details                                         []Violation
	finished                                        bool
}

type incarnation struct {
	begin, end uint64 // steps; end 0: alive
	killed     bool
	// What it may hold when killed (KindBegin): its receive queue bound, its consumer, its
	// channels' RECV ring (0: none).
	queue, ring int
	consumer    string
	// Delivery events its agent put (KindTaken; known: read) and the parent read.
	taken, reported uint64
	takenKnown      bool
	// Acknowledged notifies lost that only it could have held, by sender, and the first.
	lost      int
	lostFrom  map[string]int
	firstLost string
}

// HeldStats sums the killed incarnations whose losses were held to their bound.
type HeldStats struct {
	Checked  int    `json:"checked"`
	Lost     int    `json:"lost"`
	MostUsed int    `json:"most_used_pct"`
	Most     string `json:"most_used,omitempty"` // that incarnation's figures
}

// streamKey is a stream: a sender engine's calls to a slot, its scheduled ones (the
// operations the parent dispatches, made one operation at a time by one worker) or, with
// answer, the answers its handler made (answer.go; several out at once, no operation).
// Each has its own call numbers and payloads, and its own order per pair.
type streamKey struct {
	from, slot string
	answer     bool
}

// key is the stream of a start, result or early_done.
func key(ev Event) streamKey { return streamKey{from: ev.Eng, slot: ev.Slot, answer: ev.Answer} }

func (k streamKey) String() string {
	if k.answer {
		return k.from + " -> " + k.slot + " (answers)"
	}
	return k.from + " -> " + k.slot
}

// pairKey is the order of one stream towards one receiver engine.
type pairKey struct {
	from, to string
	answer   bool
}

type stream struct {
	calls     map[uint64]*call    // by call number
	failed    map[uint64]bool     // calls that failed definitely, kept past pruning
	delivered map[uint64]delivery // payload -> the call that delivered it, and where
	acked     map[uint64]ack      // payload -> acknowledged, not yet delivered
	ops       map[uint64]uint64   // op -> step of its dispatch
	floor     uint64              // calls below it were pruned
	maxS      uint64
	killed    bool // the sender was killed
	hist      ring
	first     []string // its first historyLen events
	schedAt   []string // the schedule at its first event
	noted     int      // events noted
}

type call struct {
	p, op uint64
	// after (an answer): the step at which the incarnation whose notify it answers began;
	// the answer was made after it, as a scheduled call after its operation's dispatch.
	after     uint64
	started   bool
	class     string // "" until its result
	delivered bool
}

type ack struct{ s, step, dispatch uint64 }

type delivery struct {
	s   uint64
	eng string
}

// NewChecker returns an empty checker.
func NewChecker() *Checker {
	return &Checker{
		slots:      map[string]map[int]*incarnation{},
		streams:    map[streamKey]*stream{},
		bySend:     map[string][]streamKey{},
		pairs:      map[pairKey]uint64{},
		sched:      newRing(scheduleLen),
		Violations: map[string]int{},
		Allowances: map[string]int{},
	}
}

// Steps is the number of events fed so far.
func (c *Checker) Steps() uint64 { return c.step }

// Total is the number of violations found so far.
func (c *Checker) Total() int {
	n := 0
	for _, v := range c.Violations {
		n += v
	}
	return n
}

func (c *Checker) stream(k streamKey) *stream {
	st := c.streams[k]
	if st == nil {
		st = &stream{
			calls: map[uint64]*call{}, failed: map[uint64]bool{},
			acked: map[uint64]ack{}, ops: map[uint64]uint64{}, hist: newRing(historyLen),
			delivered: map[uint64]delivery{},
		}
		c.streams[k] = st
		c.bySend[k.from] = append(c.bySend[k.from], k)
	}
	return st
}

func (c *Checker) inc(slot string, inc int) *incarnation {
	m := c.slots[slot]
	if m == nil {
		m = map[int]*incarnation{}
		c.slots[slot] = m
	}
	in := m[inc]
	if in == nil {
		in = &incarnation{begin: c.step}
		m[inc] = in
	}
	return in
}

func (c *Checker) violate(kind string, k streamKey, detail string) {
	c.Violations[kind]++
	// The first maxDetails in full, and past them the first of each other kind, so that a
	// flood of one kind hides no other.
	if len(c.Details) >= maxDetails && (c.Violations[kind] > 1 || len(c.Details) >= maxDetails+numKinds) {
		return
	}
	v := Violation{Kind: kind, Step: c.step, Stream: k.String(), Detail: detail, Schedule: c.sched.lines()}
	if st := c.streams[k]; st != nil {
		v.History = st.hist.lines()
		if st.noted > historyLen {
			v.First, v.ScheduleAtFirst = st.first, st.schedAt
		}
	}
	c.Details = append(c.Details, v)
}

func (c *Checker) note(st *stream, format string, args ...any) {
	line := fmt.Sprintf("step %d: ", c.step) + fmt.Sprintf(format, args...)
	st.hist.add(line)
	if st.noted == 0 {
		st.schedAt = c.sched.lines()
	}
	if st.noted < historyLen {
		st.first = append(st.first, line)
	}
	st.noted++
}

// Step feeds one event.
func (c *Checker) Step(ev Event) {
	c.step++
	switch ev.K {
	case KindBegin:
		in := c.inc(ev.Slot, ev.Inc)
		in.begin, in.queue, in.ring, in.consumer = c.step, ev.Queue, ev.Ring, ev.Consumer
		c.sched.add(fmt.Sprintf("step %d: begin %s", c.step, EngineID(ev.Slot, ev.Inc)))
	case KindKill:
		in := c.inc(ev.Slot, ev.Inc)
		if in.end == 0 {
			in.end, in.killed = c.step, true
		}
		id := EngineID(ev.Slot, ev.Inc)
		for _, k := range c.bySend[id] {
			c.streams[k].killed = true
		}
		c.senderEnded(id)
		c.sched.add(fmt.Sprintf("step %d: kill -9 %s", c.step, id))
	case KindClosed:
		slot, n, err := ParseEngineID(ev.Eng)
		if err == nil {
			if in := c.inc(slot, n); in.end == 0 {
				in.end = c.step
			}
		}
		c.senderEnded(ev.Eng)
		c.sched.add(fmt.Sprintf("step %d: closed %s", c.step, ev.Eng))
	case KindUp:
		c.sched.add(fmt.Sprintf("step %d: up %s at %s", c.step, ev.Eng, ev.Addr))
	case KindFault:
		c.sched.add(fmt.Sprintf("step %d: fault %s", c.step, ev.Err))
	case KindTaken:
		if slot, n, err := ParseEngineID(ev.Eng); err == nil {
			in := c.inc(slot, n)
			in.taken, in.takenKnown = ev.N, true
		}
	case KindDispatch:
		st := c.stream(streamKey{from: ev.Eng, slot: ev.Slot})
		st.ops[ev.Op] = c.step
		c.note(st, "op %d dispatched: %d sends, window %d", ev.Op, len(ev.Sends), ev.Window)
	case KindStart:
		c.start(ev)
	case KindResult:
		c.result(ev)
	case KindDeliver:
		c.deliver(ev)
	case KindHang:
		c.violate(VHang, key(ev), ev.Err)
	case KindCrash:
		c.violate(VCrash, key(ev), ev.Err)
	case KindLeak:
		c.violate(VLeak, key(ev), ev.Err)
	case KindSlowRecovery:
		c.violate(VSlowRecovery, key(ev), ev.Err)
	case KindEarlyDone:
		c.note(c.stream(key(ev)), "done of s=%d p=%d before its call returned", ev.S, ev.P)
		c.violate(VEarlyDone, key(ev), fmt.Sprintf("answer %d (payload %d): %s", ev.S, ev.P, ev.Err))
	}
}

func (c *Checker) call(st *stream, s, p uint64) *call {
	cl := st.calls[s]
	if cl == nil {
		cl = &call{p: p}
		st.calls[s] = cl
		st.maxS = max(st.maxS, s)
	}
	return cl
}

func (c *Checker) start(ev Event) {
	k := key(ev)
	st := c.stream(k)
	c.Calls++
	if k.answer {
		c.Answers.Calls++
		c.note(st, "start s=%d p=%d, answering %s", ev.S, ev.P, ev.From)
	} else {
		c.note(st, "start s=%d p=%d op=%d", ev.S, ev.P, ev.Op)
	}
	if ev.S < st.floor {
		return
	}
	cl := c.call(st, ev.S, ev.P)
	if cl.p != ev.P {
		c.violate(VCorrupt, k, fmt.Sprintf("call %d started with payload %d, delivered as payload %d", ev.S, ev.P, cl.p))
	}
	cl.started, cl.op = true, ev.Op
	if k.answer {
		cl.after = c.begun(ev.From)
	}
	c.prune(st)
}

// begun is the step at which engine incarnation id began (0: not known).
func (c *Checker) begun(id string) uint64 {
	slot, n, err := ParseEngineID(id)
	if err != nil {
		return 0
	}
	if in := c.slots[slot][n]; in != nil {
		return in.begin
	}
	return 0
}

func (c *Checker) result(ev Event) {
	k := key(ev)
	st := c.stream(k)
	c.note(st, "result s=%d p=%d %s %s", ev.S, ev.P, ev.Class, ev.Err)
	countClass(ev.Class, &c.Acked, &c.Maybe, &c.Failed)
	if k.answer {
		countClass(ev.Class, &c.Answers.Acked, &c.Answers.Maybe, &c.Answers.Failed)
	}
	if st.calls[ev.S] == nil && ev.S < st.floor {
		return // forgotten long ago, or its sender was compacted: nothing left to judge
	}
	cl := c.call(st, ev.S, ev.P)
	if cl.class != "" {
		c.violate(VDoubleResult, k, fmt.Sprintf("call %d (payload %d) returned %s, then %s (%s)", ev.S, ev.P, cl.class, ev.Class, ev.Err))
		return
	}
	cl.class = ev.Class
	switch ev.Class {
	case ClassOK:
		if _, ok := st.delivered[ev.P]; ok {
			c.checked(k)
		} else {
			// The earliest the call can have been made: its operation's dispatch, or for an
			// answer the start of the incarnation it answers.
			after := st.ops[cl.op]
			if k.answer {
				after = cl.after
			}
			st.acked[ev.P] = ack{s: ev.S, step: c.step, dispatch: after}
		}
	case ClassFailed:
		st.failed[ev.S] = true
		if cl.delivered {
			c.violate(VDeliveredAfterFailure, k, fmt.Sprintf("call %d (payload %d) was delivered, then failed without ErrMaybeDelivered: %s", ev.S, ev.P, ev.Err))
		}
	}
}

// countClass counts a result of class in ok, maybe or failed.
func countClass(class string, ok, maybe, failed *uint64) {
	switch class {
	case ClassOK:
		*ok++
	case ClassMaybe:
		*maybe++
	case ClassFailed:
		*failed++
	}
}

// checked counts an acknowledged notify of stream k delivered.
func (c *Checker) checked(k streamKey) {
	c.Checked++
	if k.answer {
		c.Answers.Checked++
	}
}

func (c *Checker) deliver(ev Event) {
	c.Delivered++
	if ev.Answer {
		c.Answers.Delivered++
	}
	slot, n, err := ParseEngineID(ev.Eng)
	if err == nil {
		if in := c.slots[slot][n]; in != nil {
			in.reported++
		}
	}
	k := streamKey{from: ev.From, slot: slot, answer: ev.Answer}
	if err != nil || ev.Bad != "" {
		if st := c.streams[k]; st != nil {
			c.note(st, "deliver to %s s=%d p=%d BAD %s", ev.Eng, ev.S, ev.P, ev.Bad)
		}
		c.violate(VCorrupt, k, fmt.Sprintf("%s delivered s=%d p=%d from %s: %s", ev.Eng, ev.S, ev.P, ev.From, ev.Bad))
		return
	}
	st := c.stream(k)
	c.note(st, "deliver to %s s=%d p=%d", ev.Eng, ev.S, ev.P)
	if prev, ok := st.delivered[ev.P]; ok {
		switch {
		case prev.eng == ev.Eng:
			c.violate(VDuplicate, k, fmt.Sprintf("%s delivered payload %d as call %d, and before as call %d", ev.Eng, ev.P, ev.S, prev.s))
			return
		case k.answer:
			// An answer is one call, never retried: no new incarnation may have it again.
			c.violate(VDuplicate, k, fmt.Sprintf("%s delivered answer %d (payload %d), which %s delivered before", ev.Eng, ev.S, ev.P, prev.eng))
			return
		}
		c.Allowances[ANewIncarnation]++
	}
	st.delivered[ev.P] = delivery{ev.S, ev.Eng}
	pk := pairKey{from: ev.From, to: ev.Eng, answer: ev.Answer}
	if last := c.pairs[pk]; ev.S == last {
		c.violate(VDuplicate, k, fmt.Sprintf("%s delivered call %d (payload %d) twice in a row", ev.Eng, ev.S, ev.P))
		return
	} else if ev.S < last {
		c.violate(VReorder, k, fmt.Sprintf("%s delivered call %d (payload %d) after call %d", ev.Eng, ev.S, ev.P, last))
	} else {
		c.pairs[pk] = ev.S
	}
	if a, ok := st.acked[ev.P]; ok {
		delete(st.acked, ev.P)
		_ = a
		c.checked(k)
	}
	if ev.S < st.floor {
		if st.failed[ev.S] {
			c.violate(VDeliveredAfterFailure, k, fmt.Sprintf("%s delivered call %d (payload %d), whose send failed without ErrMaybeDelivered", ev.Eng, ev.S, ev.P))
		}
		return
	}
	cl := c.call(st, ev.S, ev.P)
	if cl.p != ev.P {
		c.violate(VCorrupt, k, fmt.Sprintf("%s delivered call %d as payload %d, started as payload %d", ev.Eng, ev.S, ev.P, cl.p))
	}
	cl.delivered = true
	if cl.class == ClassFailed {
		c.violate(VDeliveredAfterFailure, k, fmt.Sprintf("%s delivered call %d (payload %d), whose send failed without ErrMaybeDelivered", ev.Eng, ev.S, ev.P))
	}
}

// prune forgets resolved calls far behind the newest, keeping what a late delivery needs.
func (c *Checker) prune(st *stream) {
	if len(st.calls) < 2*keepCalls || st.maxS <= keepCalls {
		return
	}
	floor := st.maxS - keepCalls
	for s, cl := range st.calls {
		if s < floor && cl.class != "" && cl.started {
			delete(st.calls, s)
		}
	}
	for p, d := range st.delivered {
		if d.s < floor {
			delete(st.delivered, p)
		}
	}
	st.floor = max(st.floor, floor)
}

// senderEnded compacts the streams of a sender that makes no more calls, so that a long run
// with many incarnations stays small: what it still needs is the acknowledged notifies not
// yet delivered, the calls that failed, and the calls of a live-closed sender still
// unresolved. A late delivery of an older call is still checked for order (per pair) and
// against the failed calls.
func (c *Checker) senderEnded(id string) {
	for _, k := range c.bySend[id] {
		st := c.streams[k]
		kept := map[uint64]delivery{}
		for s, cl := range st.calls {
			if cl.class != "" || st.killed {
				delete(st.calls, s)
				continue
			}
			// Unresolved: its result may still come, nil for a payload already delivered
			// (by this call, or by the one it retries).
			if d, ok := st.delivered[cl.p]; ok {
				kept[cl.p] = d
			}
		}
		st.delivered = kept
		st.floor = st.maxS + 1
	}
}

// Finish judges what only the end can: acknowledged notifies never delivered, calls that
// never returned, deliveries of calls never made. Call it once every engine was closed
// (clean, drained) or killed.
func (c *Checker) Finish() {
	if c.finished {
		return
	}
	c.finished = true
	keys := make([]streamKey, 0, len(c.streams))
	for k := range c.streams {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].from != keys[j].from {
			return keys[i].from < keys[j].from
		}
		return keys[i].slot < keys[j].slot
	})
	for _, k := range keys {
		st := c.streams[k]
		ps := make([]uint64, 0, len(st.acked))
		for p := range st.acked {
			ps = append(ps, p)
		}
		sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
		for _, p := range ps {
			a := st.acked[p]
			if held := c.mayHaveHeld(k.slot, a); len(held) > 0 {
				c.Allowances[ALostReceiverKilled]++
				if len(held) == 1 {
					in := held[0]
					in.lost++
					if in.lostFrom == nil {
						in.lostFrom = map[string]int{}
					}
					in.lostFrom[k.from]++
					if in.firstLost == "" {
						in.firstLost = fmt.Sprintf("call %d (payload %d) from %s, acknowledged at step %d", a.s, p, k.from, a.step)
					}
				}
				continue
			}
			c.violate(VLost, k, fmt.Sprintf("call %d (payload %d) returned nil at step %d and was never delivered; no incarnation of %s that could hold it was killed", a.s, p, a.step, k.slot))
		}
		ss := make([]uint64, 0)
		for s := range st.calls {
			ss = append(ss, s)
		}
		sort.Slice(ss, func(i, j int) bool { return ss[i] < ss[j] })
		for _, s := range ss {
			cl := st.calls[s]
			switch {
			case !cl.started && st.killed:
				c.Allowances[AUnreportedStart]++
			case !cl.started:
				c.violate(VPhantom, k, fmt.Sprintf("call %d (payload %d) was delivered but never made", s, cl.p))
			case cl.class == "" && !st.killed:
				c.violate(VNoResult, k, fmt.Sprintf("call %d (payload %d) never returned", s, cl.p))
			}
		}
	}
	c.judgeHeld()
}

// mayHaveHeld returns the incarnations of slot that were killed and could hold a notify
// acknowledged at step a.step and dispatched at a.dispatch: each began before the result
// was read and had not ended when the operation was dispatched.
func (c *Checker) mayHaveHeld(slot string, a ack) []*incarnation {
	var held []*incarnation
	for _, in := range c.slots[slot] {
		if in.killed && in.begin < a.step && in.end > a.dispatch {
			held = append(held, in)
		}
	}
	return held
}

// holdBound is the most acknowledged notifies a killed incarnation may lose: what the
// contract lets it hold, and what its agent had taken from it and not yet written to the
// parent. The contract: its receive queue, over rdma_twosided one RECV ring past it (the
// batch during which it filled), and per channel one RECV ring: two per sender that lost
// any, a channel and the one it replaced (which hands what it held to the queue). The
// agent: the deliveries counted and never read, and the one being handed over; a polling
// consumer may hold a whole queue's batch besides (with its ring past the queue), while
// the queue fills again behind it.
func (in *incarnation) holdBound() int {
	queues := 1
	if in.consumer == ConsumePoll {
		queues = 2
	}
	q := queues * in.queue
	rings := 0
	if in.ring > 0 {
		rings = in.ring * (queues + 2*len(in.lostFrom))
	}
	return q + rings + in.late() + 1
}

// late is how many of its delivery events its agent counted and the parent never read.
func (in *incarnation) late() int {
	if in.taken > in.reported {
		return int(in.taken - in.reported)
	}
	return 0
}

// judgeHeld holds every killed incarnation whose agent's count is known to its bound.
func (c *Checker) judgeHeld() {
	slots := make([]string, 0, len(c.slots))
	for s := range c.slots {
		slots = append(slots, s)
	}
	sort.Strings(slots)
	for _, slot := range slots {
		incs := make([]int, 0, len(c.slots[slot]))
		for n := range c.slots[slot] {
			incs = append(incs, n)
		}
		sort.Ints(incs)
		for _, n := range incs {
			in := c.slots[slot][n]
			if !in.killed || !in.takenKnown {
				continue
			}
			bound := in.holdBound()
			c.Held.Checked++
			c.Held.Lost += in.lost
			figures := fmt.Sprintf("%s lost %d (from %d senders); it could hold %d: queue %d (%s consumer), RECV ring %d per channel, %d deliveries taken and never read (%d counted, %d read)",
				EngineID(slot, n), in.lost, len(in.lostFrom), bound, in.queue, in.consumer, in.ring,
				in.late(), in.taken, in.reported)
			if used := float64(in.lost) / float64(bound); c.Held.Most == "" || used > c.mostUsed {
				c.mostUsed, c.Held.MostUsed, c.Held.Most = used, int(100*used), figures
			}
			if in.lost <= bound {
				continue
			}
			from, most := "", -1
			for f, k := range in.lostFrom {
				if k > most || (k == most && f < from) {
					from, most = f, k
				}
			}
			c.violate(VLostPastBound, streamKey{from: from, slot: slot}, fmt.Sprintf("killed: %s; the first lost: %s", figures, in.firstLost))
		}
	}
}

// ring keeps the last n lines.
type ring struct {
	buf  []string
	next int
	full bool
}

func newRing(n int) ring { return ring{buf: make([]string, n)} }

func (r *ring) add(s string) {
	r.buf[r.next] = s
	r.next++
	if r.next == len(r.buf) {
		r.next, r.full = 0, true
	}
}

func (r *ring) lines() []string {
	if !r.full {
		return append([]string(nil), r.buf[:r.next]...)
	}
	return append(append([]string(nil), r.buf[r.next:]...), r.buf[:r.next]...)
}
