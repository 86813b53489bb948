package soak

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// hist builds a history: two engines, a0e0.1 sends to slot a1e0 (engine a1e0.1).
type hist struct {
	c  *Checker
	op uint64
}

const (
	snd = "a0e0.1"
	dst = "a1e0"
	rcv = "a1e0.1"
)

func newHist() *hist {
	h := &hist{c: NewChecker()}
	h.c.Step(Event{K: KindBegin, Slot: "a0e0", Inc: 1})
	h.c.Step(Event{K: KindBegin, Slot: dst, Inc: 1})
	h.dispatch()
	return h
}

func (h *hist) dispatch() {
	h.op++
	h.c.Step(Event{K: KindDispatch, Eng: snd, Slot: dst, Op: h.op, Window: 1, Sends: []Send{{P: 1}}})
}

func (h *hist) start(s, p uint64) {
	h.c.Step(Event{K: KindStart, Eng: snd, Slot: dst, Op: h.op, S: s, P: p})
}
func (h *hist) result(s, p uint64, class string) {
	h.c.Step(Event{K: KindResult, Eng: snd, Slot: dst, S: s, P: p, Class: class, Err: "e"})
}
func (h *hist) deliverTo(eng string, s, p uint64) {
	h.c.Step(Event{K: KindDeliver, Eng: eng, From: snd, S: s, P: p})
}
func (h *hist) deliver(s, p uint64) { h.deliverTo(rcv, s, p) }

// send is a call that returns class and, when delivered, is delivered after its result.
func (h *hist) send(s, p uint64, class string, delivered bool) {
	h.start(s, p)
	h.result(s, p, class)
	if delivered {
		h.deliver(s, p)
	}
}

func (h *hist) finish() *Checker {
	h.c.Step(Event{K: KindClosed, Eng: rcv})
	h.c.Step(Event{K: KindClosed, Eng: snd})
	h.c.Finish()
	return h.c
}

func only(t *testing.T, c *Checker, kind string) {
	t.Helper()
	require.Equal(t, map[string]int{kind: 1}, c.Violations, "details: %+v", c.Details)
	require.Len(t, c.Details, 1)
	require.Equal(t, kind, c.Details[0].Kind)
	require.NotEmpty(t, c.Details[0].History, "a violation carries its stream's history")
	require.NotEmpty(t, c.Details[0].Schedule, "a violation carries the schedule around it")
}

func TestCheckerClean(t *testing.T) {
	h := newHist()
	h.send(1, 1, ClassOK, true)
	// Delivered before its result is read (another pipe), and before its start is read.
	h.deliver(2, 2)
	h.start(2, 2)
	h.result(2, 2, ClassOK)
	// Maybe, delivered; its retry with the same ID is dropped by the receiver and acked.
	h.send(3, 3, ClassMaybe, true)
	h.send(4, 3, ClassOK, false)
	// Maybe, not delivered; the retry is.
	h.send(5, 4, ClassMaybe, false)
	h.send(6, 4, ClassOK, true)
	// Failed definitely, not delivered; maybe, never delivered and not retried.
	h.send(7, 5, ClassFailed, false)
	h.send(8, 6, ClassMaybe, false)
	h.send(9, 7, ClassOK, true)
	c := h.finish()
	require.Empty(t, c.Violations, "%+v", c.Details)
	require.Empty(t, c.Allowances)
	require.EqualValues(t, 5, c.Checked) // payloads 1, 2, 3, 4, 7
	require.EqualValues(t, 9, c.Calls)
	require.EqualValues(t, 5, c.Delivered)
}

func TestCheckerLost(t *testing.T) {
	h := newHist()
	h.send(1, 1, ClassOK, true)
	h.send(2, 2, ClassOK, false)
	h.send(3, 3, ClassOK, true)
	c := h.finish()
	only(t, c, VLost)
	require.Contains(t, c.Details[0].Detail, "call 2 (payload 2)")
}

