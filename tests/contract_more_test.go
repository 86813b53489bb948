package tests

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv/soft"
	"github.com/twosided/twosided/notify"
)

// More of the delivery contract: (1) a send whose context ends while the notify is on its
// way says "maybe delivered" (or "not delivered"), and a caller that retries with the same
// Notify.ID until success gets it delivered exactly once; a retry after a success is
// dropped as a duplicate. (2) Backpressure rejections consume no seqs: after 70 000 of them
// the receiver's window holds nothing, no seq was skipped, and traffic flows as before.

// moreRec records, in order, what an engine delivered (Recv or a handler).
type moreRec struct {
	mu  sync.Mutex
	got []notify.Notify
}

func (r *moreRec) add(n notify.Notify) {
	n.Msg = append([]byte(nil), n.Msg...)
	r.mu.Lock()
	r.got = append(r.got, n)
	r.mu.Unlock()
}

func (r *moreRec) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got)
}

func (r *moreRec) snapshot() []notify.Notify {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]notify.Notify(nil), r.got...)
}

// recvInto records what e receives until the test ends.
func recvInto(t *testing.T, e *notify.Engine) *moreRec { return recvIntoPacing(t, e, 0) }

// recvIntoPacing is recvInto for an application that takes pace per notify.
func recvIntoPacing(t *testing.T, e *notify.Engine, pace time.Duration) *moreRec {
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
			if pace > 0 {
				time.Sleep(pace)
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

// waitLen waits, within ctx, until r holds at least n notifies.
func (r *moreRec) waitLen(t *testing.T, ctx context.Context, n int) {
	t.Helper()
	for r.len() < n {
		select {
		case <-ctx.Done():
			t.Fatalf("only %d of %d notifies delivered before the deadline", r.len(), n)
		case <-time.After(time.Millisecond):
		}
	}
}

// waitMsg waits, within ctx, until a notify whose Msg is msg was delivered.
func (r *moreRec) waitMsg(t *testing.T, ctx context.Context, msg string) {
	t.Helper()
	for {
		for _, n := range r.snapshot() {
			if string(n.Msg) == msg {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%q never delivered", msg)
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// moreAttempt is one try of a notify and what SendNotify said.
type moreAttempt struct {
	msg string
	err error
}

// sendUntilDelivered sends n (its Msg tagged with the attempt number, its ID kept) with a
// short deadline while the path is held (heldTries tries, each must fail), then releases
// the path and retries with the same ID until SendNotify returns nil. An error wrapping
// ErrMaybeDelivered leaves the outcome unknown; any other means "not delivered"
// (errors.go), which checkOnce holds it to.
func sendUntilDelivered(t *testing.T, a *notify.Engine, peer string, base notify.Notify, heldTries int, release func()) []moreAttempt {
	return sendUntilDeliveredOn(t, a, peer, base, heldTries, release, false)
}

// sendUntilDeliveredOn is sendUntilDelivered; delayedOnly says the path only delays, so a
// held try may succeed when the machine is slower than the delay.
func sendUntilDeliveredOn(t *testing.T, a *notify.Engine, peer string, base notify.Notify, heldTries int, release func(), delayedOnly bool) []moreAttempt {
	t.Helper()
	var tries []moreAttempt
	try := func(k int, d time.Duration) error {
		n := base
		n.Msg = []byte(fmt.Sprintf("%s#try%d", base.Msg, k))
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		err := a.SendNotify(ctx, peer, n)
		tries = append(tries, moreAttempt{msg: string(n.Msg), err: err})
		if err != nil {
			t.Logf("try %d: %v (maybe delivered: %v)", k, err, errors.Is(err, notify.ErrMaybeDelivered))
			require.True(t, isAny(err, notify.ErrMaybeDelivered, notify.ErrTimeout, notify.ErrBackpressure, notify.ErrPeerUnreachable, notify.ErrPeerDead, notify.ErrNoCtrlChannel),
				"try %d: the error is none of the kinds a held path explains: %v", k, err)
		}
		return err
	}
	k := 0
	for ; k < heldTries; k++ {
		err := try(k, 150*time.Millisecond)
		if err == nil && delayedOnly {
			// A link that delays but does not hold: a machine too loaded to see the
			// 150 ms deadline before the 400 ms late ACK rightly reports success.
			t.Logf("try %d acknowledged before its deadline was seen (a loaded machine)", k)
			return tries
		}
		require.Error(t, err, "try %d on a held path succeeded: the test did not hold the path", k)
	}
	release()
	outer := time.Now().Add(30 * time.Second)
	for ; ; k++ {
		require.True(t, time.Now().Before(outer), "no try succeeded within 30 s after the path was released")
		if try(k, 5*time.Second) == nil {
			break
		}
	}
	return tries
}

// checkOnce asserts that among delivered (Msg and, where known, ID of every delivered
// notify from the sender) the notify base was delivered exactly once: one delivery with its
// ID, one delivery of any of its tries' contents, none of a try that said "not delivered";
// and that fence came after it.
func checkOnce(t *testing.T, what string, base notify.Notify, tries []moreAttempt, delivered []notify.Notify, withIDs bool, fence string) {
	t.Helper()
	byMsg := map[string]int{}
	pos := map[string]int{}
	byID := 0
	for i, n := range delivered {
		byMsg[string(n.Msg)]++
		if _, ok := pos[string(n.Msg)]; !ok {
			pos[string(n.Msg)] = i
		}
		if withIDs && n.ID == base.ID {
			byID++
		}
	}
	total, first := 0, -1
	for k, tr := range tries {
		c := byMsg[tr.msg]
		require.LessOrEqual(t, c, 1, "%s: try %d (%s) delivered %d times", what, k, tr.msg, c)
		if tr.err != nil && !errors.Is(tr.err, notify.ErrMaybeDelivered) {
			require.Zero(t, c, "%s: try %d said 'not delivered' (%v) yet was delivered", what, k, tr.err)
		}
		if c > 0 {
			total += c
			first = pos[tr.msg]
		}
	}
	acked := 0
	for _, tr := range tries {
		if tr.err == nil {
			acked++
		}
	}
	t.Logf("%s: %d tries, %d acknowledged, %d delivered by content, %d by id", what, len(tries), acked, total, byID)
	require.Equal(t, 1, total, "%s: the notify (id %q) acknowledged once after retries was delivered %d times by content", what, base.ID, total)
	if withIDs {
		require.Equal(t, 1, byID, "%s: id %q delivered %d times", what, base.ID, byID)
	}
	fp, ok := pos[fence]
	require.True(t, ok, "%s: the fence %q was acknowledged but not delivered", what, fence)
	require.Equal(t, 1, byMsg[fence], "%s: the fence delivered twice", what)
	require.Less(t, first, fp, "%s: the retried notify was delivered after a later one (out of order)", what)
}

// warmUp sends n notifies with their own ids and requires each acknowledged.
func warmUp(t *testing.T, ctx context.Context, a *notify.Engine, peer string, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		require.NoError(t, a.SendNotify(ctx, peer, notify.Notify{Name: "warm", Msg: []byte("warm-" + strconv.Itoa(i)), ID: "warm-" + strconv.Itoa(i)}))
	}
}

// TestContractRetrySameIDOnTheWay: the first send of a notify is posted to a live peer but
// not acknowledged when its 150 ms context ends (the soft link delays every packet 400 ms;
// the link is cut; the receiver's reactor is held by a blocking handler; the receiver
// process is stopped). SendNotify must say "maybe delivered" or "not delivered"; the
// caller retries with the same Notify.ID until one succeeds; the receiver delivers that
// notify exactly once (by id and by content), before a later notify.
func TestContractRetrySameIDOnTheWay(t *testing.T) {
	// linked is a warmed-up rdma_twosided pair on soft0 -> soft1, the link restored at the end.
	linked := func(t *testing.T, opts ...notify.Option) (a, b *notify.Engine, rec *moreRec, ctx context.Context) {
		a = newEngine(t, notify.TransportRDMATwoSided, twoSidedOn("soft0", opts...)...)
		b = newEngine(t, notify.TransportRDMATwoSided, twoSidedOn("soft1")...)
		rec = recvInto(t, b)
		ctx = ctxFor(t, 60*time.Second)
		warmUp(t, ctx, a, b.Addr(), 10)
		// The faults below must meet a SEND on the wire, which needs credit; b returns it
		// from its own loop, which a loaded machine can delay: a send without credit waits
		// unposted, and the subtests' "maybe delivered" would not follow.
		require.Eventually(t, func() bool { return a.Stats().Channels.CreditAvail > 1 }, 30*time.Second, time.Millisecond,
			"b returns the ctrl channel's credit")
		t.Cleanup(func() { _ = soft.Default().RestoreLink("soft0", "soft1") })
		return a, b, rec, ctx
	}
	t.Run("rdma_twosided/delayed-link", func(t *testing.T) {
		a, b, rec, ctx := linked(t)
		require.NoError(t, soft.Default().DelayLink("soft0", "soft1", 400*time.Millisecond))
		base := notify.Notify{Name: "r", Msg: []byte("delayed"), ID: "id-delayed"}
		tries := sendUntilDeliveredOn(t, a, b.Addr(), base, 2, func() {}, true)
		require.True(t, tries[0].err == nil || errors.Is(tries[0].err, notify.ErrMaybeDelivered), "a send posted on a delayed link, not acknowledged when its context ended, must be 'maybe delivered': %v", tries[0].err)
		require.NoError(t, soft.Default().RestoreLink("soft0", "soft1"))
		require.NoError(t, a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "r", Msg: []byte("fence"), ID: "id-fence"}))
		rec.waitMsg(t, ctx, "fence")
		checkOnce(t, "delayed link", base, tries, rec.snapshot()[10:], true, "fence")
		ps := peerStats(t, b, a.Addr())
		t.Logf("receiver window: %+v", ps.Window)
		require.Zero(t, ps.Held)
	})
	t.Run("rdma_twosided/cut-link", func(t *testing.T) {
		// Fallback off: the held tries must not reach the peer. With it on, a loaded
		// machine that spaces the tries past the QP's retries (~0.5 s) lets the channel
		// die and a try go over OOB, rightly delivered.
		a, b, rec, ctx := linked(t, notify.WithOOBFallback(false))
		require.NoError(t, soft.Default().CutLink("soft0", "soft1"))
		base := notify.Notify{Name: "r", Msg: []byte("cut"), ID: "id-cut"}
		tries := sendUntilDelivered(t, a, b.Addr(), base, 3, func() {
			require.NoError(t, soft.Default().RestoreLink("soft0", "soft1"))
		})
		require.True(t, errors.Is(tries[0].err, notify.ErrMaybeDelivered), "a send posted on a cut link must be 'maybe delivered': %v", tries[0].err)
		require.NoError(t, a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "r", Msg: []byte("fence"), ID: "id-fence"}))
		rec.waitMsg(t, ctx, "fence")
		checkOnce(t, "cut link", base, tries, rec.snapshot()[10:], true, "fence")
		ps := peerStats(t, b, a.Addr())
		t.Logf("receiver window: %+v; sender limits: %+v", ps.Window, a.Stats().Limits)
	})
	for _, tr := range transports {
		t.Run(tr+"/blocked-handler", func(t *testing.T) {
			gate, entered := make(chan struct{}), make(chan struct{})
			var once sync.Once
			open := func() { once.Do(func() { close(gate) }) }
			rec := &moreRec{}
			b := newEngine(t, tr, notify.WithHandler(func(n notify.Notify) {
				if string(n.Msg) == "block" {
					close(entered)
					<-gate // the receiver's reactor is held
					return
				}
				rec.add(n)
			}))
			t.Cleanup(open) // after b's: cleanups run last first, so b's reactor is let go before b closes
			a := newEngine(t, tr, notify.WithMaxPendingSends(4096))
			c := newEngine(t, tr)
			ctx := ctxFor(t, 60*time.Second)
			warmUp(t, ctx, a, b.Addr(), 10)
			require.NoError(t, c.SendNotify(ctx, b.Addr(), notify.Notify{Name: "w", Msg: []byte("c-warm")}))
			rec.waitLen(t, ctx, 11)
			blocked := make(chan error, 1)
			require.NoError(t, c.SendNotifyAsync(b.Addr(), notify.Notify{Name: "b", Msg: []byte("block")}, func(err error) { blocked <- err }))
			select { // b's reactor is held from here on
			case <-entered:
			case <-ctx.Done():
				t.Fatal("the blocking notify never reached b's handler")
			}
			// While b's reactor is held, a's channel still takes sends until its credits
			// run out: fill it (each fill acknowledged or queued) so the next send waits.
			fills := &moreLedger{}
			if tr == notify.TransportRDMATwoSided {
				for i := 0; ; i++ {
					require.Less(t, i, 2048, "b's reactor is held, yet a's sends keep completing")
					msg := "fill-" + strconv.Itoa(i)
					ok := make(chan struct{})
					fills.submit(msg)
					require.NoError(t, a.SendNotifyAsync(b.Addr(), notify.Notify{Name: "f", Msg: []byte(msg), ID: msg}, func(err error) {
						fills.done(msg, err)
						close(ok)
					}))
					select {
					case <-ok:
						continue
					case <-time.After(300 * time.Millisecond):
					}
					break
				}
				t.Logf("%d fills before a's sends stopped completing", len(fills.order))
			}
			base := notify.Notify{Name: "r", Msg: []byte("held"), ID: "id-held"}
			tries := sendUntilDelivered(t, a, b.Addr(), base, 2, open)
			require.NoError(t, <-blocked)
			require.NoError(t, a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "r", Msg: []byte("fence"), ID: "id-fence"}))
			rec.waitMsg(t, ctx, "fence")
			got := rec.snapshot()
			var fromA []notify.Notify
			for _, n := range got {
				if n.Peer == a.Addr() {
					fromA = append(fromA, n)
				}
			}
			require.GreaterOrEqual(t, len(fromA), 10)
			var rest []notify.Notify
			for _, n := range fromA[10:] {
				if !strings.HasPrefix(string(n.Msg), "fill-") {
					rest = append(rest, n)
				}
			}
			checkOnce(t, "blocked handler", base, tries, rest, true, "fence")
			require.Eventually(t, func() bool { return fills.unresolved() == 0 }, 30*time.Second, time.Millisecond,
				"fills without a result") // a result comes after its delivery
			fills.check(t, "fills", fromA[10:])
		})
	}
	for _, tr := range transports {
		// The receiver is slow: its receive queue (4) is full and nobody consumes, so its
		// channel returns no credit and its OOB notifies are held, then answered "busy";
		// 64 pipelined sends are queued before the tries.
		t.Run(tr+"/full-queue", func(t *testing.T) {
			a := newEngine(t, tr, notify.WithMaxPendingSends(4096))
			b := newEngine(t, tr, notify.WithRecvQueue(4))
			ctx := ctxFor(t, 60*time.Second)
			fills := &moreLedger{}
			for i := 0; i < 256; i++ {
				msg := "fill-" + strconv.Itoa(i)
				fills.submit(msg)
				require.NoError(t, a.SendNotifyAsync(b.Addr(), notify.Notify{Name: "f", Msg: []byte(msg), ID: msg}, func(err error) { fills.done(msg, err) }))
			}
			require.Eventually(t, func() bool { return b.Stats().Paused }, 20*time.Second, 5*time.Millisecond)
			var rec *moreRec
			base := notify.Notify{Name: "r", Msg: []byte("slow"), ID: "id-slow"}
			tries := sendUntilDelivered(t, a, b.Addr(), base, 3, func() { rec = recvInto(t, b) })
			require.NoError(t, a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "r", Msg: []byte("fence"), ID: "id-fence"}))
			rec.waitMsg(t, ctx, "fence")
			got := rec.snapshot()
			var rest []notify.Notify
			for _, n := range got {
				if !strings.HasPrefix(string(n.Msg), "fill-") {
					rest = append(rest, n)
				}
			}
			checkOnce(t, "full queue", base, tries, rest, true, "fence")
			// A fill's result comes after the receiver delivered it (its reply is written
			// then): the last ones may still be on their way back.
			require.Eventually(t, func() bool { return fills.unresolved() == 0 }, 30*time.Second, time.Millisecond,
				"fills without a result")
			acked, _ := fills.check(t, "fills", got)
			require.Equal(t, 256, acked)
			ps := peerStats(t, b, a.Addr())
			t.Logf("receiver window: %+v; busy answers %d", ps.Window, b.Stats().OOBBusy)
		})
	}
	for _, tr := range transports {
		t.Run(tr+"/stopped-process", func(t *testing.T) {
			rcv := startPeerProc(t, tr, peerModeEnv+"=record")
			a := newEngine(t, tr)
			ctx := ctxFor(t, 60*time.Second)
			warmUp(t, ctx, a, rcv.addr, 10)
			require.NoError(t, rcv.cmd.Process.Signal(syscall.SIGSTOP))
			t.Cleanup(func() { _ = rcv.cmd.Process.Signal(syscall.SIGCONT) })
			waitStopped(t, rcv.cmd.Process.Pid) // kill(2) returns before the process has stopped
			base := notify.Notify{Name: "r", Msg: []byte("stopped"), ID: "id-stopped"}
			tries := sendUntilDelivered(t, a, rcv.addr, base, 2, func() {
				require.NoError(t, rcv.cmd.Process.Signal(syscall.SIGCONT))
			})
			require.True(t, errors.Is(tries[0].err, notify.ErrMaybeDelivered), "a send to a stopped live peer over an open path must be 'maybe delivered': %v", tries[0].err)
			require.NoError(t, a.SendNotify(ctx, rcv.addr, notify.Notify{Name: "r", Msg: []byte("fence"), ID: "id-fence"}))
			rcv.stop()
			var got []notify.Notify
			for _, m := range rcv.received() {
				got = append(got, notify.Notify{Msg: []byte(m)})
			}
			require.GreaterOrEqual(t, len(got), 10)
			checkOnce(t, "stopped process", base, tries, got[10:], false, "fence")
		})
	}
	for _, tr := range transports {
		t.Run(tr+"/after-success", func(t *testing.T) {
			a, b := newEngine(t, tr), newEngine(t, tr)
			rec := recvInto(t, b)
			ctx := ctxFor(t, 30*time.Second)
			base := notify.Notify{Name: "r", Msg: []byte("once"), ID: "id-once"}
			var tries []moreAttempt
			for k := 0; k < 3; k++ {
				n := base
				n.Msg = []byte(fmt.Sprintf("once#try%d", k))
				err := a.SendNotify(ctx, b.Addr(), n)
				require.NoError(t, err, "try %d: a retry of a delivered id is acknowledged (and dropped by the receiver)", k)
				tries = append(tries, moreAttempt{msg: string(n.Msg), err: err})
			}
			require.NoError(t, a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "r", Msg: []byte("fence"), ID: "id-fence"}))
			rec.waitMsg(t, ctx, "fence")
			got := rec.snapshot()
			checkOnce(t, "retry after success", base, tries, got, true, "fence")
			require.Equal(t, "once#try0", string(got[0].Msg), "the first try is the one delivered")
			ps := peerStats(t, b, a.Addr())
			t.Logf("receiver window: %+v", ps.Window)
			require.Equal(t, uint64(2), ps.Window.DuplicateIDs, "the two retries were dropped as duplicate ids")
		})
	}
}

