package tests

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/notify"
)

// TestIdleNoWakeups: 100 peers hold channels (and OOB connections) to a hub; with no
// traffic and keepalive off, no reactor wakes at all. This counts events, it times nothing.
func TestIdleNoWakeups(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			hub := newEngine(t, tr, notify.WithKeepalive(0), notify.WithHandler(func(notify.Notify) {}))
			ctx := ctxFor(t, 30*time.Second)
			engines := []*notify.Engine{hub}
			for i := 0; i < 100; i++ {
				e := newEngine(t, tr, notify.WithKeepalive(0), notify.WithRecvCount(8))
				require.NoError(t, e.SendNotify(ctx, hub.Addr(), notify.Notify{Name: "hi", Msg: []byte(fmt.Sprint(i))}))
				engines = append(engines, e)
			}
			if tr == notify.TransportRDMATwoSided {
				require.Eventually(t, func() bool { // every channel up and its first credit returned
					up := 0
					for _, p := range hub.Stats().Peers {
						if p.State == "up" {
							up++
						}
					}
					return up == 100
				}, 10*time.Second, time.Millisecond)
			}
			wakeups := func() []uint64 {
				w := make([]uint64, len(engines))
				for i, e := range engines {
					w[i] = e.ReactorStats().Wakeups
				}
				return w
			}
			// Let the last completions and credit returns land first.
			var before []uint64
			require.Eventually(t, func() bool {
				b := wakeups()
				time.Sleep(50 * time.Millisecond)
				before = wakeups()
				for i := range b {
					if before[i] != b[i] {
						return false
					}
				}
				return true
			}, 10*time.Second, time.Millisecond)
			time.Sleep(300 * time.Millisecond)
			total := uint64(0)
			for i, w := range wakeups() {
				require.Equal(t, before[i], w, "engine %d woke %d times while idle", i, w-before[i])
				total += w - before[i]
			}
			t.Logf("%s: 101 engines, 100 channels idle for 300 ms: %d reactor wake-ups", tr, total)
		})
	}
}
