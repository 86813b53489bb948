package tests

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/notify"
	"github.com/twosided/twosided/oob"
)

// The attacks of issue 10, one test per row, written as an independent attacker: raw
// sockets on the OOB port, an oob.Node as a client, floods, limits, kill -9. Each asserts a
// bound (Stats counts, heap after GC, fds), that a good peer is served during and after
// the attack (acknowledged ⇒ delivered once, in order), and the sentinel the API returns.
// Latency under attack is logged, never asserted.

const rdma = notify.TransportRDMATwoSided

// attackFrom is the loopback address attackers connect from; good peers use 127.0.0.1.
const attackFrom = "127.0.0.2"

// flood runs job(i) for i in [0, n) on workers goroutines.
func flood(n, workers int, job func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				job(i)
			}
		}()
	}
	wg.Wait()
}

// TestAttackBogusHandshakes (row 1): 1 100 handshakes from another address, each naming a
// ctrl channel at a random QPN nobody has, half as Mooncake engines with random names, half
// with random sessions. The channels they get stay within the cap of unconfirmed channels
// of one address (16 of the first pool: the flood never returns a busy refusal's cookie),
// fds and heap within a bound; the channels expire after the connect timeout (or are
// evicted past their grace by a newer handshake), and a real new peer is served on a
// channel of its own.
func TestAttackBogusHandshakes(t *testing.T) {
	const ghostCap, attacks = 64, 1100
	srv := newEngine(t, rdma, notify.WithConnectTimeout(2*time.Second))
	ctx := ctxFor(t, 90*time.Second)
	old := newEngine(t, rdma)
	served(t, ctx, old, srv, "old", 0, 10)
	heap0, fd0 := heapAfterGC(), openFDs(t)
	var refused, accepted, failed atomic.Int64
	flood(attacks, 16, func(i int) {
		session := uint64(0)
		if i%2 == 1 {
			session = rand.Uint64() | 1
		}
		reply, err := rawExchange(attackFrom, srv.Addr(), typConnection,
			ghostHandshake(fmt.Sprintf("10.%d.%d.%d:1", i>>16&255, i>>8&255, i&255), rand.Uint32N(1<<24-2)+1, session))
		switch {
		case err != nil:
			failed.Add(1)
		case strings.Contains(reply, `"notify_qp_num"`):
			accepted.Add(1)
		default:
			refused.Add(1)
		}
	})
	st := srv.Stats()
	heap1, fd1 := heapAfterGC(), openFDs(t)
	t.Logf("%d bogus handshakes: %d accepted with a channel, %d refused, %d failed; channels %d (up %d, unconfirmed %d), peers %d, names %d, unconfirmed refused %d, evicted %d; heap %+.1f MiB, fds %+d",
		attacks, accepted.Load(), refused.Load(), failed.Load(), st.Limits.Channels, st.ChannelsUp, st.Limits.Unconfirmed, st.PeerCount,
		st.Limits.Names, st.Limits.UnconfirmedRefused, st.Limits.UnconfirmedEvicted, float64(int64(heap1)-int64(heap0))/mib, fd1-fd0)
	require.Zero(t, failed.Load(), "every bogus handshake gets a reply")
	// At most an address's share at a time: on a slow machine (-race, strace) the first
	// ones may expire (connect timeout 2 s), or pass their grace (1 s) and be evicted,
	// before the flood ends, and their places are taken again; a channel to a QPN nobody
	// owns may also die of its own (its RC path fails) and free its place, which no
	// counter tells apart: one more share is allowed for those. An engine without the cap
	// accepts all 1 100.
	require.LessOrEqual(t, accepted.Load(), int64(ghostCap/2)+int64(st.Limits.UnconfirmedExpired+st.Limits.UnconfirmedEvicted), "bogus channels beyond the unconfirmed cap")
	require.LessOrEqual(t, st.Limits.Unconfirmed, ghostCap/4, "bogus channels from one address")
	require.LessOrEqual(t, st.Limits.Channels, ghostCap+1)
	require.LessOrEqual(t, fd1-fd0, 4*ghostCap, "fds per bogus channel")
	require.Less(t, int64(heap1)-int64(heap0), int64(64*mib), "heap kept by bogus handshakes")
	// The peer that was there keeps being served.
	served(t, ctx, old, srv, "old", 10, 50)
	// The bogus channels expire (connect timeout 2 s); a new peer gets a channel.
	t0 := time.Now()
	require.Eventually(t, func() bool { st := srv.Stats(); return st.Limits.Unconfirmed == 0 && st.Limits.Channels == 1 },
		60*time.Second, 10*time.Millisecond, "bogus channels never expire")
	st = srv.Stats()
	t.Logf("bogus channels gone %v after the attack (%d expired); peers %d, names %d", time.Since(t0).Round(time.Millisecond),
		st.Limits.UnconfirmedExpired, st.PeerCount, st.Limits.Names)
	newcomer := newEngine(t, rdma)
	served(t, ctx, newcomer, srv, "new", 0, 50)
	require.Equal(t, "up", peerStats(t, newcomer, srv.Addr()).State, "the new peer has a channel")
	t.Run("NoEntryPerRefusal", func(t *testing.T) {
		// Peers kept: the old and new good peers and what the accepted ghosts left; a
		// refused handshake must leave nothing.
		st := srv.Stats()
		if limit := 2 + int(accepted.Load()); st.PeerCount > limit {
			t.Fatalf("%d peer entries after %d refused handshakes (at most %d expected): notify.peerMachine.inbound makes the entry of a new session before refusing it (unconfirmed cap)",
				st.PeerCount, refused.Load(), limit)
		}
	})
}