// TestCheckerLostShowsFirstEvents: a call lost early in a long stream is reported with the
// stream's first events (where it went wrong) beside its last ones.
func TestCheckerLostShowsFirstEvents(t *testing.T) {
	h := newHist()
	h.send(1, 1, ClassOK, false)
	for s := uint64(2); s < 2+historyLen; s++ {
		h.send(s, s, ClassOK, true)
	}
	c := h.finish()
	only(t, c, VLost)
	v := c.Details[0]
	require.Len(t, v.First, historyLen)
	require.Contains(t, v.First[0], "op 1 dispatched")
	require.Contains(t, v.First[1], "start s=1 p=1")
	require.NotContains(t, v.History[0], "s=1 p=1", "the last events no longer hold the call")
	require.Equal(t, []string{"step 1: begin a0e0.1", "step 2: begin a1e0.1"}, v.ScheduleAtFirst)

	short := newHist()
	short.send(1, 1, ClassOK, false)
	c = short.finish()
	require.Empty(t, c.Details[0].First, "a stream its history holds whole has no separate first events")
}

func TestCheckerLostAfterCleanClose(t *testing.T) {
	// A receiver closed cleanly (drained) is no crash: what it acknowledged must arrive.
	h := newHist()
	h.send(1, 1, ClassOK, false)
	h.c.Step(Event{K: KindClosed, Eng: rcv})
	h.c.Step(Event{K: KindBegin, Slot: dst, Inc: 2})
	h.send(2, 2, ClassOK, true) // to a1e0.2: delivered there
	h.c.Finish()
	only(t, h.c, VLost)
}

func TestCheckerReceiverKilledAllowance(t *testing.T) {
	h := newHist()
	h.send(1, 1, ClassOK, true)
	h.send(2, 2, ClassOK, false) // held by the receiver when it was killed
	h.c.Step(Event{K: KindKill, Slot: dst, Inc: 1})
	h.c.Step(Event{K: KindBegin, Slot: dst, Inc: 2})
	h.dispatch()
	h.send(3, 3, ClassMaybe, false) // while it was down
	h.start(4, 4)
	h.result(4, 4, ClassOK)
	h.deliverTo("a1e0.2", 4, 4) // a new pair: its order starts over
	h.c.Step(Event{K: KindClosed, Eng: "a1e0.2"})
	h.c.Finish()
	require.Empty(t, h.c.Violations, "%+v", h.c.Details)
	require.Equal(t, map[string]int{ALostReceiverKilled: 1}, h.c.Allowances)
}

func TestCheckerKillBeforeDispatchGivesNoAllowance(t *testing.T) {
	// The killed incarnation ended before the op was dispatched: it cannot have held the
	// notify, which a later incarnation acknowledged and lost.
	h := newHist()
	h.c.Step(Event{K: KindKill, Slot: dst, Inc: 1})
	h.c.Step(Event{K: KindBegin, Slot: dst, Inc: 2})
	h.dispatch()
	h.send(1, 1, ClassOK, false)
	h.c.Step(Event{K: KindClosed, Eng: "a1e0.2"})
	h.c.Finish()
	only(t, h.c, VLost)
}

func TestCheckerKilledSenderAckStillCounts(t *testing.T) {
	// A killed sender's acknowledged sends must still arrive; its unresolved ones are unknown.
	h := newHist()
	h.send(1, 1, ClassOK, false)
	h.start(2, 2) // no result: it died
	h.c.Step(Event{K: KindKill, Slot: "a0e0", Inc: 1})
	h.deliver(3, 3) // its start line died with it
	h.c.Step(Event{K: KindClosed, Eng: rcv})
	h.c.Finish()
	only(t, h.c, VLost)
	require.Equal(t, map[string]int{AUnreportedStart: 1}, h.c.Allowances)
}

func TestCheckerDuplicate(t *testing.T) {
	t.Run("same call", func(t *testing.T) {
		h := newHist()
		h.send(1, 1, ClassOK, true)
		h.deliver(1, 1)
		only(t, h.finish(), VDuplicate)
	})
	t.Run("retry with the same ID", func(t *testing.T) {
		h := newHist()
		h.send(1, 1, ClassMaybe, true)
		h.send(2, 1, ClassOK, true)
		only(t, h.finish(), VDuplicate)
	})
}

