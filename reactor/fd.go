package reactor

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Add registers fd, level-triggered, for ev; h gets its ready events on the loop. The loop
// owns fd from now on and closes it at Stop unless it is removed first. Loop only.
func (l *Loop) Add(fd int, ev Events, h Handler) error { return l.addUser(fd, ev, h, false) }

// AddDrained is Add for a handler that drains: each call consumes the readiness it is
// called for (reads or accepts until EAGAIN or a short read, writes until EAGAIN or nothing
// is left to write) or arranges to be called again (a func it submits). Such an fd's events
// wake a caller waiting as the loop (ExecWait) and only that caller, leaving the loop thread
// asleep, with no system call to set the wait up: the fd is in the callers' set as well as
// the loop's, ahead of it (see "Callers' set" in the package doc). A handler that leaves
// readiness behind would leave it unseen once the caller's turn ends, until the fd's next
// event. Loop only.
func (l *Loop) AddDrained(fd int, ev Events, h Handler) error { return l.addUser(fd, ev, h, true) }

func (l *Loop) addUser(fd int, ev Events, h Handler, drained bool) error {
	if !l.InLoop() {
		return fmt.Errorf("reactor: add fd %d: %w", fd, ErrNotInLoop)
	}
	if fd < 0 {
		return fmt.Errorf("reactor: add: fd %d: must not be negative: %w", fd, ErrInvalid)
	}
	if h == nil {
		return fmt.Errorf("reactor: add fd %d: handler: must not be nil: %w", fd, ErrInvalid)
	}
	if l.fds.get(fd) != nil {
		return fmt.Errorf("reactor: add fd %d: %w", fd, ErrRegistered)
	}
	return l.register(fd, ev, &fdEntry{kind: kindUser, h: h, drained: drained})
}

func (l *Loop) register(fd int, ev Events, e *fdEntry) error {
	l.gen = (l.gen + 1) & genMask
	e.gen = l.gen
	if err := l.arm(fd, ev, e); err != nil {
		return fmt.Errorf("reactor: epoll_ctl add fd %d: %w", fd, err)
	}
	l.fds.set(fd, e)
	return nil
}

// genMask keeps fd generations below seenBit, the flag in an event's data that says the fd
// is in the callers' set too.
const (
	genMask = 1<<31 - 1
	seenBit = 1 << 31
)

// exclusiveOK: the events EPOLLEXCLUSIVE may be registered with.
const exclusiveOK = unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLERR | unix.EPOLLHUP | unix.EPOLLET

// arm adds fd to the loop's set for ev and, for a draining handler, to the callers' set
// first, both exclusively: the kernel runs an fd's wake-ups in the order they were added
// and stops at the first exclusive one whose set has a waiter, so an event reaches the
// loop only when no caller waits on the callers' set. An fd the kernel will not add
// exclusively (an epoll fd, as the soft provider's channels; a kernel before 4.5) or
// registered for events outside exclusiveOK goes in the loop's set alone, and counts in
// unpaired: ExecWait's callers then disarm the loop's set instead (the callers' set would
// not see it).
func (l *Loop) arm(fd int, ev Events, e *fdEntry) error {
	e.ev, e.paired = ev, false
	ee := unix.EpollEvent{Events: uint32(ev), Fd: int32(fd), Pad: int32(e.gen)}
	if e.drained && uint32(ev)&^exclusiveOK == 0 {
		xe := ee
		xe.Events |= unix.EPOLLEXCLUSIVE
		xe.Pad = int32(e.gen | seenBit)
		if unix.EpollCtl(l.callers, unix.EPOLL_CTL_ADD, fd, &xe) == nil {
			if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, fd, &xe); err != nil {
				_ = unix.EpollCtl(l.callers, unix.EPOLL_CTL_DEL, fd, nil)
				return err
			}
			e.paired = true
			return nil
		}
	}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, fd, &ee); err != nil {
		return err
	}
	if e.drained {
		l.unpaired++
	}
	return nil
}

