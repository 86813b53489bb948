package reactor

import "sync/atomic"

// ring is a bounded multi-producer, single-consumer queue of funcs: Dmitry Vyukov's array
// queue, where each cell's sequence number says whose turn it is. Producers claim a position
// with a CAS on head; the loop, the only consumer, owns tail. Nothing allocates after newRing.
type ring struct {
	head  atomic.Uint64 // next position a producer claims
	_     [56]byte      // head and tail on different cache lines
	tail  uint64        // next position the consumer reads; loop only
	_     [56]byte
	cells []cell
	size  uint64
}

type cell struct {
	// seq == 2*pos: free for the producer of pos; 2*pos+1: filled for the consumer of pos;
	// the consumer frees it for the next lap with 2*(pos+size). Doubling keeps "filled at
	// pos" and "free at pos+1" apart when size is 1.
	seq atomic.Uint64
	f   func()
}

func newRing(n int) *ring {
	r := &ring{cells: make([]cell, n), size: uint64(n)}
	for i := range r.cells {
		r.cells[i].seq.Store(2 * uint64(i))
	}
	return r
}

// push enqueues f; false when the ring is full. Safe from any goroutine.
func (r *ring) push(f func()) bool {
	pos := r.head.Load()
	for {
		c := &r.cells[pos%r.size]
		seq := c.seq.Load()
		switch dif := int64(seq - 2*pos); {
		case dif == 0:
			if r.head.CompareAndSwap(pos, pos+1) {
				c.f = f
				c.seq.Store(2*pos + 1)
				return true
			}
			pos = r.head.Load()
		case dif < 0:
			return false // the consumer has not freed this cell yet: a full lap ahead
		default:
			pos = r.head.Load() // another producer took pos
		}
	}
}

// pop dequeues the oldest func; false when empty (or when the producer that claimed the next
// position has not finished writing it yet — it will wake the loop when it has). Loop only.
func (r *ring) pop() (func(), bool) {
	c := &r.cells[r.tail%r.size]
	if c.seq.Load() != 2*r.tail+1 {
		return nil, false
	}
	f := c.f
	c.f = nil
	c.seq.Store(2 * (r.tail + r.size))
	r.tail++
	return f, true
}

// ready reports whether pop would return a func. Loop only.
func (r *ring) ready() bool {
	return r.cells[r.tail%r.size].seq.Load() == 2*r.tail+1
}

// pending reports whether any position was claimed and not yet consumed, whether or not its
// producer has finished writing it (ready reports only the latter, for the next position).
// Loop only (the turn's holder).
func (r *ring) pending() bool {
	return r.head.Load() != r.tail
}
