package bench

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
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
