package reactor

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Add registers fd, level-triggered, for ev; h gets its ready events on the loop. The loop
// owns fd from now on and closes it at Stop unless it is removed first. Loop only.
func (l *Loop) Add(fd int, ev Events, h Handler) error {
	if !l.InLoop() {
		return fmt.Errorf("reactor: add fd %d: %w", fd, ErrNotInLoop)
	}
	if fd < 0 {
		return fmt.Errorf("reactor: add: fd %d: must not be negative: %w", fd, ErrInvalid)
	}
	if h == nil {
		return fmt.Errorf("reactor: add fd %d: handler: must not be nil: %w", fd, ErrInvalid)
	}
	if _, ok := l.fds[fd]; ok {
		return fmt.Errorf("reactor: add fd %d: %w", fd, ErrRegistered)
	}
	return l.register(fd, ev, &fdEntry{kind: kindUser, h: h})
}

func (l *Loop) register(fd int, ev Events, e *fdEntry) error {
	l.gen++
	e.gen = l.gen
	e.ev = ev
	ee := unix.EpollEvent{Events: uint32(ev), Fd: int32(fd), Pad: int32(e.gen)}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, fd, &ee); err != nil {
		return fmt.Errorf("reactor: epoll_ctl add fd %d: %w", fd, err)
	}
	l.fds[fd] = e
	return nil
}

func (l *Loop) userEntry(op string, fd int) (*fdEntry, error) {
	if !l.InLoop() {
		return nil, fmt.Errorf("reactor: %s fd %d: %w", op, fd, ErrNotInLoop)
	}
	e, ok := l.fds[fd]
	if !ok || e.kind != kindUser {
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
	ee := unix.EpollEvent{Events: uint32(ev), Fd: int32(fd), Pad: int32(e.gen)}
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_MOD, fd, &ee); err != nil {
		return fmt.Errorf("reactor: epoll_ctl mod fd %d: %w", fd, err)
	}
	e.ev = ev
	return nil
}

// Remove unregisters fd; the caller owns it again (and must close it). Events of fd already
// collected in this loop iteration are dropped. Loop only.
func (l *Loop) Remove(fd int) error {
	if _, err := l.userEntry("remove", fd); err != nil {
		return err
	}
	delete(l.fds, fd)
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, fd, nil); err != nil {
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
