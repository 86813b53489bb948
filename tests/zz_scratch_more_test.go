package tests

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/notify"
)

func TestScratchRetryLoops(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			a := newEngine(t, tr)
			b := newEngine(t, tr, notify.WithRecvQueue(4))
			rec := recvIntoSlow(t, b)
			const workers, per = 8, 50
			var tries, maybes, notDel atomic.Int64
			var wg sync.WaitGroup
			for w := 0; w < workers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < per; i++ {
						id := fmt.Sprintf("w%d-%d", w, i)
						for k := 0; ; k++ {
							ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
							err := a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "r", Msg: []byte(id + "#" + strconv.Itoa(k)), ID: id})
							cancel()
							tries.Add(1)
							if err == nil {
								break
							}
							if errors.Is(err, notify.ErrMaybeDelivered) {
								maybes.Add(1)
							} else {
								notDel.Add(1)
							}
						}
					}
				}()
			}
			wg.Wait()
			ctx := ctxFor(t, 20*time.Second)
			require.NoError(t, a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "r", Msg: []byte("fence")}))
			rec.waitMsg(t, ctx, "fence")
			byID := map[string]int{}
			for _, n := range rec.snapshot() {
				if n.ID != "" {
					byID[n.ID]++
				}
			}
			dups := 0
			for _, c := range byID {
				if c > 1 {
					dups++
				}
			}
			t.Logf("%d tries (%d maybe, %d not delivered), %d ids acknowledged, %d delivered, %d delivered more than once; window %+v",
				tries.Load(), maybes.Load(), notDel.Load(), workers*per, len(byID), dups, peerStats(t, b, a.Addr()).Window)
			require.Equal(t, workers*per, len(byID))
			require.Zero(t, dups)
		})
	}
}

func recvIntoSlow(t *testing.T, e *notify.Engine) *moreRec {
	r := &moreRec{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			n, err := e.Recv(ctx)
			if err != nil {
				return
			}
			r.add(n)
			time.Sleep(300 * time.Microsecond)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return r
}
