package notify

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twosided/twosided/ctrlchannel"
	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/oob"
	"github.com/twosided/twosided/reactor"
	"golang.org/x/sys/unix"
)

// Notify is one notification. Peer is the sender's peer name, filled in on receive: the
// name it advertised in its handshake (for a Mooncake engine, what its request said). ID is
// optional: a caller-chosen idempotency id (at most 255 bytes); the receiver drops a notify
// whose ID it delivered among the last ids of that sender, so a send whose outcome was
// unknown (ErrMaybeDelivered) can be retried safely with the same ID.
//
// A received Msg belongs to the application. Messages of up to 1 KiB (over a ctrl channel
// or OOB) share 16 KiB chunks (capacity clipped to the message, so an append
// reallocates): keeping one such Msg keeps its chunk's 16 KiB alive; copy a small message
// that is kept long among many that are not.
type Notify struct {
	Peer, Name string
	Msg        []byte
	ID         string
}

// MaxIDLen bounds Notify.ID.
const MaxIDLen = 255

// Engine is one notify endpoint. Create it with New or FromEnv; all methods are safe for
// concurrent use.
//
// Close takes a context and Engine is not an io.Closer, by choice: closing drains what the
// NICs acknowledged and says goodbye to every peer, which takes time, and only the caller
// knows how long it may take. Close(ctx) is both of net/http.Server's: a ctx with time
// left is Shutdown (graceful), a ctx already done is Close (at once: the drain and the
// goodbyes are skipped, the engine stops in the background, and Close returns an error
// wrapping ErrTimeout). A Close() error with a hidden deadline would clash with it (one
// name, one method). Where an io.Closer is wanted, wrap it with the bound you choose:
//
//	type engineCloser struct{ *notify.Engine }
//
//	func (c engineCloser) Close() error {
//		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
//		defer cancel()
//		return c.Engine.Close(ctx)
//	}
type Engine struct {
	cfg     config
	loop    *reactor.Loop
	node    *oob.Node
	name    string
	session uint64

	dev     ibv.Context
	pd      ibv.PD
	devName string

	closed atomic.Bool
	dir    engineDir // directory.go: peer names, the registration

	// Loop-owned.
	m        *peerMachine
	chans    map[chanID]*ctrlchannel.Channel
	remote   map[chanID]uint32 // the peer's QPN of each connected channel
	reqs     map[reqID]*sendReq
	reqSeq   atomic.Uint64 // numbers sends (sendReq.id), from any goroutine
	mtimer   *reactor.Timer
	perf     bool // performing the machine's actions
	paused   bool
	heldOOB  []heldNotify
	closing  bool
	started  bool // the loop knows e.name
	ka       keepalive
	dropped  uint64 // deliveries after close
	oobBusy  uint64 // OOB notifies answered busy
	tokenRnd func() uint64

	lastLiteral string // the last peer sendOOB found to be a literal ip:port (loop-owned)

	rq        recvQueue
	legacyOOB serialQueues              // OOB sends to Mooncake peers, in order per peer
	freeOOB   reactor.FreeList[oobSend] // loop-only: OOB sends from the loop, to reuse
	byes      chan struct{}             // Close: closed when the last channel's goodbye completed

	reqPool   sync.Pool    // SendNotifyAsync
	waitReqs  waitReqPool  // SendNotify
	callers   atomic.Int32 // SendNotify callers between their send and their result (ExecWait alone)
	inSend    atomic.Int32 // SendNotify callers, from the call to the return (crowd)
	crowdReqs sync.Pool    // SendNotify in a crowd: reqs that wait on a channel

	ctr engineCounters
}

type heldNotify struct {
	req   oob.NotifyRequest
	reply oob.NotifyReply
	pair  uint64 // the peer entry that counts it (peerMachine.oobHold), 0: none
}

// New creates an engine from defaults and options (the environment is not read).
func New(opts ...Option) (*Engine, error) {
	cfg := defaultConfig()
	return newEngine(cfg, opts)
}

// FromEnv creates an engine from the MC_* environment, then options override.
func FromEnv(opts ...Option) (*Engine, error) {
	cfg := defaultConfig()
	cfg.fromEnv(envLookup)
	cfg.dirFromEnv(envLookup)
	return newEngine(cfg, opts)
}

