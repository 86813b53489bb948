package bench

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/twosided/twosided/notify"
)

// pumpResult is what a pipelined phase did.
type pumpResult struct {
	sent, errors int64
	bytes        int64
	firstErr     error
	call         *Hist
}

// runPump sends count messages of size bytes, one goroutine per worker client, message j to
// the worker's peer j mod npeers; every worker keeps one send in flight, so len(workers) is
// the window. It stops early past deadline (nanotime; 0: none) or when ctx ends. Nothing is
// allocated per message.
func runPump(ctx context.Context, workers []client, npeers int, count int64, size int, deadline int64) *pumpResult {
	if ec, ok := sameEngine(workers); ok {
		return runAsyncPump(ctx, ec, len(workers), npeers, count, size, deadline)
	}
	var (
		next atomic.Int64
		mu   sync.Mutex
		wg   sync.WaitGroup
		res  = &pumpResult{call: NewHist()}
	)
	for _, c := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if c.lockThread() {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
			}
			msg := newMsg(size)
			h := NewHist()
			var sent, errs, bytes int64
			var first error
			for ctx.Err() == nil {
				j := next.Add(1) - 1
				if j >= count || (deadline > 0 && nanotime() > deadline) {
					break
				}
				putSeq(msg, uint64(j))
				t := nanotime()
				err := c.send(ctx, int(j%int64(npeers)), msg)
				h.Record(nanotime() - t)
				if err != nil {
					errs++
					if first == nil {
						first = err
					}
					continue
				}
				sent++
				bytes += int64(len(msg))
			}
			mu.Lock()
			res.sent += sent
			res.errors += errs
			res.bytes += bytes
			res.call.Merge(h)
			if res.firstErr == nil {
				res.firstErr = first
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return res
}

// warmUp sends one message from every worker to each of its peers, then extra more from
// the first worker to its first peer, one after another: connections and channels are up
// before the measured phase. It returns how many were delivered.
func warmUp(ctx context.Context, workers []client, npeers, extra, size int) (int64, error) {
	msg := newMsg(size)
	var n int64
	send := func(c client, p int) error {
		putSeq(msg, 0)
		if err := c.send(ctx, p, msg); err != nil {
			return err
		}
		n++
		return nil
	}
	for _, c := range workers {
		for p := range npeers {
			if err := send(c, p); err != nil {
				return n, err
			}
		}
	}
	for range extra {
		if err := send(workers[0], 0); err != nil {
			return n, err
		}
	}
	return n, nil
}

func closeClients(cs []client) {
	for _, c := range cs {
		c.close()
	}
}

// sameEngine reports whether every worker sends through one engine (and to the same
// peers): the window is then kept with SendNotifyAsync, as an application pipelining
// notifies would, on either transport (both pipeline: ctrl channel frames, or OOB requests
// on the persistent connection).
func sameEngine(workers []client) (*engineClient, bool) {
	if len(workers) == 0 {
		return nil, false
	}
	first, ok := workers[0].(*engineClient)
	if !ok {
		return nil, false
	}
	for _, w := range workers[1:] {
		ec, ok := w.(*engineClient)
		if !ok || ec.e != first.e || len(ec.peers) != len(first.peers) {
			return nil, false
		}
		for i := range ec.peers {
			if ec.peers[i] != first.peers[i] {
				return nil, false
			}
		}
	}
	return first, true
}

// asyncSlot is one send in flight of runAsyncPump: its own message buffer and a done bound
// once, so a send allocates nothing of the pump's.
type asyncSlot struct {
	p    *asyncPump
	msg  []byte
	t0   int64
	done func(error)
}

type asyncPump struct {
	c        *engineClient
	ctx      context.Context
	npeers   int64
	count    int64
	deadline int64
	next     atomic.Int64
	mu       sync.Mutex
	res      *pumpResult
	chains   sync.WaitGroup
}

func (s *asyncSlot) complete(err error) {
	p := s.p
	p.mu.Lock()
	p.res.call.Record(nanotime() - s.t0)
	if err != nil {
		p.res.errors++
		if p.res.firstErr == nil {
			p.res.firstErr = err
		}
	} else {
		p.res.sent++
		p.res.bytes += int64(len(s.msg))
	}
	p.mu.Unlock()
	s.sendNext()
}

// sendNext sends the pump's next message in this slot, or ends the slot's chain.
func (s *asyncSlot) sendNext() {
	p := s.p
	for {
		j := p.next.Add(1) - 1
		if j >= p.count || p.ctx.Err() != nil || (p.deadline > 0 && nanotime() > p.deadline) {
			p.chains.Done()
			return
		}
		putSeq(s.msg, uint64(j))
		s.t0 = nanotime()
		err := p.c.e.SendNotifyAsync(p.c.peers[int(j%p.npeers)], notify.Notify{Name: benchName, Msg: s.msg}, s.done)
		if err == nil {
			return
		}
		p.mu.Lock()
		p.res.errors++
		if p.res.firstErr == nil {
			p.res.firstErr = err
		}
		p.mu.Unlock()
	}
}

// runAsyncPump is runPump for an engine: window chains of SendNotifyAsync, each completion
// (on the reactor thread) sending the chain's next message, as an application pipelining
// notifies from its completion callbacks would. At most window sends are in flight; no
// goroutine hand-off sits between a completion and the next send.
func runAsyncPump(ctx context.Context, c *engineClient, window, npeers int, count int64, size int, deadline int64) *pumpResult {
	p := &asyncPump{c: c, ctx: ctx, npeers: int64(npeers), count: count, deadline: deadline,
		res: &pumpResult{call: NewHist()}}
	slots := make([]*asyncSlot, window)
	for i := range slots {
		s := &asyncSlot{p: p, msg: newMsg(size)}
		s.done = s.complete
		slots[i] = s
	}
	p.chains.Add(window)
	for _, s := range slots {
		s.sendNext()
	}
	p.chains.Wait()
	return p.res
}
