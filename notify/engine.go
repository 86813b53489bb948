// Package notify is twosided's public engine: it sends and receives notifies (a name and a
// message) between processes, over exactly one transport per engine — "oob" (the classic
// path: each notify is a request on the TCP OOB channel, as Mooncake's classic transport
// does) or "rdma_twosided" (a per-peer ctrlchannel.Channel on an RC QP, with the OOB channel
// for handshakes and, optionally, fallback).
//
// The engine owns one reactor loop, one OOB node and, for rdma_twosided, one device context.
// Every peer's state lives on the loop goroutine; callers' goroutines only submit requests
// and wait for their replies, bounded by their context.
//
// Delivery contract: SendNotify returns nil only once the notify was delivered (the SEND
// completed, or the OOB peer replied success). Per-peer FIFO; the receiver drops duplicates
// by (session, seq), so a retry over OOB is never delivered twice. The receive queue is
// bounded: when it is full, credits stop and senders wait.
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

	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/oob"
	"github.com/twosided/twosided/reactor"
)

// Notify is one notification. Peer is the sender's peer name, filled in on receive.
type Notify struct {
	Peer, Name string
	Msg        []byte
}

// Errors returned by the engine; test with errors.Is.
var (
	ErrClosed          = errors.New("notify: engine closed")
	ErrInvalid         = errors.New("notify: invalid argument")
	ErrTooLarge        = errors.New("notify: notify too large")
	ErrPeerUnreachable = errors.New("notify: peer unreachable")
	ErrNoCtrlChannel   = errors.New("notify: peer has no ctrl channel")
	ErrLimit           = errors.New("notify: limit reached")
)

// errYield is the handshake reply of the preferred side of a simultaneous open.
const yieldMsg = "ts_yield: simultaneous open, the other side connects"

// Engine is one notify endpoint. Create it with New or FromEnv; all methods are safe for
// concurrent use.
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

	// Loop-owned.
	peers   map[string]*peer
	dedup   map[uint64]*seen // by the sending engine's session
	paused  bool
	heldOOB []heldNotify
	closing bool
	kaTimer *reactor.Timer
	started bool // the loop knows e.name

	rq recvQueue

	oobAsync asyncQueues

	reqPool sync.Pool

	ctr engineCounters
}

type heldNotify struct {
	n     Notify
	reply func(error)
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
		peers:   make(map[string]*peer),
		dedup:   make(map[uint64]*seen),
	}
	e.rq.init(cfg.recvQueue, e.onQueueRoom)
	e.rq.clock.hist = &e.ctr.deliverLatency
	e.reqPool.New = func() any { return newSendReq(e) }
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
		return fmt.Errorf("%w: peer: empty", ErrInvalid)
	}
	if n.Name == "" {
		return fmt.Errorf("%w: name: empty", ErrInvalid)
	}
	if sz := len(n.Name) + len(n.Msg); sz > e.cfg.maxNotifySize {
		return fmt.Errorf("%w: name+msg is %d bytes, the maximum is %d", ErrTooLarge, sz, e.cfg.maxNotifySize)
	}
	return nil
}

// defaultSendTimeout bounds a SendNotify whose context has no deadline.
const defaultSendTimeout = 30 * time.Second

// SendNotify delivers n to peer (its host:port). It returns nil only once the notify was
// delivered; otherwise an error, within ctx's deadline (or 30 s without one).
func (e *Engine) SendNotify(ctx context.Context, peer string, n Notify) (err error) {
	defer e.ctr.sendReturned(time.Now(), &err)
	if e.closed.Load() {
		return ErrClosed
	}
	if err := e.validateNotify(peer, &n); err != nil {
		return err
	}
	if e.loop.InLoop() {
		return fmt.Errorf("%w: SendNotify on the reactor thread (a handler) would wait on itself: use SendNotifyAsync", ErrInvalid)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultSendTimeout)
		defer cancel()
	}
	if e.cfg.transport == TransportOOB || !e.cfg.notifyEnabled {
		return e.sendOOB(ctx, peer, &n, 0, 0)
	}
	req := e.reqPool.Get().(*sendReq)
	req.prepare(ctx, peer, n)
	if err := e.loop.SubmitWait(ctx, req.runFn); err != nil {
		e.reqPool.Put(req)
		if errors.Is(err, reactor.ErrStopped) {
			return ErrClosed
		}
		return err
	}
	err, ok := e.spinWait(req.done)
	if !ok {
		select {
		case err = <-req.done:
		case <-ctx.Done():
			// The loop still holds req; it is not reused.
			return fmt.Errorf("notify: send to %s: %w", peer, ctx.Err())
		}
	}
	seq, epoch, fallback := req.seq, req.epoch, req.fallback
	e.reqPool.Put(req)
	if err == nil {
		return nil
	}
	final, tryOOB := e.failed(peer, err, fallback)
	if !tryOOB {
		return final
	}
	return fallbackResult(peer, err, e.sendOOB(ctx, peer, &n, seq, epoch))
}

// failed is what a send that failed on its channel comes to: a final error, or tryOOB when
// it may be retried over OOB (the engine is open, fallback is on, the failure allows it).
func (e *Engine) failed(peer string, err error, fallback bool) (final error, tryOOB bool) {
	switch {
	case e.closed.Load():
		return fmt.Errorf("notify: send to %s: %w (%v)", peer, ErrClosed, err), false
	case fallback && e.cfg.oobFallback:
		e.ctr.fallback()
		return nil, true
	}
	return fmt.Errorf("notify: send to %s: %w", peer, err), false
}