func newEngine(cfg config, opts []Option) (*Engine, error) {
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if !cfg.keepProcs {
		reserveProcs(cfg.logger)
	}
	e := &Engine{
		cfg:     cfg,
		session: randomSession(),
		freeOOB: reactor.FreeList[oobSend]{Max: maxFreeOOBSends},
		chans:   make(map[chanID]*ctrlchannel.Channel),
		remote:  make(map[chanID]uint32),
		reqs:    make(map[reqID]*sendReq),
	}
	e.tokenRnd = randomSession
	e.m = newPeerMachine(e.session, e.machineConfig(), e.tokenRnd)
	e.rq.init(cfg.recvQueue, e.onQueueRoom)
	e.rq.clock.hist = &e.ctr.deliverLatency
	e.reqPool.New = func() any { return newSendReq(e) }
	e.crowdReqs.New = func() any {
		r := newSendReq(e)
		r.ch = make(chan struct{}, 1)
		return r
	}
	if cfg.transport == TransportRDMATwoSided && cfg.notifyEnabled {
		if err := e.openDevice(); err != nil {
			return nil, err
		}
	}
	loop, err := reactor.New(reactor.WithBusyPoll(cfg.busyPoll), reactor.WithLogger(cfg.logger))
	if err != nil {
		e.closeDevice()
		return nil, fmt.Errorf("notify: reactor: %w", err)
	}
	e.loop = loop
	node, err := oob.Listen(loop, oob.Config{
		ListenAddr:           cfg.listenAddr,
		MaxFrame:             cfg.handshakeMaxLength,
		ConnectTimeout:       cfg.handshakeConnectTimeout,
		IdleTimeout:          cfg.oobIdleTimeout,
		MaxConns:             cfg.maxConns,
		MaxPendingHandshakes: cfg.maxPendingHS,
		AuthKey:              cfg.authKey,
		AllowUnauthenticated: cfg.allowUnauth,
		Logger:               cfg.logger,
	}, (*oobHandler)(e))
	if err != nil {
		_ = loop.Stop(context.Background())
		e.closeDevice()
		return nil, fmt.Errorf("notify: oob listener %s: %w", cfg.listenAddr, err)
	}
	e.node = node
	name := cfg.peerName
	if name == "" {
		name = advertised(node.Addr())
	}
	node.SetName(name) // the name our bye carries: the one peers dial
	node.SetSession(e.session)
	// The listener serves from now on; the loop learns the name (and starts answering
	// handshakes and notifies) in order with what it serves.
	started := make(chan struct{})
	if err := loop.Submit(func() { e.name, e.started = name, true; close(started) }); err != nil {
		_ = e.Close(context.Background())
		return nil, fmt.Errorf("notify: start: %w", err)
	}
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		_ = e.Close(context.Background())
		return nil, fmt.Errorf("notify: start: the reactor did not run for 10 s")
	}
	e.startAsync() // async.go: the device's async events on the reactor
	if err := e.startDirectory(); err != nil {
		return nil, err
	}
	cfg.logger.Info().Str("addr", e.name).Str("transport", cfg.transport).Str("device", e.devName).Msg("notify engine started")
	return e, nil
}

// advertised turns a bound address into a name peers can dial.
func advertised(bound string) string {
	host, port, err := net.SplitHostPort(bound)
	if err != nil {
		return bound
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if h, err := os.Hostname(); err == nil && h != "" {
			return net.JoinHostPort(h, port)
		}
	}
	return bound
}

func randomSession() uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:])
		if s := binary.LittleEndian.Uint64(b[:]); s != 0 {
			return s
		}
	}
}

// Addr is the host:port of the engine's OOB listener: its peer name.
func (e *Engine) Addr() string { return e.name }

// Transport is the installed transport's name.
func (e *Engine) Transport() string { return e.cfg.transport }

// Session is this engine's random session id, carried on every frame it sends.
func (e *Engine) Session() uint64 { return e.session }

func (e *Engine) validateNotify(peer string, n *Notify) error {
	if peer == "" {
		return sendErr(ErrInvalid, peer, "", errors.New("peer: empty"), false)
	}
	if len(peer) > oob.MaxFromLen {
		return sendErr(ErrInvalid, peer[:32]+"...", "", fmt.Errorf("peer: %d bytes, at most %d", len(peer), oob.MaxFromLen), false)
	}
	if err := checkPeerAddr(peer); err != nil {
		return sendErr(ErrInvalid, peer, "", err, false)
	}
	if len(n.ID) > MaxIDLen {
		return sendErr(ErrInvalid, peer, "", fmt.Errorf("id: %d bytes, at most %d", len(n.ID), MaxIDLen), false)
	}
	if sz := len(n.Name) + len(n.Msg); sz > e.cfg.maxNotifySize {
		return sendErr(ErrTooLarge, peer, "", fmt.Errorf("name+msg is %d bytes, the maximum is %d", sz, e.cfg.maxNotifySize), false)
	}
	return nil
}

