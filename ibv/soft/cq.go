package soft

import (
	"fmt"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/twosided/twosided/ibv"
)

// channel is a completion channel: an eventfd that is readable while events are queued.
// With manual progress its Fd is an epoll fd holding that eventfd and, while this channel
// holds it (one channel of the device at a time: device.enrol), the device's progress set,
// so that it is also readable while a socket of the device holds packets; GetEvent then does
// the receive work first (see the package doc).
type channel struct {
	ctx *context
	fd  eventfd
	efd int // the epoll fd Fd returns; -1: Fd is fd itself

	// The device's progress holder election (device.holdMu).
	enrolled bool // among the device's channels that may hold its progress set
	slot     int  // index in device.chans
	holding  bool // its efd holds the device's progress set

	mu       sync.Mutex
	ring     []*cq // queued events, one per firing
	head     int
	n        int
	cqs      int // CQs attached
	closed   bool
	raised   bool // fd's level is up (or its raise is under way)
	inflight int  // fire calls between deciding to raise and seeing the level again
	// progressed: the last GetEvent returned an event (its progress ran or was not needed)
	// and no CQ of the channel was armed since; the next one with none queued skips progress
	// and says ErrWouldBlock. An arm clears it: a consumer that arms goes on to wait on the
	// fd, and its next GetEvent comes from a new readiness (a consumer that reads one event
	// per armed CQ, as the reactor does, never makes the empty call).
	progressed atomic.Bool
	// waited: GetEvent was called, so the consumer sleeps on the fd: Poll leaves progress
	// to GetEvent.
	waited atomic.Bool
	quiet  bool // GetEvent is progressing: it takes the events itself, no raise needed
	// raising counts fire calls writing the eventfd outside mu; Close waits for them before
	// it closes the fd, so a late write never lands on a reused fd number.
	raising sync.WaitGroup
}

var _ ibv.CompChannel = (*channel)(nil)

func (ch *channel) Fd() int {
	if ch.efd >= 0 {
		return ch.efd
	}
	return int(ch.fd)
}

// fire queues one event for c; the fd becomes readable with the first queued event.
func (ch *channel) fire(c *cq) {
	ch.mu.Lock()
	if ch.closed {
		ch.mu.Unlock()
		return
	}
	if ch.n == len(ch.ring) {
		nr := make([]*cq, 2*len(ch.ring))
		for i := 0; i < ch.n; i++ {
			nr[i] = ch.ring[(ch.head+i)%len(ch.ring)]
		}
		ch.ring, ch.head = nr, 0
	}
	ch.ring[(ch.head+ch.n)%len(ch.ring)] = c
	ch.n++
	if ch.raised || ch.quiet {
		ch.mu.Unlock()
		return
	}
	// The write wakes the consumer, whose first step is GetEvent: write after unlocking so
	// it does not find mu held (measured 22 µs → 5 µs CQE-to-handler on the reactor bench).
	ch.raised = true
	ch.inflight++
	ch.raising.Add(1)
	ch.mu.Unlock()
	ch.fd.raise()
	ch.mu.Lock()
	ch.inflight--
	if !ch.raised && !ch.closed {
		ch.fd.drain() // a GetEvent took the events and lowered the level before this write
	}
	ch.mu.Unlock()
	ch.raising.Done()
}

