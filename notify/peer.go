package notify

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twosided/twosided/ctrlchannel"
	"github.com/twosided/twosided/internal/tracepoint"
	"github.com/twosided/twosided/oob"
	"github.com/twosided/twosided/reactor"
)

// This file is the driver of the peer machine: it feeds the machine the engine's events
// and performs its actions on channels, the OOB node and callers. Loop-only unless said.

// sendReq is one SendNotify or SendNotifyAsync on its way through the loop. Pooled: the
// closures it hands to the loop and the channel are bound once, so a send allocates
// nothing of its own. A SendNotify's req carries the Waiter its caller sleeps on; those
// come from the engine's waitReqs (their eventfds are released by Close), the others from
// reqPool.
type sendReq struct {
	e        *Engine
	id       reqID
	peer     string
	n        Notify
	deadline time.Time
	start    time.Time   // SendNotifyAsync: when it was called
	cb       func(error) // SendNotifyAsync: called with the result
	runFn    func()
	// resolvedFn reports whether finish has run (SendNotify's ExecWait). Made once.
	resolvedFn func() bool
	creq       ctrlchannel.SendReq

	// SendNotify's hand-off: finish stores err, then moves state to reqDone; it signals w
	// only when the caller sleeps on it (reqSleeping), and never once the caller left
	// (reqAbandoned: finish recycles the req instead).
	w     *reactor.Waiter
	ch    chan struct{} // instead of w: a SendNotify in a crowd (crowdReqs)
	err   error
	state atomic.Uint32
}

// crowdCallers is how many SendNotify callers at once wait on Waiters; past it they wait on
// channels (a Waiter is for a few sequential callers: it holds a thread while it waits).
const crowdCallers = 8