// defaultSendTimeout bounds a send whose context has no deadline, and every
// SendNotifyAsync.
const defaultSendTimeout = 30 * time.Second

// cancelGrace bounds how long a caller whose context ended waits for the loop to say
// whether its notify was withdrawn (not delivered) or is already on its way (unknown).
const cancelGrace = time.Second

// SendNotify delivers n to peer (its host:port or advertised name). It returns nil only once
// the notify was delivered; otherwise an error wrapping a sentinel, within ctx's deadline (or
// 30 s without one). An error that wraps ErrMaybeDelivered leaves the outcome unknown; any
// other error means the notify was not delivered.
func (e *Engine) SendNotify(ctx context.Context, peer string, n Notify) (result error) {
	defer e.ctr.sendReturned(time.Now(), &result)
	if ctx == nil {
		return sendErr(ErrInvalid, peer, "", errors.New("ctx: nil"), false)
	}
	if e.closed.Load() {
		return sendErr(ErrClosed, peer, "", nil, false)
	}
	peer, err := e.resolvePeer(ctx, peer)
	if err != nil {
		return err
	}
	if err := e.validateNotify(peer, &n); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return sendErr(ErrTimeout, peer, "", err, false)
	}
	if e.loop.InLoop() {
		return sendErr(ErrInvalid, peer, "", errors.New("SendNotify on the reactor thread (a handler) would wait on itself: use SendNotifyAsync"), false)
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(defaultSendTimeout)
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	busy := e.cfg.busyPoll > 0
	// Many callers at once (a window of goroutines each with one send in flight) wait on
	// a channel: each Waiter holds an OS thread in poll and costs an eventfd write per
	// result, which a crowd of callers pays in threads and context switches (256 callers:
	// ~40 µs of CPU per notify), while a channel parks the goroutine.
	crowd := e.inSend.Add(1) > crowdCallers && !busy
	defer e.inSend.Add(-1)
	var req *sendReq
	if crowd {
		req = e.crowdReqs.Get().(*sendReq)
	} else if req, err = e.waitReqs.get(e); err != nil {
		return sendErr(ErrLimit, peer, "", err, false)
	}
	req.prepare(peer, n, deadline, nil)
	req.state.Store(reqSpinning)
	// Busy poll: hold the loop's spin before the send, so that the loop blocks (its turn free
	// for the send below); the caller then spins on its own completion, and its first poll
	// takes the loop's set over (the send leaves first).
	if busy {
		e.loop.HoldSpin()
	}
	// While the loop sleeps, the caller runs the send in a turn borrowed from it: the notify
	// leaves from this thread, with no eventfd write and no loop wake-up. A caller alone in
	// SendNotify, not spinning, then waits for the result in that same turn, as the loop
	// (ExecWait, up to asLoopWait): the completion wakes this thread alone, instead of the
	// loop's thread and then, through the Waiter, this one. With several callers each one's
	// send would end another's wait (fanin, 4 engines × 16 callers in one process: 11.5 k/s
	// with the Waiter, 9.0–9.7 k/s waiting as the loop): they go to the Waiter.
	alone := e.callers.Add(1) == 1
	if d := min(asLoopWait, time.Until(deadline)); alone && !busy && d > 0 {
		_, err = e.loop.ExecWait(req.runFn, d, req.resolvedFn)
	} else {
		err = e.loop.Exec(req.runFn)
	}
	if errors.Is(err, reactor.ErrQueueFull) {
		err = e.loop.SubmitWait(ctx, req.runFn)
	}
	if err != nil {
		e.callers.Add(-1)
		if busy {
			e.loop.ReleaseSpin()
		}
		e.putWaitReq(req)
		if errors.Is(err, reactor.ErrStopped) {
			return sendErr(ErrClosed, peer, "", nil, false)
		}
		if ctx.Err() != nil {
			return sendErr(ErrTimeout, peer, "", err, false)
		}
		return sendErr(ErrLimit, peer, "", err, false)
	}
	if busy {
		e.spinWait(req) // releases the spin
	}
	e.callers.Add(-1) // a caller left to its Waiter does not keep others from waiting as the loop
	if req.state.CompareAndSwap(reqSpinning, reqSleeping) {
		// finish signals the Waiter (or the channel) once it stored the result; ctx ends
		// the wait early.
		if werr := req.wait(ctx); werr != nil {
			return e.cancelSend(req, peer, ctx.Err())
		}
	}
	err = req.err
	e.putWaitReq(req)
	return err
}