// TestAttackRefusedHugeNames (row 2): handshakes refused for a limit (MaxChannels reached),
// each with a 900 KB name, half with random sessions, half as Mooncake engines (64 of them,
// not the 600: under -race a 900 KB frame takes ~0.5 s to parse; 24 × 900 KB kept
// would still be 21 MiB). No peer entry is kept per refused handshake, names are bounded,
// and the heap comes back.
func TestAttackRefusedHugeNames(t *testing.T) {
	const attacks = 24
	// A frame must complete within the OOB IdleTimeout (the slowloris guard, 10 s). Here
	// the server's own loop is the bottleneck — 4 × 900 KB parsed at a time, under -race,
	// beside the rest of a CI run — and a CI run saw 2 of 24 frames cut (connection reset):
	// not what this test measures, so the guard gets a minute.
	srv := newEngine(t, rdma, notify.WithMaxChannels(1), notify.WithOOBIdleTimeout(time.Minute))
	good := newEngine(t, rdma)
	ctx := ctxFor(t, 90*time.Second)
	served(t, ctx, good, srv, "good", 0, 10)
	before := srv.Stats()
	heap0 := heapAfterGC()
	huge := strings.Repeat("n", 900<<10)
	var refused, failed atomic.Int64
	var sample, firstFail atomic.Value
	flood(attacks, 4, func(i int) {
		session := uint64(0)
		if i%2 == 1 {
			session = rand.Uint64() | 1
		}
		reply, err := rawExchange(attackFrom, srv.Addr(), typConnection, ghostHandshake(huge+strconv.Itoa(i), uint32(i+1), session))
		switch {
		case err != nil:
			failed.Add(1)
			firstFail.CompareAndSwap(nil, fmt.Sprintf("handshake %d: %v", i, err))
		case !strings.Contains(reply, `"notify_qp_num"`):
			refused.Add(1)
			sample.Store(reply)
		}
	})
	t.Logf("a refusal: %.300s", sample.Load())
	st := srv.Stats()
	grown := int64(heapAfterGC()) - int64(heap0)
	t.Logf("%d handshakes with 900 KB names: %d refused, %d failed; peers %d → %d, names %d → %d; heap %+.1f MiB after GC",
		attacks, refused.Load(), failed.Load(), before.PeerCount, st.PeerCount, before.Limits.Names, st.Limits.Names, float64(grown)/mib)
	require.Zero(t, failed.Load(), "first: %v", firstFail.Load())
	require.Equal(t, int64(attacks), refused.Load(), "MaxChannels 1 is taken: every handshake is refused")
	require.Less(t, grown, int64(16*mib), "memory kept by refused handshakes")
	served(t, ctx, good, srv, "good", 10, 20)
	t.Run("NoEntryPerRefusal", func(t *testing.T) {
		st := srv.Stats()
		require.Equal(t, before.PeerCount, st.PeerCount, "refused handshakes left peer entries behind")
		require.Equal(t, before.Limits.Names, st.Limits.Names, "refused handshakes left names behind")
	})
}

// TestAttackInventedSessions (row 3): 30 000 OOB notifies, each with an invented
// ts_session, seq and token: every one is refused for want of a token, nothing is kept
// (peers, names, heap), and a good peer is served throughout.
func TestAttackInventedSessions(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			const attacks = 30000
			rcv := newEngine(t, tr)
			good := newEngine(t, tr)
			ctx := ctxFor(t, 90*time.Second)
			calm := served(t, ctx, good, rcv, "good", 0, 200)
			before := rcv.Stats()
			heap0 := heapAfterGC()
			evil := attackerNode(t)
			var refusedAuth, other atomic.Int64
			var firstOther atomic.Value
			done := make(chan struct{})
			go func() {
				defer close(done)
				flood(attacks, 32, func(i int) {
					err := evil.Notify(ctx, rcv.Addr(), &oob.NotifyRequest{Name: "forged", Msg: []byte("x"), From: "evil:1",
						Session: rand.Uint64() | 1, Seq: rand.Uint64N(1<<40) + 1, Token: rand.Uint64()})
					if errors.Is(err, oob.ErrAuth) {
						refusedAuth.Add(1)
					} else {
						other.Add(1)
						firstOther.CompareAndSwap(nil, fmt.Sprint(err))
					}
				})
			}()
			loaded, next := servedUntil(t, ctx, good, rcv, done, 200)
			st := rcv.Stats()
			grown := int64(heapAfterGC()) - int64(heap0)
			t.Logf("%d invented sessions: %d refused (auth), %d otherwise (first: %v); peers %d → %d, names %d → %d, auth refusals +%d; heap %+.2f MiB",
				attacks, refusedAuth.Load(), other.Load(), firstOther.Load(), before.PeerCount, st.PeerCount,
				before.Limits.Names, st.Limits.Names, st.Limits.AuthRefused-before.Limits.AuthRefused, float64(grown)/mib)
			logLatency(t, "invented sessions", calm, loaded)
			require.Equal(t, int64(attacks), refusedAuth.Load(), "a notify with an invented session was not refused for its token")
			require.Equal(t, before.PeerCount, st.PeerCount)
			require.Equal(t, before.Limits.Names, st.Limits.Names)
			require.GreaterOrEqual(t, st.Limits.AuthRefused-before.Limits.AuthRefused, uint64(attacks))
			require.Less(t, grown, int64(4*mib), "memory kept for invented sessions")
			served(t, ctx, good, rcv, "good", next, 50)
		})
	}
}

