package soft

import (
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/twosided/twosided/ibv"
)

// eventfd is a non-blocking eventfd used as a level: readable while its owner has something.
type eventfd int

func newEventfd() (eventfd, error) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	return eventfd(fd), err
}

func (e eventfd) raise() {
	one := [8]byte{1}
	_, _ = unix.Write(int(e), one[:])
}

func (e eventfd) drain() {
	var b [8]byte
	_, _ = unix.Read(int(e), b[:])
}

// nestedEpoll makes an epoll fd that is readable while any of fds is.
func nestedEpoll(fds ...int) (int, error) {
	efd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("epoll_create1: %w", err)
	}
	for _, fd := range fds {
		if err := unix.EpollCtl(efd, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}); err != nil {
			unix.Close(efd)
			return -1, fmt.Errorf("epoll_ctl add %d: %w", fd, err)
		}
	}
	return efd, nil
}

// context is an open soft device.
type context struct {
	d       *device
	asyncFd eventfd

	mu     sync.Mutex
	events []ibv.AsyncEvent
	closed bool
	qps    map[*qp]struct{}
	cqs    map[*cq]struct{}
	chans  map[*channel]struct{}
	pds    map[*pd]struct{}
}

func newContext(d *device) *context {
	fd, err := newEventfd()
	if err != nil {
		fd = -1
	}
	return &context{d: d, asyncFd: fd, qps: map[*qp]struct{}{}, cqs: map[*cq]struct{}{},
		chans: map[*channel]struct{}{}, pds: map[*pd]struct{}{}}
}

var _ ibv.Context = (*context)(nil)

func (x *context) Device() ibv.DeviceInfo { return x.d.info() }

func (x *context) QueryPort(port uint8) (ibv.PortAttr, error) {
	if port != 1 {
		return ibv.PortAttr{}, fmt.Errorf("soft: %s: query port: port %d: only port 1 exists: %w", x.d.name, port, ibv.ErrInvalid)
	}
	return x.d.info().Ports[0], nil
}

func (x *context) check() error {
	if x.closed {
		return fmt.Errorf("soft: %s: context: %w", x.d.name, ibv.ErrClosed)
	}
	return nil
}

func (x *context) AllocPD() (ibv.PD, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if err := x.check(); err != nil {
		return nil, err
	}
	p := &pd{ctx: x, mrs: map[*mr]struct{}{}}
	x.pds[p] = struct{}{}
	return p, nil
}

func (x *context) CreateCompChannel() (ibv.CompChannel, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if err := x.check(); err != nil {
		return nil, err
	}
	fd, err := newEventfd()
	if err != nil {
		return nil, fmt.Errorf("soft: %s: create comp channel: eventfd: %w", x.d.name, err)
	}
	ch := &channel{ctx: x, fd: fd, efd: -1, ring: make([]*cq, 8)}
	if x.d.pfd >= 0 {
		// The device's progress set joins this epoll fd only while the channel holds it
		// (device.enrol): one channel of the device at a time.
		if ch.efd, err = nestedEpoll(int(fd)); err != nil {
			unix.Close(int(fd))
			return nil, fmt.Errorf("soft: %s: create comp channel: %w", x.d.name, err)
		}
		x.d.enrol(ch)
	}
	x.chans[ch] = struct{}{}
	return ch, nil
}

// MaxCQE is the largest CQ a soft device makes.
const MaxCQE = 1 << 20

func (x *context) CreateCQ(cqe int, ch ibv.CompChannel) (ibv.CQ, error) {
	if cqe < 1 || cqe > MaxCQE {
		return nil, fmt.Errorf("soft: %s: create cq: cqe %d: must be 1..%d: %w", x.d.name, cqe, MaxCQE, ibv.ErrInvalid)
	}
	var sch *channel
	if ch != nil {
		c, ok := ch.(*channel)
		if !ok || c.ctx != x {
			return nil, fmt.Errorf("soft: %s: create cq: channel: not a channel of this context: %w", x.d.name, ibv.ErrInvalid)
		}
		sch = c
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if err := x.check(); err != nil {
		return nil, err
	}
	if sch != nil {
		sch.mu.Lock()
		if sch.closed {
			sch.mu.Unlock()
			return nil, fmt.Errorf("soft: %s: create cq: channel: %w", x.d.name, ibv.ErrClosed)
		}
		sch.cqs++
		sch.mu.Unlock()
	}
	c := &cq{ctx: x, ch: sch, ring: make([]ibv.WC, cqe)}
	x.cqs[c] = struct{}{}
	return c, nil
}

func (x *context) AsyncFd() int { return int(x.asyncFd) }

func (x *context) GetAsyncEvent() (ibv.AsyncEvent, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if len(x.events) == 0 {
		return ibv.AsyncEvent{}, ibv.ErrWouldBlock
	}
	ev := x.events[0]
	x.events = append(x.events[:0], x.events[1:]...)
	if len(x.events) == 0 {
		x.asyncFd.drain()
	}
	return ev, nil
}

func (x *context) AckAsyncEvent(ibv.AsyncEvent) {}

// raise queues an async event and makes the async fd readable.
func (x *context) raise(ev ibv.AsyncEvent) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return
	}
	x.events = append(x.events, ev)
	if len(x.events) == 1 {
		x.asyncFd.raise()
	}
}