func TestCheckerRetryToNewIncarnation(t *testing.T) {
	// Delivered by a1e0.1, which closed before its ack came back (maybe); the retry with
	// the same ID reaches a1e0.2, which cannot know the id: allowed, counted.
	h := newHist()
	h.start(1, 1)
	h.deliver(1, 1)
	h.c.Step(Event{K: KindClosed, Eng: rcv})
	h.c.Step(Event{K: KindBegin, Slot: dst, Inc: 2})
	h.result(1, 1, ClassMaybe)
	h.start(2, 1)
	h.result(2, 1, ClassOK)
	h.deliverTo("a1e0.2", 2, 1)
	h.c.Step(Event{K: KindClosed, Eng: "a1e0.2"})
	h.c.Finish()
	require.Empty(t, h.c.Violations, "%+v", h.c.Details)
	require.Equal(t, map[string]int{ANewIncarnation: 1}, h.c.Allowances)
}

func TestCheckerReorder(t *testing.T) {
	h := newHist()
	h.start(1, 1)
	h.start(2, 2)
	h.result(1, 1, ClassOK)
	h.result(2, 2, ClassOK)
	h.deliver(2, 2)
	h.deliver(1, 1)
	c := h.finish()
	only(t, c, VReorder)
	require.Contains(t, c.Details[0].Detail, "call 1 (payload 1) after call 2")
	require.EqualValues(t, 2, c.Checked, "a reordered notify is still delivered")
}

func TestCheckerOrderIsPerPair(t *testing.T) {
	// Two incarnations of one target are two pairs: each starts its own order.
	h := newHist()
	h.send(5, 5, ClassOK, true)
	h.c.Step(Event{K: KindClosed, Eng: rcv})
	h.c.Step(Event{K: KindBegin, Slot: dst, Inc: 2})
	h.start(6, 6)
	h.result(6, 6, ClassOK)
	h.deliverTo("a1e0.2", 6, 6)
	// Another sender's calls to the same receiver are another pair.
	h.c.Step(Event{K: KindDeliver, Eng: "a1e0.2", From: "a2e0.1", S: 1, P: 1})
	h.c.Step(Event{K: KindStart, Eng: "a2e0.1", Slot: dst, S: 1, P: 1})
	h.c.Step(Event{K: KindResult, Eng: "a2e0.1", Slot: dst, S: 1, P: 1, Class: ClassOK})
	h.c.Step(Event{K: KindClosed, Eng: "a1e0.2"})
	h.c.Finish()
	require.Empty(t, h.c.Violations, "%+v", h.c.Details)
}

func TestCheckerDeliveredAfterFailure(t *testing.T) {
	t.Run("delivery read first", func(t *testing.T) {
		h := newHist()
		h.start(1, 1)
		h.deliver(1, 1)
		h.result(1, 1, ClassFailed)
		only(t, h.finish(), VDeliveredAfterFailure)
	})
	t.Run("result read first", func(t *testing.T) {
		h := newHist()
		h.send(1, 1, ClassFailed, true)
		only(t, h.finish(), VDeliveredAfterFailure)
	})
	t.Run("maybe is allowed", func(t *testing.T) {
		h := newHist()
		h.send(1, 1, ClassMaybe, true)
		require.Empty(t, h.finish().Violations)
	})
}

func TestCheckerCorrupt(t *testing.T) {
	h := newHist()
	h.start(1, 1)
	h.result(1, 1, ClassOK)
	h.c.Step(Event{K: KindDeliver, Eng: rcv, From: snd, S: 1, P: 1, Bad: "byte 3 differs"})
	c := h.finish()
	// The corrupt copy does not count as the delivery.
	require.Equal(t, map[string]int{VCorrupt: 1, VLost: 1}, c.Violations)
}

func TestCheckerHang(t *testing.T) {
	h := newHist()
	h.c.Step(Event{K: KindHang, Eng: snd, Slot: dst, Err: "SendNotify with a 1s deadline still runs after 61s"})
	only(t, h.finish(), VHang)
}

func TestCheckerLeakAndSlowRecovery(t *testing.T) {
	for kind, ev := range map[string]Event{
		VLeak:         {K: KindLeak, Eng: snd, Err: "goroutines 30 → 900"},
		VSlowRecovery: {K: KindSlowRecovery, Eng: snd, Slot: dst, Err: "no notify"},
	} {
		h := newHist()
		h.start(1, 1)
		h.result(1, 1, ClassOK)
		h.deliver(1, 1)
		h.c.Step(ev)
		c := h.finish()
		require.Equal(t, map[string]int{kind: 1}, c.Violations)
		require.Contains(t, c.Details[0].Detail, ev.Err)
	}
}