// TestAttackSparseSeqs (row 4): a third party learns a good peer's session and sends the
// receiver 20 000 OOB notifies with that session and sparse seqs far ahead (no token, or a
// guessed one). All are refused; the pair's window holds nothing, and the good peer's
// notifies keep being delivered in order.
func TestAttackSparseSeqs(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			const attacks = 20000
			rcv := newEngine(t, tr, notify.WithGapTimeout(time.Hour))
			good := newEngine(t, tr)
			ctx := ctxFor(t, 90*time.Second)
			calm := served(t, ctx, good, rcv, "good", 0, 200)
			evil := attackerNode(t)
			var refused, other atomic.Int64
			done := make(chan struct{})
			go func() {
				defer close(done)
				flood(attacks, 32, func(i int) {
					tok := uint64(0)
					if i%2 == 1 {
						tok = rand.Uint64()
					}
					err := evil.Notify(ctx, rcv.Addr(), &oob.NotifyRequest{Name: "good", Msg: []byte("forged"), From: good.Addr(),
						Session: good.Session(), To: rcv.Session(), Seq: 300 + uint64(i)*7919, Token: tok})
					if errors.Is(err, oob.ErrAuth) {
						refused.Add(1)
					} else {
						other.Add(1)
					}
				})
			}()
			loaded, next := servedUntil(t, ctx, good, rcv, done, 200)
			ps := peerStats(t, rcv, good.Addr())
			t.Logf("%d forged sparse seqs: %d refused, %d otherwise; good pair's window: held %d, refused %d, skipped %d",
				attacks, refused.Load(), other.Load(), ps.Held, ps.Window.Refused, ps.Window.Skipped)
			logLatency(t, "sparse seqs", calm, loaded)
			require.Equal(t, int64(attacks), refused.Load())
			require.Zero(t, ps.Held, "forged seqs sit in the good pair's window")
			require.Zero(t, ps.Window.Skipped)
			served(t, ctx, good, rcv, "good", next, 50)
		})
	}
}

