// Connect workers: the goroutines that make ctrl channels' verbs resources off the reactor.
//
// ibv_create_qp, ibv_reg_mr and ibv_modify_qp can block on a NIC (RTR on RoCE waits while
// the kernel resolves the peer's MAC: milliseconds, up to about a second). On the reactor
// thread one slow peer would stall every other peer of the engine, so each channel is
// made by a worker goroutine: ctrlchannel.Prepare (QP in INIT), the handshake RPC (ours),
// Prepared.Ready (rings, RECVs, RTR, RTS), then the loop adopts it (ctrlchannel.Adopt) or
// releases it. One goroutine per channel being made; their number is bounded by existing
// limits: our handshakes in flight by the machine's connect slots (maxConnects) and
// max_channels, peers' handshakes by the OOB node's max_pending_handshakes (a handshake is
// pending until the worker's answer). The protocol's decisions stay in the peer machine:
// whether to make a channel (aConnect, inbound), and whether the channel is still wanted
// once made (chanWanted).

package notify

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/twosided/twosided/ctrlchannel"
	"github.com/twosided/twosided/reactor"
)

// connectWorkers counts the channels being made off the loop on one device. A worker is
// done once its channel was adopted or released (on the loop, or by the worker itself when
// the loop stopped), so the device is never closed under a channel that still uses it.
type connectWorkers struct {
	mu     sync.Mutex
	n      int
	ctx    context.Context // ends the workers' handshakes when the device closes
	cancel context.CancelFunc
	idle   chan struct{} // closed when n drops to 0, for wait
	after  func()        // run by the last done when wait gave up first
}

// add counts a new worker and returns the context its waits take.
func (w *connectWorkers) add() context.Context {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ctx == nil {
		w.ctx, w.cancel = context.WithCancel(context.Background())
	}
	w.n++
	return w.ctx
}

// done ends a worker that add counted.
func (w *connectWorkers) done() {
	w.mu.Lock()
	w.n--
	if w.n > 0 {
		w.mu.Unlock()
		return
	}
	if w.idle != nil {
		close(w.idle)
		w.idle = nil
	}
	f := w.after
	w.after = nil
	w.mu.Unlock()
	if f != nil {
		f()
	}
}

// inFlight is the number of channels being made now.
func (w *connectWorkers) inFlight() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// stopAndWait ends the workers' handshakes and waits up to d for the workers to finish,
// then runs then. Past d it returns false at once, and the last worker runs then when it
// finishes (a verb cannot be interrupted: the device must outlive it).
func (w *connectWorkers) stopAndWait(d time.Duration, then func()) bool {
	w.mu.Lock()
	if w.cancel != nil {
		w.cancel()
	}
	if w.n == 0 {
		w.mu.Unlock()
		then()
		return true
	}
	idle := make(chan struct{})
	w.idle = idle
	w.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-idle:
		then()
		return true
	case <-t.C:
	}
	w.mu.Lock()
	if w.n == 0 {
		w.mu.Unlock()
		then()
		return true
	}
	w.after = then
	w.idle = nil
	w.mu.Unlock()
	return false
}

// connectDrainWait bounds how long closing the device waits for the channels being made:
// a verb cannot be interrupted, and one in flight on a NIC ends within about a second.
const connectDrainWait = 3 * time.Second

// testReadyHook, when set (tests only, before the engines start), is called by a connect
// worker on entering (begin) and leaving Prepared.Ready, the call that holds the RTR.
var testReadyHook func(e *Engine, begin bool)

// ready runs p.Ready(pi) on a worker, telling testReadyHook.
func (e *Engine) ready(p *ctrlchannel.Prepared, pi ctrlchannel.PeerInfo) error {
	if h := testReadyHook; h != nil {
		h(e, true)
		defer h(e, false)
	}
	return p.Ready(pi)
}

// goConnect runs f on a new connect worker; f must end with finish (connectWorkers.done)
// called once, by handToLoop's func or after handToLoop failed.
func (e *Engine) goConnect(f func(ctx context.Context)) {
	ctx := e.cfg.dev.workers.add()
	go f(ctx)
}

// handToLoop queues f on the loop, waiting for room when its queue is full (bounded by the
// loop's life). false: the loop stopped and f will never run.
func (e *Engine) handToLoop(f func()) bool {
	err := e.loop.Submit(f)
	if errors.Is(err, reactor.ErrQueueFull) {
		err = e.loop.SubmitWait(context.Background(), f)
	}
	return err == nil
}

// adoptChannel makes the ready p channel id of the engine. Loop-only; p is spent either way.
func (e *Engine) adoptChannel(id chanID, p *ctrlchannel.Prepared, peerSession, epoch uint64) (*ctrlchannel.Channel, error) {
	ch, err := ctrlchannel.Adopt(e.loop, p, &chanEvents{e: e, id: id}, e.session, peerSession, epoch)
	if err != nil {
		return nil, err
	}
	if e.paused {
		ch.SetPaused(true)
	}
	e.chans[id] = ch
	e.armKeepalive()
	return ch, nil
}