// moreLedger records async sends in submission order and their results.
type moreLedger struct {
	mu    sync.Mutex
	order []string
	res   map[string]error
}

func (l *moreLedger) submit(msg string) {
	l.mu.Lock()
	l.order = append(l.order, msg)
	l.mu.Unlock()
}

// unresolved is how many submitted sends have no result yet.
func (l *moreLedger) unresolved() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.order) - len(l.res)
}

func (l *moreLedger) done(msg string, err error) {
	l.mu.Lock()
	if l.res == nil {
		l.res = map[string]error{}
	}
	l.res[msg] = err
	l.mu.Unlock()
}

// check: every acknowledged notify delivered exactly once, none refused (an error without
// ErrMaybeDelivered) delivered, the delivered ones in submission order. Delivered notifies
// not in the ledger are ignored. It returns the counts.
func (l *moreLedger) check(t *testing.T, what string, delivered []notify.Notify) (acked, rejected int) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	idx := make(map[string]int, len(l.order))
	for i, m := range l.order {
		idx[m] = i
	}
	count := make(map[string]int, len(l.order))
	last, outOfOrder, dups := -1, 0, 0
	for _, n := range delivered {
		i, ok := idx[string(n.Msg)]
		if !ok {
			continue
		}
		if count[string(n.Msg)]++; count[string(n.Msg)] > 1 {
			dups++
			continue
		}
		if i < last {
			outOfOrder++
		}
		last = max(last, i)
	}
	lost, refusedDelivered, unfinished, maybe := 0, 0, 0, 0
	for _, m := range l.order {
		err, fin := l.res[m]
		switch {
		case !fin:
			unfinished++
		case err == nil:
			acked++
			if count[m] == 0 {
				lost++
			}
		case !errors.Is(err, notify.ErrMaybeDelivered):
			rejected++
			if count[m] > 0 {
				refusedDelivered++
			}
		case count[m] > 0:
			// Unknown outcome (a send that outlived its bound on a loaded machine), and it
			// landed: allowed, and counted with the acknowledged ones.
			maybe++
			acked++
		}
	}
	t.Logf("%s: %d sent, %d acknowledged (%d of them maybe-delivered that landed), %d refused, %d acknowledged not delivered, %d duplicates, %d out of order, %d refused yet delivered",
		what, len(l.order), acked, maybe, rejected, lost, dups, outOfOrder, refusedDelivered)
	require.Zero(t, unfinished, "%s: sends without a result", what)
	require.Zero(t, lost, "%s: acknowledged but never delivered", what)
	require.Zero(t, dups, "%s: delivered twice", what)
	require.Zero(t, outOfOrder, "%s: delivered out of order", what)
	require.Zero(t, refusedDelivered, "%s: refused yet delivered", what)
	return acked, rejected
}