// disarm takes fd out of the loop's set (and the callers' set).
func (l *Loop) disarm(fd int, e *fdEntry) error {
	if e.paired {
		_ = unix.EpollCtl(l.callers, unix.EPOLL_CTL_DEL, fd, nil)
	} else if e.drained {
		l.unpaired--
	}
	return unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, fd, nil)
}

func (l *Loop) userEntry(op string, fd int) (*fdEntry, error) {
	if !l.InLoop() {
		return nil, fmt.Errorf("reactor: %s fd %d: %w", op, fd, ErrNotInLoop)
	}
	e := l.fds.get(fd)
	if e == nil || e.kind != kindUser {
		return nil, fmt.Errorf("reactor: %s fd %d: %w", op, fd, ErrNotRegistered)
	}
	return e, nil
}

// Modify changes the events fd is registered for. Loop only.
func (l *Loop) Modify(fd int, ev Events) error {
	e, err := l.userEntry("modify", fd)
	if err != nil {
		return err
	}
	if !e.paired {
		ee := unix.EpollEvent{Events: uint32(ev), Fd: int32(fd), Pad: int32(e.gen)}
		if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_MOD, fd, &ee); err != nil {
			return fmt.Errorf("reactor: epoll_ctl mod fd %d: %w", fd, err)
		}
		e.ev = ev
		return nil
	}
	// An exclusive registration cannot be modified: taken out of both sets and added again,
	// in the same order (what is ready then is queued again, as a modify would).
	if err := l.disarm(fd, e); err != nil {
		return fmt.Errorf("reactor: epoll_ctl mod fd %d: del: %w", fd, err)
	}
	if err := l.arm(fd, ev, e); err != nil {
		// In neither set now: the owner's error path closes it (Close does not fail on it).
		e.lost = true
		return fmt.Errorf("reactor: epoll_ctl mod fd %d: add: %w", fd, err)
	}
	return nil
}

// Remove unregisters fd; the caller owns it again (and must close it). Events of fd already
// collected in this loop iteration are dropped. Loop only.
func (l *Loop) Remove(fd int) error {
	e, err := l.userEntry("remove", fd)
	if err != nil {
		return err
	}
	l.fds.del(fd)
	if e.lost {
		return nil // a failed Modify left it in neither set
	}
	if err := l.disarm(fd, e); err != nil {
		return fmt.Errorf("reactor: epoll_ctl del fd %d: %w", fd, err)
	}
	return nil
}

// Close is Remove followed by closing fd. Loop only. A registered fd is closed even when
// epoll_ctl fails to remove it (closing takes it out of the set anyway), so after any error
// but ErrNotInLoop and ErrNotRegistered the fd is gone: the caller must not close it again
// (its number may already be someone else's).
func (l *Loop) Close(fd int) error {
	err := l.Remove(fd)
	if errors.Is(err, ErrNotInLoop) || errors.Is(err, ErrNotRegistered) {
		return err
	}
	if cerr := unix.Close(fd); cerr != nil {
		return errors.Join(err, fmt.Errorf("reactor: close fd %d: %w", fd, cerr))
	}
	return err
}

// fdTable holds the entries of the registered fds, indexed by fd: fds are small integers
// that the kernel hands out lowest first, and dispatch looks one up per event (a map's
// lookup there was 1.1 % of a softverbs echo's user samples, its cache lines cold after
// each wake-up). Loop only.
type fdTable struct{ s []*fdEntry }

func (t *fdTable) get(fd int) *fdEntry {
	if uint(fd) < uint(len(t.s)) {
		return t.s[fd]
	}
	return nil
}

func (t *fdTable) set(fd int, e *fdEntry) {
	if fd >= len(t.s) {
		n := max(fd+1, 2*len(t.s), 64)
		s := make([]*fdEntry, n)
		copy(s, t.s)
		t.s = s
	}
	t.s[fd] = e
}

func (t *fdTable) del(fd int) {
	if uint(fd) < uint(len(t.s)) {
		t.s[fd] = nil
	}
}