// Close destroys what the caller left (QPs, CQs, channels, MRs, PDs) and closes the device
// when this was its last context.
func (x *context) Close() error {
	x.mu.Lock()
	if x.closed {
		x.mu.Unlock()
		return fmt.Errorf("soft: %s: close: %w", x.d.name, ibv.ErrClosed)
	}
	x.closed = true
	qps := keys(x.qps)
	cqs := keys(x.cqs)
	chans := keys(x.chans)
	pds := keys(x.pds)
	x.mu.Unlock()
	for _, q := range qps {
		q.destroy()
	}
	for _, p := range pds {
		p.mu.Lock()
		for m := range p.mrs {
			x.d.removeMR(m)
		}
		p.mu.Unlock()
	}
	for _, c := range cqs {
		c.mu.Lock()
		c.destroyed = true
		c.disarmLocked()
		c.mu.Unlock()
	}
	for _, ch := range chans {
		ch.mu.Lock()
		if !ch.closed {
			ch.closed = true
			ch.closeFds()
		}
		ch.mu.Unlock()
	}
	unix.Close(int(x.asyncFd))
	return x.d.closeContext(x)
}

func keys[K comparable](m map[K]struct{}) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// pd is a protection domain.
type pd struct {
	ctx  *context
	mu   sync.Mutex
	mrs  map[*mr]struct{}
	qps  int
	gone bool
}

var _ ibv.PD = (*pd)(nil)

func (p *pd) RegMR(buf []byte, access ibv.AccessFlags) (ibv.MR, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("soft: reg mr: buf: empty: %w", ibv.ErrInvalid)
	}
	if access&^(ibv.AccessLocalWrite|ibv.AccessRemoteWrite|ibv.AccessRemoteRead|ibv.AccessRemoteAtomic) != 0 {
		return nil, fmt.Errorf("soft: reg mr: access %#x: unknown flags: %w", uint32(access), ibv.ErrInvalid)
	}
	if access&(ibv.AccessRemoteWrite|ibv.AccessRemoteAtomic) != 0 && access&ibv.AccessLocalWrite == 0 {
		return nil, fmt.Errorf("soft: reg mr: access %#x: remote write/atomic needs local write: %w", uint32(access), ibv.ErrInvalid)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gone {
		return nil, fmt.Errorf("soft: reg mr: pd: %w", ibv.ErrClosed)
	}
	m := &mr{pd: p, buf: buf, access: access, addr: uint64(uintptr(unsafe.Pointer(&buf[0])))}
	p.ctx.d.addMR(m)
	p.mrs[m] = struct{}{}
	return m, nil
}

func (p *pd) CreateQP(attr ibv.QPInitAttr) (ibv.QP, error) { return newQP(p, attr) }

func (p *pd) Dealloc() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gone {
		return fmt.Errorf("soft: dealloc pd: %w", ibv.ErrClosed)
	}
	if len(p.mrs) > 0 || p.qps > 0 {
		return fmt.Errorf("soft: dealloc pd: %d MRs and %d QPs still use it: %w", len(p.mrs), p.qps, ibv.ErrBusy)
	}
	p.gone = true
	p.ctx.mu.Lock()
	delete(p.ctx.pds, p)
	p.ctx.mu.Unlock()
	return nil
}

// mr is a registered memory region over caller memory; it keeps buf alive.
type mr struct {
	pd     *pd
	buf    []byte
	access ibv.AccessFlags
	addr   uint64
	lkey   uint32
	gone   bool
}

var _ ibv.MR = (*mr)(nil)

func (m *mr) LKey() uint32            { return m.lkey }
func (m *mr) RKey() uint32            { return m.lkey }
func (m *mr) Addr() uint64            { return m.addr }
func (m *mr) Len() int                { return len(m.buf) }
func (m *mr) Access() ibv.AccessFlags { return m.access }
func (m *mr) Buf() []byte             { return m.buf }

func (m *mr) Dereg() error {
	m.pd.mu.Lock()
	defer m.pd.mu.Unlock()
	if m.gone {
		return fmt.Errorf("soft: dereg mr %#x: %w", m.lkey, ibv.ErrClosed)
	}
	m.gone = true
	delete(m.pd.mrs, m)
	m.pd.ctx.d.removeMR(m)
	return nil
}
