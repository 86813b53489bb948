package tests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/notify"
)

// sendSized sends a notify of size name+msg bytes.
func sendSized(ctx context.Context, e *notify.Engine, peer string, size int, tag byte) error {
	return e.SendNotify(ctx, peer, notify.Notify{Name: "n", Msg: bytes.Repeat([]byte{tag}, size-1)})
}

// TestReceiverLimitAnnounced: a receiver with WithMaxNotifySize(1000), a sender at the
// default. Each notify over the receiver's limit is refused by the sender with ErrTooLarge
// naming both limits, before anything is acknowledged, whatever path it would take (one
// frame, fragments, OOB); the ones at the limit are delivered, and so are the small ones
// after them at once (no seq left for the receiver's window to wait on).
func TestReceiverLimitAnnounced(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			rcv := newEngine(t, tr, notify.WithMaxNotifySize(1000), notify.WithGapTimeout(10*time.Minute))
			snd := newEngine(t, tr)
			ctx := ctxFor(t, 60*time.Second)
			require.NoError(t, sendSized(ctx, snd, rcv.Addr(), 1000, 'a'), "exactly the receiver's limit")
			for _, size := range []int{1001, 4000, 6000, 100000} {
				err := sendSized(ctx, snd, rcv.Addr(), size, 'x')
				require.ErrorIs(t, err, notify.ErrTooLarge, "size %d", size)
				require.NotErrorIs(t, err, notify.ErrMaybeDelivered, "size %d", size)
				require.ErrorContains(t, err, "max_notify_size 1000", "size %d", size)
				require.ErrorContains(t, err, "this engine's is 1048576", "size %d", size)
			}
			for i := 0; i < 5; i++ {
				require.NoError(t, snd.SendNotify(ctx, rcv.Addr(), notify.Notify{Name: "small", Msg: []byte(fmt.Sprint(i))}))
			}
			got := recvAll(ctx, rcv, time.Second)
			require.Len(t, got, 6, "the one at the limit and the five small ones, nothing over the limit")
			require.Equal(t, []string{"0", "1", "2", "3", "4"}, got[1:])
			st := rcv.Stats()
			require.Zero(t, st.Channels.DroppedFragment+st.Channels.DroppedTooLarge, "nothing sent that the receiver drops")
		})
	}
}

// TestSmallRecvRing: MC_RDMA_NOTIFY_RECV_COUNT of 1 or 2 leaves no room for credit flow
// control, so the ctrl channel carries no fragments: a notify above one RECV buffer goes
// over OOB when fallback is on and is refused with ErrTooLarge when it is off, before a seq
// is drawn; 20 000 such refusals leak nothing, and a good notify goes after them.
func TestSmallRecvRing(t *testing.T) {
	for _, recv := range []int{1, 2} {
		for _, fallback := range []bool{true, false} {
			t.Run(fmt.Sprintf("recv%d/fallback=%v", recv, fallback), func(t *testing.T) {
				rcv := newEngine(t, notify.TransportRDMATwoSided, notify.WithRecvCount(recv), notify.WithGapTimeout(10*time.Minute))
				snd := newEngine(t, notify.TransportRDMATwoSided, notify.WithOOBFallback(fallback))
				ctx := ctxFor(t, 120*time.Second)
				require.NoError(t, snd.SendNotify(ctx, rcv.Addr(), notify.Notify{Name: "first", Msg: []byte("small")}))
				big := 10000 // above one 4096-byte RECV buffer
				if fallback {
					require.NoError(t, sendSized(ctx, snd, rcv.Addr(), big, 'b'))
					require.Positive(t, snd.Stats().Limits.Fallbacks, "it went over OOB")
				} else {
					const failures = 20000 // above the 8192 unresolved seqs a pair may have
					for i := 0; i < failures; i++ {
						err := sendSized(ctx, snd, rcv.Addr(), big, 'b')
						if !errors.Is(err, notify.ErrTooLarge) || errors.Is(err, notify.ErrMaybeDelivered) {
							t.Fatalf("send %d: %v", i, err)
						}
						if i == 0 {
							require.ErrorContains(t, err, "OOB fallback is off")
						}
					}
				}
				require.NoError(t, snd.SendNotify(ctx, rcv.Addr(), notify.Notify{Name: "last", Msg: []byte("small")}))
				got := recvAll(ctx, rcv, time.Second)
				want := 2
				if fallback {
					want = 3
				}
				require.Len(t, got, want)
				require.Equal(t, "small", got[len(got)-1])
			})
		}
	}
}
