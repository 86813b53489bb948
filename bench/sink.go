package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/twosided/twosided/internal/tracepoint"
)

// seqLen is the head of every bench message: the sequence number in 16 hex digits, so the
// message stays printable (a valid JSON string on the classic path).
const seqLen = 16

// minSize is the smallest message the bench sends.
const minSize = seqLen

const hexDigits = "0123456789abcdef"

// newMsg returns a message of size bytes (at least minSize): the sequence head, then 'x'.
func newMsg(size int) []byte {
	b := make([]byte, max(size, minSize))
	for i := range b {
		b[i] = 'x'
	}
	putSeq(b, 0)
	return b
}

// putSeq writes seq into the head of b.
func putSeq(b []byte, seq uint64) {
	for i := seqLen - 1; i >= 0; i-- {
		b[i] = hexDigits[seq&15]
		seq >>= 4
	}
}

// parseSeq reads the sequence head of b; ok is false when b has none.
func parseSeq(b []byte) (seq uint64, ok bool) {
	if len(b) < seqLen {
		return 0, false
	}
	for _, c := range b[:seqLen] {
		switch {
		case c >= '0' && c <= '9':
			seq = seq<<4 | uint64(c-'0')
		case c >= 'a' && c <= 'f':
			seq = seq<<4 | uint64(c-'a'+10)
		default:
			return 0, false
		}
	}
	return seq, true
}

// sink is where a node delivers what it receives: it counts, records latencies against
// the send timestamps (one clock: this process), echoes sequence numbers to a sender, and
// wakes one waiter. deliver allocates nothing and never blocks.
type sink struct {
	mu        sync.Mutex
	delivered int64
	bytes     int64
	hist      *Hist          // nil: latencies not recorded
	t0        []atomic.Int64 // send start by sequence number
	from      uint64         // record only sequence numbers >= from
	echo      chan uint64    // non-nil: hand every sequence number to the echo sender
	echoNow   func(uint64)   // non-nil: echo right here, on the delivering thread
	got       chan struct{}  // one pending wake-up for the waiter
	bad       atomic.Int64   // messages without a sequence head, echo overflow

	// Breakdown (sender of an echo run): by sequence number, the receiver's handler stamp
	// carried by the echo and the echo's arrival, CLOCK_MONOTONIC.
	peerAt, echoAt []atomic.Int64
}

func newSink() *sink { return &sink{got: make(chan struct{}, 1)} }

// timed makes the sink record nanotime()-t0[seq] for every seq in [from, len(t0)).
func (s *sink) timed(t0 []atomic.Int64, from uint64) {
	s.mu.Lock()
	s.hist, s.t0, s.from = NewHist(), t0, from
	s.mu.Unlock()
}

func (s *sink) deliver(msg []byte) {
	tracepoint.Mark(tracepoint.Deliver, len(msg))
	now := nanotime()
	seq, ok := parseSeq(msg)
	if !ok {
		s.bad.Add(1)
	}

	s.mu.Lock()
	if ok && seq < uint64(len(s.echoAt)) {
		s.echoAt[seq].Store(monoNow())
		if peer, ok := parseSeq(msg[seqLen:]); ok {
			s.peerAt[seq].Store(int64(peer))
		}
	}
	s.delivered++
	s.bytes += int64(len(msg))
	if ok && s.hist != nil && seq >= s.from && seq < uint64(len(s.t0)) {
		s.hist.Record(now - s.t0[seq].Load())
	}
	s.mu.Unlock()
	if s.echoNow != nil && ok {
		s.echoNow(seq)
		tracepoint.Mark(tracepoint.HandlerDone, 0)
	} else if s.echo != nil && ok {
		select {
		case s.echo <- seq:
		default:
			s.bad.Add(1)
		}
	}
	select {
	case s.got <- struct{}{}:
	default:
	}
}

func (s *sink) count() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.delivered
}

// wait returns once target messages were delivered, or ctx ends. One waiter at a time.
func (s *sink) wait(ctx context.Context, target int64) error {
	for {
		if n := s.count(); n >= target {
			return nil
		}
		select {
		case <-s.got:
		case <-ctx.Done():
			return fmt.Errorf("bench: waiting for %d deliveries, have %d: %w", target, s.count(), ctx.Err())
		}
	}
}

// latency returns the recorded histogram; call it after wait returned.
func (s *sink) latency() *Hist {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hist
}