func (ch *channel) GetEvent() (ibv.CQ, error) {
	if ch.efd >= 0 && !ch.ctx.d.holderWaited.Load() {
		ch.ctx.d.claim(ch) // nobody waits on the sockets: this consumer does from now on
	}
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.closed {
		return nil, fmt.Errorf("soft: get cq event: %w", ibv.ErrClosed)
	}
	ch.waited.Store(true)
	if ch.n == 0 && ch.efd >= 0 && !ch.progressed.Load() {
		// Manual progress: read the sockets here; the CQEs it makes fire this channel
		// quietly, as this call takes their events. The call after one that got an event
		// skips it unless a CQ was armed since: a consumer that drains until ErrWouldBlock
		// pays one socket read per wake-up, and what arrived meanwhile keeps the fd
		// readable.
		ch.quiet = true
		ch.mu.Unlock()
		ch.ctx.d.progress()
		ch.mu.Lock()
		ch.quiet = false
		if ch.closed {
			return nil, fmt.Errorf("soft: get cq event: %w", ibv.ErrClosed)
		}
	}
	if ch.n == 0 {
		ch.progressed.Store(false)
		if ch.raised || ch.inflight > 0 {
			// A write still on its way may land after this drain; its writer drains again
			// once it sees the level lowered. Without this drain a level-triggered consumer
			// would spin on the fd until that writer runs again.
			ch.fd.drain()
			ch.raised = false
		}
		return nil, ibv.ErrWouldBlock
	}
	ch.progressed.Store(ch.efd >= 0)
	c := ch.ring[ch.head]
	ch.ring[ch.head] = nil
	ch.head = (ch.head + 1) % len(ch.ring)
	ch.n--
	switch {
	case ch.n == 0 && ch.raised:
		ch.fd.drain()
		ch.raised = false
	case ch.n > 0 && !ch.raised:
		ch.fd.raise() // events fired quietly remain: the level must show them
		ch.raised = true
	}
	c.events.Add(1)
	return c, nil
}

// drop removes the queued events of c (it is being destroyed).
func (ch *channel) drop(c *cq) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	k := 0
	for i := 0; i < ch.n; i++ {
		x := ch.ring[(ch.head+i)%len(ch.ring)]
		if x != c {
			ch.ring[(ch.head+k)%len(ch.ring)] = x
			k++
		}
	}
	for i := k; i < ch.n; i++ {
		ch.ring[(ch.head+i)%len(ch.ring)] = nil
	}
	ch.n = k
	if ch.n == 0 && !ch.closed && ch.raised {
		ch.fd.drain()
		ch.raised = false
	}
	ch.cqs--
}

func (ch *channel) Close() error {
	ch.mu.Lock()
	if ch.closed {
		ch.mu.Unlock()
		return fmt.Errorf("soft: close comp channel: %w", ibv.ErrClosed)
	}
	if ch.cqs > 0 {
		n := ch.cqs
		ch.mu.Unlock()
		return fmt.Errorf("soft: close comp channel: %d CQs still use it: %w", n, ibv.ErrBusy)
	}
	ch.closed = true
	ch.mu.Unlock()
	ch.raising.Wait()
	ch.closeFds()
	ch.ctx.mu.Lock()
	delete(ch.ctx.chans, ch)
	ch.ctx.mu.Unlock()
	return nil
}

func (ch *channel) closeFds() {
	if ch.efd >= 0 {
		ch.ctx.d.unenrol(ch) // hands the progress set on before the fd goes
	}
	unix.Close(int(ch.fd))
	if ch.efd >= 0 {
		unix.Close(ch.efd)
	}
}

// cq is a completion queue: a ring of WCs filled by the NIC goroutines.
type cq struct {
	ctx *context
	ch  *channel

	mu            sync.Mutex
	ring          []ibv.WC
	head, n       int
	armed         bool
	solicitedOnly bool
	overrun       bool
	destroyed     bool
	qps           int

	events atomic.Int64 // got from the channel
	acked  atomic.Int64
}

var _ ibv.CQ = (*cq)(nil)

// push adds a CQE as the NIC does, firing the channel when armed. It returns false on
// overrun (the CQ was full): the CQE is lost, the CQ is in error and EventCQErr is raised.
func (c *cq) push(wc *ibv.WC, solicited bool) bool {
	c.mu.Lock()
	if c.destroyed {
		c.mu.Unlock()
		return true
	}
	if c.overrun {
		c.mu.Unlock()
		return false
	}
	if c.n == len(c.ring) {
		c.overrun = true
		c.mu.Unlock()
		c.ctx.d.ctr.cqOverruns.Add(1)
		c.ctx.raise(ibv.AsyncEvent{Type: ibv.EventCQErr, CQ: c})
		return false
	}
	c.ring[(c.head+c.n)%len(c.ring)] = *wc
	c.n++
	fire := c.armed && (!c.solicitedOnly || solicited || wc.Status != ibv.WCSuccess)
	if fire {
		c.disarmLocked()
	}
	c.mu.Unlock()
	if fire && c.ch != nil {
		c.ch.fire(c)
	}
	return true
}

