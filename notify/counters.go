package notify

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/twosided/twosided/ctrlchannel"
)

// engineCounters are the engine-wide counters and latency histograms that the peer machine
// does not keep. They are updated where the engine already counts (a send returns, a notify
// is handed to the application, a channel closes) and read by Stats from any goroutine:
// atomics and fixed arrays only, so an update is lock-free and allocates nothing.
type engineCounters struct {
	sent      atomic.Uint64                      // sends that returned nil
	failed    [len(failureReasons)]atomic.Uint64 // sends that returned an error, by reason
	delivered atomic.Uint64                      // received notifies handed to the application

	sendLatency    latencyHist // SendNotify or SendNotifyAsync call → success
	deliverLatency latencyHist // queued on receive → taken by Recv or GetNotifies

	// Loop-owned: the counters of channels that closed, so that engine totals never go back.
	closedChannels ChannelStats
}

// sendResult counts the end of one send that started at start; err is what the caller got.
func (c *engineCounters) sendResult(start time.Time, err error) {
	if err != nil {
		c.failed[failureIndex(err)].Add(1)
		return
	}
	c.sent.Add(1)
	c.sendLatency.observe(time.Since(start))
}

// sendReturned is sendResult for a deferred call on a named result:
// defer e.ctr.sendReturned(time.Now(), &err).
func (c *engineCounters) sendReturned(start time.Time, errp *error) { c.sendResult(start, *errp) }

// refused counts a send that SendNotifyAsync refused at once (its done is never called):
// defer e.ctr.refused(&err).
func (c *engineCounters) refused(errp *error) {
	if *errp != nil {
		c.failed[failureIndex(*errp)].Add(1)
	}
}

// deliveredOne counts a received notify handed to the application.
func (c *engineCounters) deliveredOne() { c.delivered.Add(1) }

// channelClosed folds a closed channel's counters into the engine's totals. Loop-only.
func (c *engineCounters) channelClosed(ch *ctrlchannel.Channel) {
	if ch == nil {
		return
	}
	c.closedChannels.add(channelStatsOf(ch.Stats()), false)
}

// failureReasons are the labels of a failed send, in the order failureIndex tries them; the
// last is every error no sentinel matches. The set is fixed: a new sentinel joins a label.
var failureReasons = [...]string{
	"closed", "invalid", "too_large", "limit", "auth", "rejected", "peer_device",
	"no_ctrl_channel", "peer_dead", "backpressure", "unreachable", "timeout", "other",
}

// failureMatch maps notify's sentinels to failureReasons.
var failureMatch = [len(failureReasons) - 1][]error{
	{ErrClosed},
	{ErrInvalid},
	{ErrTooLarge},
	{ErrLimit},
	{ErrAuth},
	{ErrRejected},
	{errPeerDevice},
	{ErrNoCtrlChannel},
	{ErrPeerDead},
	{ErrBackpressure},
	{ErrPeerUnreachable},
	{ErrTimeout, context.DeadlineExceeded, context.Canceled},
}

func failureIndex(err error) int {
	// A send error's kind decides, not a sentinel its cause happens to carry.
	switch k := err.(type) {
	case *sendError:
		err = k.kind
	case *kindError:
		err = k.kind
	}
	for i, sentinels := range failureMatch {
		for _, s := range sentinels {
			if errors.Is(err, s) {
				return i
			}
		}
	}
	return len(failureReasons) - 1
}

// FailureReasons are the reasons Stats.Failed counts, a fixed set.
func FailureReasons() []string { return failureReasons[:] }

// FailureReason is the reason a send's error is counted under in Stats.Failed: "closed",
// "invalid", "too_large", "limit", "auth", "rejected", "peer_device" (ErrNoCtrlChannel
// because the peer's device cannot make a channel: its port is down, the device failed),
// "no_ctrl_channel", "peer_dead", "backpressure", "unreachable", "timeout" (a deadline or
// cancellation) or "other".
func FailureReason(err error) string {
	if err == nil {
		return ""
	}
	return failureReasons[failureIndex(err)]
}

// latencyBounds are the histograms' bucket upper bounds: 1-2-5 steps from 1 µs to 1 s,
// which covers a busy-polled channel round trip (a few µs) up to an OOB connect (ms).
var latencyBounds = [...]time.Duration{
	1 * time.Microsecond, 2 * time.Microsecond, 5 * time.Microsecond,
	10 * time.Microsecond, 20 * time.Microsecond, 50 * time.Microsecond,
	100 * time.Microsecond, 200 * time.Microsecond, 500 * time.Microsecond,
	1 * time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond,
	10 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond,
	1 * time.Second,
}

// latencyHist is a lock-free histogram over latencyBounds: one atomic count per bucket
// (the last is above 1 s) and the sum.
type latencyHist struct {
	counts [len(latencyBounds) + 1]atomic.Uint64
	sum    atomic.Int64 // ns
}

func (h *latencyHist) observe(d time.Duration) {
	d = max(d, 0)
	lo, hi := 0, len(latencyBounds)
	for lo < hi { // the first bound ≥ d
		mid := int(uint(lo+hi) >> 1)
		if d <= latencyBounds[mid] {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	h.counts[lo].Add(1)
	h.sum.Add(int64(d))
}

// snapshot reads the histogram; Count is the sum of the buckets read, so the buckets always
// add up to it even while observations land.
func (h *latencyHist) snapshot() Histogram {
	s := Histogram{Bounds: latencyBounds[:], Counts: make([]uint64, len(h.counts))}
	for i := range h.counts {
		s.Counts[i] = h.counts[i].Load()
		s.Count += s.Counts[i]
	}
	s.Sum = time.Duration(h.sum.Load())
	return s
}

// clockBase is the origin of nanotime.
var clockBase = time.Now()

// nanotime is a monotonic reading in ns.
func nanotime() int64 { return int64(time.Since(clockBase)) }

// queueClock times notifies through the receive queue: a ring of the times they were
// queued, in queue order, next to the queue's own ring. Its methods run under the queue's
// lock; it allocates only when it grows, as the queue does.
type queueClock struct {
	hist   *latencyHist // nil: not timed
	stamps []int64
	head   int
	n      int
}

// in records that a notify was queued now.
func (q *queueClock) in() {
	if q.hist == nil {
		return
	}
	if q.n == len(q.stamps) {
		ns := make([]int64, max(2*len(q.stamps), 16))
		for i := 0; i < q.n; i++ {
			ns[i] = q.stamps[(q.head+i)%len(q.stamps)]
		}
		q.stamps, q.head = ns, 0
	}
	q.stamps[(q.head+q.n)%len(q.stamps)] = nanotime()
	q.n++
}

// out observes the time the oldest queued notify waited.
func (q *queueClock) out() {
	if q.hist == nil || q.n == 0 {
		return
	}
	t := q.stamps[q.head]
	q.head = (q.head + 1) % len(q.stamps)
	q.n--
	q.hist.observe(time.Duration(nanotime() - t))
}
