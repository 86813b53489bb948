package reactor

import (
	"errors"
	"fmt"

	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/internal/tracepoint"
)

// CQHandler consumes the completions of a watched CQ, on the loop goroutine.
type CQHandler interface {
	// HandleWC gets a batch of polled WCs (step 1). The slice is reused after return.
	HandleWC(wcs []ibv.WC)
	// Repost re-posts the RECVs, send slots and credits the WCs released (step 2): after
	// reaping, before arming.
	Repost()
}

// Flusher is optionally implemented by a CQ whose provider defers its doorbells — SENDs
// posted, acknowledgements owed — to the end of the consumer's turn (the soft provider's CQ
// does): the loop calls Flush once per iteration, before it sleeps or spins again, so what
// one turn sends leaves in one write. Hardware CQs need not implement it.
type Flusher interface {
	Flush()
}

// CQErrorHandler is optionally implemented by a CQHandler to receive Poll, ReqNotify and
// GetEvent errors of its CQ; without it they are logged. After an error the cycle stops with
// the CQ not armed; Kick retries.
type CQErrorHandler interface {
	CQError(err error)
}

// CQWatch is a CQ watched by the loop under the completion handling rule. Loop only.
type CQWatch struct {
	l      *Loop
	cq     ibv.CQ
	h      CQHandler
	eh     CQErrorHandler
	fl     Flusher
	cw     *chanWatch
	wcs    []ibv.WC
	events int // got from the channel, not acked yet
	// armed: ReqNotify succeeded and no event of this CQ has been read since: the CQ may
	// still raise its one event, or have raised it. The cycle does not arm such a CQ again,
	// so the channel never holds more than one event of it (see drainChannel).
	armed      bool
	inCycle    bool
	kickQueued bool
	needArm    bool // busy-poll mode: handled while spinning, not armed since
	failed     bool // the last Poll or ReqNotify failed: no busy polling until Kick
	closed     bool
}

// chanWatch is one completion channel's fd in the epoll set, shared by its CQs.
type chanWatch struct {
	ch     ibv.CompChannel
	fd     int
	cqs    []*CQWatch
	failed bool // GetEvent failed; the fd is out of the epoll set
}

// anyArmed: some CQ of the channel may still raise an event, or have one queued.
func (cw *chanWatch) anyArmed() bool {
	for _, w := range cw.cqs {
		if w.armed && !w.closed {
			return true
		}
	}
	return false
}

func (cw *chanWatch) find(cq ibv.CQ) *CQWatch {
	for _, w := range cw.cqs {
		if w.cq == cq {
			return w
		}
	}
	return nil
}

// WatchCQ applies the completion handling rule to cq, whose Channel must be non-nil: it
// registers the channel's fd (once per channel), arms cq and queues a first drain/arm cycle
// that runs once the current callback returns. CQ values must be comparable (pointers), as
// GetEvent's result is matched against them. Loop only.
func (l *Loop) WatchCQ(cq ibv.CQ, h CQHandler) (*CQWatch, error) {
	if !l.InLoop() {
		return nil, fmt.Errorf("reactor: watch cq: %w", ErrNotInLoop)
	}
	if cq == nil {
		return nil, fmt.Errorf("reactor: watch cq: cq: must not be nil: %w", ErrInvalid)
	}
	if h == nil {
		return nil, fmt.Errorf("reactor: watch cq: handler: must not be nil: %w", ErrInvalid)
	}
	ch := cq.Channel()
	if ch == nil {
		return nil, fmt.Errorf("reactor: watch cq: cq: has no completion channel: %w", ErrInvalid)
	}
	for _, w := range l.watches {
		if w.cq == cq {
			return nil, fmt.Errorf("reactor: watch cq: %w", ErrRegistered)
		}
	}
	fd := ch.Fd()
	cw := l.chans[fd]
	if cw == nil {
		if l.fds.get(fd) != nil {
			return nil, fmt.Errorf("reactor: watch cq: channel fd %d: %w", fd, ErrRegistered)
		}
		cw = &chanWatch{ch: ch, fd: fd}
		// drainChannel takes every event (GetEvent until ErrWouldBlock): a draining handler.
		if err := l.register(fd, Readable, &fdEntry{kind: kindChannel, cw: cw, drained: true}); err != nil {
			return nil, fmt.Errorf("reactor: watch cq: %w", err)
		}
		l.chans[fd] = cw
	} else if cw.ch != ch {
		return nil, fmt.Errorf("reactor: watch cq: channel fd %d: another channel has it: %w", fd, ErrRegistered)
	}
	w := &CQWatch{l: l, cq: cq, h: h, cw: cw, wcs: make([]ibv.WC, l.cfg.cqBatch)}
	w.eh, _ = h.(CQErrorHandler)
	w.fl, _ = cq.(Flusher)
	if err := cq.ReqNotify(false); err != nil {
		if len(cw.cqs) == 0 {
			l.unregisterChannel(cw)
		}
		return nil, fmt.Errorf("reactor: watch cq: req notify: %w", err)
	}
	w.armed = true
	cw.cqs = append(cw.cqs, w)
	l.watches = append(l.watches, w)
	l.watchGen++
	l.queueKick(w)
	return w, nil
}