// cancelSend ends a SendNotify whose context ended while it slept: a notify still waiting
// is withdrawn (not delivered); one already on its way leaves the outcome unknown, unless
// its result came meanwhile.
func (e *Engine) cancelSend(req *sendReq, peer string, cause error) error {
	withdrawn := make(chan bool, 1)
	id := req.id
	if err := e.loop.Submit(func() {
		w := e.m.cancel(e.loop.Now(), id, cause)
		e.perform()
		withdrawn <- w
	}); err == nil {
		t := time.NewTimer(cancelGrace)
		defer t.Stop()
		select {
		case w := <-withdrawn:
			if w {
				// finish ran in the cancel's perform: the result is stored and signalled.
				req.takeSignal()
				err := req.err
				e.putWaitReq(req)
				return err
			}
		case <-t.C:
		}
	}
	if !req.state.CompareAndSwap(reqSleeping, reqAbandoned) {
		// Done after all: take the signal finish gives (at once) before req is reused.
		req.takeSignal()
		err := req.err
		e.putWaitReq(req)
		return err
	}
	return sendErr(ErrTimeout, peer, "", cause, true)
}

// SendNotifyAsync queues n for peer and returns at once; done (may be nil) is called exactly
// once with the result, as SendNotify would return it, within 30 s (the deadline of every
// async send). It never blocks, so it may be called from a WithHandler callback (to answer a
// notify on the reactor thread); there the send starts before the callback returns, so an
// answer over a ctrl channel leaves in the turn that delivered the notify. done runs on the
// reactor thread, never before SendNotifyAsync has returned, and must not block. The engine
// reads n.Msg until done.
func (e *Engine) SendNotifyAsync(peer string, n Notify, done func(error)) (err error) {
	defer e.ctr.refused(&err)
	if e.closed.Load() {
		return sendErr(ErrClosed, peer, "", nil, false)
	}
	peer, err = e.resolveCached(peer)
	if err != nil {
		return err
	}
	if err := e.validateNotify(peer, &n); err != nil {
		return err
	}
	if done == nil {
		done = func(error) {}
	}
	req := e.reqPool.Get().(*sendReq)
	req.prepare(peer, n, time.Now().Add(defaultSendTimeout), done)
	req.start = req.deadline.Add(-defaultSendTimeout)
	// From a handler (the engine delivering, on the loop) with nothing queued before it,
	// the send runs now: on a ctrl channel its SEND is posted in the completion cycle that
	// delivered the notify, before the cycle's re-post, re-arm and poll, not after them.
	// Order holds (nothing submitted earlier waits), and done still runs after this call
	// returns: the delivering loop performs the send's actions once the handler is back.
	if e.loop.InLoop() && e.perf && !e.closing && !e.loop.Queued() {
		req.run()
		return nil
	}
	// Else queued: from a handler behind earlier work, the loop is awake (no eventfd
	// write) and the order with the sends queued before holds.
	if err := e.loop.Submit(req.runFn); err != nil {
		e.reqPool.Put(req)
		if errors.Is(err, reactor.ErrStopped) {
			return sendErr(ErrClosed, peer, "", nil, false)
		}
		return sendErr(ErrBackpressure, peer, "", err, false)
	}
	return nil
}

// spinWait spins on req's state for up to the busy-poll budget, polling the loop's fds and
// CQs in turns borrowed from it (reactor.Loop.Poll), so that the completion is reaped on the
// caller's thread without a wake-up. SendNotify calls it with the spin held (HoldSpin, before
// its send) when busy poll is on; it releases the spin; a result that has not come when the
// budget ran out is waited for on the Waiter.
//
// Busy poll spins in one place per engine: while a caller spins, its loop blocks in
// epoll_wait instead of spinning (HoldSpin), and the loop spins only when no caller does
// (an engine that only serves handlers). Two processes, echo, 50 µs (bench/RESULTS.md):
// the caller alone spinning gave 48 µs p50 one-way and 201 CPU µs per notify, the loop alone
// 66 µs and 288 µs, both (before) 79 µs and 417 µs; in one process the caller alone lost
// (68 µs per call: both loops asleep), so the loop of an engine without a spinning caller
// keeps spinning. Each empty round yields the CPU, as the loop's spin does.
func (e *Engine) spinWait(req *sendReq) {
	defer e.loop.ReleaseSpin() // held by SendNotify before the send
	deadline := time.Now().Add(e.cfg.busyPoll)
	for req.state.Load() == reqSpinning && time.Now().Before(deadline) {
		// The caller polls its loop's fds and CQs itself (a turn borrowed while the loop
		// blocks): the completion is reaped on this thread, with no loop wake-up first.
		if !e.loop.Poll() {
			_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
		}
	}
}

