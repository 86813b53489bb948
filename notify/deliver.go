package notify

import (
	"context"
	"sync"
	"sync/atomic"
)

// seen is the receive-side duplicate filter of one sending session: every seq ≤ floor was
// delivered, and so was every seq in above. A notify retried over OOB after its SEND
// failed may arrive out of order, hence the set; it stays small because gaps close.
type seen struct {
	floor uint64
	above map[uint64]struct{}
}

// maxSeenGap bounds the set: past it the oldest gap is given up (its seq, were it ever to
// come, would be taken as a duplicate).
const maxSeenGap = 1 << 16

// add records seq and reports whether it is new.
func (s *seen) add(seq uint64) bool {
	if seq <= s.floor {
		return false
	}
	if seq == s.floor+1 {
		s.floor = seq
		for len(s.above) > 0 {
			if _, ok := s.above[s.floor+1]; !ok {
				break
			}
			delete(s.above, s.floor+1)
			s.floor++
		}
		return true
	}
	if _, dup := s.above[seq]; dup {
		return false
	}
	if s.above == nil {
		s.above = make(map[uint64]struct{})
	}
	s.above[seq] = struct{}{}
	if len(s.above) > maxSeenGap {
		min := seq
		for k := range s.above {
			if k < min {
				min = k
			}
		}
		s.floor = min - 1
		s.add(min)
	}
	return true
}

// deliver hands a received notify to the application, once. session 0 is a Mooncake peer
// (no seq): always delivered. reply (OOB only) is answered when the notify is queued.
// Loop-only.
func (e *Engine) deliver(p *peer, session, seq uint64, n Notify, reply func(error)) {
	if session != 0 && seq != 0 {
		s := e.dedup[session]
		if s == nil {
			s = &seen{}
			e.dedup[session] = s
		}
		if !s.add(seq) {
			e.ctr.received(true)
			if p != nil {
				p.dups++
			}
			if reply != nil {
				reply(nil) // already delivered: the sender's retry succeeded
			}
			return
		}
	}
	e.ctr.received(false)
	if p != nil {
		p.received++
	}
	if e.cfg.onNotify != nil {
		e.cfg.onNotify(n)
		if reply != nil {
			reply(nil)
		}
		return
	}
	if reply != nil && (e.paused || len(e.heldOOB) > 0) {
		// Queue full: the OOB sender waits for its reply (bounded by its deadline).
		e.heldOOB = append(e.heldOOB, heldNotify{n: n, reply: reply})
		return
	}
	if full := e.rq.push(n); full && !e.paused {
		e.setPaused(true)
	}
	if reply != nil {
		reply(nil)
	}
}

// setPaused stops (or restarts) credit return on every channel. Loop-only.
func (e *Engine) setPaused(on bool) {
	e.paused = on
	for _, p := range e.peers {
		if p.ch != nil {
			p.ch.SetPaused(on)
		}
	}
}

// onQueueRoom runs on a consumer's goroutine when the queue drained below its low mark.
func (e *Engine) onQueueRoom() {
	_ = e.loop.Submit(func() {
		if !e.paused {
			return
		}
		held := e.heldOOB
		e.heldOOB = nil
		for _, h := range held {
			e.rq.push(h.n)
			h.reply(nil)
		}
		if e.rq.len() < e.rq.capacity {
			e.setPaused(false)
		}
	})
}

// recvQueue is the bounded queue of received notifies, between the loop (push) and the
// application (Recv, GetNotifies).
type recvQueue struct {
	mu       sync.Mutex
	buf      []Notify
	head     int
	n        int
	capacity int
	closed   bool
	wake     chan struct{} // a token when items arrive
	done     chan struct{} // closed when the queue closes
	room     func()
	wantRoom atomic.Bool
	clock    queueClock // times each notify's wait in the queue
}

func (q *recvQueue) init(capacity int, room func()) {
	q.capacity = capacity
	q.buf = make([]Notify, 0, min(capacity, 1024))
	q.wake = make(chan struct{}, 1)
	q.done = make(chan struct{})
	q.room = room
}

func (q *recvQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}

// push appends n and reports whether the queue is now at capacity. It never drops: the
// caller stops credit when it is full, so at most the channels' windows overshoot.
func (q *recvQueue) push(n Notify) (full bool) {
	q.mu.Lock()
	if q.n == len(q.buf) {
		q.grow()
	}
	q.buf[(q.head+q.n)%len(q.buf)] = n
	q.n++
	q.clock.in()
	full = q.n >= q.capacity
	if full {
		q.wantRoom.Store(true)
	}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return full
}

func (q *recvQueue) grow() {
	size := max(2*len(q.buf), 16)
	nb := make([]Notify, size)
	for i := 0; i < q.n; i++ {
		nb[i] = q.buf[(q.head+i)%len(q.buf)]
	}
	q.buf, q.head = nb, 0
}

func (q *recvQueue) popLocked() Notify {
	n := q.buf[q.head]
	q.buf[q.head] = Notify{}
	q.head = (q.head + 1) % len(q.buf)
	q.n--
	q.clock.out()
	return n
}

// afterPop signals room once the queue is at half capacity again.
func (q *recvQueue) afterPop(left int) {
	if left <= q.capacity/2 && q.wantRoom.CompareAndSwap(true, false) {
		q.room()
	}
	if left > 0 {
		select {
		case q.wake <- struct{}{}:
		default:
		}
	}
}

func (q *recvQueue) pop(ctx context.Context, closed *atomic.Bool) (Notify, error) {
	for {
		q.mu.Lock()
		if q.n > 0 {
			n := q.popLocked()
			left := q.n
			q.mu.Unlock()
			q.afterPop(left)
			return n, nil
		}
		isClosed := q.closed
		q.mu.Unlock()
		if isClosed || closed.Load() {
			return Notify{}, ErrClosed
		}
		select {
		case <-q.wake:
		case <-q.done:
		case <-ctx.Done():
			return Notify{}, ctx.Err()
		}
	}
}

func (q *recvQueue) drain() []Notify {
	q.mu.Lock()
	if q.n == 0 {
		q.mu.Unlock()
		return nil
	}
	out := make([]Notify, 0, q.n)
	for q.n > 0 {
		out = append(out, q.popLocked())
	}
	q.mu.Unlock()
	q.afterPop(0)
	return out
}

func (q *recvQueue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.closed {
		q.closed = true
		close(q.done)
	}
}
