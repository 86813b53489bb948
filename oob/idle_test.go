package oob

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/reactor"
)

// onLoop runs f on loop and waits until it ran.
func onLoop(t testing.TB, loop *reactor.Loop, f func()) {
	t.Helper()
	ran := make(chan struct{})
	require.NoError(t, loop.SubmitWait(bg(t), func() { f(); close(ran) }))
	select {
	case <-ran:
	case <-time.After(waitBound):
		t.Fatal("the loop did not run the func")
	}
}

// armedTimers counts the connections of nodes (all on loop) whose deadline timer is armed.
func armedTimers(t testing.TB, loop *reactor.Loop, nodes []*Node) (armed, conns int) {
	onLoop(t, loop, func() {
		for _, n := range nodes {
			for c := range n.conns {
				conns++
				if c.tmArmed {
					armed++
				}
			}
		}
	})
	return armed, conns
}

// An idle engine sleeps: a hub on one loop and 100 spokes on another, each spoke with a
// persistent connection to the hub and the hub with one to each spoke (200 connections,
// both sides of each on both loops), after a first notify each way. Without Keepalive no
// timer is armed and neither loop wakes; with it, both do.
func TestIdleNoWakeups(t *testing.T) {
	raiseNofile(t, 4096)
	const (
		spokes = 100
		window = 300 * time.Millisecond
	)
	for _, tc := range []struct {
		name      string
		idle      time.Duration
		keepalive time.Duration
	}{
		// A deadline left armed would fire within the window.
		{"keepalive off", 100 * time.Millisecond, 0},
		// 6*IdleTimeout unused outlasts the setup on a loaded machine, and IdleTimeout a
		// loop starved of the CPU between two keepalives (a second was not: 63 of 100
		// connections cut during the setup beside two CPU hogs and two soaks).
		{"keepalive on", 5 * time.Second, 20 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{IdleTimeout: tc.idle, Keepalive: tc.keepalive}
			la, lb := newLoop(t), newLoop(t)
			hub := listen(t, la, newHandler(), cfg)
			nodes := make([]*Node, spokes)
			for i := range nodes {
				nodes[i] = listen(t, lb, newHandler(), cfg)
			}
			ctx := bg(t)
			for _, s := range nodes {
				require.NoError(t, s.Notify(ctx, hub.Addr(), &NotifyRequest{Name: "to hub"}))
				require.NoError(t, hub.Notify(ctx, s.Addr(), &NotifyRequest{Name: "to spoke"}))
			}
			hs := hub.Stats()
			require.EqualValues(t, spokes, hs.ServerConns)
			require.EqualValues(t, spokes, hs.ClientConns)

			loops := []*reactor.Loop{la, lb}
			wakeups := func() [2]uint64 {
				return [2]uint64{la.Stats().Wakeups, lb.Stats().Wakeups}
			}
			if tc.keepalive == 0 {
				armedA, connsA := armedTimers(t, la, []*Node{hub})
				armedB, connsB := armedTimers(t, lb, nodes)
				require.Equal(t, 2*spokes, connsA)
				require.Equal(t, 2*spokes, connsB)
				require.Zero(t, armedA, "hub: timers armed on idle connections")
				require.Zero(t, armedB, "spokes: timers armed on idle connections")
				for _, l := range loops {
					onLoop(t, l, func() {})
				}
				// Let the loops take the eventfd writes of the last submissions and go to
				// sleep; then nothing may wake them.
				time.Sleep(100 * time.Millisecond)
				before := wakeups()
				time.Sleep(window)
				after := wakeups()
				t.Logf("idle %v, %d persistent connections (%d ends on each loop): wake-ups hub loop %d, spoke loop %d",
					window, 2*spokes, 2*spokes, after[0]-before[0], after[1]-before[1])
				require.Zero(t, after[0]-before[0], "hub loop woke while idle")
				require.Zero(t, after[1]-before[1], "spoke loop woke while idle")
				require.Zero(t, hub.Stats().IdleCuts)
				require.EqualValues(t, spokes, hub.Stats().ProbeServed, "only the hellos")
				return
			}
			before := wakeups()
			require.Eventually(t, func() bool {
				now := wakeups()
				return now[0] > before[0] && now[1] > before[1]
			}, waitBound, time.Millisecond, "keepalive probes wake both loops")
			require.Eventually(t, func() bool { return hub.Stats().ProbeServed > 2*spokes }, waitBound, time.Millisecond)
			require.Zero(t, hub.Stats().IdleCuts, "keepalives hold the connections")
			now := wakeups()
			t.Logf("keepalive %v: wake-ups since the last notify: hub loop %d, spoke loop %d", tc.keepalive, now[0]-before[0], now[1]-before[1])
		})
	}
}

