package notify

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestLatencyHistBuckets(t *testing.T) {
	tests := []struct {
		d      time.Duration
		bucket int
	}{
		{-time.Second, 0}, // a clock step back counts as 0
		{0, 0},
		{time.Microsecond, 0},
		{time.Microsecond + 1, 1},
		{3 * time.Microsecond, 2},
		{time.Millisecond, 9},
		{999 * time.Millisecond, 18},
		{time.Second, 18},
		{time.Second + 1, 19},
		{time.Hour, 19},
	}
	for _, tt := range tests {
		t.Run(tt.d.String(), func(t *testing.T) {
			var h latencyHist
			h.observe(tt.d)
			s := h.snapshot()
			require.Len(t, s.Counts, len(latencyBounds)+1)
			want := make([]uint64, len(latencyBounds)+1)
			want[tt.bucket] = 1
			require.Equal(t, want, s.Counts)
			require.Equal(t, uint64(1), s.Count)
			require.Equal(t, max(tt.d, 0), s.Sum)
		})
	}
}

func TestFailureReason(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{nil, ""},
		{ErrClosed, "closed"},
		{sendErr(ErrClosed, "p", "", context.DeadlineExceeded, false), "closed"},
		{sendErr(ErrInvalid, "p", "", errors.New("name: empty"), false), "invalid"},
		{sendErr(ErrTooLarge, "p", "oob", nil, false), "too_large"},
		{sendErr(ErrLimit, "p", "", nil, false), "limit"},
		{sendErr(ErrAuth, "p", "oob", nil, false), "auth"},
		{sendErr(ErrRejected, "p", "oob", nil, false), "rejected"},
		{fmt.Errorf("connect: %w", ErrNoCtrlChannel), "no_ctrl_channel"},
		{sendErr(errPeerDevice, "p", "handshake", errors.New("the peer refused: port 1 is PORT_DOWN"), false), "peer_device"},
		{sendErr(ErrPeerDead, "p", "rdma_twosided", nil, true), "peer_dead"},
		{sendErr(ErrBackpressure, "p", "", nil, false), "backpressure"},
		{sendErr(ErrPeerUnreachable, "p", "oob", nil, true), "unreachable"},
		// The kind decides, not a sentinel the cause carries.
		{sendErr(ErrTimeout, "p", "", fmt.Errorf("dial: %w", ErrPeerUnreachable), true), "timeout"},
		{&kindError{kind: ErrPeerUnreachable, cause: context.DeadlineExceeded}, "unreachable"},
		{fmt.Errorf("send: %w", context.DeadlineExceeded), "timeout"},
		{context.Canceled, "timeout"},
		{errors.New("something else"), "other"},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, FailureReason(tt.err), "%v", tt.err)
	}
	require.Equal(t, "other", FailureReasons()[len(FailureReasons())-1])
}

func TestSendCounters(t *testing.T) {
	var c engineCounters
	start := time.Now().Add(-3 * time.Millisecond)
	c.sendResult(start, nil)
	c.sendReturned(start, new(error))
	errp := new(error)
	*errp = fmt.Errorf("x: %w", ErrPeerUnreachable)
	c.sendReturned(start, errp)
	c.refused(errp)
	c.refused(new(error)) // nil: queued, not a failure
	c.deliveredOne()
	require.Equal(t, uint64(2), c.sent.Load())
	require.Equal(t, uint64(2), c.failed[failureIndex(ErrPeerUnreachable)].Load())
	require.Equal(t, uint64(1), c.delivered.Load())
	s := c.sendLatency.snapshot()
	require.Equal(t, uint64(2), s.Count, "failures are not latencies")
	require.GreaterOrEqual(t, s.Sum, 6*time.Millisecond)
}

func TestQueueClock(t *testing.T) {
	var h latencyHist
	q := queueClock{hist: &h}
	for i := range 40 { // grows past its first 16 slots while wrapped
		q.in()
		if i%3 == 0 {
			q.out()
		}
	}
	require.Equal(t, 40-14, q.n)
	for q.n > 0 {
		q.out()
	}
	q.out() // empty: nothing observed
	require.Equal(t, uint64(40), h.snapshot().Count)
	off := queueClock{}
	off.in()
	off.out()
	require.Zero(t, off.n, "no histogram: not timed")
}

// TestCountersAllocateNothing: the updates on the per-notify path allocate nothing.
func TestCountersAllocateNothing(t *testing.T) {
	var c engineCounters
	var h latencyHist
	q := queueClock{hist: &h}
	q.in()
	q.out() // the ring's first growth
	errFail := fmt.Errorf("x: %w", ErrPeerUnreachable)
	start := time.Now()
	allocs := testing.AllocsPerRun(1000, func() {
		var err error
		c.sendReturned(start, &err)
		c.sendResult(start, errFail)
		c.refused(&err)
		c.deliveredOne()
		c.deliverLatency.observe(time.Microsecond)
		q.in()
		q.out()
	})
	require.Zero(t, allocs)
}

func BenchmarkCountersPerNotify(b *testing.B) {
	var c engineCounters
	start := time.Now()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c.sendResult(start, nil)
			c.deliveredOne()
		}
	})
}
