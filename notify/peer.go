package notify

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twosided/twosided/ctrlchannel"
	"github.com/twosided/twosided/oob"
	"github.com/twosided/twosided/reactor"
)

// noCtrlRetry is how long a peer that said it has no ctrl channel is served over OOB only
// before the engine asks again (it may have restarted with rdma_twosided).
const noCtrlRetry = 30 * time.Second

// chanState is a peer's channel state, as Stats reports it.
type chanState uint8

const (
	stateIdle       chanState = iota // no channel; the next send connects
	stateConnecting                  // our handshake is in flight; senders wait
	stateAwaiting                    // we yielded a simultaneous open; the peer connects to us
	stateUp                          // channel established
)

func (s chanState) String() string {
	return [...]string{"idle", "connecting", "awaiting-peer", "up"}[s]
}

// peer is everything the engine knows of one remote engine. Loop-owned.
type peer struct {
	name    string
	state   chanState
	ch      *ctrlchannel.Channel // established channel
	pending *ctrlchannel.Channel // channel of our handshake in flight
	epoch   uint64               // epoch of the latest channel
	nextSeq uint64
	waiters []*sendReq // sends waiting for the connect in progress

	yieldTimer    *reactor.Timer
	lastErr       error
	remoteQPN     uint32    // the peer's QPN of ch
	remoteSession uint64    // the peer's session on ch
	noCtrlUntil   time.Time // the peer has no ctrl channel: OOB only until then
	noCredit      uint64    // keepalive: last KeepalivesNoCredit seen
	starved       int       // keepalive rounds in a row without credit

	sent, received, dups uint64
}

func (e *Engine) peer(name string) *peer {
	p := e.peers[name]
	if p == nil {
		p = &peer{name: name}
		e.peers[name] = p
	}
	return p
}

// fail completes every waiting send with err. fallback says whether the caller may retry
// the notify over OOB.
func (p *peer) fail(err error, fallback bool) {
	for _, r := range p.waiters {
		r.complete(err, fallback)
	}
	p.waiters = p.waiters[:0]
}

// sendReq is one SendNotify on its way through the loop. Pooled: the closures it hands to
// the loop and the channel are bound once, so a send allocates nothing of its own.
type sendReq struct {
	e        *Engine
	peer     string
	n        Notify
	deadline time.Time
	start    time.Time // SendNotifyAsync: when it was called
	seq      uint64
	epoch    uint64
	fallback bool
	done     chan error
	cb       func(error) // SendNotifyAsync: called instead of a send on done
	runFn    func()
	creq     ctrlchannel.SendReq
}

func newSendReq(e *Engine) *sendReq {
	r := &sendReq{e: e, done: make(chan error, 1)}
	r.runFn = r.run
	r.creq.Done = r.onChannelDone
	return r
}

func (r *sendReq) prepare(ctx context.Context, peer string, n Notify) {
	r.peer, r.n = peer, n
	r.deadline, _ = ctx.Deadline()
	r.seq, r.epoch, r.fallback, r.cb = 0, 0, false, nil
}

func (r *sendReq) complete(err error, fallback bool) {
	r.fallback = fallback
	if r.cb != nil {
		r.e.completeAsync(r, err)
		return
	}
	r.done <- err
}

// onChannelDone is the channel's completion of this send. A failure of the channel itself
// (QP error, peer gone) may be retried over OOB; a deadline or a local limit may not.
func (r *sendReq) onChannelDone(err error) {
	fallback := err != nil && !errors.Is(err, context.DeadlineExceeded) &&
		!errors.Is(err, ctrlchannel.ErrBackpressure) && !errors.Is(err, ctrlchannel.ErrTooLarge) &&
		!errors.Is(err, ErrClosed)
	r.complete(err, fallback)
}

// run is the loop side of SendNotify.
func (r *sendReq) run() {
	e := r.e
	if e.closing {
		r.complete(ErrClosed, false)
		return
	}
	p := e.peer(r.peer)
	p.nextSeq++
	r.seq = p.nextSeq
	switch p.state {
	case stateUp:
		r.post(p)
	case stateConnecting, stateAwaiting:
		if len(p.waiters) >= e.cfg.maxPendingSends {
			r.complete(fmt.Errorf("%w: %d sends already wait for the connect to %s", ctrlchannel.ErrBackpressure, len(p.waiters), p.name), false)
			return
		}
		p.waiters = append(p.waiters, r)
	case stateIdle:
		if e.loop.Now().Before(p.noCtrlUntil) {
			// The peer said it has no ctrl channel: straight to OOB, no handshake per notify.
			r.complete(p.lastErr, true)
			return
		}
		p.waiters = append(p.waiters, r)
		e.connect(p)
	}
}

func (r *sendReq) post(p *peer) {
	r.epoch = p.epoch
	r.creq.Seq, r.creq.Name, r.creq.Msg, r.creq.Deadline = r.seq, r.n.Name, r.n.Msg, r.deadline
	p.sent++
	p.ch.Send(&r.creq)
}

// flush posts every waiting send on the peer's established channel.
func (p *peer) flush() {
	for _, r := range p.waiters {
		r.post(p)
	}
	p.waiters = p.waiters[:0]
}

