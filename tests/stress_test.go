package tests

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/notify"
)

// watchdog dumps every goroutine and fails the test if it is still running after d: a
// stall shows where it is stuck instead of hanging CI.
func watchdog(t *testing.T, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	timer := time.AfterFunc(d, func() {
		fmt.Fprintf(os.Stderr, "watchdog: %s still running after %v; goroutines:\n", t.Name(), d)
		_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 2)
		close(done)
	})
	t.Cleanup(func() {
		if !timer.Stop() {
			<-done
			t.Errorf("watchdog fired after %v", d)
		}
	})
}

// restartable is a peer engine that can be closed and reopened on the same address; what
// each incarnation received is kept, so exactly-once can be checked across incarnations.
type restartable struct {
	mu   sync.Mutex
	e    *notify.Engine
	addr string
	got  map[string]int
	tr   string
}

func (r *restartable) open(t *testing.T) {
	var opts []notify.Option
	opts = append(opts, notify.WithTransport(r.tr), notify.WithListenAddr(r.addr),
		notify.WithHandler(func(n notify.Notify) {
			r.mu.Lock()
			r.got[string(n.Msg)]++
			r.mu.Unlock()
		}))
	var e *notify.Engine
	var err error
	// The old listener's port may linger a moment in the kernel; the retry is bounded.
	for i := 0; i < 50; i++ {
		if e, err = notify.New(opts...); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.NoError(t, err)
	r.e = e
	if r.addr != e.Addr() {
		r.addr = e.Addr() // first open only: senders read addr afterwards
	}
}

func (r *restartable) close(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, r.e.Close(ctx))
}

// TestConcurrentChurn: 64 goroutines send to 16 peers under -race while peers close and
// reopen. Every notify whose SendNotify returned nil was delivered exactly once; every other
// call returned an error within its bound; nothing stalls (watchdog).
func TestConcurrentChurn(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			watchdog(t, 90*time.Second)
			peers := make([]*restartable, 16)
			for i := range peers {
				peers[i] = &restartable{addr: "127.0.0.1:0", got: map[string]int{}, tr: tr}
				peers[i].open(t)
			}
			a := newEngine(t, tr, notify.WithConnectTimeout(time.Second))
			ctx := ctxFor(t, 60*time.Second)
			var acked sync.Map
			var okN, errN atomic.Int64
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for g := 0; g < 64; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						p := peers[(g+i)%len(peers)]
						msg := fmt.Sprintf("g%d-%d", g, i)
						sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
						err := a.SendNotify(sctx, p.addr, notify.Notify{Name: "churn", Msg: []byte(msg)})
						cancel()
						if err != nil {
							require.NoError(t, ctx.Err(), "a call outlived its bound: %v", err)
							errN.Add(1)
							continue
						}
						okN.Add(1)
						acked.Store(msg, p)
					}
				}()
			}
			// Churn: close and reopen peers, one at a time, while traffic flows.
			for round := 0; round < 8; round++ {
				require.Eventually(t, func() bool { return okN.Load() > int64(200*(round+1)) }, 30*time.Second, time.Millisecond)
				p := peers[round%len(peers)]
				p.close(t)
				p.open(t)
			}
			close(stop)
			wg.Wait()
			for _, p := range peers {
				p.close(t)
			}
			// Exactly once: no message twice, and every acked one arrived. A peer closed with
			// notifies it had taken but not handed to its handler can lose them: those went
			// to the closing incarnation only, and the test counts them.
			lost := 0
			acked.Range(func(k, v any) bool {
				p := v.(*restartable)
				switch c := p.got[k.(string)]; {
				case c > 1:
					t.Errorf("%s delivered %d times", k, c)
				case c == 0:
					lost++
				}
				return true
			})
			for _, p := range peers {
				for m, c := range p.got {
					if c > 1 {
						t.Errorf("%s delivered %d times", m, c)
					}
				}
			}
			require.Zero(t, lost, "acknowledged notifies lost")
			t.Logf("%s: %d acked, %d errors during churn, 0 duplicates, 0 lost", tr, okN.Load(), errN.Load())
		})
	}
}

// TestReconnectStorm: 100 peers restart at once and all reconnect to one hub, over
// rdma_twosided without fallback, each within the connect timeout.
func TestReconnectStorm(t *testing.T) {
	watchdog(t, 90*time.Second)
	const n = 100
	var delivered atomic.Int64
	hub := newEngine(t, notify.TransportRDMATwoSided, notify.WithHandler(func(notify.Notify) { delivered.Add(1) }))
	ctx := ctxFor(t, 60*time.Second)
	start := func() []*notify.Engine {
		es := make([]*notify.Engine, n)
		for i := range es {
			e, err := notify.New(notify.WithTransport(notify.TransportRDMATwoSided), notify.WithListenAddr("127.0.0.1:0"),
				notify.WithOOBFallback(false), notify.WithConnectTimeout(10*time.Second), notify.WithRecvCount(8))
			require.NoError(t, err)
			es[i] = e
		}
		return es
	}
	burst := func(es []*notify.Engine) []error {
		errs := make([]error, len(es))
		var wg sync.WaitGroup
		for i, e := range es {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = e.SendNotify(ctx, hub.Addr(), notify.Notify{Name: "storm", Msg: []byte(fmt.Sprint(i))})
			}()
		}
		wg.Wait()
		return errs
	}
	closeAll := func(es []*notify.Engine) {
		var wg sync.WaitGroup
		for _, e := range es {
			wg.Add(1)
			go func() { defer wg.Done(); require.NoError(t, e.Close(ctx)) }()
		}
		wg.Wait()
	}
	first := start()
	for _, err := range burst(first) {
		require.NoError(t, err)
	}
	closeAll(first) // all 100 go away at once
	second := start()
	defer closeAll(second)
	for i, err := range burst(second) {
		require.NoError(t, err, "peer %d did not reconnect", i)
	}
	// A SEND completes when the bytes sit in the hub's RECV ring; the hub's reactor hands
	// them to the handler right after.
	require.Eventually(t, func() bool { return delivered.Load() == 2*n }, 20*time.Second, time.Millisecond)
	fresh := map[string]bool{}
	for _, e := range second {
		fresh[e.Addr()] = true
	}
	up := 0
	for _, p := range hub.Stats().Peers {
		if fresh[p.Peer] && p.State == "up" {
			up++
		}
	}
	require.Equal(t, n, up, "hub should hold a channel to each of the %d restarted peers", n)
	require.False(t, errors.Is(ctx.Err(), context.DeadlineExceeded))
}