// TestAttackPipelinedWhileFull (row 5): the receiver's queue (WithRecvQueue 16) is full and
// nobody reads; an attacker pipelines 2 000 notifies on OOB connections and a good peer
// sends 200. The receiver holds at most 64 OOB notifies, plus one of the good peer (a known
// pair with none held among the 64), and answers the rest busy; once the consumer reads,
// every notify answered success is delivered once, none answered busy is, and the good
// peer's all arrive, in order.
func TestAttackPipelinedWhileFull(t *testing.T) {
	const attacks, goodN, maxHeld = 2000, 200, 64
	rcv := newEngine(t, notify.TransportOOB, notify.WithRecvQueue(16))
	good := newEngine(t, notify.TransportOOB)
	ctx := ctxFor(t, 90*time.Second)
	evil := attackerNode(t)
	heap0 := heapAfterGC()
	// Fill the queue.
	goodSends(t, ctx, good, rcv.Addr(), "fill", 0, 16)
	require.Eventually(t, func() bool { return rcv.Stats().Paused }, 10*time.Second, time.Millisecond)

	// attacker messages answered success, answered busy, and failed otherwise (a timeout
	// under load: its outcome is unknown to the sender, so it may have been delivered)
	var okMsgs, busyMsgs, otherMsgs sync.Map
	var busy, other atomic.Int64
	var firstOther atomic.Value
	attackDone := make(chan struct{})
	go func() {
		defer close(attackDone)
		flood(attacks, 64, func(i int) {
			msg := "a" + strconv.Itoa(i)
			err := evil.Notify(ctx, rcv.Addr(), &oob.NotifyRequest{Name: "flood", Msg: []byte(msg), From: "evil:1"})
			switch {
			case err == nil:
				okMsgs.Store(msg, true)
			case errors.Is(err, oob.ErrBusy):
				busy.Add(1)
				busyMsgs.Store(msg, true)
			default:
				other.Add(1)
				otherMsgs.Store(msg, true)
				firstOther.CompareAndSwap(nil, fmt.Sprint(err))
			}
		})
	}()
	l := newLedger()
	goodDone := make(chan struct{})
	go func() {
		defer close(goodDone)
		asyncBurst(t, good, rcv.Addr(), "g", goodN, goodN, l, nil)
	}()
	// Sample the held count while the queue stays full, until the held places are taken and
	// the rest has been answered busy a good many times: the good peer's burst (it then
	// waits for its held one's answer), or the attacker's senders that hold none.
	maxSeen := 0
	var peak uint64
	require.Eventually(t, func() bool {
		st := rcv.Stats()
		maxSeen = max(maxSeen, st.HeldOOB)
		return st.HeldOOB >= maxHeld && st.OOBBusy >= goodN/2
	}, 60*time.Second, 2*time.Millisecond, "the flood is never answered busy")
	peak = heapAfterGC()
	// The consumer reads: what is held is delivered, the good peer's retries get through.
	var got []notify.Notify
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		for {
			c, cancel := context.WithTimeout(ctx, 3*time.Second)
			n, err := rcv.Recv(c)
			cancel()
			if err != nil {
				return
			}
			got = append(got, n)
		}
	}()
	<-attackDone
	<-goodDone
	<-recvDone
	st := rcv.Stats()
	maxSeen = max(maxSeen, st.HeldOOB)
	var goodGot []string
	flooded := map[string]int{}
	for _, n := range got {
		switch n.Name {
		case "c":
			goodGot = append(goodGot, string(n.Msg))
		case "flood":
			flooded[string(n.Msg)]++
		}
	}
	okCount := 0
	okMsgs.Range(func(k, _ any) bool {
		okCount++
		require.Equal(t, 1, flooded[k.(string)], "attacker notify %s answered success, delivered %d times", k, flooded[k.(string)])
		return true
	})
	t.Logf("queue 16 full: held OOB at most %d (bound %d), engine answered busy %d; attacker: %d success, %d busy, %d other (first: %v); delivered %d flood notifies; heap at the peak %+.1f MiB",
		maxSeen, maxHeld+1, st.OOBBusy, okCount, busy.Load(), other.Load(), firstOther.Load(), len(flooded), float64(int64(peak)-int64(heap0))/mib)
	require.LessOrEqual(t, maxSeen, maxHeld+1, "OOB notifies held while the queue is full (64, and one of the good peer)")
	// Who is answered busy depends on who came first: when the attacker's notifies take all
	// 64 held places, its 64 senders all wait for those answers and send nothing more
	// until the consumer reads, and the good peer is the one answered busy and sending
	// again. Someone was.
	require.Positive(t, st.OOBBusy, "nothing was answered busy")
	busyMsgs.Range(func(k, _ any) bool {
		require.Zero(t, flooded[k.(string)], "attacker notify %s answered busy was delivered", k)
		return true
	})
	otherDelivered := 0
	otherMsgs.Range(func(k, _ any) bool {
		require.LessOrEqual(t, flooded[k.(string)], 1, "attacker notify %s delivered twice", k)
		otherDelivered += flooded[k.(string)]
		return true
	})
	require.Equal(t, okCount+otherDelivered, len(flooded), "a flood notify nobody sent was delivered")
	acked, arrived, _, _ := l.tally(t, "good peer through the full queue", goodGot)
	// Every good notify is delivered, once and in order (tally), and acknowledged, except
	// the one the receiver holds: the consumer reads only once the flood has been answered
	// busy often enough, which on a loaded machine may take longer than its sender's request
	// timeout (10 s), and that one then ends ErrMaybeDelivered (tally: a delivered notify
	// that failed otherwise fails the test).
	require.Equal(t, goodN, arrived, "the good peer's notifies are retried until the queue has room")
	require.GreaterOrEqual(t, acked, goodN-1, "more good notifies unacknowledged than the one held")
}

