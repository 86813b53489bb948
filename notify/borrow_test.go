package notify

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestBorrowedTurnsKeepTheContract: SendNotify callers that send in turns borrowed from
// their loop and wait as the loop (one caller alone, then several at once, event mode and
// busy poll), beside the receiver's handler answering every notify with SendNotifyAsync on
// its own loop: every acknowledged notify is delivered exactly once and in each caller's
// order, and every answer arrives.
func TestBorrowedTurnsKeepTheContract(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for _, tr := range []string{TransportRDMATwoSided, TransportOOB} {
		for _, busy := range []time.Duration{0, 50 * time.Microsecond} {
			t.Run(fmt.Sprintf("%s/busy=%v", tr, busy), func(t *testing.T) {
				borrowedContract(t, tr, busy)
			})
		}
	}
}

func borrowedContract(t *testing.T, tr string, busy time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const callers, each = 4, 150
	var mu sync.Mutex
	next := make([]uint32, callers) // per caller: the sequence expected next
	var dup, gap, answered int
	recv, err := New(WithTransport(tr), WithBusyPoll(busy), WithHandler(func(n Notify) {
		c, seq := binary.BigEndian.Uint32(n.Msg), binary.BigEndian.Uint32(n.Msg[4:])
		mu.Lock()
		switch {
		case seq < next[c]:
			dup++
		case seq > next[c]:
			gap++
		}
		next[c] = seq + 1
		mu.Unlock()
	}))
	require.NoError(t, err)
	defer closeEngine(t, recv)
	send, err := New(WithTransport(tr), WithBusyPoll(busy), WithHandler(func(Notify) {
		mu.Lock()
		answered++
		mu.Unlock()
	}))
	require.NoError(t, err)
	defer closeEngine(t, send)
	// Each acknowledged notify is answered by the receiver (an async send from another
	// goroutine), so the sender's handler runs in its callers' borrowed turns too. The
	// contract holds for the answers as well: each one acknowledged arrives.
	var answersAcked, answersFailed atomic.Int64
	var lastAnswerErr atomic.Value
	recvAnswer := func() error {
		return recv.SendNotifyAsync(send.Addr(), Notify{Name: "answer", Msg: []byte{1}}, func(err error) {
			if err != nil {
				answersFailed.Add(1)
				lastAnswerErr.Store(err.Error())
				return
			}
			answersAcked.Add(1)
		})
	}
	var acked [callers]int
	run := func(c int, wg *sync.WaitGroup) {
		defer wg.Done()
		for i := 0; i < each; i++ {
			msg := make([]byte, 8)
			binary.BigEndian.PutUint32(msg, uint32(c))
			binary.BigEndian.PutUint32(msg[4:], uint32(i))
			if err := send.SendNotify(ctx, recv.Addr(), Notify{Name: "seq", Msg: msg}); err != nil {
				t.Errorf("caller %d notify %d: %v", c, i, err)
				return
			}
			acked[c]++
			if err := recvAnswer(); err != nil {
				t.Errorf("answer: %v", err)
				return
			}
		}
	}
	// One caller alone (it waits as the loop), then all of them at once.
	var wg sync.WaitGroup
	wg.Add(1)
	run(0, &wg)
	for c := 1; c < callers; c++ {
		wg.Add(1)
		go run(c, &wg)
	}
	wg.Wait()
	total := 0
	for c := range acked {
		total += acked[c]
	}
	require.Equal(t, callers*each, total, "acknowledged")
	// Every async send resolves within its 30 s deadline; the acknowledged ones are delivered.
	require.Eventually(t, func() bool { return answersAcked.Load()+answersFailed.Load() == int64(total) },
		45*time.Second, time.Millisecond, "answers unresolved")
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return int64(answered) >= answersAcked.Load()
	}, 10*time.Second, time.Millisecond, "acknowledged answers not delivered")
	if n := answersFailed.Load(); n > 0 {
		t.Logf("%d answers failed (allowed: not acknowledged), the last: %v", n, lastAnswerErr.Load())
	}
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		got := 0
		for c := range next {
			got += int(next[c])
		}
		return got == total
	}, 10*time.Second, time.Millisecond, "acknowledged notifies not delivered")
	mu.Lock()
	defer mu.Unlock()
	require.Zero(t, dup, "delivered twice")
	require.Zero(t, gap, "out of order")
	require.LessOrEqual(t, answered, total, "answers delivered twice")
	st := send.Stats()
	// How many turns were borrowed depends on the scheduler (a caller borrows only when it
	// finds its loop asleep: 0 to 600 of them, seen 0 in CI over softverbs); the reactor's
	// own tests pin borrowing itself. The count is logged.
	t.Logf("%s busy=%v: %d acknowledged, %d delivered in order; answers %d acknowledged, %d delivered; sender turns borrowed %d, wake-ups %d",
		tr, busy, total, total, answersAcked.Load(), answered, st.Reactor.Borrowed, st.Reactor.Wakeups)
}

// closeEngine closes e within its own bound (not the test's, which a failure may have spent).
func closeEngine(t *testing.T, e *Engine) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, e.Close(ctx))
}