func TestCheckerNoResult(t *testing.T) {
	h := newHist()
	h.start(1, 1)
	only(t, h.finish(), VNoResult)
}

func TestCheckerPhantom(t *testing.T) {
	h := newHist()
	h.deliver(1, 1)
	only(t, h.finish(), VPhantom)
}

func TestCheckerDoubleResult(t *testing.T) {
	h := newHist()
	h.send(1, 1, ClassOK, true)
	h.result(1, 1, ClassMaybe)
	only(t, h.finish(), VDoubleResult)
}

func TestCheckerPrunesAndStillJudges(t *testing.T) {
	h := newHist()
	const n = 5 * keepCalls
	for s := uint64(1); s <= n; s++ {
		switch {
		case s == 7:
			h.send(s, s, ClassFailed, false)
		case s == n-3:
			h.send(s, s, ClassOK, false) // lost
		default:
			h.send(s, s, ClassOK, true)
		}
	}
	st := h.c.streams[streamKey{from: snd, slot: dst}]
	require.Less(t, len(st.calls), 3*keepCalls, "resolved calls are forgotten")
	h.deliver(7, 7) // a failed call delivered long after: still caught (and out of order)
	c := h.finish()
	require.Equal(t, map[string]int{VLost: 1, VDeliveredAfterFailure: 1, VReorder: 1}, c.Violations)
	require.EqualValues(t, n-2, c.Checked)
}

func TestCheckerCompactsEndedSenders(t *testing.T) {
	h := newHist()
	for s := uint64(1); s <= 100; s++ {
		h.send(s, s, ClassOK, s <= 90) // 91..100 still on their way when the sender dies
	}
	h.send(101, 101, ClassFailed, false)
	h.c.Step(Event{K: KindKill, Slot: "a0e0", Inc: 1})
	st := h.c.streams[streamKey{from: snd, slot: dst}]
	require.Empty(t, st.calls)
	require.Empty(t, st.delivered)
	require.Len(t, st.acked, 10)
	for s := uint64(91); s <= 99; s++ {
		h.deliver(s, s)
	}
	h.deliver(95, 95)   // a duplicate after the compaction: still caught
	h.deliver(101, 101) // a failed call: still caught
	c := h.finish()
	require.Equal(t, map[string]int{VDuplicate: 1, VDeliveredAfterFailure: 1, VLost: 1}, c.Violations)
	require.Contains(t, c.Details[len(c.Details)-1].Detail, "call 100")
}

func TestCheckerResultsAfterSenderClosed(t *testing.T) {
	// A sender closed mid-operation: its calls still under way return after its "closed"
	// line (ErrClosed, or nil for what landed); they are judged, not left unresolved.
	h := newHist()
	h.start(1, 1)
	h.start(2, 2)
	h.c.Step(Event{K: KindClosed, Eng: snd})
	h.result(1, 1, ClassOK)
	h.result(2, 2, ClassMaybe)
	h.deliver(1, 1)
	h.c.Step(Event{K: KindClosed, Eng: rcv})
	h.c.Finish()
	require.Empty(t, h.c.Violations, "%+v", h.c.Details)
	require.EqualValues(t, 1, h.c.Checked)
}

func TestCheckerDeliveredBeforeResultAfterSenderClosed(t *testing.T) {
	// Delivered before its result was read, and the sender closed in between: the result
	// (nil) comes after the "closed" line, which compacted the stream. The delivery counts,
	// also for a retry whose payload its original call delivered. Before, compaction forgot
	// the deliveries and the results were judged "lost" (the short soaks of make test, under
	// load, and twosided soak --seed 31337).
	h := newHist()
	h.start(1, 1)
	h.deliver(1, 1)
	h.start(2, 2)
	h.deliver(2, 2)
	h.result(2, 2, ClassMaybe)
	h.start(3, 2) // the retry of payload 2, with its ID
	h.c.Step(Event{K: KindClosed, Eng: snd})
	h.result(1, 1, ClassOK)
	h.result(3, 2, ClassOK)
	h.c.Step(Event{K: KindClosed, Eng: rcv})
	h.c.Finish()
	require.Empty(t, h.c.Violations, "%+v", h.c.Details)
	require.EqualValues(t, 2, h.c.Checked)
}