// TestAttackEscapingOverFrame (row 6): OOB notifies under the notify size limit whose JSON
// escaping would exceed the peer's Notify frame limit (1 MiB−64 of quotes, escaped to 2
// bytes a byte; 300 KB of control bytes, to 6) travel base64 to a twosided peer and are
// delivered, while 8 small notifies on the same connection at the same time are all
// delivered, in order. (Towards a Mooncake peer, which reads no base64, such a notify fails
// with ErrTooLarge before it is sent: oob's TestTooLargeOnTheWire.)
func TestAttackEscapingOverFrame(t *testing.T) {
	a := newEngine(t, notify.TransportOOB)
	b := newEngine(t, notify.TransportOOB)
	ctx := ctxFor(t, 60*time.Second)
	served(t, ctx, a, b, "small", 0, 1) // the connection exists
	big := map[string][]byte{
		"text with quotes": []byte(strings.Repeat(`"`, 1<<20-64)),
		"control bytes":    []byte(strings.Repeat("\x01", 300<<10)),
	}
	var wg sync.WaitGroup
	errs := map[string]error{}
	var mu sync.Mutex
	for what, msg := range big {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "big:" + what, Msg: msg})
			mu.Lock()
			errs[what] = err
			mu.Unlock()
		}()
	}
	goodSends(t, ctx, a, b.Addr(), "small", 1, 8)
	wg.Wait()
	for what, err := range errs {
		require.NoError(t, err, what)
	}
	// The small ones in order, the big ones whole, wherever they fell among them.
	var small []string
	bigGot := map[string]bool{}
	for len(small) < 8 || len(bigGot) < len(big) {
		n, err := b.Recv(ctx)
		require.NoError(t, err)
		if what, ok := strings.CutPrefix(n.Name, "big:"); ok {
			require.Equal(t, big[what], n.Msg, what)
			require.False(t, bigGot[what], "%s delivered twice", what)
			bigGot[what] = true
			continue
		}
		require.Equal(t, "small", n.Name)
		small = append(small, string(n.Msg))
	}
	for i, m := range small {
		require.Equal(t, strconv.Itoa(i+1), m, "the small notifies in order")
	}
	served(t, ctx, a, b, "small", 9, 10)
}

// TestAttackManyUnreachable (row 7): sends to 400 peers at once, each a name of a
// listener that accepts and never answers (rdma_twosided, connect timeout 1 s). The heap
// held by the pending connects stays bounded; afterwards no peer, name or channel is left.
func TestAttackManyUnreachable(t *testing.T) {
	const peers = 400 // ~21 KiB each at the peak (was ~176 KiB before the rings waited for Connect)
	e := newEngine(t, rdma, notify.WithConnectTimeout(time.Second))
	var names []string
	for len(names) < peers {
		ln, err := net.Listen("tcp", "0.0.0.0:0")
		require.NoError(t, err)
		t.Cleanup(func() { _ = ln.Close() })
		go func() {
			var held []net.Conn
			defer func() {
				for _, c := range held {
					_ = c.Close()
				}
			}()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				held = append(held, c) // never answered
			}
		}()
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		for x := 1; x <= 250 && len(names) < peers; x++ {
			names = append(names, net.JoinHostPort(fmt.Sprintf("127.0.%d.%d", x/200, x%200+1), port))
		}
	}
	heap0 := heapAfterGC()
	var wg sync.WaitGroup
	var unreachable, limited, other atomic.Int64
	var firstOther atomic.Value
	for _, n := range names {
		wg.Add(1)
		err := e.SendNotifyAsync(n, notify.Notify{Name: "x", Msg: []byte("y")}, func(err error) {
			defer wg.Done()
			switch {
			case errors.Is(err, notify.ErrPeerUnreachable):
				unreachable.Add(1)
			case errors.Is(err, notify.ErrLimit), errors.Is(err, notify.ErrBackpressure):
				limited.Add(1)
			default:
				other.Add(1)
				firstOther.CompareAndSwap(nil, fmt.Sprint(err))
			}
		})
		require.NoError(t, err)
	}
	var peak uint64
	var peakChannels int
	waited := make(chan struct{})
	go func() { wg.Wait(); close(waited) }()
	for sampling := true; sampling; {
		select {
		case <-waited:
			sampling = false
		case <-time.After(50 * time.Millisecond):
			peak = max(peak, heapAfterGC())
			peakChannels = max(peakChannels, e.Stats().Limits.Channels)
		}
	}
	require.Eventually(t, func() bool {
		st := e.Stats()
		return len(st.Peers) == 0 && st.Limits.Names == 0 && st.Limits.Channels == 0
	}, 10*time.Second, 10*time.Millisecond)
	st := e.Stats()
	per := float64(int64(peak)-int64(heap0)) / peers
	t.Logf("%d unreachable peers at once: %d ErrPeerUnreachable, %d limited, %d other (first %v); peak heap %+.1f MiB (%.0f KiB per pending connect), peak channels %d; after: peers %d, names %d, channels %d",
		peers, unreachable.Load(), limited.Load(), other.Load(), firstOther.Load(), float64(int64(peak)-int64(heap0))/mib, per/1024,
		peakChannels, len(st.Peers), st.Limits.Names, st.Limits.Channels)
	require.Zero(t, other.Load())
	require.Equal(t, int64(peers), unreachable.Load()+limited.Load())
	t.Run("PerConnectMemory", func(t *testing.T) {
		// A pending connect holds its QP and CQ; the rings wait for the peer's answer.
		require.LessOrEqual(t, per, float64(64<<10), "KiB of heap per unreachable peer")
	})
}

