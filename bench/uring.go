package bench

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A minimal io_uring for floor-uring: one small ring owned by one locked thread, SEND and
// RECV on sockets, waits bounded by a timeout (IORING_ENTER_EXT_ARG). The kernel's ABI
// (include/uapi/linux/io_uring.h) is spelled out here; no C library is involved.

const (
	uringOpSend     = 26 // IORING_OP_SEND
	uringOpRecv     = 27 // IORING_OP_RECV
	uringOpEpollCtl = 29 // IORING_OP_EPOLL_CTL

	uringSkipSuccess = 1 << 6 // IOSQE_CQE_SKIP_SUCCESS: no completion unless the request fails

	uringEnterGetEvents = 1 << 0 // IORING_ENTER_GETEVENTS
	uringEnterExtArg    = 1 << 3 // IORING_ENTER_EXT_ARG

	uringFeatSingleMmap = 1 << 0 // IORING_FEAT_SINGLE_MMAP
	uringFeatExtArg     = 1 << 8 // IORING_FEAT_EXT_ARG

	uringSetupSingleIssuer = 1 << 12 // IORING_SETUP_SINGLE_ISSUER
	uringSetupDeferTaskrun = 1 << 13 // IORING_SETUP_DEFER_TASKRUN

	uringOffSQRing = 0
	uringOffCQRing = 0x8000000
	uringOffSQEs   = 0x10000000
)

// errNoURing: the kernel has no io_uring (too old, or disabled by kernel.io_uring_disabled),
// or lacks a feature floor-uring needs.
var errNoURing = errors.New("bench: io_uring unavailable")

type uringParams struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFD uint32
	resv                                                                   [3]uint32
	sqOff                                                                  struct {
		head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
		userAddr                                                        uint64
	}
	cqOff struct {
		head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
		userAddr                                                        uint64
	}
}

// uringSQE is struct io_uring_sqe (64 bytes).
type uringSQE struct {
	opcode, flags uint8
	ioprio        uint16
	fd            int32
	off, addr     uint64
	len, opFlags  uint32
	userData      uint64
	bufIndex      uint16
	personality   uint16
	spliceFDIn    int32
	addr3, pad    uint64
}

// uringCQE is struct io_uring_cqe (16 bytes).
type uringCQE struct {
	userData uint64
	res      int32
	flags    uint32
}

type uringGetEventsArg struct {
	sigmask   uint64
	sigmaskSz uint32
	minWaitUS uint32
	ts        uint64
}

type uring struct {
	fd             int
	rings, sqeMem  []byte
	sqTail         *uint32 // the submitter never reads the kernel's head: the ring stays below a quarter full
	sqMask         uint32
	sqArray        unsafe.Pointer
	cqHead, cqTail *uint32
	cqMask         uint32
	cqes           unsafe.Pointer
	sqes           unsafe.Pointer
	pending        uint32 // entries queued since the last enter
	ts             unix.Timespec
	arg            uringGetEventsArg
}

// newURing sets up a ring of entries submission slots. single: for the calling thread
// alone (which must stay locked to it: a single-issuer ring whose completions run when that
// thread waits); else any thread may submit and wait, as a reactor's borrowed turn would.
func newURing(entries uint32, single bool) (*uring, error) {
	var p uringParams
	if single {
		p.flags = uringSetupSingleIssuer | uringSetupDeferTaskrun
	}
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno == unix.EINVAL && single { // a kernel before 6.1: no deferred task work
		p = uringParams{}
		fd, _, errno = unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	}
	if errno != 0 {
		return nil, fmt.Errorf("%w: io_uring_setup: %v", errNoURing, errno)
	}
	r := &uring{fd: int(fd)}
	if p.features&uringFeatSingleMmap == 0 || p.features&uringFeatExtArg == 0 {
		r.close()
		return nil, fmt.Errorf("%w: features %#x lack a single mmap or timed waits", errNoURing, p.features)
	}
	size := max(int(p.sqOff.array)+int(p.sqEntries)*4, int(p.cqOff.cqes)+int(p.cqEntries)*int(unsafe.Sizeof(uringCQE{})))
	var err error
	if r.rings, err = unix.Mmap(r.fd, uringOffSQRing, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		r.close()
		return nil, fmt.Errorf("bench: io_uring rings: %w", err)
	}
	if r.sqeMem, err = unix.Mmap(r.fd, uringOffSQEs, int(p.sqEntries)*int(unsafe.Sizeof(uringSQE{})), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		r.close()
		return nil, fmt.Errorf("bench: io_uring entries: %w", err)
	}
	at := func(off uint32) unsafe.Pointer { return unsafe.Pointer(&r.rings[off]) }
	r.sqTail = (*uint32)(at(p.sqOff.tail))
	r.sqMask = *(*uint32)(at(p.sqOff.ringMask))
	r.sqArray = at(p.sqOff.array)
	r.cqHead, r.cqTail = (*uint32)(at(p.cqOff.head)), (*uint32)(at(p.cqOff.tail))
	r.cqMask = *(*uint32)(at(p.cqOff.ringMask))
	r.cqes = at(p.cqOff.cqes)
	r.sqes = unsafe.Pointer(&r.sqeMem[0])
	r.arg.ts = uint64(uintptr(unsafe.Pointer(&r.ts)))
	return r, nil
}