// connect starts the active side of a channel to p: a channel in INIT with its RECVs
// posted, then the handshake RPC over OOB on a goroutine (the loop never blocks), then
// finishConnect on the loop. One connect per peer at a time: senders queue in p.waiters.
func (e *Engine) connect(p *peer) {
	if e.channels() >= e.cfg.maxChannels {
		p.lastErr = e.channelLimitErr()
		p.fail(p.lastErr, true)
		return
	}
	ch, err := e.newChannel(p)
	if err != nil {
		p.lastErr = err
		p.fail(err, true)
		return
	}
	p.state = stateConnecting
	p.pending = ch
	p.epoch++
	epoch := p.epoch
	req := e.handshakeDesc(ch, p.name, epoch)
	name := p.name
	timeout := e.cfg.connectTimeout
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		resp, err := e.node.Handshake(ctx, name, req)
		if serr := e.loop.Submit(func() { e.finishConnect(name, ch, epoch, resp, err) }); serr != nil {
			// The loop stopped: Close already failed every waiter and closed the channel.
			return
		}
	}()
}

func (e *Engine) finishConnect(name string, ch *ctrlchannel.Channel, epoch uint64, resp *oob.HandshakeDesc, err error) {
	p := e.peers[name]
	if p == nil || e.closing {
		ch.Close(ctrlchannel.ErrClosed)
		return
	}
	// Superseded: the peer connected to us meanwhile (simultaneous open). If the peer
	// nevertheless accepted our handshake, it replaced its channel with ours, so ours wins:
	// the latest channel a peer accepted is the one both ends use.
	superseded := p.pending != ch
	if !superseded {
		p.pending = nil
	}
	if err == nil || (errors.Is(err, oob.ErrRejected) && resp != nil) {
		// A refusal comes back as a reply with reply_msg: read why.
		err = checkHandshakeReply(resp)
	}
	if superseded && err != nil {
		ch.Close(ctrlchannel.ErrClosed)
		return
	}
	if err != nil && isYield(err) {
		// The peer is the preferred active side: it connects to us. Wait for it, bounded.
		ch.Close(ctrlchannel.ErrClosed)
		p.state = stateAwaiting
		p.yieldTimer = e.loop.AfterFunc(e.cfg.connectTimeout, func() {
			p.yieldTimer = nil
			if p.state == stateAwaiting {
				p.state = stateIdle
				p.lastErr = fmt.Errorf("%w: %s yielded but never connected", ErrPeerUnreachable, name)
				p.fail(p.lastErr, true)
			}
		})
		return
	}
	if err == nil {
		var peerInfo ctrlchannel.PeerInfo
		peerInfo, err = peerInfoFrom(resp)
		if err == nil {
			err = ch.Connect(peerInfo, e.session, resp.Session, epoch)
		}
	}
	if err != nil {
		ch.Close(ctrlchannel.ErrClosed)
		if !superseded {
			p.state = stateIdle
			if errors.Is(err, ErrNoCtrlChannel) {
				p.noCtrlUntil = e.loop.Now().Add(noCtrlRetry)
			}
			p.lastErr = fmt.Errorf("connect %s: %w", name, err)
			p.fail(p.lastErr, true)
		}
		return
	}
	if p.ch != nil && p.ch != ch {
		p.ch.Close(fmt.Errorf("%w: replaced by the channel %s accepted", ctrlchannel.ErrClosed, name))
	}
	e.adopt(p, ch, max(epoch, p.epoch), resp.Session, resp.NotifyQPNum)
}

func isYield(err error) bool {
	var re *handshakeRejected
	return errors.As(err, &re) && re.msg == yieldMsg
}

type handshakeRejected struct{ msg string }

func (h *handshakeRejected) Error() string { return "handshake rejected by peer: " + h.msg }

func checkHandshakeReply(resp *oob.HandshakeDesc) error {
	if resp == nil {
		return fmt.Errorf("%w: empty handshake reply", ErrPeerUnreachable)
	}
	if resp.ReplyMsg != "" {
		if strings.Contains(resp.ReplyMsg, ErrNoCtrlChannel.Error()) {
			// A twosided peer running the oob transport says so in words.
			return fmt.Errorf("%w: %s", ErrNoCtrlChannel, resp.ReplyMsg)
		}
		return &handshakeRejected{msg: resp.ReplyMsg}
	}
	if !resp.CtrlChannel || resp.NotifyQPNum == 0 {
		return fmt.Errorf("%w: reply has ctrl_channel=%v notify_qp_num=%d", ErrNoCtrlChannel, resp.CtrlChannel, resp.NotifyQPNum)
	}
	return nil
}

// chanEvents routes one channel's events to its peer. Loop-only.
type chanEvents struct {
	e  *Engine
	p  *peer
	ch *ctrlchannel.Channel // set right after NewChannel returns
}

func (c *chanEvents) OnNotify(d ctrlchannel.Delivery) {
	c.e.deliver(c.p, d.Session, d.Seq, Notify{Peer: c.p.name, Name: d.Name, Msg: d.Msg}, nil)
}

func (c *chanEvents) OnClosed(err error) {
	c.e.ctr.channelClosed(c.ch)
	p := c.p
	if c.ch != nil && p.ch == c.ch {
		p.ch = nil
		p.state = stateIdle
		p.lastErr = err
		c.e.cfg.logger.Debug().Str("peer", p.name).Err(err).Msg("ctrl channel closed")
	}
}
