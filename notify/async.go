package notify

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/twosided/twosided/ctrlchannel"
	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/reactor"
)

// The rdma_twosided device's async events (ibv_get_async_event), watched on the reactor
// as Mooncake watches its context's async fd:
//
//   - PORT_ERR on the channels' port and DEVICE_FATAL fail every ctrl channel of the device
//     at once: each is drained (what its NIC acknowledged is delivered) and closed, so its
//     unacknowledged sends go on over OOB where fallback is on (Stats.Limits.Fallbacks), as
//     for any broken channel, instead of waiting for the QP's retries to run out. No
//     channel is made while the port is down or the device fatal: their handshakes are
//     served over OOB.
//   - PORT_ACTIVE lets channels be made again (the next send to a peer asks for one).
//   - GID_CHANGE selects the source GID again (ibv.SelectGID, MC_GID_INDEX honoured): the
//     channels made from then on advertise and use the new one.
//
// Each is counted (Stats.DeviceEvents, twosided_device_events_total).
//
// A fatal device is opened again: once its channels are closed and no channel is being
// made on it, a worker opens the device by name (off the loop: opening is a verb), with
// its port active and a source GID selected as at start, and the loop swaps it in (the old
// context, its PD and its async fd are released) and lets channels be made again. A try
// that fails (the device still fatal, gone, its port down) is tried again after a backoff,
// 100 ms doubling to 5 s, until the engine closes (DeviceEventStats.Reopened, ReopenFailed).

// deviceEventCounters count the device's async events and what they did.
type deviceEventCounters struct {
	portErr, portActive, deviceFatal, gidChange, other, channelsFailed atomic.Uint64
	reopened, reopenFailed                                             atomic.Uint64
}

// DeviceEventStats counts the async events of an rdma_twosided engine's device.
type DeviceEventStats struct {
	PortErr     uint64 // IBV_EVENT_PORT_ERR on the channels' port
	PortActive  uint64 // IBV_EVENT_PORT_ACTIVE on the channels' port
	DeviceFatal uint64 // IBV_EVENT_DEVICE_FATAL
	GIDChange   uint64 // IBV_EVENT_GID_CHANGE (the source GID was selected again)
	Other       uint64 // any other event (QP, CQ, other ports, LID, P_Key, SM changes)
	// ChannelsFailed: ctrl channels closed at once by a PORT_ERR or DEVICE_FATAL.
	ChannelsFailed uint64
	// Reopened: a fatal device opened again; ReopenFailed: tries that found it not usable yet.
	Reopened, ReopenFailed uint64
	// PortDown: now, a PORT_ERR (or DEVICE_FATAL) holds: no channel is made.
	PortDown bool
}

// DeviceEvents are the counters of the device's async events (zero on an engine without an
// RDMA device).
func (e *Engine) DeviceEvents() DeviceEventStats {
	st := e.cfg.dev
	if st == nil {
		return DeviceEventStats{}
	}
	c := &st.events
	return DeviceEventStats{PortErr: c.portErr.Load(), PortActive: c.portActive.Load(),
		DeviceFatal: c.deviceFatal.Load(), GIDChange: c.gidChange.Load(), Other: c.other.Load(),
		ChannelsFailed: c.channelsFailed.Load(), Reopened: c.reopened.Load(), ReopenFailed: c.reopenFailed.Load(),
		PortDown: st.down.Load()}
}

// startAsync puts the device's async fd in the reactor's epoll set. The loop watches a
// duplicate of it, which it closes when it stops; the device keeps and closes its own.
func (e *Engine) startAsync() {
	if e.dev == nil || e.cfg.dev == nil {
		return
	}
	fd := e.dev.AsyncFd()
	if fd < 0 {
		return
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		e.cfg.logger.Warn().Err(err).Str("device", e.devName).Msg("rdma_twosided: async events not watched: dup")
		return
	}
	if err := e.loop.Submit(func() {
		if err := e.loop.Add(dup, reactor.Readable, e.onAsync); err != nil {
			unix.Close(dup)
			e.cfg.logger.Warn().Err(err).Str("device", e.devName).Msg("rdma_twosided: async events not watched")
			return
		}
		e.cfg.dev.asyncFd = dup
	}); err != nil {
		unix.Close(dup)
	}
}

