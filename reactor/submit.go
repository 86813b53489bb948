package reactor

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/petermattis/goid"
	"golang.org/x/sys/unix"

	"github.com/twosided/twosided/internal/tracepoint"
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
	// per batch, none while the loop is running. A func submitted in a borrowed turn (Exec)
	// runs before the turn ends, or the turn's end wakes the loop for it.
	if l.state.Load() == asleep && !l.inBorrowedTurn() && l.state.CompareAndSwap(asleep, awake) {
		l.wake()
	}
	l.mu.RUnlock()
	return nil
}

// Queued reports whether a submitted func waits to run (its position claimed, not yet
// run). A callback that would submit work for later may run it at once instead when
// nothing waits, and keep the order in which work was submitted. Loop only: it panics
// elsewhere.
func (l *Loop) Queued() bool {
	if !l.OnLoop() {
		panic(ErrNotInLoop)
	}
	return l.q.pending()
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

// Exec runs f as Submit would, but when the loop sleeps in epoll_wait with nothing queued it
// runs f at once on the calling goroutine, which borrows the loop's turn: the loop does not
// wake for it. A borrowed turn is a loop turn in all but the thread: f sees InLoop true and
// may call loop-only methods; the funcs queued before f run first (submission order per
// producer holds), funcs f submits run after it, and the CQs' doorbells are flushed before
// Exec returns, so what f posted has left. The loop keeps its own events for its next turn and
// is woken if the borrowed turn left work for it (a timer earlier than its sleep, a func
// queued meanwhile). A borrower never waits for the turn: when the loop is awake, spinning or
// another caller holds it, f is queued (ErrQueueFull, ErrStopped as Submit). f must not
// block, as every loop callback. The caller's goroutine is locked to its thread for the turn.
func (l *Loop) Exec(f func()) error {
	if f == nil {
		return fmt.Errorf("reactor: exec: f: must not be nil: %w", ErrInvalid)
	}
	if l.borrowTurn() && l.execBorrowed(f) {
		return nil
	}
	return l.trySubmit(f)
}

// borrowTurn takes the loop's turn for the caller when the loop sleeps in epoll_wait and
// nobody holds it; endBorrow gives it back.
func (l *Loop) borrowTurn() bool {
	if l.state.Load() != asleep || !l.turn.TryLock() {
		return false
	}
	if l.stopped.Load() || l.gid.Load() == 0 {
		l.turn.Unlock()
		return false
	}
	runtime.LockOSThread()
	l.borrower.Store(goid.Get())
	now := l.mono()
	l.now.Store(now)
	l.cbStart = now
	l.st.borrowed.Add(1)
	return true
}

// execBorrowed is Exec's turn on the caller's thread; false: f did not run (runBorrowed),
// the caller queues it.
func (l *Loop) execBorrowed(f func()) bool {
	defer l.endBorrow() // also when f panics and the caller recovers: the loop must go on
	return l.runBorrowed(f)
}

// runBorrowed runs f in a borrowed turn with what was queued before it and what it
// submits, then ends the turn's batch (CQ cycles, doorbells). It runs f only once every
// func queued before it ran: a position claimed by another producer that is still writing
// its func stops the queue there (ring.pop), and this caller's own earlier submissions may
// sit behind it; f must then be queued behind them (false), or a producer's funcs would run
// out of its order.
func (l *Loop) runBorrowed(f func()) bool {
	l.runQueue() // what was queued before f
	if l.q.pending() {
		return false
	}
	l.st.submissions.Add(1)
	f()
	l.endCallback("exec", 0)
	l.runQueue() // what f submitted (to the queue: the turn is taken)
	l.runKicks()
	l.flushCQs()
	return true
}

// endBorrow gives the turn back and wakes the loop if the turn left it work.
func (l *Loop) endBorrow() {
	late := l.q.ready() || len(l.kicks) > 0 || (len(l.timers) > 0 && l.timers[0].when < l.sleepUntil)
	l.borrower.Store(0)
	runtime.UnlockOSThread()
	// The loop leaves its set to a turn's holder only under holdMu, having found the turn
	// taken: giving that back and ending the turn under it too, no leaving can fall
	// between them unseen (what this turn left in the loop's set then wakes the loop).
	l.holdMu.Lock()
	l.giveBackLoopBlind()
	l.turn.Unlock()
	l.holdMu.Unlock()
	if late && l.state.Load() == asleep && l.state.CompareAndSwap(asleep, awake) {
		l.wake()
	}
}

// inBorrowedTurn reports whether the caller is the goroutine running a borrowed turn.
func (l *Loop) inBorrowedTurn() bool {
	b := l.borrower.Load()
	return b != 0 && goid.Get() == b
}

// Poll runs one loop turn that does not block on the calling goroutine, when the loop sleeps
// in epoll_wait and its turn is free (borrowed as in Exec): the ready fds and completion
// channels (epoll_wait with timeout 0), the queue, due timers, CQ cycles and doorbells. It
// reports whether the turn handled anything; false also when the turn was not free. It is
// for a caller that busy-polls for its own completion (holding HoldSpin, so that its loop
// blocks instead of spinning): the completion is reaped and handed over on the caller's
// thread, with no loop wake-up between. The loop thread, waiting on the same epoll set,
// may still wake for what Poll handled; it then finds nothing to do.
func (l *Loop) Poll() bool {
	if !l.borrowTurn() {
		return false
	}
	defer l.endBorrow()
	l.watchForHolders()
	work, _ := l.borrowedBatch(l.epfd, 0)
	return work
}

// borrowedBatch is one batch of a borrowed turn: epoll_wait on set (the loop's, or the
// callers' set for ExecWait) for at most ms (0: no wait), the events (the eventfd left to the loop), the queue, due timers, CQ
// cycles, doorbells. It reports whether it handled anything, and woken: the eventfd was
// ready, so the loop thread is awake (or waking) for a submission or Stop.
func (l *Loop) borrowedBatch(set, ms int) (work, woken bool) {
	if ms != 0 {
		tracepoint.Mark(tracepoint.SleepCaller, ms)
	}
	n, err := unix.EpollWait(set, l.pevents, ms)
	tracepoint.Mark(tracepoint.CallerWoke, n)
	if ms != 0 {
		l.st.wakeups.Add(1)
	}
	if err != nil {
		n = 0
	}
	now := l.mono()
	l.now.Store(now)
	l.cbStart = now
	woken, work = l.dispatch(l.pevents[:n], true)
	if l.runQueue() > 0 {
		work = true
	}
	if len(l.timers) > 0 && l.timers[0].when <= now {
		work = true
		l.runTimers(now)
	}
	if len(l.kicks) > 0 {
		work = true
		l.runKicks()
	}
	l.flushCQs()
	return work, woken
}

// ExecWait is Exec and then, when f ran in a borrowed turn, a wait in that same turn, as the
// loop, until done reports true or d passed: one borrow for a send and the wait for its
// answer. Every fd, completion channel, timer and submission the wait finds is handled on
// the caller's thread, with the loop's doorbells flushed after each batch. The caller waits
// in the callers' set (the wake-up eventfd and the draining fds: AddDrained, completion
// channels), which the kernel wakes ahead of the loop's own set and instead of it: an
// answer wakes one thread, the caller's, with no system call to set the wait up. An answer
// faster than the wait's start (the caller's thread still in its send) wakes the loop
// thread, which finds the turn taken, disarms its set in the outer one and sleeps on,
// leaving the answer to the caller; an event of an fd outside the callers' set (Add) is
// taken over: the loop ends the wait through the eventfd and handles it once the turn is
// back. With a draining fd the kernel would not add there (the soft provider's epoll-fd
// channels), or while more than 3 in 10 of its waits there woke the loop (events close
// together, each coming while the caller was busy with the one before: waitChoice), the
// caller waits in the loop's own set instead, disarmed in the outer set once f's sends
// have left (no system call between the caller and its send). A submission or
// Stop (the eventfd) ends the wait: the loop takes over. When the turn is not free, f is
// queued as Submit would (borrowed false, no wait). done is called in the turn.
func (l *Loop) ExecWait(f func(), d time.Duration, done func() bool) (borrowed bool, err error) {
	if f == nil {
		return false, fmt.Errorf("reactor: exec wait: f: must not be nil: %w", ErrInvalid)
	}
	if !l.borrowTurn() {
		return false, l.trySubmit(f)
	}
	ran := false
	func() {
		defer l.endBorrow()
		// With every draining fd in the callers' set, the caller waits there unless the
		// traffic makes the disarm cheaper (waitChoice): the kernel wakes it alone for those
		// fds, and nothing is set up for the wait. Marked before f, so that the loop, should
		// an answer wake it before this wait begins, leaves the answer to this turn
		// (waitOuter) but never an event the callers' set does not see.
		onCallers := l.unpaired == 0 && l.choice.onCallers()
		l.onCallers.Store(onCallers)
		defer l.onCallers.Store(false)
		left := l.st.leftToCaller.Load()
		if ran = l.runBorrowed(f); !ran {
			return
		}
		l.waitTurnAt.Store(max(l.now.Load(), 1))
		if onCallers && l.unpaired == 0 {
			l.waitBorrowed(l.callers, d, done)
			l.choice.record(l.st.leftToCaller.Load() != left)
			return
		}
		// The loop's set is disarmed for the wait, f's sends having left first (no system
		// call between the caller and its send), and the caller waits in it: a draining fd
		// is outside the callers' set (the soft provider's channels), or events come close
		// together.
		l.onCallers.Store(false)
		l.blindForWait()
		defer l.unblind()
		l.waitBorrowed(l.epfd, d, done)
	}()
	if !ran {
		return false, l.trySubmit(f) // behind what was queued before it (runBorrowed)
	}
	return true, nil
}

// blindForWait starts a wait as the loop: the loop's set is disarmed in the outer set.
func (l *Loop) blindForWait() {
	l.waitTurnAt.Store(max(l.now.Load(), 1))
	l.holdMu.Lock()
	l.blind(+1)
	l.holdMu.Unlock()
}

// waitBorrowed is ExecWait's wait on set (the callers' set, or the loop's own set disarmed
// in the outer one), in a borrowed turn: it reports done's last answer.
func (l *Loop) waitBorrowed(set int, d time.Duration, done func() bool) bool {
	end := l.mono() + int64(d)
	for !done() {
		now := l.mono()
		if now >= end || l.stopped.Load() || l.state.Load() == awake {
			// Awake: the loop thread woke as the turn was borrowed (or a producer woke it)
			// and waits for it.
			return false
		}
		ms := timeoutMillis(end - now)
		if len(l.timers) > 0 {
			ms = min(ms, timeoutMillis(l.timers[0].when-now))
		}
		if _, woken := l.borrowedBatch(set, ms); woken {
			break // a submission or Stop: the loop thread is awake for it
		}
	}
	return done()
}

// unblind ends ExecWait's watch of the loop's set.
func (l *Loop) unblind() {
	l.holdMu.Lock()
	l.blind(-1)
	l.giveBackLoopBlind() // one re-arm for both
	l.holdMu.Unlock()
}
