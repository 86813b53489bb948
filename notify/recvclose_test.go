package notify

import (
	"context"
	"encoding/binary"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestRecvReturnsWhatCloseHandsOver: a receiver's queue is full (WithRecvQueue 4, nobody
// consuming), so its channel's RECV ring holds notifies its NIC acknowledged. A Recv loop
// that starts once Close has begun gets every acknowledged notify, in order, once — what
// the queue held and what Close drained from the channel — and then ErrClosed; nothing is
// left for GetNotifies.
func TestRecvReturnsWhatCloseHandsOver(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	recvThroughClose(t, TransportRDMATwoSided)
}

func recvThroughClose(t *testing.T, tr string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const queue, n = 4, 80
	recv, err := New(WithTransport(tr), WithRecvQueue(queue), WithRecvCount(16), WithKeepalive(0))
	require.NoError(t, err)
	send, err := New(WithTransport(tr), WithKeepalive(0))
	require.NoError(t, err)
	// The pair is set up (a handshake needs the receiver's loop), and its first notify taken.
	require.NoError(t, send.SendNotify(ctx, recv.Addr(), Notify{Name: "c", Msg: binary.BigEndian.AppendUint32(nil, 0)}))
	first, err := recv.Recv(ctx)
	require.NoError(t, err)
	require.Equal(t, uint32(0), binary.BigEndian.Uint32(first.Msg))

	// The receiver's loop is held: over rdma_twosided its NIC acknowledges what the
	// channel's RECVs take, and nothing reaches the queue until Close drains the channel.
	release, running := make(chan struct{}), make(chan struct{})
	require.NoError(t, recv.loop.Submit(func() { close(running); <-release }))
	<-running
	var mu sync.Mutex
	acked := map[uint32]bool{}
	results := make(chan error, n)
	for i := 1; i < n; i++ {
		msg := binary.BigEndian.AppendUint32(nil, uint32(i))
		require.NoError(t, send.SendNotifyAsync(recv.Addr(), Notify{Name: "c", Msg: msg}, func(err error) {
			if err == nil {
				mu.Lock()
				acked[uint32(i)] = true
				mu.Unlock()
			}
			results <- err
		}))
	}
	// More than the queue holds is acknowledged.
	taken := 0
	for got := 0; got <= queue; {
		select {
		case err := <-results:
			taken++
			if err == nil {
				got++
			}
		case <-ctx.Done():
			close(release)
			t.Fatalf("only %d sends acknowledged", got)
		}
	}

	closed := make(chan error, 1)
	go func() { closed <- recv.Close(ctx) }()
	for !recv.closed.Load() { // Close has begun
		runtime.Gosched()
	}
	var out []uint32
	end := make(chan error, 1)
	go func() {
		for {
			d, err := recv.Recv(ctx)
			if err != nil {
				end <- err
				return
			}
			out = append(out, binary.BigEndian.Uint32(d.Msg))
		}
	}()
	// The loop goes on once Recv waits for what Close hands over (or has ended).
	var recvErr error
	for ended := false; !ended && recv.rq.parked.Load() == 0; {
		select {
		case recvErr = <-end:
			ended = true
		default:
			runtime.Gosched()
		}
	}
	close(release)
	if recvErr == nil {
		recvErr = <-end
	}
	require.ErrorIs(t, recvErr, ErrClosed, "Recv ends with ErrClosed")
	require.NoError(t, <-closed)
	left := recv.GetNotifies()
	// Every send has its result once the sender closed too (the rest end with ErrClosed).
	closeEngine(t, send)
	for ; taken < n-1; taken++ {
		<-results
	}
	mu.Lock()
	defer mu.Unlock()
	seen := map[uint32]bool{}
	for k, i := range out {
		require.False(t, seen[i], "%d received twice", i)
		seen[i] = true
		if k > 0 {
			require.Greater(t, i, out[k-1], "in order: %v", out)
		}
	}
	missed := 0
	for i := range acked {
		if !seen[i] {
			missed++
		}
	}
	require.Zero(t, missed, "%s: %d of %d acknowledged notifies did not come out of Recv before ErrClosed (Recv gave %d; GetNotifies %d)",
		tr, missed, len(acked), len(out), len(left))
	require.Empty(t, left, "nothing is left for GetNotifies after Recv's ErrClosed")
	t.Logf("%s: %d acknowledged, %d from Recv after Close began", tr, len(acked), len(out))
}