// TestContractBackpressureThroughput: warm-up, then a pipelined phase of count notifies
// (window 32, under MaxPendingSends 64) whose delivered/s is measured at the receiver;
// then SendNotifyAsync in a tight loop until at least 70 000 sends were refused with
// ErrBackpressure (the bug: each refusal drew a seq, and 65 536 entries above the
// oldest gap made every delivery scan a map); then the same measured phase again. Every
// accepted notify is delivered exactly once and in order, no refused one is delivered, the
// receiver's window holds nothing and skipped and timed-out gaps are 0. Both rates are
// logged, not asserted.
func TestContractBackpressureThroughput(t *testing.T) {
	for _, c := range []struct {
		tr    string
		count int
	}{{notify.TransportRDMATwoSided, 20000}, {notify.TransportOOB, 10000}} {
		t.Run(c.tr, func(t *testing.T) {
			a := newEngine(t, c.tr, notify.WithMaxPendingSends(64))
			b := newEngine(t, c.tr)
			rec := recvInto(t, b)
			ctx := ctxFor(t, 120*time.Second)
			l := &moreLedger{}
			var wg sync.WaitGroup
			seq := 0
			var bpCount atomic.Int64 // sends refused with ErrBackpressure, returned or through done
			send := func(prefix string) error {
				msg := prefix + strconv.Itoa(seq)
				seq++
				l.submit(msg)
				wg.Add(1)
				err := a.SendNotifyAsync(b.Addr(), notify.Notify{Name: "bp", Msg: []byte(msg)}, func(err error) {
					if errors.Is(err, notify.ErrBackpressure) {
						bpCount.Add(1)
					}
					l.done(msg, err)
					wg.Done()
				})
				if err != nil {
					if errors.Is(err, notify.ErrBackpressure) {
						bpCount.Add(1)
					}
					l.done(msg, err)
					wg.Done()
				}
				return err
			}
			// phase sends n notifies with at most window in flight, and returns the
			// receiver's delivered/s over them (from the first send to the n-th delivery).
			phase := func(prefix string, n, window int) float64 {
				sem := make(chan struct{}, window)
				base := rec.len()
				start := time.Now()
				for i := 0; i < n; i++ {
					select {
					case sem <- struct{}{}:
					case <-ctx.Done():
						t.Fatalf("%s: send %d: no completion before the deadline", prefix, i)
					}
					msg := prefix + strconv.Itoa(seq)
					seq++
					l.submit(msg)
					wg.Add(1)
					err := a.SendNotifyAsync(b.Addr(), notify.Notify{Name: "bp", Msg: []byte(msg)}, func(err error) {
						l.done(msg, err)
						<-sem
						wg.Done()
					})
					if err != nil {
						l.done(msg, err)
						<-sem
						wg.Done()
					}
				}
				rec.waitLen(t, ctx, base+n)
				return float64(n) / time.Since(start).Seconds()
			}
			phase("warm-", 2000, 32)
			before := phase("before-", c.count, 32)

			refused, sent := 0, 0 // refused: returned by SendNotifyAsync itself
			for bpCount.Load() < 70000 {
				require.Less(t, sent, 2_000_000, "no backpressure: %d sends, %d refused", sent, bpCount.Load())
				sent++
				if err := send("flood-"); err != nil {
					require.ErrorIs(t, err, notify.ErrBackpressure)
					refused++
				}
			}
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-ctx.Done():
				t.Fatal("flood sends without a result before the deadline")
			}
			// Refusals that came back through done (the peer's queue was full) count too.
			l.mu.Lock()
			bp := 0
			for _, err := range l.res {
				if errors.Is(err, notify.ErrBackpressure) {
					bp++
					require.NotErrorIs(t, err, notify.ErrMaybeDelivered)
				}
			}
			l.mu.Unlock()

			after := phase("after-", c.count, 32)
			require.NoError(t, a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "bp", Msg: []byte("last")}))
			rec.waitMsg(t, ctx, "last")
			got := rec.snapshot()
			acked, rejected := l.check(t, c.tr+" backpressure", got)
			require.Equal(t, len(got)-1, acked, "delivered notifies that were not acknowledged")
			require.GreaterOrEqual(t, bp, 70000, "fewer than 70 000 sends refused with ErrBackpressure")
			require.Equal(t, bp, rejected, "sends failed with an error other than ErrBackpressure")

			ps := peerStats(t, b, a.Addr())
			st := a.Stats()
			t.Logf("%s: %d notifies: %.0f delivered/s before %d backpressure refusals (%d returned by SendNotifyAsync, %d through done), %.0f delivered/s after",
				c.tr, c.count, before, bp, refused, bp-refused, after)
			busy := b.Stats().OOBBusy
			t.Logf("receiver window: %+v, held now %d; sender limits: given up %d, fences %d; receiver answered busy %d",
				ps.Window, ps.Held, st.Limits.GivenUp, st.Limits.FencesSent, busy)
			require.Zero(t, ps.Held, "the receiver's window holds notifies")
			if busy == 0 {
				// A notify answered busy (the receiver's queue was full: the OOB flood is
				// fast enough for it) is sent again after a pause, behind later seqs that
				// the window then holds for it, at most the sender's pending sends at once.
				require.Zero(t, ps.Window.Held, "a notify waited for a missing seq")
			}
			require.Zero(t, ps.Window.Skipped, "refused sends drew seqs the sender then gave up")
			require.Zero(t, ps.Window.GapsTimedOut, "a gap timed out")
			require.Zero(t, ps.Window.Duplicates)
			require.Equal(t, uint64(acked+1), ps.Window.Delivered, "the window delivered other than the acknowledged notifies (and the last)")
			require.Zero(t, st.Limits.FencesSent, "the sender gave up seqs")
		})
	}
}