// fallbackResult is a send's result after its OOB retry.
func fallbackResult(peer string, rdmaErr, oobErr error) error {
	if oobErr != nil {
		return fmt.Errorf("notify: send to %s: rdma: %v; oob fallback: %w", peer, rdmaErr, oobErr)
	}
	return nil
}

// SendNotifyAsync queues n for peer and returns at once; done (may be nil) is called exactly
// once with the result, as SendNotify would return it, within 30 s. It never blocks, so it
// may be called from a WithHandler callback (to answer a notify on the reactor thread).
// done runs on the reactor thread — it must not block — except after an OOB fallback, when
// it runs on the goroutine that carried the fallback. The engine reads n.Msg until done.
func (e *Engine) SendNotifyAsync(peer string, n Notify, done func(error)) (err error) {
	defer e.ctr.refused(&err)
	if e.closed.Load() {
		return ErrClosed
	}
	if err := e.validateNotify(peer, &n); err != nil {
		return err
	}
	if done == nil {
		done = func(error) {}
	}
	if e.cfg.transport == TransportOOB || !e.cfg.notifyEnabled {
		e.oobAsync.push(e, peer, asyncOOB{n: n, done: done, start: time.Now()})
		return nil
	}
	req := e.reqPool.Get().(*sendReq)
	req.peer, req.n = peer, n
	req.start = time.Now()
	req.deadline = req.start.Add(defaultSendTimeout)
	req.seq, req.epoch, req.fallback, req.cb = 0, 0, false, done
	// From a handler too: the loop is awake, so this costs no eventfd write, and it keeps
	// the per-peer order with sends queued before.
	if err := e.loop.Submit(req.runFn); err != nil {
		e.reqPool.Put(req)
		if errors.Is(err, reactor.ErrStopped) {
			return ErrClosed
		}
		return fmt.Errorf("notify: send to %s: %w", peer, err)
	}
	return nil
}

// completeAsync ends a SendNotifyAsync: like SendNotify's tail, with the OOB fallback on a
// goroutine (the loop never blocks).
func (e *Engine) completeAsync(r *sendReq, err error) {
	cb, peer, n, seq, epoch, fallback, start := r.cb, r.peer, r.n, r.seq, r.epoch, r.fallback, r.start
	r.cb = nil
	e.reqPool.Put(r)
	if err == nil {
		e.ctr.sendResult(start, nil)
		cb(nil)
		return
	}
	final, tryOOB := e.failed(peer, err, fallback)
	if !tryOOB {
		e.ctr.sendResult(start, final)
		cb(final)
		return
	}
	e.oobAsync.push(e, peer, asyncOOB{n: n, seq: seq, epoch: epoch, start: start, done: func(ferr error) {
		cb(fallbackResult(peer, err, ferr))
	}})
}

// spinWait polls done for up to the busy-poll budget, so that with busy polling on the
// completion reaches the caller without a scheduler wake-up. Off (the default), it returns
// at once.
func (e *Engine) spinWait(done chan error) (error, bool) {
	if e.cfg.busyPoll <= 0 {
		return nil, false
	}
	deadline := time.Now().Add(e.cfg.busyPoll)
	for {
		select {
		case err := <-done:
			return err, true
		default:
		}
		if time.Now().After(deadline) {
			return nil, false
		}
	}
}

func (e *Engine) sendOOB(ctx context.Context, peer string, n *Notify, seq, epoch uint64) error {
	req := oob.NotifyRequest{Name: n.Name, Msg: n.Msg, From: e.name, Session: e.session, Epoch: epoch, Seq: seq}
	if err := e.node.Notify(ctx, peer, &req); err != nil {
		if errors.Is(err, oob.ErrClosed) && e.closed.Load() {
			return ErrClosed
		}
		return fmt.Errorf("notify: oob send to %s: %w", peer, err)
	}
	return nil
}

// Recv returns the next received notify, waiting with ctx.
func (e *Engine) Recv(ctx context.Context) (Notify, error) {
	return e.rq.pop(ctx, &e.closed)
}

// GetNotifies drains what has arrived; it never blocks.
func (e *Engine) GetNotifies() []Notify { return e.rq.drain() }

// Close stops the engine: pending sends end with ErrClosed, channels and sockets close, the
// reactor stops. Bounded by ctx.
func (e *Engine) Close(ctx context.Context) error {
	if !e.closed.CompareAndSwap(false, true) {
		return nil
	}
	var errs []error
	if err := e.node.Close(ctx); err != nil {
		errs = append(errs, fmt.Errorf("oob: %w", err))
	}
	done := make(chan struct{})
	if err := e.loop.SubmitWait(ctx, func() { e.closeOnLoop(); close(done) }); err == nil {
		select {
		case <-done:
		case <-ctx.Done():
			errs = append(errs, ctx.Err())
		}
	}
	if err := e.loop.Stop(ctx); err != nil {
		errs = append(errs, fmt.Errorf("reactor: %w", err))
	}
	e.closeDevice()
	e.rq.close()
	return errors.Join(errs...)
}

func (e *Engine) closeOnLoop() {
	e.closing = true
	for _, p := range e.peers {
		p.fail(ErrClosed, false)
		if p.ch != nil {
			p.ch.Drain() // what the peer saw acknowledged is delivered, not dropped
		}
		if p.ch != nil {
			p.ch.Close(ErrClosed)
			p.ch = nil
		}
		if p.pending != nil {
			p.pending.Close(ErrClosed)
			p.pending = nil
		}
		if p.yieldTimer != nil {
			p.yieldTimer.Stop()
		}
	}
	for _, h := range e.heldOOB {
		h.reply(ErrClosed)
	}
	e.heldOOB = nil
}
