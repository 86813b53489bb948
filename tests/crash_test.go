package tests

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/notify"
)

// TestReceiverCrashLosesAtMostItsQueue: an acknowledgement means the peer engine has the
// notify, not that its application took it. A receiver whose application never reads is
// killed -9: what it lost is what it had acknowledged, and that is bounded by its receive
// queue plus, over rdma_twosided, one channel's RECV ring (the NIC acknowledged those
// before the full queue stopped credit). Over OOB a notify held while the queue is full is
// answered only when taken, so only the queue is lost.
func TestReceiverCrashLosesAtMostItsQueue(t *testing.T) {
	const queue, recvCount = 16, 64
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			p := startPeerProc(t, tr, peerModeEnv+"=hold", peerQueueEnv+"="+strconv.Itoa(queue))
			snd := newEngine(t, tr, notify.WithRecvCount(recvCount))
			acked, failedInARow := 0, 0
			for i := 0; i < 2000 && failedInARow < 3; i++ {
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				err := snd.SendNotify(ctx, p.addr, notify.Notify{Name: "n", Msg: []byte(strconv.Itoa(i))})
				cancel()
				if err == nil {
					acked++
					failedInARow = 0
				} else {
					failedInARow++
				}
			}
			p.kill()
			bound := queue
			if tr == notify.TransportRDMATwoSided {
				bound += recvCount
			}
			t.Logf("%s: %d acknowledged notifies lost with the receiver (bound %d)", tr, acked, bound)
			require.Positive(t, acked)
			require.LessOrEqual(t, acked, bound, "acknowledged beyond what a full receiver holds")
		})
	}
}
