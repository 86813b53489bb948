package tests

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/notify"
)

// sessionHandshake is a Connection request for a session without ctrl channel (a pair over
// OOB): the cheapest way to make a receiver keep a peer entry.
func sessionHandshake(name string, session uint64) []byte {
	return []byte(fmt.Sprintf(`{"local_nic_path":%q,"peer_nic_path":"__ctrl__","qp_num":[],"local_lid":0,"local_gid":"",`+
		`"ts_session":%d,"ts_token":%d,"ts_peer":%q}`, name+"@x", session, session^0x5a5a, name))
}

// TestAttackPeerTableFlood: one good peer talks to a receiver; then 3 000 handshakes with
// invented sessions from eight other addresses, which never use what they get, while 20 new
// legitimate senders arrive. Unconfirmed entries are capped per address and evicted oldest
// first, so the good peer and every newcomer are served (no ErrLimit), and the table stays
// within max_peers.
func TestAttackPeerTableFlood(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			const attacks, newcomers = 3000, 20
			rcv := newEngine(t, tr)
			good := newEngine(t, tr)
			ctx := ctxFor(t, 180*time.Second)
			served(t, ctx, good, rcv, "good", 0, 20)

			var accepted, refused atomic.Int64
			done := make(chan struct{})
			go func() {
				defer close(done)
				flood(attacks, 16, func(i int) {
					src := "127.0.0." + strconv.Itoa(2+i%8)
					reply, err := rawExchange(src, rcv.Addr(), typConnection, sessionHandshake("ghost-"+strconv.Itoa(i), rand.Uint64()|1))
					if err == nil && !strings.Contains(reply, `"ts_refuse":"limit"`) {
						accepted.Add(1)
					} else {
						refused.Add(1)
					}
				})
			}()
			// The newcomers come once the flood has filled the table.
			require.True(t, waitUntil(60*time.Second, func() bool { return accepted.Load()+refused.Load() >= 1500 }))
			var wg sync.WaitGroup
			errs := make(chan error, newcomers)
			for k := 0; k < newcomers; k++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					e := newEngine(t, tr)
					for i := 0; i < 10; i++ {
						if err := e.SendNotify(ctx, rcv.Addr(), notify.Notify{Name: "new" + strconv.Itoa(k), Msg: []byte(strconv.Itoa(i))}); err != nil {
							errs <- fmt.Errorf("newcomer %d, notify %d: %w", k, i, err)
							return
						}
					}
				}()
			}
			next, got := 20, 0 // got: the newcomers' notifies the receiver delivered
			for running := true; running; {
				select {
				case <-done:
					running = false
				default:
					goodSends(t, ctx, good, rcv.Addr(), "good", next, 10)
					got += recvNamed(t, ctx, rcv, "good", good.Addr(), next, 10)
					next += 10
				}
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			goodSends(t, ctx, good, rcv.Addr(), "good", next, 10)
			got += recvNamed(t, ctx, rcv, "good", good.Addr(), next, 10)
			got += len(recvAll(ctx, rcv, time.Second))
			st := rcv.Stats()
			t.Logf("%d handshakes: %d accepted, %d refused; peers %d (unconfirmed %d), evicted %d, refused %d; newcomers' notifies delivered %d",
				attacks, accepted.Load(), refused.Load(), st.PeerCount, st.Limits.PeersUnconfirmed, st.Limits.PeersEvicted,
				st.Limits.PeersRefused, got)
			require.Equal(t, newcomers*10, got, "every newcomer's notify delivered")
			require.LessOrEqual(t, st.PeerCount, 1024, "max_peers")
			require.Positive(t, st.Limits.PeersEvicted, "the flood's entries made room")
		})
	}
}