// TestContractRetrySameIDHeldCopies: callers retry with the same Notify.ID while an
// earlier copy is still on its way, to a slow receiver (receive queue 4, a consumer that
// takes 1 ms per notify), so OOB notifies are answered "busy" and sent again and the
// receiver's window holds later seqs behind the gaps. Every id must be delivered exactly
// once, and no try that said "not delivered" may be delivered.
//
// retry-loops: 32 callers, 30 ids each; every try is a SendNotify with a 5 ms deadline,
// retried with the same id until it returns nil (the contract's own recipe).
// pipelined-copies: 1 000 ids, each sent twice back to back with SendNotifyAsync (a retry
// made while the first copy is still in flight, as after ErrMaybeDelivered).
//
// Before the window checked ids at release, oob failed both (about 30 of 960 ids, 400-800
// of 1 000, delivered twice; every id acknowledged): two copies of one id held behind a gap
// were both delivered. rdma_twosided retry-loops failed too where its sends fell back over
// OOB (seen under -race). notify's TestWindowHeldCopiesOfOneID is the unit form.
func TestContractRetrySameIDHeldCopies(t *testing.T) {
	slowConsumer := func(t *testing.T, e *notify.Engine) *moreRec {
		return recvIntoPacing(t, e, time.Millisecond) // a slow application
	}
	// verdict counts, by id, the acknowledged and delivered, and the tries that said "not
	// delivered" yet were delivered (by content).
	verdict := func(t *testing.T, what string, ids int, acked map[string]bool, notDelivered map[string]bool, got []notify.Notify, extra string) {
		t.Helper()
		byID := map[string]int{}
		wrong := 0
		for _, n := range got {
			if n.ID == "" {
				continue
			}
			byID[n.ID]++
			if notDelivered[string(n.Msg)] {
				wrong++
			}
		}
		twice, lost := 0, 0
		for _, c := range byID {
			if c > 1 {
				twice++
			}
		}
		for id := range acked {
			if byID[id] == 0 {
				lost++
			}
		}
		t.Logf("%s: %d ids, %d acknowledged, %d delivered, %d delivered more than once, %d acknowledged never delivered, %d tries said 'not delivered' yet were delivered; %s",
			what, ids, len(acked), len(byID), twice, lost, wrong, extra)
		require.Equal(t, ids, len(acked), "%s: ids never acknowledged", what)
		require.Zero(t, lost, "%s: acknowledged ids never delivered", what)
		require.Zero(t, twice, "%s: ids delivered more than once after retries with the same id", what)
		require.Zero(t, wrong, "%s: tries that said 'not delivered' were delivered", what)
	}
	for _, tr := range transports {
		t.Run(tr+"/retry-loops", func(t *testing.T) {
			a := newEngine(t, tr)
			b := newEngine(t, tr, notify.WithRecvQueue(4))
			rec := slowConsumer(t, b)
			const workers, per = 32, 30
			var mu sync.Mutex
			acked, notDelivered := map[string]bool{}, map[string]bool{}
			var tries, maybes atomic.Int64
			var wg sync.WaitGroup
			for w := 0; w < workers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					deadline := time.Now().Add(60 * time.Second)
					for i := 0; i < per; i++ {
						id := fmt.Sprintf("w%d-%d", w, i)
						for k := 0; time.Now().Before(deadline); k++ {
							n := notify.Notify{Name: "r", Msg: []byte(id + "#" + strconv.Itoa(k)), ID: id}
							ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
							err := a.SendNotify(ctx, b.Addr(), n)
							cancel()
							tries.Add(1)
							mu.Lock()
							switch {
							case err == nil:
								acked[id] = true
							case errors.Is(err, notify.ErrMaybeDelivered):
								maybes.Add(1)
							default:
								notDelivered[string(n.Msg)] = true
							}
							mu.Unlock()
							if err == nil {
								break
							}
						}
					}
				}()
			}
			wg.Wait()
			ctx := ctxFor(t, 30*time.Second)
			require.NoError(t, a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "r", Msg: []byte("fence")}))
			rec.waitMsg(t, ctx, "fence")
			ps := peerStats(t, b, a.Addr())
			verdict(t, tr+" retry loops", workers*per, acked, notDelivered, rec.snapshot(),
				fmt.Sprintf("%d tries, %d maybe delivered; receiver window %+v, %d busy answers", tries.Load(), maybes.Load(), ps.Window, b.Stats().OOBBusy))
		})
		t.Run(tr+"/pipelined-copies", func(t *testing.T) {
			a := newEngine(t, tr, notify.WithMaxPendingSends(4096))
			b := newEngine(t, tr, notify.WithRecvQueue(4))
			rec := slowConsumer(t, b)
			const ids = 1000
			var mu sync.Mutex
			acked, notDelivered := map[string]bool{}, map[string]bool{}
			var wg sync.WaitGroup
			for i := 0; i < ids; i++ {
				id := "x" + strconv.Itoa(i)
				for k := 0; k < 2; k++ {
					msg := id + "#" + strconv.Itoa(k)
					wg.Add(1)
					require.NoError(t, a.SendNotifyAsync(b.Addr(), notify.Notify{Name: "d", Msg: []byte(msg), ID: id}, func(err error) {
						mu.Lock()
						if err == nil {
							acked[id] = true
						} else if !errors.Is(err, notify.ErrMaybeDelivered) {
							notDelivered[msg] = true
						}
						mu.Unlock()
						wg.Done()
					}))
				}
			}
			wg.Wait()
			ctx := ctxFor(t, 30*time.Second)
			require.NoError(t, a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "r", Msg: []byte("fence")}))
			rec.waitMsg(t, ctx, "fence")
			ps := peerStats(t, b, a.Addr())
			verdict(t, tr+" pipelined copies", ids, acked, notDelivered, rec.snapshot(),
				fmt.Sprintf("receiver window %+v, %d busy answers", ps.Window, b.Stats().OOBBusy))
		})
	}
}