func TestCheckerDuplicateAfterCompaction(t *testing.T) {
	h := newHist()
	h.send(1, 1, ClassOK, true)
	h.send(2, 2, ClassOK, true)
	h.c.Step(Event{K: KindKill, Slot: "a0e0", Inc: 1})
	h.deliver(2, 2) // the same call again, after its sender's streams were compacted
	only(t, h.finish(), VDuplicate)
}

func TestCheckerDetailsBounded(t *testing.T) {
	h := newHist()
	for s := uint64(1); s <= 3*maxDetails; s++ {
		h.send(s, s, ClassOK, false)
	}
	c := h.finish()
	require.Equal(t, 3*maxDetails, c.Violations[VLost])
	require.Len(t, c.Details, maxDetails)
	require.Equal(t, 3*maxDetails, c.Total())

	// Past the bound, the first violation of another kind is still given in full, once.
	c.Step(Event{K: KindSlowRecovery, Eng: "a0e0.1", Slot: "a1e0", Err: "late"})
	c.Step(Event{K: KindSlowRecovery, Eng: "a0e0.1", Slot: "a1e0", Err: "late again"})
	require.Len(t, c.Details, maxDetails+1)
	require.Equal(t, VSlowRecovery, c.Details[maxDetails].Kind)
	require.Equal(t, "late", c.Details[maxDetails].Detail)
}

// killedHolding: the receiver (queue q, consumer, ring) acknowledges n notifies it never
// hands over, its agent having put reported+late delivery events of which the parent read
// reported, and is killed; the sender's op was dispatched before the kill.
func killedHolding(q int, consumer string, ring, n, late int) *Checker {
	h := &hist{c: NewChecker()}
	h.c.Step(Event{K: KindBegin, Slot: "a0e0", Inc: 1})
	h.c.Step(Event{K: KindBegin, Slot: dst, Inc: 1, Queue: q, Consumer: consumer, Ring: ring})
	h.dispatch()
	h.send(1, 1, ClassOK, true)
	for i := range n {
		h.send(uint64(2+i), uint64(2+i), ClassOK, false)
	}
	h.c.Step(Event{K: KindKill, Slot: dst, Inc: 1})
	h.c.Step(Event{K: KindTaken, Eng: rcv, N: uint64(1 + late)})
	h.c.Step(Event{K: KindClosed, Eng: snd})
	h.c.Finish()
	return h.c
}

func TestCheckerKilledReceiverHeldToItsBound(t *testing.T) {
	// Queue 32, Recv consumer, a channel's ring of 4 (one past the queue, two per sender:
	// 12), one in hand: 45 may be lost, and 3 deliveries the parent never read add 3; a
	// polling consumer: twice the queue and a ring more, 81.
	for _, tc := range []struct {
		name             string
		consumer         string
		ring, lost, late int
	}{
		{"queue and rings", ConsumeRecv, 4, 45, 0},
		{"deliveries never read", ConsumeRecv, 4, 48, 3},
		{"oob: no rings", ConsumeRecv, 0, 33, 0},
		{"a polling consumer's batch", ConsumePoll, 4, 81, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := killedHolding(32, tc.consumer, tc.ring, tc.lost, tc.late)
			require.Empty(t, c.Violations, "%+v", c.Details)
			require.Equal(t, tc.lost, c.Allowances[ALostReceiverKilled])
			require.Equal(t, 1, c.Held.Checked)
			require.Equal(t, tc.lost, c.Held.Lost)
			require.Equal(t, 100, c.Held.MostUsed)

			c = killedHolding(32, tc.consumer, tc.ring, tc.lost+1, tc.late)
			only(t, c, VLostPastBound)
			require.Contains(t, c.Details[0].Detail, "killed: a1e0.1 lost")
			require.Contains(t, c.Details[0].Detail, "queue 32 ("+tc.consumer+" consumer)")
		})
	}
}

