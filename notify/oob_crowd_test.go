package notify

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// Many SendNotify callers at once wait on channels (crowdReqs) instead of Waiters: each
// gets its own result, once; a caller whose context ends while its notify is on the wire
// leaves with ErrTimeout and ErrMaybeDelivered, and its req, answered later, is recycled
// without waking anyone. The receiver's handler holds the first notify until released, so
// every caller is in flight when some are cancelled.
func TestSendNotifyCrowd(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	release := make(chan struct{})
	var once sync.Once
	recv, err := New(WithTransport(TransportOOB), WithHandler(func(n Notify) {
		if n.Name == "hold" {
			once.Do(func() { <-release })
		}
	}))
	require.NoError(t, err)
	defer recv.Close(ctx)
	send, err := New(WithTransport(TransportOOB), WithMaxPendingSends(256))
	require.NoError(t, err)
	defer send.Close(ctx)
	require.NoError(t, send.SendNotify(ctx, recv.Addr(), Notify{Name: "warm"}))
	sent0 := send.Stats().OOB.PersistentSent

	const callers, cancelled = 4 * crowdCallers, crowdCallers
	ctxs := make([]context.Context, callers)
	cancels := make([]context.CancelFunc, callers)
	for i := range ctxs {
		ctxs[i], cancels[i] = context.WithCancel(ctx)
		defer cancels[i]()
	}
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = send.SendNotify(ctxs[i], recv.Addr(), Notify{Name: "hold", Msg: []byte{byte(i)}})
		}()
	}
	// Every caller's notify is on the wire, not only its caller inside SendNotify (a notify
	// not yet sent would be withdrawn, not maybe delivered). Bounded wait: a hang detector,
	// not a timing.
	for deadline := time.Now().Add(30 * time.Second); send.inSend.Load() < callers || send.Stats().OOB.PersistentSent-sent0 < callers; {
		require.True(t, time.Now().Before(deadline), "callers did not all start")
		time.Sleep(time.Millisecond)
	}
	for i := range cancelled {
		cancels[i]()
	}
	for deadline := time.Now().Add(30 * time.Second); send.inSend.Load() > callers-cancelled; {
		require.True(t, time.Now().Before(deadline), "cancelled callers did not return")
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	for i, err := range errs {
		if i < cancelled {
			require.ErrorIs(t, err, ErrTimeout, "caller %d", i)
			require.ErrorIs(t, err, ErrMaybeDelivered, "caller %d: its notify was on the wire", i)
			continue
		}
		require.NoError(t, err, "caller %d", i)
	}
	// The abandoned reqs were answered and recycled: the engine still sends.
	require.NoError(t, send.SendNotify(ctx, recv.Addr(), Notify{Name: "after"}))
	require.False(t, errors.Is(send.Close(ctx), ErrTimeout))
	require.NoError(t, recv.Close(ctx))
}