// asLoopWait bounds a SendNotify caller's wait as the loop (ExecWait): a notify's round trip
// is tens of µs; a peer slower than this is waited for on the Waiter, which answers a
// context's end at once.
const asLoopWait = time.Millisecond

// Recv returns the next received notify, waiting with ctx. It goes on through Close: it
// returns what the queue holds and what Close hands over (what the channels' NICs
// acknowledged), and ErrClosed once Close has delivered all of it and the queue is empty.
// A receive loop that stops at ErrClosed therefore gets every acknowledged notify.
func (e *Engine) Recv(ctx context.Context) (Notify, error) {
	if ctx == nil {
		return Notify{}, fmt.Errorf("%w: ctx: nil", ErrInvalid)
	}
	n, err := e.rq.pop(ctx)
	switch {
	case err == nil, errors.Is(err, ErrClosed):
	case errors.Is(err, context.Canceled):
		err = &canceledError{op: "recv", err: err} // ErrTimeout, as for a send
	default:
		err = fmt.Errorf("%w: recv: %w", ErrTimeout, err)
	}
	return n, err
}

// GetNotifies drains what has arrived; it never blocks. After Close it returns what Recv
// has not taken.
func (e *Engine) GetNotifies() []Notify { return e.rq.drain() }

// Close stops the engine: every peer is told (SESSION_CLOSE on its channel), what the
// channels' NICs acknowledged is delivered (to the handler, or to the queue, where Recv
// still finds it: Recv returns ErrClosed only once Close is done and the queue is empty),
// pending sends end with ErrClosed, sockets close, the reactor stops. Bounded by ctx: if
// ctx ends first, the rest is cut short, the engine stops in the background, and the error
// wraps ErrTimeout and ctx's error (its message says "canceled" for a cancelled ctx). A
// second Close returns nil. See Engine for why Close takes a context (Engine is not an
// io.Closer).
func (e *Engine) Close(ctx context.Context) error {
	if !e.closed.CompareAndSwap(false, true) {
		return nil
	}
	if ctx == nil {
		ctx = context.Background()
	}
	var errs []error
	errs = append(errs, e.stopDirectory(ctx)) // first: peers stop finding this engine
	// Goodbyes first: each channel sends SESSION_CLOSE after what is queued on it and
	// closes when it completed (so its peer frees the channel at once), reaping what
	// arrives meanwhile; bounded by ctx and byeWait. What is left is drained and closed.
	byes := make(chan struct{})
	if err := e.loop.Submit(func() { e.sayGoodbye(byes) }); err == nil {
		t := time.NewTimer(byeWait)
		select {
		case <-byes:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	done := make(chan struct{})
	if err := e.loop.SubmitWait(ctx, func() { e.closeOnLoop(); close(done) }); err == nil {
		select {
		case <-done:
		case <-ctx.Done():
			errs = append(errs, ctx.Err())
		}
	}
	if err := e.node.Close(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := e.loop.Stop(ctx); err != nil {
		errs = append(errs, err)
	}
	// The device outlives every verb on it: when ctx cut the stop short, the loop goes on
	// in the background (its shutdown runs what was queued, closeOnLoop included, which
	// destroys the channels' QPs), and the device closes only once the loop has ended.
	select {
	case <-e.loop.Done():
		e.closeDevice()
	default:
		go func() {
			<-e.loop.Done()
			e.closeDevice()
		}()
	}
	e.rq.close()
	e.waitReqs.close()
	return closeErr(ctx, errs)
}

// byeWait bounds how long Close waits for its channels' goodbyes to complete.
const byeWait = 1500 * time.Millisecond

// sayGoodbye starts Close: new work is refused, every channel says goodbye; byes is closed
// once no channel is left. Loop-only.
func (e *Engine) sayGoodbye(byes chan struct{}) {
	e.closing = true
	if len(e.chans) == 0 {
		close(byes)
		return
	}
	e.byes = byes
	for _, ch := range e.chans {
		ch.Bye()
	}
}

func (e *Engine) closeOnLoop() {
	e.closing = true
	// Channels whose goodbye did not complete: drained (what the peer saw acknowledged is
	// delivered), then closed.
	for id, ch := range e.chans {
		e.drainForClose(ch)
		ch.Close(ErrClosed)
		delete(e.chans, id)
	}
	e.byes = nil
	e.m.closeAll(sendErr(ErrClosed, e.name, "", nil, false))
	e.perform()
	for _, h := range e.heldOOB {
		h.reply.Send(&oob.RefusedError{Code: oob.RefuseClosed, Msg: "engine closing"})
	}
	e.heldOOB = nil
	if e.mtimer != nil {
		e.mtimer.Stop()
	}
	e.ka.stop()
}