// disarmLocked clears the arm (fired or destroyed).
func (c *cq) disarmLocked() {
	if c.armed {
		c.armed = false
		if c.ch != nil {
			c.ctx.d.armed.Add(-1)
		}
	}
}

func (c *cq) Poll(wcs []ibv.WC) (int, error) {
	c.mu.Lock()
	if c.destroyed {
		c.mu.Unlock()
		return 0, fmt.Errorf("soft: poll cq: %w", ibv.ErrClosed)
	}
	if c.n == 0 && c.ctx.d.pfd >= 0 && (c.ch == nil || !c.ch.waited.Load() || !c.ctx.d.holderWaited.Load()) {
		// Manual progress: an empty CQ looks at the sockets before it says so — unless
		// its consumer waits on the channel and a consumer waits on the fd that shows
		// readable sockets (the holder's: its GetEvent does the work then, and places
		// this CQ's completions too; a Poll syscall per empty poll would be waste).
		c.mu.Unlock()
		c.ctx.d.progress()
		c.mu.Lock()
		if c.destroyed {
			c.mu.Unlock()
			return 0, fmt.Errorf("soft: poll cq: %w", ibv.ErrClosed)
		}
	}
	k := len(wcs)
	if k > c.n {
		k = c.n
	}
	for i := 0; i < k; i++ {
		wcs[i] = c.ring[c.head]
		c.head++
		if c.head == len(c.ring) {
			c.head = 0
		}
	}
	c.n -= k
	c.mu.Unlock()
	return k, nil
}

func (c *cq) ReqNotify(solicitedOnly bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.destroyed {
		return fmt.Errorf("soft: req notify cq: %w", ibv.ErrClosed)
	}
	if c.ch == nil {
		return fmt.Errorf("soft: req notify cq: no completion channel: %w", ibv.ErrInvalid)
	}
	if !c.armed {
		c.armed = true
		c.ctx.d.armed.Add(1)
	}
	c.ch.progressed.Store(false)
	c.solicitedOnly = solicitedOnly
	return nil
}

// Flush is the end of the consumer's turn (reactor.Flusher): the SENDs it posted and the
// ACKs its progress owes leave now, one write per connection. A consumer that calls it once
// per turn gets doorbell batching from then on; one that never does gets a write per post.
func (c *cq) Flush() { c.ctx.d.flush() }

func (c *cq) AckEvents(n int) { c.acked.Add(int64(n)) }

func (c *cq) CQE() int { return len(c.ring) }

func (c *cq) Channel() ibv.CompChannel {
	if c.ch == nil {
		return nil
	}
	return c.ch
}

func (c *cq) Destroy() error {
	c.mu.Lock()
	if c.destroyed {
		c.mu.Unlock()
		return fmt.Errorf("soft: destroy cq: %w", ibv.ErrClosed)
	}
	if c.qps > 0 {
		n := c.qps
		c.mu.Unlock()
		return fmt.Errorf("soft: destroy cq: %d QPs still use it: %w", n, ibv.ErrBusy)
	}
	if un := c.events.Load() - c.acked.Load(); un > 0 {
		c.mu.Unlock()
		return fmt.Errorf("soft: destroy cq: %d events not acknowledged: %w", un, ibv.ErrBusy)
	}
	c.destroyed = true
	c.disarmLocked()
	c.mu.Unlock()
	if c.ch != nil {
		c.ch.drop(c)
	}
	c.ctx.mu.Lock()
	delete(c.ctx.cqs, c)
	c.ctx.mu.Unlock()
	return nil
}