func TestCheckerKilledReceiverWithoutCountsIsNotJudged(t *testing.T) {
	// No count file (an agent on another host): the losses stay an allowance.
	h := &hist{c: NewChecker()}
	h.c.Step(Event{K: KindBegin, Slot: "a0e0", Inc: 1})
	h.c.Step(Event{K: KindBegin, Slot: dst, Inc: 1, Queue: 1, Consumer: ConsumeRecv})
	h.dispatch()
	for i := range 10 {
		h.send(uint64(1+i), uint64(1+i), ClassOK, false)
	}
	h.c.Step(Event{K: KindKill, Slot: dst, Inc: 1})
	h.c.Step(Event{K: KindClosed, Eng: snd})
	h.c.Finish()
	require.Empty(t, h.c.Violations, "%+v", h.c.Details)
	require.Equal(t, 10, h.c.Allowances[ALostReceiverKilled])
	require.Zero(t, h.c.Held.Checked)
}

func TestCheckerHeldReportsTheClosest(t *testing.T) {
	// Two killed incarnations, each lost one: of a bound of 2 048, then of 101. The report
	// names the second, though both round down to 0 %.
	h := &hist{c: NewChecker()}
	h.c.Step(Event{K: KindBegin, Slot: "a0e0", Inc: 1})
	h.c.Step(Event{K: KindBegin, Slot: dst, Inc: 1, Queue: 2047, Consumer: ConsumeRecv})
	h.dispatch()
	h.send(1, 1, ClassOK, false)
	h.c.Step(Event{K: KindKill, Slot: dst, Inc: 1})
	h.c.Step(Event{K: KindTaken, Eng: rcv, N: 0})
	h.c.Step(Event{K: KindBegin, Slot: dst, Inc: 2, Queue: 100, Consumer: ConsumeRecv})
	h.dispatch()
	h.send(2, 2, ClassOK, false)
	h.c.Step(Event{K: KindKill, Slot: dst, Inc: 2})
	h.c.Step(Event{K: KindTaken, Eng: "a1e0.2", N: 0})
	h.c.Step(Event{K: KindClosed, Eng: snd})
	h.c.Finish()
	require.Empty(t, h.c.Violations, "%+v", h.c.Details)
	require.Equal(t, 2, h.c.Held.Checked)
	require.Equal(t, 2, h.c.Held.Lost)
	require.Equal(t, 0, h.c.Held.MostUsed)
	require.Contains(t, h.c.Held.Most, "a1e0.2 lost 1 ")
}

func TestCheckerLossOfTwoKilledIncarnationsIsNotAttributed(t *testing.T) {
	// An op dispatched before the first incarnation's kill and acknowledged after the
	// second began could have been held by either: it counts against neither bound.
	h := &hist{c: NewChecker()}
	h.c.Step(Event{K: KindBegin, Slot: "a0e0", Inc: 1})
	h.c.Step(Event{K: KindBegin, Slot: dst, Inc: 1, Queue: 1, Consumer: ConsumeRecv})
	h.dispatch()
	h.start(1, 1)
	h.c.Step(Event{K: KindKill, Slot: dst, Inc: 1})
	h.c.Step(Event{K: KindTaken, Eng: rcv, N: 0})
	h.c.Step(Event{K: KindBegin, Slot: dst, Inc: 2, Queue: 1, Consumer: ConsumeRecv})
	h.result(1, 1, ClassOK)
	h.dispatch()
	for i := range 5 {
		h.send(uint64(2+i), uint64(2+i), ClassOK, false)
	}
	h.c.Step(Event{K: KindKill, Slot: dst, Inc: 2})
	h.c.Step(Event{K: KindTaken, Eng: "a1e0.2", N: 0})
	h.c.Step(Event{K: KindClosed, Eng: snd})
	h.c.Finish()
	// a1e0.2 alone lost 5 > its bound of 2 (queue 1, one in hand): caught; call 1 is not
	// its alone and is not counted.
	only(t, h.c, VLostPastBound)
	require.Contains(t, h.c.Details[0].Detail, "killed: a1e0.2 lost 5 ")
	require.Equal(t, 6, h.c.Allowances[ALostReceiverKilled])
}

// answers builds the answer stream of hist's receiver (a1e0.1), whose handler answers the
// notifies of a0e0.1: its calls to slot a0e0, each with the payload of its call number.
type answers struct{ h *hist }