// TestAttackOverMaxChannels (row 8): a hub with MaxChannels 2 and two peers on channels; a
// third peer sends 200 notifies. Without fallback each fails with ErrLimit; with it each is
// delivered over OOB. Either way the third peer does not handshake again per notify: it
// backs off.
func TestAttackOverMaxChannels(t *testing.T) {
	hub := newEngine(t, rdma, notify.WithMaxChannels(2))
	ctx := ctxFor(t, 90*time.Second)
	for i := 0; i < 2; i++ {
		p := newEngine(t, rdma)
		served(t, ctx, p, hub, "p"+strconv.Itoa(i), 0, 5)
		require.Equal(t, "up", peerStats(t, p, hub.Addr()).State)
	}
	for _, fallback := range []bool{false, true} {
		t.Run(fmt.Sprintf("fallback=%v", fallback), func(t *testing.T) {
			third := newEngine(t, rdma, notify.WithOOBFallback(fallback))
			hs0 := hub.Stats().OOB.HandshakeServed
			t0 := time.Now()
			limited := 0
			for i := 0; i < 200; i++ {
				err := third.SendNotify(ctx, hub.Addr(), notify.Notify{Name: "third", Msg: []byte(strconv.Itoa(i))})
				if fallback {
					require.NoError(t, err, "notify %d over OOB", i)
					continue
				}
				require.ErrorIs(t, err, notify.ErrLimit, "notify %d", i)
				require.ErrorContains(t, err, "max_channels", "the refusal names the limit")
				limited++
			}
			elapsed := time.Since(t0)
			if fallback {
				recvNamed(t, ctx, hub, "third", third.Addr(), 0, 200)
			}
			hs := hub.Stats().OOB.HandshakeServed - hs0
			// One handshake, then at most one per backoff (5 s) that passed.
			bound := 2 + uint64(elapsed/(5*time.Second))
			t.Logf("fallback %v: 200 notifies over %d channels in %v: %d ErrLimit, %d handshakes reached the hub (bound %d)",
				fallback, 2, elapsed.Round(time.Millisecond), limited, hs, bound)
			require.LessOrEqual(t, hs, bound, "the refused peer handshakes again per notify")
		})
	}
}

// TestAttackMaxConns (row 9): the OOB port's MaxConns (2) is taken by idle connections. A
// raw client reads a reply naming the limit, an oob.Node client gets oob.ErrLimit, an
// engine gets notify.ErrLimit: never a reset. Once the connections go, the engine is served.
func TestAttackMaxConns(t *testing.T) {
	srv := newEngine(t, notify.TransportOOB, notify.WithMaxConns(2))
	ctx := ctxFor(t, 60*time.Second)
	var hogs []net.Conn
	for i := 0; i < 2; i++ {
		c, err := dialFrom(attackFrom, srv.Addr())
		require.NoError(t, err)
		hogs = append(hogs, c)
	}
	defer func() {
		for _, c := range hogs {
			_ = c.Close()
		}
	}()
	require.Eventually(t, func() bool { return srv.Stats().OOB.ServerConns == 2 }, 10*time.Second, time.Millisecond)

	// The refusal is written before the request is read, so it carries type Connection.
	_, reply, err := rawExchangeAny("", srv.Addr(), typNotify, []byte(`{"name":"mc","notify_msg":"hi"}`))
	t.Logf("raw client: %s (%v)", reply, err)
	require.NoError(t, err, "the raw client sees a reset, not the limit")
	require.Contains(t, reply, "max_conns")
	require.Contains(t, reply, `"notify_msg":""`)

	err = attackerNode(t).Notify(ctx, srv.Addr(), &oob.NotifyRequest{Name: "n", Msg: []byte("m")})
	t.Logf("oob client: %v", err)
	require.ErrorIs(t, err, oob.ErrLimit)

	client := newEngine(t, notify.TransportOOB)
	t.Run("Engine", func(t *testing.T) {
		err := client.SendNotify(ctx, srv.Addr(), notify.Notify{Name: "n", Msg: []byte("m")})
		t.Logf("engine: %v", err)
		require.Error(t, err)
		require.NotContains(t, err.Error(), "reset")
		require.Positive(t, srv.Stats().OOB.RejectedConns)
		if !errors.Is(err, notify.ErrLimit) {
			t.Fatalf("an engine whose handshake meets the peer's MaxConns gets %v, not ErrLimit (the chain holds oob.ErrLimit: %v); notify.peerMachine.connected maps every handshake transport error to ErrPeerUnreachable",
				err, errors.Is(err, oob.ErrLimit))
		}
	})
	for _, c := range hogs {
		_ = c.Close()
	}
	hogs = nil
	require.Eventually(t, func() bool { return srv.Stats().OOB.ServerConns == 0 }, 10*time.Second, time.Millisecond)
	served(t, ctx, client, srv, "after", 0, 10)
}