// wait waits for finish's signal, or for ctx's end.
func (r *sendReq) wait(ctx context.Context) error {
	if r.ch == nil {
		return r.w.Wait(ctx)
	}
	select {
	case <-r.ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// takeSignal takes the signal finish gives (or gave) before r is reused.
func (r *sendReq) takeSignal() {
	if r.ch == nil {
		_ = r.w.Wait(context.Background())
		return
	}
	<-r.ch
}

// putWaitReq recycles a SendNotify's req.
func (e *Engine) putWaitReq(r *sendReq) {
	if r.ch == nil {
		e.waitReqs.put(r)
		return
	}
	r.n, r.err = Notify{}, nil
	e.crowdReqs.Put(r)
}

// SendNotify's hand-off states.
const (
	reqSpinning  uint32 = iota // the caller has not slept yet: no signal needed
	reqSleeping                // the caller waits on w: finish signals it
	reqDone                    // err is set
	reqAbandoned               // the caller returned without the result: finish recycles
)

func newSendReq(e *Engine) *sendReq {
	r := &sendReq{e: e}
	r.runFn = r.run
	r.resolvedFn = func() bool { return r.state.Load() != reqSpinning }
	r.creq.Done = r.onChannelDone
	return r
}

func (r *sendReq) prepare(peer string, n Notify, deadline time.Time, cb func(error)) {
	r.peer, r.n, r.deadline, r.cb = peer, n, deadline, cb
	// Numbered by the caller, before the loop sees it: a caller whose context ends names
	// its send by this id (cancelSend) while the loop may be running it.
	r.id = reqID(r.e.reqSeq.Add(1))
}

// run is the loop side of a send.
func (r *sendReq) run() {
	e := r.e
	if e.closing {
		r.finish(sendErr(ErrClosed, r.peer, "", nil, false))
		return
	}
	tracepoint.Mark(tracepoint.SendRun, 0)
	e.reqs[r.id] = r
	e.m.send(e.loop.Now(), r.id, r.peer, r.n.ID, r.deadline, len(r.n.Name)+len(r.n.Msg))
	e.perform()
}

// finish hands the result to the caller: SendNotifyAsync's callback, or the SendNotify
// caller through state (and w's eventfd when it sleeps).
func (r *sendReq) finish(err error) {
	if r.cb != nil {
		r.e.ctr.sendResult(r.start, err) // SendNotify counts its own return
		cb := r.cb
		r.cb = nil
		r.e.reqPool.Put(r)
		cb(err)
		return
	}
	r.err = err
	w := r.w
	if r.state.CompareAndSwap(reqSpinning, reqDone) {
		return // the caller sees it spinning (or when it tries to sleep): no wake-up
	}
	if r.state.CompareAndSwap(reqSleeping, reqDone) {
		// The caller consumes it before it lets r go.
		if r.ch != nil {
			r.ch <- struct{}{}
		} else {
			w.Signal()
		}
		return
	}
	r.e.putWaitReq(r) // abandoned
}

// waitReqPool holds SendNotify's reqs with their Waiters. Unlike a sync.Pool it never drops
// one behind Close's back: Close releases every eventfd, and a req returned after Close is
// released on its return.
type waitReqPool struct {
	mu     sync.Mutex
	free   []*sendReq
	closed bool
}

// maxFreeWaitReqs bounds the free list: one per caller waiting at once, beyond which a
// returned req releases its eventfd.
const maxFreeWaitReqs = 64

func (p *waitReqPool) get(e *Engine) (*sendReq, error) {
	p.mu.Lock()
	if n := len(p.free); n > 0 {
		r := p.free[n-1]
		p.free[n-1] = nil
		p.free = p.free[:n-1]
		p.mu.Unlock()
		return r, nil
	}
	p.mu.Unlock()
	w, err := reactor.NewWaiter()
	if err != nil {
		return nil, err
	}
	r := newSendReq(e)
	r.w = w
	return r, nil
}

func (p *waitReqPool) put(r *sendReq) {
	r.n, r.err = Notify{}, nil
	p.mu.Lock()
	if p.closed || len(p.free) >= maxFreeWaitReqs {
		p.mu.Unlock()
		_ = r.w.Close()
		return
	}
	p.free = append(p.free, r)
	p.mu.Unlock()
}

// close releases the free reqs' eventfds; reqs still out release theirs when put back.
func (p *waitReqPool) close() {
	p.mu.Lock()
	free := p.free
	p.free, p.closed = nil, true
	p.mu.Unlock()
	for _, r := range free {
		_ = r.w.Close()
	}
}

// onChannelDone is the channel's completion of this send.
func (r *sendReq) onChannelDone(err error) {
	e := r.e
	if err == nil {
		e.m.sendResult(e.loop.Now(), r.id, nil, false, false)
		e.perform()
		if e.m.inflight == 0 && e.cfg.keepalive == 0 && e.ka.armed {
			e.ka.stop() // nothing waits on a channel: the stall probe is not needed
		}
		return
	}
	maybe, local := false, false
	switch {
	case e.closing:
		// Posted on a channel the close tore down: it may have landed.
		err, local, maybe = &kindError{kind: ErrClosed, cause: err}, true, true
	case errors.Is(err, ctrlchannel.ErrTooLarge):
		err, local = &kindError{kind: ErrTooLarge, cause: err}, true
	case errors.Is(err, context.DeadlineExceeded):
		err, local = &kindError{kind: ErrTimeout, cause: err}, true
	case errors.Is(err, ctrlchannel.ErrBackpressure):
		err, local = &kindError{kind: ErrBackpressure, cause: err}, true
	default:
		// A completion error: the SEND may have landed and only its ACK been lost.
		maybe = true
	}
	e.m.sendResult(e.loop.Now(), r.id, err, maybe, local)
	e.perform()
}

// chanEvents routes one channel's events to the machine.
type chanEvents struct {
	e  *Engine
	id chanID
}

func (c *chanEvents) OnNotify(d ctrlchannel.Delivery) {
	e := c.e
	e.m.chanArrival(e.loop.Now(), c.id, d.Seq, d.ID, Notify{Name: d.Name, Msg: d.Msg, ID: d.ID})
	e.perform()
}

func (c *chanEvents) OnFence(session, first, count uint64) {
	e := c.e
	e.m.chanFence(e.loop.Now(), c.id, first, count)
	e.perform()
}

func (c *chanEvents) OnClosed(err error) {
	e := c.e
	e.ctr.channelClosed(e.chans[c.id])
	delete(e.chans, c.id)
	delete(e.remote, c.id)
	if e.byes != nil && len(e.chans) == 0 {
		close(e.byes) // Close: every goodbye completed
		e.byes = nil
	}
	e.cfg.logger.Debug().Uint64("chan", uint64(c.id)).Err(err).Msg("ctrl channel closed")
	e.m.chanClosed(e.loop.Now(), c.id, err)
	e.perform()
}

// perform carries out the machine's actions until it has none. Re-entrant calls (a
// channel completing a send synchronously) only add actions, picked up by the outer loop.
func (e *Engine) perform() {
	if e.perf {
		return
	}
	e.perf = true
	defer func() { e.perf = false }()
	for {
		acts := e.m.ready()
		if len(acts) == 0 {
			return
		}
		for i := range acts {
			e.do(&acts[i])
		}
	}
}

func (e *Engine) do(a *mAction) {
	switch a.kind {
	case aConnect:
		e.startConnect(a)
	case aPost:
		r := e.reqs[a.req]
		ch := e.chans[a.ch]
		if r == nil || ch == nil {
			e.m.sendResult(e.loop.Now(), a.req, errors.New("channel gone"), false, false)
			return
		}
		r.creq.Seq, r.creq.Name, r.creq.Msg, r.creq.ID, r.creq.Deadline = a.seq, r.n.Name, r.n.Msg, r.n.ID, r.deadline
		ch.Send(&r.creq)
		if !e.ka.armed {
			e.armKeepalive() // with keepalive off: probe while sends wait
		}
	case aOOB:
		r := e.reqs[a.req]
		if r == nil {
			return
		}
		req := oob.NotifyRequest{Name: r.n.Name, Msg: r.n.Msg, From: e.name}
		if !a.legacy {
			req.Session, req.Seq, req.Token, req.To, req.ID = e.session, a.seq, a.token, a.session, r.n.ID
		}
		e.sendOOB(a.name, req, a.deadline, oobTarget{req: a.req})
	case aComplete:
		r := e.reqs[a.req]
		if r == nil {
			return
		}
		delete(e.reqs, a.req)
		r.finish(a.err)
	case aClose:
		if ch := e.chans[a.ch]; ch != nil {
			e.drainForClose(ch)
			ch.Close(a.err)
		}
	case aFence:
		if ch := e.chans[a.ch]; a.ch != 0 && ch != nil {
			if err := ch.Fence(a.first, a.count); err == nil {
				return
			}
		}
		req := oob.NotifyRequest{From: e.name, Session: e.session, Token: a.token, To: a.session,
			SkipFrom: a.first, SkipCount: a.count}
		e.sendOOB(a.name, req, e.loop.Now().Add(defaultSendTimeout),
			oobTarget{fence: true, session: a.session, first: a.first, count: a.count, token: a.token, pair: a.pair})
	case aDeliver:
		e.deliver(a.n)
	case aTimer:
		d := a.at.Sub(e.loop.Now())
		if e.mtimer == nil {
			e.mtimer = e.loop.AfterFunc(d, e.onMachineTimer)
		} else {
			e.mtimer.Reset(d)
		}
	}
}

// drainForClose delivers everything the channel's peer saw acknowledged before it goes:
// the QP stops acknowledging and its CQ is reaped, and what a paused channel holds (frames
// reaped while the receive queue was full) is handed over too — the queue overshoots its
// bound by at most that channel's window rather than lose acknowledged notifies.
func (e *Engine) drainForClose(ch *ctrlchannel.Channel) {
	ch.Drain()
	if e.paused {
		ch.SetPaused(false)
	}
}

func (e *Engine) onMachineTimer() {
	if e.closing {
		return
	}
	e.m.tick(e.loop.Now())
	e.perform()
}

// busyRetry bounds the pause before a notify to a Mooncake peer that the peer answered
// "busy" is sent again (a notify with a seq, or a fence, goes back to the machine instead).
const busyRetry = 50 * time.Millisecond

// oobTarget says what an OOB send's result is for: a notify's request, or a fence.
type oobTarget struct {
	req                          reqID
	fence                        bool
	session, first, count, token uint64
	pair                         uint64 // a fence's peer entry (mAction.pair)
}

// report hands an OOB send's result to the machine. Loop-only.
func (e *Engine) report(t oobTarget, err error, maybe, local bool) {
	if t.fence {
		e.m.fenceResult(e.loop.Now(), t.session, t.first, t.count, t.token, t.pair, err)
		return
	}
	e.m.sendResult(e.loop.Now(), t.req, err, maybe, local)
}

// sendOOB sends req over OOB and reports the result to the machine on the loop. A twosided
// peer at a literal address is sent to from the loop itself (oob.Node.NotifyOnLoop: no
// submission, no goroutine, no allocation); a Mooncake peer's notifies go one after another
// on a goroutine, and a peer named by host name on a goroutine of its own (resolving
// blocks). A peer whose queue is full answers "busy": the machine sends the notify again
// when the pair's pacing allows (a fence after its backoff); a seq-less notify is sent again
// here after a pause, until the deadline.
func (e *Engine) sendOOB(peer string, req oob.NotifyRequest, deadline time.Time, t oobTarget) {
	tracepoint.Mark(tracepoint.SendOOB, 0)
	if req.Session == 0 {
		// A Mooncake peer has no seqs to reorder by: its notifies go one after another.
		e.legacyOOB.push(peer, func() { e.doOOB(peer, req, deadline, t) })
		return
	}
	if peer == "" || peer != e.lastLiteral {
		if _, err := netip.ParseAddrPort(peer); err != nil {
			go e.doOOB(peer, req, deadline, t) // a host name: resolved off the loop
			return
		}
		e.lastLiteral = peer
	}
	s := e.getOOBSend()
	s.peer, s.req, s.deadline, s.t = peer, req, deadline, t
	s.send()
}

// oobSend is one OOB send from the loop, with its callbacks made once: the Engine keeps
// a free list of them (loop-only), so a send allocates nothing.
type oobSend struct {
	e        *Engine
	peer     string
	req      oob.NotifyRequest
	deadline time.Time
	t        oobTarget
	doneFn   func(error)
}

// maxFreeOOBSends bounds the Engine's free list of oobSends.
const maxFreeOOBSends = 1024

func (e *Engine) getOOBSend() *oobSend {
	if s := e.freeOOB.Get(); s != nil {
		return s
	}
	s := &oobSend{e: e}
	s.doneFn = s.done
	return s
}

func (e *Engine) putOOBSend(s *oobSend) {
	s.peer, s.req, s.t = "", oob.NotifyRequest{}, oobTarget{}
	e.freeOOB.Put(s)
}

// send tries s once. Loop-only.
func (s *oobSend) send() {
	if err := s.e.node.NotifyOnLoop(s.peer, &s.req, s.deadline.Sub(s.e.loop.Now()), s.doneFn); err != nil {
		s.done(err)
	}
}

// done is NotifyOnLoop's result. Loop-only.
func (s *oobSend) done(err error) {
	e := s.e
	// While closing too: a notify the peer answered during the goodbyes is reported as it
	// went (after closeOnLoop failed every send, the machine no longer knows it). A busy
	// answer goes to the machine too: it paces the pair (machine_busy.go), and backs off a
	// refused fence (fenceResult), one try per answer or wait rather than a timer each.
	maybe, local := oobOutcome(err)
	if err != nil {
		err = oobKind(err)
	}
	t := s.t
	e.putOOBSend(s)
	e.report(t, err, maybe, local)
	e.perform() // inside a perform already (a result at once) it only returns
}

func (e *Engine) doOOB(peer string, req oob.NotifyRequest, deadline time.Time, t oobTarget) {
	{
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		defer cancel()
		var err error
		for pause := time.Millisecond; ; pause = min(2*pause, busyRetry) {
			err = e.node.Notify(ctx, peer, &req)
			if !errors.Is(err, oob.ErrBusy) || req.Session != 0 {
				break // with a seq, or a fence: the machine decides (sendOOB)
			}
			t := time.NewTimer(pause)
			select {
			case <-ctx.Done():
				t.Stop()
				err = errors.Join(err, ctx.Err())
			case <-t.C:
				continue
			}
			break
		}
		maybe, local := oobOutcome(err)
		if err != nil {
			err = oobKind(err)
		}
		_ = e.loop.Submit(func() {
			e.report(t, err, maybe, local) // while closing too (see oobSend.done)
			e.perform()
		})
	}
}

// serialQueues runs jobs one after another per key, on one goroutine per busy key (OOB
// calls block). Its map holds only keys with work.
type serialQueues struct {
	mu   sync.Mutex
	keys map[string][]func()
}

func (q *serialQueues) push(key string, job func()) {
	q.mu.Lock()
	if q.keys == nil {
		q.keys = make(map[string][]func())
	}
	jobs, busy := q.keys[key]
	q.keys[key] = append(jobs, job)
	q.mu.Unlock()
	if !busy {
		go q.drain(key)
	}
}

func (q *serialQueues) drain(key string) {
	for {
		q.mu.Lock()
		jobs := q.keys[key]
		if len(jobs) == 0 {
			delete(q.keys, key)
			q.mu.Unlock()
			return
		}
		job := jobs[0]
		q.keys[key] = jobs[1:]
		q.mu.Unlock()
		job()
	}
}

// oobOutcome says whether a failed OOB notify may have been delivered, and whether the
// failure is the caller's (no other path would help).
func oobOutcome(err error) (maybe, local bool) {
	switch {
	case err == nil:
		return false, false
	case errors.Is(err, oob.ErrTooLarge), errors.Is(err, oob.ErrBadRequest), errors.Is(err, oob.ErrNotifyTooLarge):
		return false, true
	case errors.Is(err, oob.ErrRejected):
		return false, false // the peer answered: not delivered
	case errors.Is(err, oob.ErrNotSent):
		return false, false // never written: not delivered, and another path may serve
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, oob.ErrTimeout),
		errors.Is(err, oob.ErrPeerUnreachable):
		// The request may have been written before the connection broke or time ran out.
		return true, errors.Is(err, context.DeadlineExceeded)
	}
	return true, false
}

// oobKind maps an OOB failure to the notify sentinel it is.
func oobKind(err error) error {
	kind := ErrPeerUnreachable
	switch {
	case errors.Is(err, oob.ErrTooLarge), errors.Is(err, oob.ErrNotifyTooLarge):
		kind = ErrTooLarge
	case errors.Is(err, oob.ErrAuth) && errors.Is(err, oob.ErrRejected):
		// The peer refused our token: it does not know the pair (it forgot us).
		return &kindError{kind: ErrAuth, cause: errors.Join(errRebind, err)}
	case errors.Is(err, oob.ErrAuth):
		kind = ErrAuth
	case errors.Is(err, oob.ErrBusy):
		// The peer's queue is full: not delivered; the pair's pacing sends it again.
		return &kindError{kind: ErrBackpressure, cause: errors.Join(errPeerBusy, err)}
	case errors.Is(err, oob.ErrLimit):
		kind = ErrLimit // the peer's MaxConns, or a cap of ours on OOB peers
	case errors.Is(err, oob.ErrStale):
		// The receiver gave this seq up: not delivered, and not to be sent again.
		return &kindError{kind: ErrRejected, cause: errors.Join(errGaveUp, err)}
	case errors.Is(err, oob.ErrRejected):
		kind = ErrRejected
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, oob.ErrTimeout):
		kind = ErrTimeout
	case errors.Is(err, oob.ErrClosed):
		kind = ErrClosed
	}
	return &kindError{kind: kind, cause: err}
}

var _ reactor.CQHandler = (*ctrlchannel.Channel)(nil)
