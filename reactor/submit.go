package reactor

import (
	"context"
	"fmt"
)

// Submit queues f to run on the loop. It never blocks and allocates nothing: ErrQueueFull
// when the queue has no room, ErrStopped after Stop. Funcs run in submission order per
// producer. Safe from any goroutine, the loop included.
func (l *Loop) Submit(f func()) error {
	if f == nil {
		return fmt.Errorf("reactor: submit: f: must not be nil: %w", ErrInvalid)
	}
	return l.trySubmit(f)
}

func (l *Loop) trySubmit(f func()) error {
	l.mu.RLock()
	if l.stopped.Load() {
		l.mu.RUnlock()
		return ErrStopped
	}
	if !l.q.push(f) {
		l.mu.RUnlock()
		l.st.queueFull.Add(1)
		return ErrQueueFull
	}
	// Only the producer that flips the loop from asleep to awake writes the eventfd: one write
	// per batch, none while the loop is running.
	if l.state.Load() == asleep && l.state.CompareAndSwap(asleep, awake) {
		l.wake()
	}
	l.mu.RUnlock()
	return nil
}

// SubmitWait queues f like Submit, waiting for room when the queue is full, bounded by ctx.
// The wait parks on a signal the loop gives when it frees room; it never spins. On the loop
// goroutine it does not wait (the loop would wait for itself): a full queue is ErrQueueFull.
func (l *Loop) SubmitWait(ctx context.Context, f func()) error {
	if f == nil {
		return fmt.Errorf("reactor: submit wait: f: must not be nil: %w", ErrInvalid)
	}
	for {
		err := l.trySubmit(f)
		if err != ErrQueueFull {
			return err
		}
		if l.InLoop() {
			return err
		}
		// Register as a waiter before taking the room channel and trying again: the loop
		// frees room, then checks waiters, so either the retry sees the room or the channel
		// taken here gets closed.
		l.waiters.Add(1)
		l.roomMu.Lock()
		room := l.room
		l.roomMu.Unlock()
		if err = l.trySubmit(f); err != ErrQueueFull {
			l.waiters.Add(-1)
			return err
		}
		select {
		case <-room:
			l.waiters.Add(-1)
		case <-l.done:
			l.waiters.Add(-1)
			return ErrStopped
		case <-ctx.Done():
			l.waiters.Add(-1)
			return fmt.Errorf("reactor: submit wait: %w", ctx.Err())
		}
	}
}
