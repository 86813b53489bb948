package tests

import (
	"context"
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

// TestAttackChannelHandshakesLockOut: raw handshakes that ask for a ctrl channel at a QPN
// nobody owns, with invented sessions, never use what they get. Each makes an unconfirmed
// peer entry that holds a channel (a QP); such an entry is as evictable as any unconfirmed
// one (its channel closes with it): within its channel's grace by a newcomer that returns
// the cookie of a busy refusal, past it by anyone. So with max_peers 16, 8 of them from
// the good peers' own address, or 40 from four other addresses, lock nobody out: 10 fresh
// engines deliver all of their 200 notifies, with OOB fallback on and off, and 10 more in
// another process (fallback off) after a second round of the same handshakes. Confirmed
// peers are never evicted, and the ghosts' channels stay within their caps. Before, every
// one of the 200 sends failed with ErrLimit.
func TestAttackChannelHandshakesLockOut(t *testing.T) {
	const maxPeers, newcomers, each = 16, 10, 20
	for _, c := range []struct {
		name  string
		srcs  []string
		ghost int
	}{
		{"SameAddress", []string{"127.0.0.1"}, 8},
		{"OtherAddresses", []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"}, 40},
	} {
		for _, fallback := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/fallback=%v", c.name, fallback), func(t *testing.T) {
				ctx := ctxFor(t, 120*time.Second)
				// Keepalive off and a long connect timeout: the ghosts' channels would end
				// by themselves otherwise, and only their eviction is under test.
				rcv := newEngine(t, rdma, notify.WithMaxPeers(maxPeers), notify.WithOOBFallback(fallback),
					notify.WithKeepalive(0), notify.WithConnectTimeout(60*time.Second))
				good := newEngine(t, rdma, notify.WithOOBFallback(fallback))
				served(t, ctx, good, rcv, "good", 0, 5)

				ghosts := func() (accepted int) {
					for i := 0; i < c.ghost; i++ {
						src := c.srcs[i%len(c.srcs)]
						reply, err := rawExchange(src, rcv.Addr(), typConnection,
							ghostHandshake(fmt.Sprintf("10.7.%d.%d:1", i>>8&255, i&255), rand.Uint32N(1<<24-2)+1, rand.Uint64()|1))
						require.NoError(t, err, "ghost %d", i)
						if strings.Contains(reply, `"notify_qp_num"`) {
							accepted++
						}
					}
					return accepted
				}
				accepted := ghosts()
				st := rcv.Stats()
				t.Logf("%d ghost handshakes: %d got a channel; peers %d (unconfirmed %d), unconfirmed channels %d",
					c.ghost, accepted, st.PeerCount, st.Limits.PeersUnconfirmed, st.Limits.Unconfirmed)
				if accepted == 0 {
					// The verbs provider (on softverbs) cannot make a channel to a QPN nobody
					// owns: the handshake is refused (cause "device") and leaves nothing. The
					// newcomers are served all the same.
					t.Log("no ghost got a channel on this provider")
				}

				var wg sync.WaitGroup
				errs := make(chan error, newcomers*each)
				var sent atomic.Int64
				send := func(e *notify.Engine, k, i int) {
					sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
					err := e.SendNotify(sctx, rcv.Addr(), notify.Notify{Name: "new" + strconv.Itoa(k), Msg: []byte(strconv.Itoa(i))})
					cancel()
					if err != nil {
						errs <- fmt.Errorf("newcomer %d, notify %d: %w", k, i, err)
						return
					}
					sent.Add(1)
				}
				for k := 0; k < newcomers; k++ {
					e := newEngine(t, rdma, notify.WithOOBFallback(fallback))
					// Newcomers arrive one after another (the first send of each), then send
					// together: newcomers from one address handshaking at once beyond its
					// share (4 here) would compete among themselves, ghosts or not.
					send(e, k, 0)
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := 1; i < each; i++ {
							send(e, k, i)
						}
						// It leaves (its goodbye frees its entry for the next round).
						cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
						defer cancel()
						_ = e.Close(cctx)
					}()
				}
				done := make(chan struct{})
				go func() { wg.Wait(); close(done) }()
				got := 0 // the newcomers' notifies the receiver delivered
				for ctx.Err() == nil {
					if closedChan(done) && got >= int(sent.Load()) {
						break
					}
					rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
					m, err := rcv.Recv(rctx)
					cancel()
					if err == nil && strings.HasPrefix(m.Name, "new") {
						got++
					}
				}
				close(errs)
				failed := 0
				for err := range errs {
					if failed++; failed <= 5 {
						t.Error(err)
					}
				}
				st = rcv.Stats()
				t.Logf("newcomers: %d of %d sends failed, %d delivered; peers %d (unconfirmed %d), evicted %d, refused %d; unconfirmed channels %d, evicted %d, expired %d",
					failed, newcomers*each, got, st.PeerCount, st.Limits.PeersUnconfirmed, st.Limits.PeersEvicted, st.Limits.PeersRefused,
					st.Limits.Unconfirmed, st.Limits.UnconfirmedEvicted, st.Limits.UnconfirmedExpired)
				require.Zero(t, failed, "newcomers' sends failed")
				require.Equal(t, newcomers*each, got, "every newcomer's notify delivered")
				if accepted > 0 {
					require.Positive(t, st.Limits.PeersEvicted, "ghost entries made room")
				}
				require.LessOrEqual(t, st.PeerCount, maxPeers)
				// The good peer was never evicted: still served on its pair.
				served(t, ctx, good, rcv, "good", 5, 5)

				if !fallback {
					// Across processes: the newcomers left; a second round of ghosts, then
					// 10 engines of another process, each of which must deliver.
					require.True(t, waitUntil(30*time.Second, func() bool { return rcv.Stats().PeerCount <= 1+c.ghost }),
						"the newcomers' entries outlived their goodbyes")
					ghosts()
					p, err := startSenders(t, newcomers, rcv.Addr())
					require.NoError(t, err, "a process of fresh engines")
					p.kill()
					n := 0
					for n < newcomers {
						m, err := rcv.Recv(ctx)
						require.NoError(t, err, "the other process's notifies: %d of %d", n, newcomers)
						if m.Name == "doomed" {
							n++
						}
					}
				}
				st = rcv.Stats()
				require.LessOrEqual(t, st.Limits.Unconfirmed, 2*64, "unconfirmed channels in all (two pools of 64)")
			})
		}
	}
}

