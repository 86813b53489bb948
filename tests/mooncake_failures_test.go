package tests

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/notify"
)

// TestMooncakeLocalChannelFailure: the handshake with a Mooncake peer succeeds, and then
// our own side of the channel fails. That is ErrNoCtrlChannel naming our side ("local"),
// never the peer's refusal; with fallback on the notifies go over OOB; either way the
// channel is asked for again only after a backoff, not per send.
func TestMooncakeLocalChannelFailure(t *testing.T) {
	for _, fallback := range []bool{true, false} {
		t.Run(fmt.Sprintf("fallback=%v", fallback), func(t *testing.T) {
			mc := newMooncakePeer(t, mcBadReply)
			e := rdmaEngine(t, notify.WithOOBFallback(fallback))
			const n = 200
			acked, timedOut := 0, 0
			for i := 1; i <= n; i++ {
				// With fallback off a send waits for the next handshake when its deadline
				// allows: short deadlines keep the test short once the backoff is long (the
				// first send has the whole handshake to wait for).
				d := 10 * time.Second
				if !fallback && i > 1 {
					d = 300 * time.Millisecond
				}
				ctx, cancel := context.WithTimeout(context.Background(), d)
				err := e.SendNotify(ctx, mc.name, notify.Notify{Name: "ts", Msg: []byte("t" + strconv.Itoa(i))})
				cancel()
				if fallback {
					require.NoError(t, err, "notify %d over OOB", i)
					acked++
					continue
				}
				if i == 1 {
					require.ErrorIs(t, err, notify.ErrNoCtrlChannel)
					require.ErrorContains(t, err, "local")
				}
				if noChannel(t, err, i) {
					timedOut++
				}
			}
			st := e.Stats()
			mc.mu.Lock()
			conns := mc.connections
			mc.mu.Unlock()
			t.Logf("fallback %v: %d acknowledged, %d handshakes reached the peer, %d failed here, %d sends refused in backoff, %d fallbacks, %d sends' deadlines passed in a handshake",
				fallback, acked, conns, st.Limits.HandshakesFailed, st.Limits.BackoffRefused, st.Limits.Fallbacks, timedOut)
			require.Less(t, conns, 20, "a handshake per send")
			if fallback {
				tally(t, "twosided -> Mooncake over OOB", acked, mcMsgs(mc.collect(n)), "t", 1, n)
			} else {
				require.Empty(t, mc.received(), "nothing over OOB with fallback off")
			}
		})
	}
}

// noChannel checks the error of send i, with fallback off, to a peer that has no ctrl
// channel for us: ErrNoCtrlChannel, never the peer's refusal and never maybe-delivered. A
// send whose short deadline came while it waited for a handshake (it waits when the
// backoff ends before its deadline, and a loaded machine can make that handshake slower
// than the rest of the deadline) fails with ErrTimeout instead: that is reported true.
func noChannel(t *testing.T, err error, i int) (timedOut bool) {
	t.Helper()
	require.NotErrorIs(t, err, notify.ErrRejected, "notify %d: not the peer's refusal", i)
	require.NotErrorIs(t, err, notify.ErrMaybeDelivered, "notify %d: nothing was sent", i)
	if errors.Is(err, notify.ErrTimeout) {
		return true
	}
	require.ErrorIs(t, err, notify.ErrNoCtrlChannel, "notify %d", i)
	return false
}

// TestMooncakeMainFallbackOff: Mooncake main answers the ctrl handshake without ctrl
// fields. With fallback off nothing goes over OOB: the sends fail with ErrNoCtrlChannel and
// the channel is asked for again after the backoff, not one handshake per send.
func TestMooncakeMainFallbackOff(t *testing.T) {
	mc := newMooncakePeer(t, mcMain)
	e := rdmaEngine(t, notify.WithOOBFallback(false))
	timedOut := 0
	for i := 0; i < 200; i++ {
		d := 300 * time.Millisecond
		if i == 0 {
			d = 10 * time.Second // the first waits for the whole handshake
		}
		ctx, cancel := context.WithTimeout(context.Background(), d)
		err := e.SendNotify(ctx, mc.name, notify.Notify{Name: "ts", Msg: []byte("x")})
		cancel()
		if i == 0 {
			require.ErrorIs(t, err, notify.ErrNoCtrlChannel)
		}
		if noChannel(t, err, i) {
			timedOut++
		}
	}
	t.Logf("%d of 200 sends' deadlines passed in a handshake", timedOut)
	require.Empty(t, mc.received(), "nothing went over OOB")
	mc.mu.Lock()
	conns := mc.connections
	mc.mu.Unlock()
	require.Less(t, conns, 20, "a handshake per send")
}

