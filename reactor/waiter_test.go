package reactor

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A Waiter completes on a Signal from the loop, consumes it, and can be reused; a Signal
// given before the Wait is not lost.
func TestWaiterSignalFromLoop(t *testing.T) {
	l := newLoop(t)
	w, err := NewWaiter()
	require.NoError(t, err)
	defer func() { require.NoError(t, w.Close()) }()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	for i := 0; i < 3; i++ {
		require.NoError(t, l.Submit(w.Signal))
		require.NoError(t, w.Wait(ctx))
	}
	w.Signal() // before the Wait
	require.NoError(t, w.Wait(ctx))
	// Consumed: the next Wait waits for its own Signal (here: the deadline).
	short, cancel2 := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel2()
	err = w.Wait(short)
	require.True(t, errors.Is(err, context.DeadlineExceeded), "%v", err)
}

// A Wait ends with the context's cancellation even without a deadline.
func TestWaiterCancel(t *testing.T) {
	w, err := NewWaiter()
	require.NoError(t, err)
	defer func() { require.NoError(t, w.Close()) }()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Wait(ctx) }()
	cancel()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(waitBound):
		t.Fatal("Wait did not see the cancellation")
	}
	// The cancellation's kick is not a signal: the next Wait waits for its own.
	short, cancel2 := context.WithTimeout(context.Background(), 2*time.Millisecond)
	defer cancel2()
	require.ErrorIs(t, w.Wait(short), context.DeadlineExceeded, "a kick was taken for a signal")
	w.Signal()
	w.Reset()
	short3, cancel3 := context.WithTimeout(context.Background(), 2*time.Millisecond)
	defer cancel3()
	require.ErrorIs(t, w.Wait(short3), context.DeadlineExceeded, "Reset dropped the pending signal")
}

// A signal that arrives with a kick still completes the Wait.
func TestWaiterSignalWithKick(t *testing.T) {
	w, err := NewWaiter()
	require.NoError(t, err)
	defer func() { require.NoError(t, w.Close()) }()
	w.kick()
	w.Signal()
	require.NoError(t, w.Wait(context.Background()))
	w.kick()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, w.Wait(ctx), context.DeadlineExceeded, "a kick alone completed the Wait")
}

func TestWaiterAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's syscall instrumentation allocates")
	}
	w, err := NewWaiter()
	require.NoError(t, err)
	defer func() { require.NoError(t, w.Close()) }()
	ctx := context.Background()
	require.Zero(t, testing.AllocsPerRun(200, func() {
		w.Signal()
		if err := w.Wait(ctx); err != nil {
			panic(err)
		}
	}))
	// A context that can end costs nothing either while the wait is short.
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.Zero(t, testing.AllocsPerRun(200, func() {
		w.Signal()
		if err := w.Wait(dctx); err != nil {
			panic(err)
		}
	}))
}

// A context that ends after the unwatched poll (the Wait registered for its end) still ends
// the Wait, and a signal after that is taken by the next Wait.
func TestWaiterCancelLate(t *testing.T) {
	w, err := NewWaiter()
	require.NoError(t, err)
	defer func() { require.NoError(t, w.Close()) }()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Wait(ctx) }()
	time.Sleep(20 * waitUnwatchedMs * time.Millisecond) // lets the Wait reach its watched poll
	cancel()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(waitBound):
		t.Fatal("Wait did not see the cancellation")
	}
	w.Signal()
	require.NoError(t, w.Wait(context.Background()))
}