// TestAttackSendersGone (row 10): 40 senders close cleanly, then 40 (in child processes)
// are killed -9, keepalive off. The receiver's channels to them are reclaimed within 10 s:
// a clean Close says goodbye; a killed process's soft-RoCE TCP connections end, which is
// the link going down (ibv/soft fails the idle QPs to a device that is gone after ~1–2 s).
// The time taken is logged.
func TestAttackSendersGone(t *testing.T) {
	const perProc, procs, closers = 10, 4, 40
	var opts []notify.Option
	if verbsDevice() {
		// On an RC NIC (the verbs provider) an idle QP learns nothing of a peer killed -9:
		// no packet, no error. The keepalive is what reclaims it there.
		opts = append(opts, notify.WithKeepalive(500*time.Millisecond))
	}
	rcv := newEngine(t, rdma, opts...)
	ctx := ctxFor(t, 120*time.Second)
	good := newEngine(t, rdma)
	served(t, ctx, good, rcv, "good", 0, 5)
	othersUp := func() int {
		up := 0
		for _, p := range rcv.Stats().Peers {
			if p.State == "up" && p.Peer != good.Addr() {
				up++
			}
		}
		return up
	}
	t.Run("Closed", func(t *testing.T) {
		var closing []*notify.Engine
		for i := 0; i < closers; i++ {
			e, err := notify.New(notify.WithTransport(rdma), notify.WithListenAddr("127.0.0.1:0"), notify.WithOOBFallback(false))
			require.NoError(t, err)
			t.Cleanup(func() { _ = e.Close(context.Background()) })
			require.NoError(t, e.SendNotify(ctx, rcv.Addr(), notify.Notify{Name: "doomed", Msg: []byte("c")}))
			closing = append(closing, e)
		}
		require.Eventually(t, func() bool { return othersUp() == closers }, 20*time.Second, 10*time.Millisecond)
		fd0 := openFDs(t)
		t0 := time.Now()
		for _, e := range closing {
			require.NoError(t, e.Close(ctx))
		}
		ok := waitUntil(10*time.Second, func() bool { return othersUp() == 0 })
		t.Logf("%d closed cleanly: %d of their channels still up after %v; channels up now %d; fds %+d",
			closers, othersUp(), time.Since(t0).Round(time.Millisecond), rcv.Stats().ChannelsUp, openFDs(t)-fd0)
		require.True(t, ok, "%d of %d channels of cleanly closed peers still up 10 s after their Close (keepalive off): their SESSION_CLOSE did not free them", othersUp(), closers)
	})
	t.Run("Killed", func(t *testing.T) {
		base := othersUp() // what the closed ones left up
		var children []*senderProc
		for i := 0; i < procs; i++ {
			c, err := startSenders(t, perProc, rcv.Addr())
			if err != nil {
				t.Fatalf("sender process %d could not set up its channels: %v (seen: the receiver's new channel fails with \"reactor: watch cq: epoll_ctl add fd N: invalid argument\" once engines of other processes hold channels to it; ibv/soft or reactor)", i, err)
			}
			children = append(children, c)
		}
		require.Eventually(t, func() bool { return othersUp() == base+procs*perProc }, 20*time.Second, 10*time.Millisecond)
		t0 := time.Now()
		for _, c := range children {
			c.kill()
		}
		ok := waitUntil(10*time.Second, func() bool { return othersUp() <= base })
		t.Logf("%d killed -9: %d of their channels still up after %v", procs*perProc, othersUp()-base, time.Since(t0).Round(time.Millisecond))
		require.True(t, ok, "%d of %d channels of killed senders still up 10 s after kill -9 (keepalive off): the end of the soft provider's TCP connections did not fail their idle QPs", othersUp()-base, procs*perProc)
	})
	served(t, ctx, good, rcv, "good", 5, 20)
}

// verbsDevice reports whether rdma_twosided engines here take a device of the verbs
// provider (built with -tags rdma, libibverbs listing a device) rather than the soft one.
func verbsDevice() bool {
	p, err := ibv.LookupProvider("verbs")
	if err != nil {
		return false
	}
	devs, err := p.GetDeviceList()
	return err == nil && len(devs) > 0
}