// TestDeadPeerBackoffAndOutcome: a Mooncake peer with a channel goes away (its port closes)
// while a sender keeps sending. Sends that wrote nothing (a refused connect) never carry
// ErrMaybeDelivered, and the handshakes it gets are bounded by the backoff, not one per
// send.
func TestDeadPeerBackoffAndOutcome(t *testing.T) {
	for _, fallback := range []bool{true, false} {
		t.Run(fmt.Sprintf("fallback=%v", fallback), func(t *testing.T) {
			mc := newMooncakePeer(t, mcPR3440)
			e := rdmaEngine(t, notify.WithOOBFallback(fallback), notify.WithConnectTimeout(time.Second))
			acked := tsSend(t, e, mc.name, "ts", "t", 1, 10, 1)
			require.Equal(t, 10, acked)
			mc.close()
			before := e.Stats().Limits.HandshakesFailed
			t0 := time.Now()
			maybe, failed, late := 0, 0, 0 // late: maybe-delivered after a send failed with nothing sent
			sends := 0
			for ; time.Since(t0) < 3*time.Second; sends++ {
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				err := e.SendNotify(ctx, mc.name, notify.Notify{Name: "ts", Msg: []byte("x")})
				cancel()
				if err == nil {
					continue
				}
				if errors.Is(err, notify.ErrMaybeDelivered) {
					maybe++
					if failed >= maybe { // an earlier failure wrote nothing
						late++
						t.Logf("send %d: %v", sends, err)
					}
				}
				failed++
			}
			elapsed := time.Since(t0)
			hs := e.Stats().Limits.HandshakesFailed - before
			// Backoff from 75-100 ms doubling: at most one handshake per doubling of the
			// time since the first failure, and a few to spare.
			bound := uint64(4)
			for d := 50 * time.Millisecond; d < elapsed; d *= 2 {
				bound++
			}
			t.Logf("fallback %v: %d sends in %v to a gone peer: %d failed, %d of them maybe-delivered (on the dying channel); %d handshakes failed (bound %d)",
				fallback, sends, elapsed.Round(time.Millisecond), failed, maybe, hs, bound)
			// Only sends posted on the dying channel may have landed: once sends fail with
			// nothing written, none is maybe-delivered any more.
			require.Zero(t, late, "a send that wrote nothing classed maybe-delivered")
			require.LessOrEqual(t, hs, bound, "handshakes while the peer is down")
		})
	}
}

// TestHandshakeToSilentPeerBounded: a peer that accepts the TCP connection and never
// answers. The send fails on the handshake's own bound (the connect timeout), not on the
// caller's much longer deadline.
func TestHandshakeToSilentPeerBounded(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			e := newEngine(t, tr, notify.WithConnectTimeout(time.Second))
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			err := e.SendNotify(ctx, ln.Addr().String(), notify.Notify{Name: "n", Msg: []byte("m")})
			t.Logf("%s: %v", tr, err)
			require.Error(t, err)
			require.NoError(t, ctx.Err(), "the caller's deadline is not what ended it")
		})
		// A send that comes while a handshake is on its way waits for that handshake and
		// fails with it: it does not start a second one when the first fails (that was a
		// send blocked for two connect timeouts, 9.70 s with a 5 s timeout). Sends during
		// the backoff that follows fail at once, refused by it.
		t.Run(tr+"/joins", func(t *testing.T) {
			// The sends are queued one after another from here, long before the silent
			// peer's handshake can time out.
			e := newEngine(t, tr, notify.WithConnectTimeout(2*time.Second))
			const n = 4
			errs := make(chan error, n)
			for range n {
				require.NoError(t, e.SendNotifyAsync(ln.Addr().String(), notify.Notify{Name: "n", Msg: []byte("m")}, func(err error) { errs <- err }))
			}
			for range n {
				select {
				case err := <-errs:
					require.Error(t, err)
					require.ErrorIs(t, err, notify.ErrPeerUnreachable, "%v", err)
				case <-time.After(time.Minute):
					t.Fatal("a send to a silent peer never ended")
				}
			}
			lim := e.Stats().Limits
			t.Logf("%s: %d handshakes failed, %d sends refused by the backoff", tr, lim.HandshakesFailed, lim.BackoffRefused)
			require.EqualValues(t, 1, lim.HandshakesFailed, "one handshake for the sends that came while it was on its way")
		})
	}
	_ = ln.Close()
	for c := range accepted {
		conns = append(conns, c)
	}
}