// An idle persistent connection without Keepalive outlives IdleTimeout on both ends and
// carries no probe.
func TestIdlePersistentKeptWithoutKeepalive(t *testing.T) {
	const idle = 50 * time.Millisecond
	la, lb := newLoop(t), newLoop(t)
	a := listen(t, la, newHandler(), Config{IdleTimeout: idle})
	b := listen(t, lb, newHandler(), Config{IdleTimeout: idle})
	ctx := bg(t)
	require.NoError(t, a.Notify(ctx, b.Addr(), &NotifyRequest{Name: "x"}))
	// Witnesses accepted later that send nothing are cut on both loops: any deadline the
	// persistent connection had would have passed first.
	for _, n := range []*Node{a, b} {
		w, err := net.Dial("tcp", n.Addr())
		require.NoError(t, err)
		defer w.Close()
		requireEOF(t, w)
		require.EqualValues(t, 1, n.Stats().IdleCuts)
	}
	require.NoError(t, a.Notify(ctx, b.Addr(), &NotifyRequest{Name: "x"}))
	require.EqualValues(t, 1, a.Stats().Dialed, "the same connection")
	require.EqualValues(t, 1, b.Stats().ProbeServed, "the hello, no keepalive")
	require.EqualValues(t, 1, b.Stats().IdleCuts, "only the witness")
}

// A client that drips a frame one byte at a time, each within IdleTimeout of the last, is
// cut IdleTimeout after the frame's first byte, before and after the hello.
func TestSlowDripCut(t *testing.T) {
	const idle = 100 * time.Millisecond
	loop := newLoop(t)
	h := newHandler()
	b := listen(t, loop, h, Config{IdleTimeout: idle})
	frame := AppendFrame(nil, TypeNotify, []byte(`{"name":"`+strings.Repeat("d", 64)+`","notify_msg":"x"}`))
	for _, hello := range []bool{false, true} {
		t.Run(fmt.Sprintf("hello=%v", hello), func(t *testing.T) {
			cuts := b.Stats().IdleCuts
			p := dialRaw(t, b.Addr())
			if hello {
				p.hello(nil)
			}
			sent := 0
			var err error
			for sent < len(frame)-1 {
				if _, err = p.c.Write(frame[sent : sent+1]); err != nil {
					break
				}
				sent++
				// Half an IdleTimeout between bytes: each is read progress, so only a
				// deadline per frame cuts this client.
				require.NoError(t, p.c.SetReadDeadline(time.Now().Add(idle/2)))
				var one [1]byte
				_, err = p.c.Read(one[:])
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					err = nil
					continue
				}
				break
			}
			require.Less(t, sent, len(frame)-1, "dripped the whole frame but the last byte without being cut")
			require.True(t, errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE),
				"closed by the server: %v", err)
			require.Equal(t, cuts+1, b.Stats().IdleCuts)
		})
	}
	require.Empty(t, h.notifies())
}

// A request in flight on a persistent connection whose server answered the hello and then
// went silent is cut by IdleTimeout, well before RequestTimeout.
func TestInFlightCutWhenPeerSilent(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var hdr [HeaderSize]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		if _, err := io.ReadFull(c, make([]byte, int(hdr[0])-1)); err != nil { // the hello is short
			return
		}
		if _, err := c.Write(appendProbe(nil, reqMeta{}, true)); err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, c) // read the request, never answer
	}()
	loop := newLoop(t)
	a := listen(t, loop, newHandler(), Config{IdleTimeout: 100 * time.Millisecond, RequestTimeout: time.Hour})
	err = a.Notify(bg(t), ln.Addr().String(), &NotifyRequest{Name: "x"})
	require.ErrorIs(t, err, ErrPeerUnreachable)
	require.ErrorIs(t, err, ErrTimeout)
	require.Contains(t, err.Error(), "half-open")
	require.EqualValues(t, 1, a.Stats().IdleCuts)
	<-done
}