// onAsync reads every queued async event. Loop-only.
func (e *Engine) onAsync(reactor.Events) {
	for {
		ev, err := e.dev.GetAsyncEvent()
		if errors.Is(err, ibv.ErrWouldBlock) {
			return
		}
		if err != nil {
			// A broken async fd would stay readable: stop watching it rather than spin.
			e.cfg.logger.Warn().Err(err).Str("device", e.devName).Msg("rdma_twosided: async events: stop watching")
			if fd := e.cfg.dev.asyncFd; fd >= 0 {
				_ = e.loop.Close(fd)
				e.cfg.dev.asyncFd = -1
			}
			return
		}
		e.asyncEvent(ev)
		e.dev.AckAsyncEvent(ev)
	}
}

// asyncEvent acts on one event. Loop-only.
func (e *Engine) asyncEvent(ev ibv.AsyncEvent) {
	st := e.cfg.dev
	c := &st.events
	ours := ev.Port == 0 || ev.Port == st.port
	log := e.cfg.logger.Info().Str("device", e.devName).Uint8("port", ev.Port).Stringer("event", ev.Type)
	switch {
	case ev.Type == ibv.EventPortErr && ours:
		c.portErr.Add(1)
		st.portDown = true
		st.down.Store(true)
		log.Msg("rdma_twosided: port down: ctrl channels fail over to OOB")
		e.failChannels(ev)
	case ev.Type == ibv.EventDeviceFatal:
		c.deviceFatal.Add(1)
		st.fatal = true
		st.down.Store(true)
		log.Msg("rdma_twosided: device fatal: ctrl channels fail over to OOB; the device is opened again when it can be")
		e.failChannels(ev)
		e.scheduleReopen()
	case ev.Type == ibv.EventPortActive && ours:
		c.portActive.Add(1)
		st.portDown = false
		st.down.Store(st.fatal)
		log.Msg("rdma_twosided: port active: ctrl channels can be made again")
	case ev.Type == ibv.EventGIDChange && ours:
		c.gidChange.Add(1)
		e.reselectGID()
	default:
		c.other.Add(1)
		e.cfg.logger.Debug().Str("device", e.devName).Uint8("port", ev.Port).Stringer("event", ev.Type).Msg("rdma_twosided: async event")
	}
}

// failChannels drains and closes every ctrl channel of the device (all of the engine's). The
// machine sends what they left unacknowledged over OOB where fallback is on. Loop-only.
func (e *Engine) failChannels(ev ibv.AsyncEvent) {
	if e.closing {
		return
	}
	err := fmt.Errorf("%w: device %s: %s (port %d)", ctrlchannel.ErrPeerError, e.devName, ev.Type, ev.Port)
	chans := make([]*ctrlchannel.Channel, 0, len(e.chans))
	for _, ch := range e.chans {
		chans = append(chans, ch)
	}
	for _, ch := range chans {
		e.drainForClose(ch) // what the NIC acknowledged is delivered, not dropped
		ch.Close(err)
	}
	e.cfg.dev.events.channelsFailed.Add(uint64(len(chans)))
}

// reselectGID chooses the source GID again after a GID table change. Loop-only.
func (e *Engine) reselectGID() {
	st := e.cfg.dev
	pa, err := e.dev.QueryPort(st.port)
	if err == nil {
		var g ibv.GIDEntry
		if g, err = ibv.SelectGID(pa, st.gidRequested); err == nil {
			e.useGID(g, pa)
			return
		}
	}
	e.cfg.logger.Warn().Err(err).Str("device", e.devName).Int("gid_index", st.gid.Index).
		Msg("rdma_twosided: GID table changed and no source GID fits: the current one is kept")
}

// CreateQP refuses while the port is down or the device fatal (async events), so no ctrl
// channel is made then: its peer is served over OOB.
func (p *channelPD) CreateQP(attr ibv.QPInitAttr) (ibv.QP, error) {
	if p.st != nil && p.st.down.Load() {
		return nil, fmt.Errorf("%w: the device's port is down (async event)", ibv.ErrNoDevice)
	}
	return p.PD.CreateQP(attr)
}

// reopenState is the reopening of a fatal device. Loop-owned.
type reopenState struct {
	timer   *reactor.Timer
	armed   bool          // a try is scheduled
	running bool          // a worker is opening the device
	pause   time.Duration // the backoff before the next try
	wg      sync.WaitGroup
}

// Reopen backoff: the first try after reopenFirst, doubling to reopenMax.
const (
	reopenFirst = 100 * time.Millisecond
	reopenMax   = 5 * time.Second
)

