package notify

import (
	"context"
	"sync"
	"time"
)

// asyncOOB is one SendNotifyAsync carried over OOB.
type asyncOOB struct {
	n          Notify
	seq, epoch uint64
	start      time.Time // when the send was called
	done       func(error)
}

// asyncQueues keeps SendNotifyAsync's OOB sends in order per peer: one goroutine per peer
// with work drains its queue, one blocking OOB request after another, and exits when the
// queue is empty. OOB client calls block, so they never run on the loop.
type asyncQueues struct {
	mu    sync.Mutex
	peers map[string]*asyncPeer
}

type asyncPeer struct {
	q       []asyncOOB
	running bool
}

func (a *asyncQueues) push(e *Engine, peer string, r asyncOOB) {
	a.mu.Lock()
	if a.peers == nil {
		a.peers = make(map[string]*asyncPeer)
	}
	p := a.peers[peer]
	if p == nil {
		p = &asyncPeer{}
		a.peers[peer] = p
	}
	p.q = append(p.q, r)
	start := !p.running
	p.running = true
	a.mu.Unlock()
	if start {
		go a.drain(e, peer, p)
	}
}

func (a *asyncQueues) drain(e *Engine, peer string, p *asyncPeer) {
	for {
		a.mu.Lock()
		if len(p.q) == 0 {
			p.running = false
			delete(a.peers, peer)
			a.mu.Unlock()
			return
		}
		r := p.q[0]
		p.q[0] = asyncOOB{}
		p.q = p.q[1:]
		a.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), defaultSendTimeout)
		err := ErrClosed
		if !e.closed.Load() {
			err = e.sendOOB(ctx, peer, &r.n, r.seq, r.epoch)
		}
		cancel()
		e.ctr.sendResult(r.start, err)
		r.done(err)
	}
}
