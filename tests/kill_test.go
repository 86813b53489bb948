package tests

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/notify"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// TestKillReceiverAndRestart: the receiver process is killed with SIGKILL mid-burst and
// restarted on the same address. Senders get errors while it is down; the channel
// reconnects with a new epoch; traffic resumes. Nothing is delivered twice, and of what was
// acknowledged only a notify still in the dead process's RECV ring (not yet handed to the
// application) can be missing: sends are sequential, so at most the last one before the kill.
func TestKillReceiverAndRestart(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			addr := freeAddr(t)
			env := []string{peerAddrEnv + "=" + addr, peerModeEnv + "=record"}
			first := startPeerProc(t, tr, env...)
			a := newEngine(t, tr, notify.WithConnectTimeout(time.Second), notify.WithOOBFallback(false))
			ctx := ctxFor(t, 60*time.Second)
			const n = 400
			acked := map[string]bool{}
			var lastBeforeKill string
			var failed int
			var second *peerProc
			var epochBefore uint64
			for i := 0; i < n; i++ {
				if i == n/2 {
					if tr == notify.TransportRDMATwoSided {
						epochBefore = peerStats(t, a, addr).Epoch
					}
					first.kill()
				}
				if i == n/2+20 {
					second = startPeerProc(t, tr, env...)
					// The sender's handshakes back off while the peer is down (at most
					// 8 s apart): it is reached again once the next one goes.
					probes := 0
					require.True(t, waitUntil(30*time.Second, func() bool {
						sctx, cancel := contextWithTimeout(ctx, 3*time.Second)
						defer cancel()
						probes++
						return a.SendNotify(sctx, addr, notify.Notify{Name: "k", Msg: []byte(fmt.Sprint("probe", probes))}) == nil
					}), "the restarted peer was not reached again")
				}
				msg := fmt.Sprint(i)
				sctx, cancel := contextWithTimeout(ctx, 3*time.Second)
				err := a.SendNotify(sctx, addr, notify.Notify{Name: "k", Msg: []byte(msg)})
				cancel()
				if err != nil {
					failed++
					continue
				}
				acked[msg] = true
				if i < n/2 {
					lastBeforeKill = msg
				}
			}
			require.NotNil(t, second)
			var epochAfter uint64
			if tr == notify.TransportRDMATwoSided {
				// Read before the clean stop: its goodbye makes a forget the pair.
				epochAfter = peerStats(t, a, addr).Epoch
			}
			second.stop()
			seen := map[string]int{}
			for _, p := range []*peerProc{first, second} {
				for _, m := range p.received() {
					seen[m]++
				}
			}
			for m, c := range seen {
				require.Equal(t, 1, c, "notify %s delivered %d times", m, c)
				if strings.HasPrefix(m, "probe") {
					delete(seen, m)
				}
			}
			var missing []string
			for m := range acked {
				if seen[m] == 0 {
					missing = append(missing, m)
				}
			}
			if len(missing) > 0 {
				require.Equal(t, []string{lastBeforeKill}, missing, "acknowledged notifies lost")
			}
			require.Greater(t, failed, 0, "no send failed while the receiver was dead")
			require.Greater(t, len(acked), n/2, "traffic did not resume after the restart")
			if tr == notify.TransportRDMATwoSided {
				require.Greater(t, epochAfter, epochBefore, "no new epoch after reconnect")
			}
			t.Logf("%s: %d sent, %d acked, %d failed while down, %d delivered, 0 duplicates, %d acked-but-missing",
				tr, n, len(acked), failed, len(seen), len(missing))
		})
	}
}