// waitUntil polls cond every 10 ms until it holds or d passed.
func waitUntil(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// silentHandler answers handshakes as a Mooncake engine without a ctrl channel, and never
// answers a notify.
type silentHandler struct{}

func (silentHandler) HandleNotify(*oob.NotifyRequest, oob.NotifyReply) {}
func (silentHandler) HandleHandshake(req *oob.HandshakeDesc, reply func(*oob.HandshakeDesc, error)) {
	reply(&oob.HandshakeDesc{LocalNICPath: "silent@x", PeerNICPath: req.LocalNICPath}, nil)
}

// TestAttackSilentPeerAsync (row 11): SendNotifyAsync over oob to a peer that never answers,
// 4 queued. Every callback comes within the documented 30 s (each is awaited with a 45 s
// hang guard), and says the notify failed with a notify sentinel.
func TestAttackSilentPeerAsync(t *testing.T) {
	check := func(t *testing.T, e *notify.Engine, peer string, kinds ...error) {
		t.Helper()
		type res struct {
			err error
			at  time.Duration
		}
		out := make(chan res, 4)
		t0 := time.Now()
		for i := 0; i < 4; i++ {
			require.NoError(t, e.SendNotifyAsync(peer, notify.Notify{Name: "s", Msg: []byte(strconv.Itoa(i))}, func(err error) {
				out <- res{err, time.Since(t0)}
			}))
		}
		for i := 0; i < 4; i++ {
			select {
			case r := <-out:
				t.Logf("callback %d after %v: %v", i, r.at.Round(time.Millisecond), r.err)
				require.Error(t, r.err)
				require.True(t, isAny(r.err, kinds...), "callback %d: %v wraps none of %v", i, r.err, kinds)
			case <-time.After(45 * time.Second):
				t.Fatalf("callback %d missing 45 s after the sends (documented: within 30 s)", i)
			}
		}
	}
	t.Run("NoAnswerAtAll", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
			}
		}()
		e := newEngine(t, notify.TransportOOB, notify.WithConnectTimeout(2*time.Second))
		check(t, e, ln.Addr().String(), notify.ErrTimeout, notify.ErrPeerUnreachable)
	})
	t.Run("NotifiesUnanswered", func(t *testing.T) {
		if testing.Short() {
			t.Skip("waits for the 30 s async deadline")
		}
		// A Mooncake engine that takes the handshake and never answers a notify: its OOB
		// notifies go one after another, each bounded by the request timeout, all by 30 s.
		silent := attackerNodeWith(t, silentHandler{})
		e := newEngine(t, notify.TransportOOB)
		check(t, e, silent.Addr(), notify.ErrTimeout)
	})
}

// TestAttackEmptyAndForgedIdentity (row 12): `{}` as an OOB notify is refused naming the
// missing field; a 500 KB ts_from is refused naming ts_from; a twosided notify's Peer is
// the sender's handshaken name. Received notifies obey the receiver's size rule too.
func TestAttackEmptyAndForgedIdentity(t *testing.T) {
	rcv := newEngine(t, notify.TransportOOB, notify.WithMaxNotifySize(4096))
	good := newEngine(t, notify.TransportOOB)
	ctx := ctxFor(t, 30*time.Second)

	reply, err := rawExchange(attackFrom, rcv.Addr(), typNotify, []byte(`{}`))
	require.NoError(t, err)
	t.Logf("{}: %s", reply)
	require.Contains(t, reply, `"notify_msg":""`, "refused")
	require.Contains(t, reply, "name", "the refusal names the missing field")

	reply, err = rawExchange(attackFrom, rcv.Addr(), typNotify,
		[]byte(`{"name":"n","notify_msg":"m","ts_from":"`+strings.Repeat("f", 500<<10)+`"}`))
	require.NoError(t, err)
	require.Contains(t, reply, `"notify_msg":""`, "a 500 KB ts_from is refused")
	require.Contains(t, reply, "ts_from")

	served(t, ctx, good, rcv, "good", 0, 5) // recvNamed checks Peer == good.Addr()
	rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	n, err := rcv.Recv(rctx)
	require.ErrorIs(t, err, notify.ErrTimeout, "something else was delivered: %+v", n)

	t.Run("ReceivedSizeRule", func(t *testing.T) {
		reply, err := rawExchange(attackFrom, rcv.Addr(), typNotify,
			[]byte(`{"name":"n","notify_msg":"`+strings.Repeat("m", 8192)+`"}`))
		require.NoError(t, err)
		if !strings.Contains(reply, `"notify_msg":""`) {
			got := rcv.GetNotifies()
			t.Fatalf("a received notify of 8 KiB is accepted (%d delivered) by an engine whose max_notify_size is 4096: received notifies are not held to the send rule", len(got))
		}
	})
}

// TestAttackUnreachableErrors (row 13): a refused port on both transports, with and without
// fallback: errors.Is(err, ErrPeerUnreachable), the peer named once in the message.
func TestAttackUnreachableErrors(t *testing.T) {
	for _, tr := range transports {
		for _, fallback := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/fallback=%v", tr, fallback), func(t *testing.T) {
				e := newEngine(t, tr, notify.WithOOBFallback(fallback), notify.WithConnectTimeout(time.Second))
				peer := freeAddr(t)
				err := e.SendNotify(ctxFor(t, 20*time.Second), peer, notify.Notify{Name: "x"})
				t.Logf("%v", err)
				require.ErrorIs(t, err, notify.ErrPeerUnreachable)
				require.NotErrorIs(t, err, notify.ErrMaybeDelivered, "a refused connect delivered nothing")
				require.Equal(t, 1, strings.Count(err.Error(), peer), "the peer is named once: %v", err)
				errAsync := make(chan error, 1)
				require.NoError(t, e.SendNotifyAsync(peer, notify.Notify{Name: "x"}, func(err error) { errAsync <- err }))
				select {
				case err := <-errAsync:
					require.ErrorIs(t, err, notify.ErrPeerUnreachable)
					require.Equal(t, 1, strings.Count(err.Error(), peer), "the peer is named once: %v", err)
				case <-time.After(45 * time.Second):
					t.Fatal("no callback")
				}
			})
		}
	}
}
