//go:build rdma

package notify

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Through libibverbs on softverbs, whose rtr_delay_ms fault makes every modify to RTR
// take 500 ms (a RoCE NIC's kernel resolving the peer's MAC): engines a, b and c, with
// channels a↔b and b↔c up; then a sends to c, so c's RTR (answering) and a's RTR (after
// the reply) each take 500 ms. Meanwhile notifies a→b and b→c go on, one after the other:
// some complete while c's connect worker is inside Ready, and some while a's is (known
// from the workers' hook, not from the clock). Before, the RTR ran on the reactor: no
// notify of that engine's other peers completed while it lasted.
func TestSlowRTRVerbs(t *testing.T) {
	ctl, out, child := softverbsChild(t, "TestSlowRTRVerbs", "rtr_delay_ms=0\n", "its control file delays RTR")
	if !child {
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "during") {
				t.Log(strings.TrimSpace(l))
			}
		}
		return
	}
	// inReady: the engine whose connect worker is inside Ready (the RTR), for a and c.
	var watchA, watchC atomic.Pointer[Engine]
	var inA, inC atomic.Bool
	var readies atomic.Int32
	testReadyHook = func(e *Engine, begin bool) {
		switch e {
		case watchA.Load():
			inA.Store(begin)
		case watchC.Load():
			inC.Store(begin)
		default:
			return
		}
		if begin {
			readies.Add(1)
		}
	}
	t.Cleanup(func() { testReadyHook = nil })

	opts := append(verbsOpts(t), WithKeepalive(0))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	eng := func() *Engine {
		e, err := New(opts...)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, e.Close(ctx)) })
		return e
	}
	a, b, c := eng(), eng(), eng()
	sendRecv(t, ctx, a, b, "a-b up")
	sendRecv(t, ctx, b, c, "b-c up")
	watchA.Store(a)
	watchC.Store(c)

	require.NoError(t, os.WriteFile(ctl, []byte("rtr_delay_ms=500\n"), 0o600))
	toC := make(chan error, 1)
	require.NoError(t, a.SendNotifyAsync(c.Addr(), Notify{Name: "to-c"}, func(err error) { toC <- err }))
	var sent, duringA, duringC int
	gotToC := false
	var result error
	for done := false; !done; {
		sendRecv(t, ctx, a, b, fmt.Sprintf("a-b %d", sent))
		if inA.Load() {
			duringA++
		}
		name := fmt.Sprintf("b-c %d", sent)
		require.NoError(t, b.SendNotify(ctx, c.Addr(), Notify{Name: name}))
		n, err := c.Recv(ctx)
		require.NoError(t, err)
		if n.Name == "to-c" { // a's notify, as soon as its channel is up
			gotToC = true
			n, err = c.Recv(ctx)
			require.NoError(t, err)
		}
		require.Equal(t, name, n.Name)
		if inC.Load() {
			duringC++
		}
		sent++
		select {
		case result = <-toC:
			done = true
		default:
		}
	}
	require.NoError(t, os.WriteFile(ctl, []byte("rtr_delay_ms=0\n"), 0o600))
	require.NoError(t, result)
	if !gotToC {
		got, err := c.Recv(ctx)
		require.NoError(t, err)
		require.Equal(t, "to-c", got.Name)
	}
	t.Logf("%d notifies a→b and %d b→c during the connect a→c: %d a→b during a's RTR, %d b→c during c's RTR", sent, sent, duringA, duringC)
	require.Equal(t, int32(2), readies.Load(), "one Ready on each side of the connect a→c")
	require.Positive(t, duringA, "notifies to b completed while a's RTR towards c was in progress")
	require.Positive(t, duringC, "notifies from b completed while c's RTR towards a was in progress")
	require.Equal(t, 2, a.Stats().ChannelsUp)
	require.Zero(t, c.Stats().OOB.NotifyServed, "nothing went over OOB")
}
