package notify

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv/soft"
)

// A handler's SendNotifyAsync runs in the handler's own turn when nothing is queued before
// it (its SEND leaves before the completion cycle re-posts and re-arms): the send is in
// flight when the call returns. Its done still runs after the call returned, and the
// answers keep the order of the notifies that caused them, with sends from another
// goroutine interleaved.
func TestHandlerSendInItsTurn(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			t.Setenv(soft.EnvDevices, "2")
			ctx := errCtx(t)
			opts := []Option{WithProvider("soft"), WithTransport(tr), WithKeepalive(0)}
			a, err := New(append(opts, WithDeviceFilters("soft0"))...)
			require.NoError(t, err)
			t.Cleanup(func() { _ = a.Close(ctx) })
			const n = 200
			var early, now atomic.Int32
			errs := make(chan error, 2*n)
			var b *Engine
			b, err = New(append(opts, WithDeviceFilters("soft1"), WithHandler(func(in Notify) {
				var returned atomic.Bool
				before := len(b.reqs) // the handler runs on b's loop, which owns reqs
				err := b.SendNotifyAsync(a.Addr(), Notify{Name: "answer", Msg: in.Msg}, func(err error) {
					if !returned.Load() {
						early.Add(1)
					}
					errs <- err
				})
				returned.Store(true)
				if len(b.reqs) > before {
					now.Add(1) // the send ran in this turn: it is in flight already
				}
				if err != nil {
					errs <- err
				}
			}))...)
			require.NoError(t, err)
			t.Cleanup(func() { _ = b.Close(ctx) })
			go func() {
				window := make(chan struct{}, 8) // well within the sends a peer may have waiting
				for i := 0; i < n; i++ {
					window <- struct{}{}
					if err := b.SendNotifyAsync(a.Addr(), Notify{Name: "other", Msg: []byte(fmt.Sprint(i))}, func(err error) { <-window; errs <- err }); err != nil {
						errs <- err
						return
					}
				}
			}()
			for i := 0; i < n; i++ {
				require.NoError(t, a.SendNotify(ctx, b.Addr(), Notify{Name: "ask", Msg: []byte(fmt.Sprint(i))}))
			}
			next := map[string]int{}
			for got := 0; got < 2*n; got++ {
				m, err := a.Recv(ctx)
				require.NoError(t, err, "after %d: %v; errs %d", got, next, len(errs))
				require.Equal(t, fmt.Sprint(next[m.Name]), string(m.Msg), "%s in order", m.Name)
				next[m.Name]++
			}
			for i := 0; i < 2*n; i++ {
				require.NoError(t, <-errs)
			}
			require.Zero(t, early.Load(), "a done ran before its SendNotifyAsync returned")
			if tr == TransportRDMATwoSided {
				// Over a ctrl channel nothing else queues work on b's loop but the other
				// goroutine's sends, eight at most: most answers find the queue empty. (Over
				// OOB a reply's completion is queued too, and may still wait there.)
				require.Positive(t, now.Load(), "no answer was sent in its handler's turn")
			}
		})
	}
}
