package reactor

import (
	"sync"

	"github.com/twosided/twosided/ibv"
	"golang.org/x/sys/unix"
)

// fakeChannel is a completion channel over a non-blocking eventfd that is readable while
// events are queued, with libibverbs' one-event-per-firing semantics.
type fakeChannel struct {
	fd     int
	mu     sync.Mutex
	queue  []*fakeCQ
	getErr error
	empty  int // GetEvent calls that found no event
}

func newFakeChannel() (*fakeChannel, error) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	return &fakeChannel{fd: fd, queue: make([]*fakeCQ, 0, 64)}, nil
}

func (c *fakeChannel) Fd() int { return c.fd }

// fire queues an event; the eventfd is written after the lock is released, so the woken loop
// does not find the lock still held (measured: holding it across the write costs the
// CQE→HandleWC path about 4x at p50, see BenchmarkCQLatency).
func (c *fakeChannel) fire(q *fakeCQ) {
	c.mu.Lock()
	c.queue = append(c.queue, q)
	first := len(c.queue) == 1
	c.mu.Unlock()
	if first {
		_, _ = unix.Write(c.fd, wakeOne[:])
	}
}

func (c *fakeChannel) GetEvent() (ibv.CQ, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.getErr != nil {
		return nil, c.getErr
	}
	if len(c.queue) == 0 {
		c.empty++
		var b [8]byte
		_, _ = unix.Read(c.fd, b[:]) // a write that raced a drain: clear it, or it stays readable
		return nil, ibv.ErrWouldBlock
	}
	q := c.queue[0]
	c.queue = append(c.queue[:0], c.queue[1:]...)
	if len(c.queue) == 0 {
		var b [8]byte
		_, _ = unix.Read(c.fd, b[:])
	}
	q.events++
	return q, nil
}

func (c *fakeChannel) Close() error { return unix.Close(c.fd) }

// fakeCQ is a CQ with one-shot arm semantics: a CQE raises an event only if the CQ was armed
// when it landed, and disarms it; CQEs present at arm time raise nothing (as ibv_req_notify_cq
// promises nothing about them).
type fakeCQ struct {
	ch *fakeChannel

	mu        sync.Mutex
	wcs       []ibv.WC
	armed     bool
	beforeArm func() // runs inside ReqNotify, before arming: the "provider hook"
	pollErr   error
	armErr    error
	events    int // got through the channel (under ch.mu)
	ackCalls  []int
	acked     int
	arms      int
	polls     int
}

func newFakeCQ(ch *fakeChannel) *fakeCQ {
	return &fakeCQ{ch: ch, wcs: make([]ibv.WC, 0, 1024), ackCalls: make([]int, 0, 64)}
}

// land adds a CQE as the NIC would, firing the channel when armed. Any goroutine.
func (q *fakeCQ) land(wc ibv.WC) {
	q.mu.Lock()
	q.wcs = append(q.wcs, wc)
	fire := q.armed
	q.armed = false
	q.mu.Unlock()
	if fire {
		q.ch.fire(q)
	}
}

func (q *fakeCQ) Poll(out []ibv.WC) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.polls++
	if q.pollErr != nil {
		return 0, q.pollErr
	}
	n := copy(out, q.wcs)
	q.wcs = append(q.wcs[:0], q.wcs[n:]...)
	return n, nil
}

func (q *fakeCQ) ReqNotify(bool) error {
	q.mu.Lock()
	hook := q.beforeArm
	q.mu.Unlock()
	if hook != nil {
		hook()
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.armErr != nil {
		return q.armErr
	}
	q.armed = true
	q.arms++
	return nil
}

func (q *fakeCQ) AckEvents(n int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.ackCalls) < cap(q.ackCalls) { // bounded, so that steady state allocates nothing
		q.ackCalls = append(q.ackCalls, n)
	}
	q.acked += n
}

func (q *fakeCQ) CQE() int                 { return cap(q.wcs) }
func (q *fakeCQ) Channel() ibv.CompChannel { return q.ch }
func (q *fakeCQ) Destroy() error           { return nil }

func (q *fakeCQ) isArmed() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.armed
}

func (q *fakeCQ) acks() (int, []int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.acked, append([]int(nil), q.ackCalls...)
}

func (q *fakeCQ) gotEvents() int {
	q.ch.mu.Lock()
	defer q.ch.mu.Unlock()
	return q.events
}

// recorder is a CQHandler that logs what the loop asks of it.
type recorder struct {
	mu      sync.Mutex
	wrids   []uint64
	steps   []string // "wc" and "repost", in call order
	errs    []error
	onWC    func(wcs []ibv.WC)
	handled chan uint64 // optional: every WRID, as it is handled
}

func (r *recorder) HandleWC(wcs []ibv.WC) {
	r.mu.Lock()
	for _, wc := range wcs {
		r.wrids = append(r.wrids, wc.WRID)
	}
	r.steps = append(r.steps, "wc")
	f := r.onWC
	r.mu.Unlock()
	if r.handled != nil {
		for _, wc := range wcs {
			r.handled <- wc.WRID
		}
	}
	if f != nil {
		f(wcs)
	}
}

func (r *recorder) Repost() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.steps = append(r.steps, "repost")
}

func (r *recorder) CQError(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, err)
}

func (r *recorder) got() []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]uint64(nil), r.wrids...)
}