// scheduleReopen arms the next try to open a fatal device again. Loop-only.
func (e *Engine) scheduleReopen() {
	st := e.cfg.dev
	r := &st.reopen
	if r.armed || r.running || e.closing || !st.fatal {
		return
	}
	switch {
	case r.pause == 0:
		r.pause = reopenFirst
	default:
		r.pause = min(2*r.pause, reopenMax)
	}
	r.armed = true
	if r.timer == nil {
		r.timer = e.loop.AfterFunc(r.pause, e.tryReopen)
		return
	}
	r.timer.Reset(r.pause)
}

// tryReopen starts a worker that opens the fatal device again, once nothing uses the old
// one: no channel open and none being made. Loop-only.
func (e *Engine) tryReopen() {
	st := e.cfg.dev
	st.reopen.armed = false
	if e.closing || !st.fatal {
		return
	}
	if len(e.chans) > 0 || st.workers.inFlight() > 0 {
		e.scheduleReopen() // closing channels still hold the old context
		return
	}
	st.reopen.running = true
	st.reopen.wg.Add(1) // closeDevice waits for it
	provider, name, port, gidIndex := st.provider, e.devName, st.port, st.gidRequested
	go func() {
		defer st.reopen.wg.Done()
		r := openAgain(provider, name, port, gidIndex)
		if !e.handToLoop(func() { e.finishReopen(r) }) {
			r.release() // the loop has stopped: the engine is closing
		}
	}()
}

// reopened is what a reopening worker found: the device open again with its PD, port and
// source GID, or why not.
type reopened struct {
	ctx  ibv.Context
	pd   ibv.PD
	port ibv.PortAttr
	gid  ibv.GIDEntry
	err  error
}

func (r *reopened) release() {
	if r.pd != nil {
		_ = r.pd.Dealloc()
	}
	if r.ctx != nil {
		_ = r.ctx.Close()
	}
}

// openAgain opens device name of provider and readies it as openDevice does: port active,
// a source GID (gidIndex as configured), a PD. Any goroutine.
func openAgain(provider, name string, portNum uint8, gidIndex int) *reopened {
	r := &reopened{}
	if r.ctx, r.err = ibv.OpenDevice(provider, name); r.err != nil {
		return r
	}
	if r.port, r.err = r.ctx.QueryPort(portNum); r.err == nil && r.port.State != ibv.PortActive {
		r.err = fmt.Errorf("port %d is %v", portNum, r.port.State)
	}
	if r.err == nil {
		r.gid, r.err = ibv.SelectGID(r.port, gidIndex)
	}
	if r.err == nil {
		r.pd, r.err = r.ctx.AllocPD()
	}
	if r.err != nil {
		r.release()
		r.ctx, r.pd = nil, nil
	}
	return r
}

// finishReopen swaps a reopened device in, or schedules the next try. Loop-only.
func (e *Engine) finishReopen(r *reopened) {
	st := e.cfg.dev
	st.reopen.running = false
	if e.closing || !st.fatal || e.dev == nil {
		r.release()
		return
	}
	if r.err == nil && st.workers.inFlight() > 0 {
		// A channel began to be made on the old context meanwhile (it fails: the device is
		// down): the old context outlives it, and the swap waits for the next try.
		r.release()
		e.scheduleReopen()
		return
	}
	if r.err != nil {
		st.events.reopenFailed.Add(1)
		e.cfg.logger.Debug().Err(r.err).Str("device", e.devName).Msg("rdma_twosided: fatal device not usable yet")
		e.scheduleReopen()
		return
	}
	if fd := st.asyncFd; fd >= 0 {
		_ = e.loop.Close(fd)
		st.asyncFd = -1
	}
	oldPD, oldDev := e.pd, e.dev
	if oldPD != nil {
		_ = oldPD.Dealloc()
	}
	_ = oldDev.Close()
	e.dev, e.pd = r.ctx, &channelPD{PD: r.pd, qp: e.cfg.qp, st: st}
	st.fatal, st.portDown = false, false
	st.down.Store(false)
	st.reopen.pause = 0
	e.useGID(r.gid, r.port)
	st.events.reopened.Add(1)
	e.cfg.logger.Info().Str("device", e.devName).Msg("rdma_twosided: fatal device opened again: ctrl channels can be made again")
	e.startAsync()
}