func (a answers) startFor(of string, s uint64) {
	a.h.c.Step(Event{K: KindStart, Eng: rcv, Slot: "a0e0", S: s, P: s, From: of, Answer: true})
}
func (a answers) start(s uint64) { a.startFor(snd, s) }
func (a answers) result(s uint64, class string) {
	a.h.c.Step(Event{K: KindResult, Eng: rcv, Slot: "a0e0", S: s, P: s, Class: class, Err: "e", Answer: true})
}
func (a answers) deliverTo(eng string, s uint64) {
	a.h.c.Step(Event{K: KindDeliver, Eng: eng, From: rcv, S: s, P: s, Answer: true})
}
func (a answers) deliver(s uint64) { a.deliverTo(snd, s) }

// send is an answer that returns class and, when delivered, is delivered after its result.
func (a answers) send(s uint64, class string, delivered bool) {
	a.start(s)
	a.result(s, class)
	if delivered {
		a.deliver(s)
	}
}

func TestCheckerAnswersClean(t *testing.T) {
	h := newHist()
	a := answers{h}
	h.send(1, 1, ClassOK, true)
	// Several answers out at once, their results read in another order than made, one
	// delivered before its result is read; a failed one not delivered, a maybe one delivered.
	a.start(1)
	a.start(2)
	a.start(3)
	a.deliver(1)
	a.result(2, ClassOK)
	a.result(1, ClassOK)
	a.deliver(2)
	a.result(3, ClassFailed)
	a.send(4, ClassMaybe, true)
	a.send(5, ClassMaybe, false)
	// The receiver's scheduled stream to a0e0 has calls 1..3 too, delivered between its
	// answers and after a later answer: another stream, with its own numbers and order.
	h.c.Step(Event{K: KindDispatch, Eng: rcv, Slot: "a0e0", Op: 1, Window: 1, Sends: []Send{{P: 1}}})
	for s := uint64(1); s <= 3; s++ {
		h.c.Step(Event{K: KindStart, Eng: rcv, Slot: "a0e0", Op: 1, S: s, P: s})
		h.c.Step(Event{K: KindResult, Eng: rcv, Slot: "a0e0", S: s, P: s, Class: ClassOK})
		h.c.Step(Event{K: KindDeliver, Eng: snd, From: rcv, S: s, P: s})
	}
	a.send(6, ClassOK, true)
	c := h.finish()
	require.Empty(t, c.Violations, "%+v", c.Details)
	require.Empty(t, c.Allowances)
	require.Equal(t, AnswerStats{Calls: 6, Acked: 3, Maybe: 2, Failed: 1, Delivered: 4, Checked: 3}, c.Answers)
	require.EqualValues(t, 10, c.Calls, "answers are calls of the run")
	require.EqualValues(t, 7, c.Checked)
}

// TestCheckerAnswerViolations: an answer stream shows each violation a scheduled stream
// does, and early_done, its own; each is reported as the answer stream's.
func TestCheckerAnswerViolations(t *testing.T) {
	for _, tc := range []struct {
		kind  string
		build func(a answers)
		also  map[string]int // other violations the history shows
	}{
		{VLost, func(a answers) { a.send(1, ClassOK, true); a.send(2, ClassOK, false); a.send(3, ClassOK, true) }, nil},
		{VDuplicate, func(a answers) { a.send(1, ClassOK, true); a.deliver(1) }, nil},
		{VReorder, func(a answers) {
			a.start(1)
			a.start(2)
			a.result(1, ClassOK)
			a.result(2, ClassOK)
			a.deliver(2)
			a.deliver(1)
		}, nil},
		{VDeliveredAfterFailure, func(a answers) { a.send(1, ClassFailed, true) }, nil},
		{VCorrupt, func(a answers) {
			a.start(1)
			a.result(1, ClassOK)
			a.h.c.Step(Event{K: KindDeliver, Eng: snd, From: rcv, S: 1, P: 1, Answer: true, Bad: "size 3, sent 4"})
		}, map[string]int{VLost: 1}}, // the corrupt copy is no delivery
		{VNoResult, func(a answers) { a.start(1) }, nil},
		{VPhantom, func(a answers) { a.send(1, ClassOK, true); a.deliver(2) }, nil},
		{VDoubleResult, func(a answers) { a.send(1, ClassOK, true); a.result(1, ClassMaybe) }, nil},
		{VHang, func(a answers) {
			a.start(1)
			a.h.c.Step(Event{K: KindHang, Eng: rcv, Slot: "a0e0", Answer: true, Err: "answer 1 (SendNotifyAsync from the handler) still runs after 1m31s"})
		}, map[string]int{VNoResult: 1}},
		{VEarlyDone, func(a answers) {
			a.start(1)
			a.h.c.Step(Event{K: KindEarlyDone, Eng: rcv, Slot: "a0e0", S: 1, P: 1, Answer: true, Err: "done ran before SendNotifyAsync returned"})
			a.result(1, ClassOK)
			a.deliver(1)
		}, nil},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			h := newHist()
			h.send(1, 1, ClassOK, true)
			tc.build(answers{h})
			c := h.finish()
			want := map[string]int{tc.kind: 1}
			for k, n := range tc.also {
				want[k] = n
			}
			require.Equal(t, want, c.Violations, "%+v", c.Details)
			for _, v := range c.Details {
				require.Equal(t, "a1e0.1 -> a0e0 (answers)", v.Stream)
				require.NotEmpty(t, v.History)
			}
		})
	}
}

