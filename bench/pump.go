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

// sameEngine reports whether every worker sends through one rdma_twosided engine (and to
// the same peers).
func sameEngine(workers []client) (*engineClient, bool) {
	if len(workers) == 0 {
		return nil, false
	}
	// OOB async sends are carried one after another per peer (their FIFO), so only the
	// rdma_twosided engine pipelines through SendNotifyAsync.
	first, ok := workers[0].(*engineClient)
	if !ok || first.e.Transport() != notify.TransportRDMATwoSided {
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
	mu     sync.Mutex
	free   []*asyncSlot // slots whose send completed
	refill int          // free slots that make the pump refill the window
	wake   chan struct{}
	res    *pumpResult
	inFly  sync.WaitGroup
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
	p.free = append(p.free, s)
	wake := len(p.free) == p.refill
	p.mu.Unlock()
	p.inFly.Done()
	if wake {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
}

// runAsyncPump is runPump for an engine: one goroutine keeps up to window SendNotifyAsync
// calls in flight (a completion on the reactor thread frees its slot), as an application
// pipelining notifies would, instead of window goroutines each blocked in SendNotify. It
// refills the window once half of it is free, in one go (as floor-stream writes what its
// window allows after each read of acks): a wake-up of the pump per completion would make the
// scheduler's hand-off, not the transport, the figure.
func runAsyncPump(ctx context.Context, c *engineClient, window, npeers int, count int64, size int, deadline int64) *pumpResult {
	p := &asyncPump{free: make([]*asyncSlot, 0, window), refill: max(1, window/2), wake: make(chan struct{}, 1),
		res: &pumpResult{call: NewHist()}}
	for range window {
		s := &asyncSlot{p: p, msg: newMsg(size)}
		s.done = s.complete
		p.free = append(p.free, s)
	}
	batch := make([]*asyncSlot, 0, window)
	j := int64(0)
	for j < count && ctx.Err() == nil && (deadline <= 0 || nanotime() <= deadline) {
		p.mu.Lock()
		if need := int64(min(p.refill, len(p.free)+1)); int64(len(p.free)) < need && int64(len(p.free)) < count-j {
			p.mu.Unlock()
			select {
			case <-p.wake:
			case <-ctx.Done():
			}
			continue
		}
		batch = append(batch[:0], p.free...)
		p.free = p.free[:0]
		p.mu.Unlock()
		for i, s := range batch {
			if j >= count {
				p.mu.Lock()
				p.free = append(p.free, batch[i:]...)
				p.mu.Unlock()
				break
			}
			putSeq(s.msg, uint64(j))
			s.t0 = nanotime()
			p.inFly.Add(1)
			if err := c.e.SendNotifyAsync(c.peers[int(j%int64(npeers))], notify.Notify{Name: benchName, Msg: s.msg}, s.done); err != nil {
				s.complete(err)
			}
			j++
		}
	}
	p.inFly.Wait()
	return p.res
}