// Kick runs the drain/arm cycle now (e.g. after posting). Inside the watch's own cycle it
// does nothing: the cycle polls again before it ends anyway. Loop only: it panics elsewhere.
func (w *CQWatch) Kick() {
	if !w.l.OnLoop() {
		panic(ErrNotInLoop)
	}
	if w.closed || w.inCycle {
		return
	}
	w.failed = false
	w.cycle(0)
}

// Close acknowledges the CQ's outstanding channel events and stops watching it; the
// channel's fd leaves the epoll set with its last CQ. It neither destroys the CQ nor closes
// the channel. Loop only.
func (w *CQWatch) Close() error {
	l := w.l
	if !l.InLoop() {
		return fmt.Errorf("reactor: close cq watch: %w", ErrNotInLoop)
	}
	if w.closed {
		return fmt.Errorf("reactor: close cq watch: %w", ErrClosed)
	}
	cw := w.cw
	if !cw.failed {
		l.drainChannel(cw, true) // acks this CQ's events; those of the channel's other CQs get a kick
	}
	w.closed = true
	cw.cqs = removeWatch(cw.cqs, w)
	l.watches = removeWatch(l.watches, w)
	l.watchGen++
	if len(cw.cqs) == 0 {
		return l.unregisterChannel(cw)
	}
	return nil
}

func removeWatch(s []*CQWatch, w *CQWatch) []*CQWatch {
	for i, x := range s {
		if x == w {
			copy(s[i:], s[i+1:])
			s[len(s)-1] = nil
			return s[:len(s)-1]
		}
	}
	return s
}

func (l *Loop) unregisterChannel(cw *chanWatch) error {
	delete(l.chans, cw.fd)
	e := l.fds.get(cw.fd)
	l.fds.del(cw.fd)
	if cw.failed || e == nil {
		return nil
	}
	if err := l.disarm(cw.fd, e); err != nil {
		return fmt.Errorf("reactor: epoll_ctl del channel fd %d: %w", cw.fd, err)
	}
	return nil
}

func (l *Loop) queueKick(w *CQWatch) {
	if !w.kickQueued {
		w.kickQueued = true
		l.kicks = append(l.kicks, w)
	}
}

func (l *Loop) runKicks() {
	for i := 0; i < len(l.kicks); i++ {
		w := l.kicks[i]
		l.kicks[i] = nil
		w.kickQueued = false
		if !w.closed {
			w.cycle(0)
			l.endCallback("cq", w.cw.fd)
		}
	}
	l.kicks = l.kicks[:0]
}

// flushCQs ends the loop's turn for the watched CQs whose provider defers doorbells.
func (l *Loop) flushCQs() {
	for _, w := range l.watches {
		if w.fl != nil && !w.closed {
			w.fl.Flush()
		}
	}
}

// drainChannel is step 4's wake-up half: get the channel's events, then ack them in one
// batch per CQ and queue a drain/arm cycle for each CQ that fired. It reads until
// ErrWouldBlock when all is set (a CQ leaving the loop: every event of it must be acked),
// otherwise until no CQ of the channel is armed: a CQ is armed again only once its last
// arm's event has been read (CQWatch.armed), so the channel holds at most one event per
// armed CQ, and once each has been read it is empty: the read that would find it so (a
// system call; on softverbs also a lock and an fcntl) is not made. A drain that stopped
// early leaves nothing behind, which matters for a channel in the callers' set: readiness
// left there would not be seen by the loop's set. It always reads once: a readiness without
// an event (a provider's progress in GetEvent, a busy-poll CQ) ends there as before.
func (l *Loop) drainChannel(cw *chanWatch, all bool) {
	for {
		cq, err := cw.ch.GetEvent()
		if err != nil {
			if err != ibv.ErrWouldBlock && !errors.Is(err, ibv.ErrWouldBlock) {
				l.channelFailed(cw, err)
			}
			break
		}
		l.st.cqEvents.Add(1)
		tracepoint.Mark(tracepoint.ChannelEvents, 1)
		if w := cw.find(cq); w != nil {
			w.events++
			w.armed = false
		} else if cq != nil {
			cq.AckEvents(1) // a CQ no longer watched: its events still need their ack
		}
		if !all && !cw.anyArmed() {
			break
		}
	}
	for _, w := range cw.cqs {
		switch {
		case w.events > 0:
			w.cq.AckEvents(w.events)
			w.events = 0
			l.queueKick(w)
		case w.needArm && !w.closed:
			// Busy poll: this CQ is not armed, so it raised no event, yet the channel's
			// readiness may be its completions (a provider that makes progress in
			// GetEvent, as ibv/soft does): it is polled in this turn, not a spin round
			// (and a sched_yield) later.
			l.queueKick(w)
		}
	}
}

