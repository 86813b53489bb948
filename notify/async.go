package notify

import (
	"errors"
	"fmt"
	"sync/atomic"

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
// Each is counted (Stats.DeviceEvents, twosided_device_events_total). A fatal device stays
// failed until the engine is closed: it is not reopened.

// deviceEventCounters count the device's async events and what they did.
type deviceEventCounters struct {
	portErr, portActive, deviceFatal, gidChange, other, channelsFailed atomic.Uint64
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
		ChannelsFailed: c.channelsFailed.Load(), PortDown: st.down.Load()}
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
		log.Msg("rdma_twosided: device fatal: ctrl channels fail over to OOB")
		e.failChannels(ev)
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
