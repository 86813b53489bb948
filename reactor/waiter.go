package reactor

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// Waiter is a reusable one-shot completion for a goroutine off the loop: it waits in a
// system call (poll on an eventfd) and the loop signals it with one eventfd write.
//
// Why not a channel. A channel send on the loop readies the waiting goroutine into the
// loop's own run queue; the loop then blocks in epoll_wait and another thread must be woken
// to steal that goroutine (or sysmon must retake the loop's P). On the 2-vCPU VM that hand-off
// was the largest hop of a SendNotify (p50 15–25 µs of "echo handler → caller resumes",
// ~1.8 thread parks and ~1.6 sysmon wake-ups per notify). The eventfd write wakes the
// waiting thread directly and readies nothing: in a prototype of SendNotify on a Waiter the
// hop fell to ~7.5 µs and context switches per notify by ~20 %.
//
// The cost: a waiting goroutine holds its OS thread (in poll) for the wait. Use it where
// few goroutines wait at once (a sequential caller), not for thousands of parked callers.
type Waiter struct {
	fd int
}

// waiterSlice bounds one poll when the context has no deadline, so that a cancellation is
// seen within it.
const waiterSlice = 20 * time.Millisecond

// NewWaiter makes a Waiter (one eventfd). Close it when done.
func NewWaiter() (*Waiter, error) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("reactor: waiter eventfd: %w", err)
	}
	return &Waiter{fd: fd}, nil
}

// Signal completes the current (or next) Wait. Any goroutine; allocation-free.
func (w *Waiter) Signal() { _, _ = unix.Write(w.fd, wakeOne[:]) }

// Wait returns nil once Signal was called (consuming the signal, so the Waiter can be reused),
// or ctx's error, wrapped, when ctx ends first. A Signal that races with the end of ctx stays
// pending: Reset clears it before reuse.
func (w *Waiter) Wait(ctx context.Context) error {
	pfd := [1]unix.PollFd{{Fd: int32(w.fd), Events: unix.POLLIN}}
	for {
		if w.take() {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("reactor: wait: %w", err)
		}
		d := waiterSlice
		if dl, ok := ctx.Deadline(); ok {
			d = min(d, time.Until(dl))
		}
		ms := int((d + time.Millisecond - 1) / time.Millisecond)
		if ms < 0 {
			ms = 0
		}
		pfd[0].Revents = 0
		_, _ = unix.Poll(pfd[:], ms)
	}
}

// Reset drops a pending signal.
func (w *Waiter) Reset() { w.take() }

// take consumes a pending signal.
func (w *Waiter) take() bool {
	var b [8]byte
	n, err := unix.Read(w.fd, b[:])
	return err == nil && n == 8
}

// Close releases the eventfd.
func (w *Waiter) Close() error { return unix.Close(w.fd) }