func TestCheckerAnswerDeliveredByTwoIncarnations(t *testing.T) {
	// A scheduled call's payload delivered again by a new incarnation is allowed (its retry
	// with the same ID); an answer is one call, never retried: a second copy anywhere is a
	// duplicate.
	h := newHist()
	a := answers{h}
	a.start(1)
	a.deliver(1)
	h.c.Step(Event{K: KindClosed, Eng: snd})
	h.c.Step(Event{K: KindBegin, Slot: "a0e0", Inc: 2})
	a.result(1, ClassMaybe)
	a.deliverTo("a0e0.2", 1)
	h.c.Step(Event{K: KindClosed, Eng: "a0e0.2"})
	h.c.Step(Event{K: KindClosed, Eng: rcv})
	h.c.Finish()
	only(t, h.c, VDuplicate)
	require.Contains(t, h.c.Details[0].Detail, "which a0e0.1 delivered before")
	require.Empty(t, h.c.Allowances)
}

func TestCheckerAnswerLossAllowedOnlyWhereItCouldBeHeld(t *testing.T) {
	t.Run("the answered engine killed", func(t *testing.T) {
		h := newHist()
		a := answers{h}
		a.send(1, ClassOK, true)
		a.send(2, ClassOK, false) // held by a0e0.1 when it was killed
		h.c.Step(Event{K: KindKill, Slot: "a0e0", Inc: 1})
		h.c.Step(Event{K: KindClosed, Eng: rcv})
		h.c.Finish()
		require.Empty(t, h.c.Violations, "%+v", h.c.Details)
		require.Equal(t, map[string]int{ALostReceiverKilled: 1}, h.c.Allowances)
	})
	t.Run("killed before the answered engine began", func(t *testing.T) {
		// a0e0.1 was killed before a0e0.2 began; the answer to a0e0.2's notify was made
		// after that, acknowledged, and never delivered by a0e0.2, closed cleanly.
		h := newHist()
		a := answers{h}
		h.c.Step(Event{K: KindKill, Slot: "a0e0", Inc: 1})
		h.c.Step(Event{K: KindBegin, Slot: "a0e0", Inc: 2})
		a.startFor("a0e0.2", 1)
		a.result(1, ClassOK)
		h.c.Step(Event{K: KindClosed, Eng: "a0e0.2"})
		h.c.Step(Event{K: KindClosed, Eng: rcv})
		h.c.Finish()
		only(t, h.c, VLost)
		require.Empty(t, h.c.Allowances)
	})
	t.Run("the answering engine killed", func(t *testing.T) {
		// Its answers without a result are unknown; its acknowledged ones must arrive.
		h := newHist()
		a := answers{h}
		a.send(1, ClassOK, false)
		a.start(2)
		h.c.Step(Event{K: KindKill, Slot: dst, Inc: 1})
		a.deliver(3) // its start line died with it
		h.c.Step(Event{K: KindClosed, Eng: snd})
		h.c.Finish()
		only(t, h.c, VLost)
		require.Equal(t, map[string]int{AUnreportedStart: 1}, h.c.Allowances)
	})
}
