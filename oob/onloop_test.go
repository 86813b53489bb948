package oob

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestNotifyOnLoopReusesCalls: NotifyOnLoop's calls come from a free list, so a call must
// go back only once nothing refers to it. Three ways a call ends are mixed on one node —
// its caller's deadline while the peer holds it, the peer's node closing with the call in
// flight, and the reply — and every callback sends the next notify at once, taking the
// call just freed. Each callback runs exactly once with its own notify's result, a late
// reply for a timed-out call reaches nobody, and the free list holds what came back.
func TestNotifyOnLoopReusesCalls(t *testing.T) {
	la, lb, lc := newLoop(t), newLoop(t), newLoop(t)
	a := listen(t, la, newHandler(), Config{})
	hb := newHandler()
	b, err := Listen(lb, Config{ListenAddr: "127.0.0.1:0"}, hb)
	require.NoError(t, err)
	hc := newHandler()
	c := listen(t, lc, hc, Config{})

	const waves = 40
	var mu sync.Mutex
	results := map[string][]error{} // name -> every result its callback saw
	var onLoop func(peer, name string, timeout time.Duration, then func())
	onLoop = func(peer, name string, timeout time.Duration, then func()) {
		req := &NotifyRequest{Name: name, Msg: []byte(name)}
		done := func(err error) {
			mu.Lock()
			results[name] = append(results[name], err)
			mu.Unlock()
			if then != nil {
				then()
			}
		}
		if err := a.NotifyOnLoop(peer, req, timeout, done); err != nil {
			done(err)
		}
	}
	submit := func(f func()) { require.NoError(t, la.Submit(f)) }

	// Held by b, ended by the caller's deadline; each callback sends to c at once.
	submit(func() {
		for i := 0; i < waves; i++ {
			next := fmt.Sprint("after-timeout-", i)
			onLoop(b.Addr(), fmt.Sprint("hold-timeout-", i), 50*time.Millisecond, func() {
				onLoop(c.Addr(), next, time.Minute, nil)
			})
		}
	})
	// Held by b until b closes; each callback sends to c at once.
	submit(func() {
		for i := 0; i < waves; i++ {
			next := fmt.Sprint("after-close-", i)
			onLoop(b.Addr(), fmt.Sprint("hold-close-", i), time.Minute, func() {
				onLoop(c.Addr(), next, time.Minute, nil)
			})
		}
	})
	for i := 0; i < 2*waves; i++ {
		select {
		case <-hb.ch:
		case <-time.After(waitBound):
			t.Fatalf("b saw %d of %d held notifies", i, 2*waves)
		}
	}
	// The deadline ends the first wave; then b answers everything it holds (too late for
	// those) and closes, which ends the second.
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(results) >= 2*waves
	}, waitBound, time.Millisecond)
	hb.release()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	require.NoError(t, b.Close(ctx))
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(results) == 4*waves
	}, waitBound, time.Millisecond)

	mu.Lock()
	defer mu.Unlock()
	for i := 0; i < waves; i++ {
		for name, check := range map[string]func(error){
			fmt.Sprint("hold-timeout-", i):  func(err error) { require.ErrorIs(t, err, context.DeadlineExceeded) },
			fmt.Sprint("after-timeout-", i): func(err error) { require.NoError(t, err) },
			fmt.Sprint("after-close-", i):   func(err error) { require.NoError(t, err) },
		} {
			require.Len(t, results[name], 1, "%s: one result", name)
			check(results[name][0])
		}
		// Answered by b's release, or cut by its close: one result either way, its own.
		name := fmt.Sprint("hold-close-", i)
		require.Len(t, results[name], 1, "%s: one result", name)
		if err := results[name][0]; err != nil {
			require.True(t, errors.Is(err, ErrPeerUnreachable) || errors.Is(err, ErrClosed), "%s: %v", name, err)
		}
	}
	seen := map[string]int{}
	for {
		select {
		case r := <-hc.ch:
			seen[r.Name]++
			require.Equal(t, r.Name, string(r.Msg), "each notify carries its own message")
			continue
		default:
		}
		break
	}
	require.Len(t, seen, 2*waves)
	for name, k := range seen {
		require.Equal(t, 1, k, name)
	}
	free := make(chan int, 1)
	submit(func() { free <- a.freeCalls.Len() })
	require.Greater(t, <-free, 0, "calls came back to the free list")
}

// TestReaderGoesOnAfterItsReadCap: a connection's reader stops after 16 reads of its buffer
// and goes on in a func of its own, so that no readiness is left behind: its fd is
// registered as draining, and a burst that woke a caller waiting as the loop (in the
// callers' set, which the loop's own set never hears of) would otherwise stay in the socket
// once that caller's turn ended. Here the buffer is 16 bytes, the burst 20 notifies in one
// write, and the caller's wait ends with the first notify.
func TestReaderGoesOnAfterItsReadCap(t *testing.T) {
	la, lb := newLoop(t), newLoop(t)
	a := listen(t, la, newHandler(), Config{})
	hb := newHandler()
	b := listen(t, lb, hb, Config{})
	require.NoError(t, a.Notify(bg(t), b.Addr(), &NotifyRequest{Name: "connect", Msg: []byte("x")}))
	<-hb.ch
	onLoop(t, lb, func() { b.scratch = make([]byte, 16) })

	const burst = 20
	reqs := make([]NotifyRequest, burst)
	for i := range reqs {
		reqs[i] = NotifyRequest{Name: fmt.Sprint("burst-", i), Msg: []byte("0123456789abcdef")}
	}
	got := 0
	take := func() {
		for {
			select {
			case <-hb.ch:
				got++
			default:
				return
			}
		}
	}
	var borrowed bool
	tryUntil := time.Now().Add(waitBound)
	for !borrowed {
		require.True(t, time.Now().Before(tryUntil), "the loop never slept for the test to borrow its turn")
		sent := false
		var err error
		borrowed, err = lb.ExecWait(func() {}, waitBound, func() bool {
			if !sent {
				sent = true
				require.NoError(t, la.Submit(func() {
					for i := range reqs {
						_ = a.NotifyOnLoop(b.Addr(), &reqs[i], time.Minute, func(error) {})
					}
				}))
			}
			take()
			return got > 0
		})
		require.NoError(t, err)
		if !borrowed {
			time.Sleep(time.Millisecond) // the loop was awake: try again once it sleeps
		}
	}
	deadline := time.After(waitBound)
	for got < burst {
		select {
		case <-hb.ch:
			got++
		case <-deadline:
			t.Fatalf("%d of %d notifies of the burst arrived", got, burst)
		}
	}
}
