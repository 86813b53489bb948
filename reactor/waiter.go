package reactor

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"

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
// waiting thread directly and readies nothing.
//
// Cancellation. A Wait that lasts past waitUnwatchedMs registers context.AfterFunc on its
// context: when the context ends, a "kick" (a different value added to the same eventfd)
// ends the poll at once; before that, an ended context is seen within waitUnwatchedMs. A kick is never
// taken for a Signal, and a late kick of an earlier Wait only costs the next Wait one more
// turn round its loop.
//
// The cost: a waiting goroutine holds its OS thread (in poll) for the wait. Use it where
// few goroutines wait at once (a sequential caller), not for thousands of parked callers.
type Waiter struct {
	fd     int
	mu     sync.Mutex // kick against Close: a kick never writes to a closed (reused) fd
	closed bool
}

// waitUnwatchedMs is how long a Wait polls before it watches its context: the bound on
// how late it sees a context that ends in that time.
const waitUnwatchedMs = 1

// The eventfd counter holds signals in its low bits and kicks above them.
const (
	waiterSignal    = 1
	waiterKick      = 1 << 32
	waiterSignalSet = waiterKick - 1
)

// The values an eventfd write adds, in host byte order.
var signalBytes, kickBytes = eventfdValue(waiterSignal), eventfdValue(waiterKick)

func eventfdValue(v uint64) (b [8]byte) {
	binary.NativeEndian.PutUint64(b[:], v)
	return b
}

// NewWaiter makes a Waiter (one eventfd). Close it when done.
func NewWaiter() (*Waiter, error) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("reactor: waiter eventfd: %w", err)
	}
	return &Waiter{fd: fd}, nil
}

// Signal completes the current (or next) Wait. Any goroutine; allocation-free. The Waiter
// must not be closed before the Signal returns.
func (w *Waiter) Signal() { _, _ = unix.Write(w.fd, signalBytes[:]) }

func (w *Waiter) kick() {
	w.mu.Lock()
	if !w.closed {
		_, _ = unix.Write(w.fd, kickBytes[:])
	}
	w.mu.Unlock()
}

// Wait returns nil once Signal was called (consuming the signal, so the Waiter can be reused),
// or ctx's error, wrapped, when ctx ends first. A Signal that races with the end of ctx stays
// pending: Reset clears it before reuse (or a Wait takes it).
func (w *Waiter) Wait(ctx context.Context) error {
	pfd := [1]unix.PollFd{{Fd: int32(w.fd), Events: unix.POLLIN}}
	if ctx.Done() != nil {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("reactor: wait: %w", err)
		}
		// Most waits end within microseconds: they wait unwatched for up to
		// waitUnwatchedMs, then look at ctx, and only a longer wait registers for its end
		// (context.AfterFunc costs two allocations and the context's lock).
		_, _ = unix.Poll(pfd[:], waitUnwatchedMs)
		if w.take() {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("reactor: wait: %w", err)
		}
		stop := context.AfterFunc(ctx, w.kick)
		defer stop()
	}
	for {
		pfd[0].Revents = 0
		_, _ = unix.Poll(pfd[:], -1)
		if w.take() {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("reactor: wait: %w", err)
		}
	}
}

// Reset drops a pending signal.
func (w *Waiter) Reset() { w.take() }

// take consumes the counter and reports whether it held a signal (kicks are dropped).
func (w *Waiter) take() bool {
	var b [8]byte
	n, err := unix.Read(w.fd, b[:])
	if err != nil || n != 8 {
		return false
	}
	return binary.NativeEndian.Uint64(b[:])&waiterSignalSet != 0
}

// Close releases the eventfd. No Signal may follow; a kick of a Wait's context that ends
// later is dropped.
func (w *Waiter) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	return unix.Close(w.fd)
}