// queue fills the next submission slot with an operation on buf; it is submitted by the
// next enter. The ring is sized so that a caller never queues more than it has slots
// between two enters.
func (r *uring) queue(op uint8, flags uint8, fd int, buf []byte, opFlags uint32, userData uint64) {
	sqe := uringSQE{opcode: op, flags: flags, fd: int32(fd), len: uint32(len(buf)), opFlags: opFlags, userData: userData}
	if len(buf) > 0 {
		sqe.addr = uint64(uintptr(unsafe.Pointer(&buf[0])))
	}
	r.push(&sqe)
}

// queueEpollCtl queues an epoll_ctl(epfd, op, fd, ev); ev must stay put until the next
// enter, which runs it in order with what was queued before it.
func (r *uring) queueEpollCtl(flags uint8, epfd, op, fd int, ev *unix.EpollEvent, userData uint64) {
	r.push(&uringSQE{opcode: uringOpEpollCtl, flags: flags, fd: int32(epfd), off: uint64(fd), len: uint32(op),
		addr: uint64(uintptr(unsafe.Pointer(ev))), userData: userData})
}

func (r *uring) push(e *uringSQE) {
	tail := *r.sqTail // only the thread that holds the ring writes the tail
	i := tail & r.sqMask
	*(*uringSQE)(unsafe.Add(r.sqes, uintptr(i)*unsafe.Sizeof(uringSQE{}))) = *e
	*(*uint32)(unsafe.Add(r.sqArray, uintptr(i)*4)) = i
	atomic.StoreUint32(r.sqTail, tail+1) // the kernel reads the entry after it sees the tail
	r.pending++
}

// enter submits what was queued and waits, at most timeout, until a completion is there.
// It returns errDeadline when none came in time.
func (r *uring) enter(timeout time.Duration) error {
	if r.ready() > 0 && r.pending == 0 {
		return nil
	}
	// The clock is read once up front and again only after a wait that brought nothing
	// (not twice per call).
	deadline := nanotime() + int64(timeout)
	left := int64(timeout)
	for {
		r.ts = unix.NsecToTimespec(max(left, 0))
		n, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(r.pending), 1,
			uringEnterGetEvents|uringEnterExtArg, uintptr(unsafe.Pointer(&r.arg)), unsafe.Sizeof(r.arg))
		switch errno {
		case 0:
			// The count submitted; a wait that ended without a completion (its bound, a
			// signal) is not reported when something was submitted.
			r.pending -= uint32(n)
			if r.pending == 0 && r.ready() > 0 {
				return nil
			}
		case unix.EINTR:
		case unix.ETIME:
			if r.pending == 0 {
				return errDeadline
			}
		default:
			return fmt.Errorf("bench: io_uring_enter: %w", errno)
		}
		if left = deadline - nanotime(); left <= 0 {
			return errDeadline
		}
	}
}

func (r *uring) ready() uint32 { return atomic.LoadUint32(r.cqTail) - *r.cqHead }

// reap hands each completion there to f, then frees their slots.
func (r *uring) reap(f func(userData uint64, res int32)) {
	head, tail := *r.cqHead, atomic.LoadUint32(r.cqTail)
	for ; head != tail; head++ {
		c := (*uringCQE)(unsafe.Add(r.cqes, uintptr(head&r.cqMask)*unsafe.Sizeof(uringCQE{})))
		f(c.userData, c.res)
	}
	atomic.StoreUint32(r.cqHead, head)
}

func (r *uring) close() {
	if r.sqeMem != nil {
		_ = unix.Munmap(r.sqeMem)
		r.sqeMem = nil
	}
	if r.rings != nil {
		_ = unix.Munmap(r.rings)
		r.rings = nil
	}
	if r.fd >= 0 {
		_ = unix.Close(r.fd)
		r.fd = -1
	}
}