// channelFailed takes a channel whose GetEvent fails out of the epoll set (level-triggered,
// it would stay readable forever) and tells its CQs.
func (l *Loop) channelFailed(cw *chanWatch, err error) {
	cw.failed = true
	if e := l.fds.get(cw.fd); e != nil && !e.lost {
		_ = l.disarm(cw.fd, e)
		e.lost = true // out of both sets: unregisterChannel has nothing left to take out
	}
	err = fmt.Errorf("reactor: channel fd %d: get event: %w", cw.fd, err)
	for _, w := range cw.cqs {
		w.report(err)
	}
}

// cycle is steps 1-3 of the completion handling rule; n > 0 means w.wcs[:n] were polled
// already.
func (w *CQWatch) cycle(n int) {
	w.inCycle = true
	for !w.closed {
		// 1. Poll until empty, handling every WC. A poll that filled less than the batch
		// emptied the CQ as it was: the arm and the poll after it (step 3) find what came
		// since, so no poll is spent to see it empty (on a NIC a cache miss, on an
		// emulated one a system call or more).
		for {
			if n == 0 {
				if n = w.poll(); n <= 0 {
					break
				}
			}
			short := n < len(w.wcs)
			w.handle(n)
			n = 0
			if w.closed || short {
				break
			}
		}
		if n < 0 || w.closed {
			break
		}
		// 2. Re-post what the WCs released.
		w.h.Repost()
		if w.closed {
			break
		}
		// 3. Arm, then poll once more: a CQE that landed between the last poll and the arm
		// raised no event, so only this poll finds it.
		if w.l.deferArm {
			w.needArm = true // busy poll: armed right before the loop blocks
			break
		}
		if w.armed {
			// Still armed from before this cycle's polls (a kick, a watch's first cycle, a
			// busy-poll round, none of which read this CQ's event): a CQE since then raised
			// the event or will, and its drain polls again. Arming again could let the CQ
			// fire twice before one event is read.
			w.needArm = false
			break
		}
		if err := w.cq.ReqNotify(false); err != nil {
			w.report(fmt.Errorf("reactor: req notify: %w", err))
			break
		}
		w.armed = true
		w.needArm = false
		if n = w.poll(); n <= 0 {
			break
		}
	}
	w.inCycle = false
}

func (w *CQWatch) poll() int {
	n, err := w.cq.Poll(w.wcs)
	if err != nil {
		w.report(fmt.Errorf("reactor: poll cq: %w", err))
		return -1
	}
	return n
}

func (w *CQWatch) handle(n int) {
	w.l.st.wcs.Add(uint64(n))
	w.h.HandleWC(w.wcs[:n])
}

func (w *CQWatch) report(err error) {
	w.needArm = false
	w.failed = true
	if w.eh != nil {
		w.eh.CQError(err)
		return
	}
	w.l.log.Error().Err(err).Int("channel_fd", w.cw.fd).Msg("reactor: cq")
}

// spinPoll is the busy-poll look at the CQ: true when it found (and handled) completions.
func (w *CQWatch) spinPoll() bool {
	if w.closed || w.inCycle || w.failed {
		return false
	}
	n := w.poll()
	if n <= 0 {
		return false
	}
	w.cycle(n)
	w.l.endCallback("cq", w.cw.fd)
	return true
}

// armDeferred ends the busy-poll phase: every CQ handled while spinning is armed and polled
// once more (steps 3 and 1) before the loop blocks.
func (l *Loop) armDeferred() {
	l.deferArm = false
	for restart := true; restart; {
		restart = false
		gen := l.watchGen
		for i := 0; i < len(l.watches); i++ {
			if w := l.watches[i]; w.needArm && !w.closed && !w.inCycle {
				l.cbStart = l.mono()
				w.cycle(0)
				l.endCallback("cq", w.cw.fd)
			}
			if gen != l.watchGen {
				restart = true
				break
			}
		}
	}
}
