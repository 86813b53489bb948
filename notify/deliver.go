package notify

import (
	"context"
	"sync"
	"sync/atomic"
)

// deliver hands a notify the peer machine released (in order, once) to the application:
// the handler, or the bounded receive queue. When the queue fills, every channel pauses
// (no credit goes back, senders wait) and OOB notifies are held, then answered "busy".
// Loop-only.
func (e *Engine) deliver(n Notify) {
	e.ctr.deliveredOne()
	if e.cfg.onNotify != nil {
		e.cfg.onNotify(n)
		return
	}
	if full := e.rq.push(n); full && !e.paused {
		e.setPaused(true)
	}
}

// setPaused stops (or restarts) credit return on every channel. Loop-only.
func (e *Engine) setPaused(on bool) {
	e.paused = on
	for _, ch := range e.chans {
		ch.SetPaused(on)
	}
}

// onQueueRoom runs on a consumer's goroutine when the queue drained below its low mark.
func (e *Engine) onQueueRoom() {
	_ = e.loop.Submit(func() {
		if !e.paused || e.closing {
			return
		}
		// Held OOB notifies first, in order; one that fills the queue again pauses it again
		// (deliver), and the rest wait for the next room.
		e.paused = false
		held := e.heldOOB
		e.heldOOB = nil
		for i := range held {
			if e.paused {
				e.heldOOB = append(e.heldOOB, held[i:]...)
				return
			}
			e.m.oobTaken(held[i].req.Session, held[i].pair)
			e.takeOOB(&held[i].req, held[i].reply)
		}
		if e.paused {
			return
		}
		if e.rq.stillFull() {
			// Filled meanwhile (a closing channel handed over what it held): stay paused;
			// the next room comes when the consumer drains it (armed under the queue's lock).
			e.paused = true
			return
		}
		for _, ch := range e.chans {
			if e.paused {
				// What one channel held filled the queue again: deliver paused every
				// channel, the ones not reached yet included; they stay so.
				return
			}
			ch.SetPaused(false)
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
	clock    queueClock   // times each notify's wait in the queue
	parked   atomic.Int32 // pop calls waiting for a notify (tests)
}

func (q *recvQueue) init(capacity int, room func()) {
	q.capacity = capacity
	q.buf = make([]Notify, 0, min(capacity, 1024))
	q.wake = make(chan struct{}, 1)
	q.done = make(chan struct{})
	q.room = room
}

// stillFull reports whether the queue is at capacity, and if so arms the next room signal
// (under the lock, so a consumer's pops cannot slip between the check and the arming).
func (q *recvQueue) stillFull() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n >= q.capacity {
		q.wantRoom.Store(true)
		return true
	}
	return false
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

// pop takes the next notify, waiting with ctx. It reports ErrClosed only once the queue is
// closed and empty: the queue closes at the end of Close, after Close has handed over what
// the channels held, so a Recv loop that goes on through Close gets all of it.
func (q *recvQueue) pop(ctx context.Context) (Notify, error) {
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
		if isClosed {
			return Notify{}, ErrClosed
		}
		q.parked.Add(1)
		select {
		case <-q.wake:
		case <-q.done:
		case <-ctx.Done():
			q.parked.Add(-1)
			return Notify{}, ctx.Err()
		}
		q.parked.Add(-1)
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