// closedChan reports whether c is closed.
func closedChan(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// TestAttackChannelHandshakeFlood: an endless flood of handshakes asking for channels at
// QPNs nobody owns, from 4 goroutines, against an engine at its default limits, from the
// good peers' own address or from another; meanwhile 10 fresh engines send 20 notifies
// each, with OOB fallback on and off. Every one is delivered: the flood holds at most its
// address's share of unused channels of the first pool (16), and a newcomer answered busy
// asks again with the cookie, in the pool the flood cannot fill (it never reads replies).
// The unused channels stay within their caps (two pools of 64). Newcomers' latency is
// logged, never asserted (before, a newcomer waited for a ghost's channel to expire and
// its place to come free before the flood took it again: p99 up to seconds, and some
// sends timed out).
func TestAttackChannelHandshakeFlood(t *testing.T) {
	const newcomers, each = 10, 20
	for _, c := range []struct {
		src      string
		fallback bool
	}{{"127.0.0.1", true}, {"127.0.0.1", false}, {attackFrom, true}, {attackFrom, false}} {
		src := c.src
		t.Run(fmt.Sprintf("%s/fallback=%v", src, c.fallback), func(t *testing.T) {
			ctx := ctxFor(t, 180*time.Second)
			rcv := newEngine(t, rdma)
			stop := make(chan struct{})
			var floodDone sync.WaitGroup
			var ghosts, withChannel atomic.Int64
			for w := 0; w < 4; w++ {
				floodDone.Add(1)
				go func() {
					defer floodDone.Done()
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						reply, err := rawExchange(src, rcv.Addr(), typConnection,
							ghostHandshake(fmt.Sprintf("10.8.%d.%d:1", w, i&255), rand.Uint32N(1<<24-2)+1, rand.Uint64()|1))
						ghosts.Add(1)
						if err == nil && strings.Contains(reply, `"notify_qp_num"`) {
							withChannel.Add(1)
						}
					}
				}()
			}
			// The newcomers come once the flood holds its channels.
			require.True(t, waitUntil(60*time.Second, func() bool { return withChannel.Load() >= 200 || ghosts.Load() >= 2000 }),
				"the flood got no replies")
			if withChannel.Load() == 0 {
				// The verbs provider (on softverbs) cannot make a channel to a QPN nobody
				// owns: each handshake is refused (cause "device") and leaves nothing.
				close(stop)
				floodDone.Wait()
				t.Skipf("no channel for %d handshakes at QPNs nobody owns on this provider: no flood of channels to hold", ghosts.Load())
			}
			var wg sync.WaitGroup
			var failed, sent atomic.Int64
			var latMu sync.Mutex
			var lat []time.Duration
			errs := make(chan error, 5)
			maxUnused := 0
			for k := 0; k < newcomers; k++ {
				e := newEngine(t, rdma, notify.WithOOBFallback(c.fallback))
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < each; i++ {
						// The default send deadline, as an application's send has (a hang
						// guard: served, a send takes milliseconds).
						sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
						t0 := time.Now()
						err := e.SendNotify(sctx, rcv.Addr(), notify.Notify{Name: "new" + strconv.Itoa(k), Msg: []byte(strconv.Itoa(i))})
						cancel()
						latMu.Lock()
						lat = append(lat, time.Since(t0))
						latMu.Unlock()
						if err != nil {
							failed.Add(1)
							select {
							case errs <- fmt.Errorf("newcomer %d, notify %d: %w", k, i, err):
							default:
							}
							continue
						}
						sent.Add(1)
					}
				}()
			}
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			got := 0
			for ctx.Err() == nil && !(closedChan(done) && got >= int(sent.Load())) {
				maxUnused = max(maxUnused, rcv.Stats().Limits.Unconfirmed)
				rctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
				m, err := rcv.Recv(rctx)
				cancel()
				if err == nil && strings.HasPrefix(m.Name, "new") {
					got++
				}
			}
			close(stop)
			floodDone.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			st := rcv.Stats()
			t.Logf("flood from %s: %d handshakes, %d got a channel; newcomers: %d of %d sends failed, %d delivered, latency p50 %v p99 %v max %v; unconfirmed channels at most %d seen, evicted %d, refused %d; peers evicted %d",
				src, ghosts.Load(), withChannel.Load(), failed.Load(), newcomers*each, got,
				pct(lat, .5).Round(time.Millisecond), pct(lat, .99).Round(time.Millisecond), pct(lat, 1).Round(time.Millisecond), maxUnused,
				st.Limits.UnconfirmedEvicted, st.Limits.UnconfirmedRefused, st.Limits.PeersEvicted)
			require.Zero(t, failed.Load(), "newcomers' sends failed during the flood")
			require.Equal(t, newcomers*each, got, "every newcomer's notify delivered")
			require.LessOrEqual(t, maxUnused, 2*64, "unused channels in all (two pools of 64)")
		})
	}
}
