package reactor

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitBound bounds every wait of these tests; it is a hang detector, not a timing assertion.
const waitBound = 10 * time.Second

// quiet keeps tests that block the loop on purpose from logging slow callbacks.
var quiet = WithLogger(zerolog.Nop())

func newLoop(t testing.TB, opts ...Option) *Loop {
	t.Helper()
	l, err := New(append([]Option{quiet}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitBound)
		defer cancel()
		require.NoError(t, l.Stop(ctx))
	})
	return l
}

// onLoop runs f on the loop and waits for it. f must not call t.FailNow (it runs on the loop
// goroutine): collect values and assert after onLoop returns.
func onLoop(t testing.TB, l *Loop, f func()) {
	t.Helper()
	done := make(chan struct{})
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	require.NoError(t, l.SubmitWait(ctx, func() { defer close(done); f() }))
	select {
	case <-done:
	case <-time.After(waitBound):
		t.Fatal("the loop did not run the submitted func")
	}
}

// recv waits for one value, bounded.
func recv[T any](t testing.TB, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitBound):
		t.Fatal("nothing arrived")
	}
	var zero T
	return zero
}

// syncBuffer is a log sink the loop writes while tests read.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func closeFd(fd int) { _ = unix.Close(fd) }