// waitStopped waits until process pid is in the stopped state (T in /proc/pid/stat).
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	path := fmt.Sprintf("/proc/%d/stat", pid)
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(path)
		if err != nil {
			return false
		}
		i := strings.LastIndexByte(string(b), ')') // the command name may hold spaces
		return i > 0 && i+2 < len(b) && b[i+2] == 'T'
	}, 10*time.Second, time.Millisecond, "process %d did not stop", pid)
}

// TestOOBByHostName: an oob engine addressed by host name ("localhost:P") is sent to off
// the reactor (the name is resolved on a goroutine); its notifies arrive once and in order.
func TestOOBByHostName(t *testing.T) {
	a := newEngine(t, notify.TransportOOB)
	b := newEngine(t, notify.TransportOOB)
	rec := recvInto(t, b)
	ctx := ctxFor(t, 30*time.Second)
	_, port, err := net.SplitHostPort(b.Addr())
	require.NoError(t, err)
	const n = 20
	for i := 0; i < n; i++ {
		require.NoError(t, a.SendNotify(ctx, net.JoinHostPort("localhost", port), notify.Notify{Name: "h", Msg: []byte("h-" + strconv.Itoa(i))}))
	}
	rec.waitLen(t, ctx, n)
	got := rec.snapshot()
	require.Len(t, got, n)
	for i, g := range got {
		require.Equal(t, "h-"+strconv.Itoa(i), string(g.Msg))
	}
}
