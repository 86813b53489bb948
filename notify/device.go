package notify

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/twosided/twosided/ctrlchannel"
	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/ibv/soft" // the software RC provider, always present
)

var softNotice sync.Once

// openDevice picks and opens the device of the rdma_twosided transport: the forced
// provider if any; MC_TE_FILTERS; then the first device with an active port, real devices
// before soft ones. Devices whose ports are all down (phantom NICs) are skipped.
func (e *Engine) openDevice() error {
	var devs []ibv.DeviceInfo
	var errs []error
	for _, p := range ibv.Providers() {
		if e.cfg.provider != "" && p.Name() != e.cfg.provider {
			continue
		}
		if f, ok := p.(ibv.ForkIniter); ok && e.cfg.forkSafe == 1 {
			if err := f.ForkInit(); err != nil {
				return fmt.Errorf("%w: fork_safe (TWOSIDED_FORK_SAFE): %w", ErrConfig, err)
			}
		}
		d, err := p.GetDeviceList()
		if err != nil {
			errs = append(errs, ibv.ProviderError(p.Name(), err))
			continue
		}
		devs = append(devs, d...)
	}
	if e.cfg.provider != "" && len(devs) == 0 && len(errs) == 0 {
		return fmt.Errorf("%w: provider: %q is not built in", ErrConfig, e.cfg.provider)
	}
	// Real hardware first.
	slices.SortStableFunc(devs, func(a, b ibv.DeviceInfo) int {
		ra, rb := a.Provider == "soft", b.Provider == "soft"
		switch {
		case ra == rb:
			return 0
		case rb:
			return -1
		}
		return 1
	})
	var gidErrs []error
	for _, d := range devs {
		if len(e.cfg.filters) > 0 && !slices.Contains(e.cfg.filters, d.Name) {
			continue
		}
		port, ok := d.ActivePort()
		if !ok {
			e.cfg.logger.Debug().Str("device", d.Name).Msg("skipping device without an active port")
			continue
		}
		ctx, err := ibv.OpenDevice(d.Provider, d.Name)
		if err != nil {
			errs = append(errs, fmt.Errorf("open %s: %w", d.Name, err))
			continue
		}
		// The port as the open device sees it: its GIDs (a soft device has one only once open).
		if pa, err := ctx.QueryPort(port.Num); err == nil {
			port = pa
		}
		gid, err := ibv.SelectGID(port, e.cfg.gidIndex)
		if err != nil {
			_ = ctx.Close()
			err = fmt.Errorf("%s: %w", d.Name, err)
			gidErrs = append(gidErrs, err)
			errs = append(errs, err)
			continue
		}
		pd, err := ctx.AllocPD()
		if err != nil {
			_ = ctx.Close()
			errs = append(errs, fmt.Errorf("alloc pd on %s: %w", d.Name, err))
			continue
		}
		if e.cfg.ibPort == 1 && port.Num != 1 {
			e.cfg.ibPort = int(port.Num)
		}
		e.cfg.dev = &deviceState{gidRequested: e.cfg.gidIndex, port: port.Num, asyncFd: -1, provider: d.Provider}
		e.dev, e.pd, e.devName = ctx, &channelPD{PD: pd, qp: e.cfg.qp, st: e.cfg.dev}, d.Name
		e.useGID(gid, port)
		if d.Provider == "soft" {
			softNotice.Do(func() {
				e.cfg.logger.Info().Str("device", d.Name).Msg("no RDMA device usable: using the soft provider (RC over TCP)")
			})
		}
		return nil
	}
	if e.cfg.gidIndex >= 0 && len(gidErrs) > 0 {
		// The index asked for does not fit the devices that were otherwise usable.
		return fmt.Errorf("%w: gid_index (MC_GID_INDEX) %d: %w", ErrConfig, e.cfg.gidIndex, ibv.JoinErrors(gidErrs...))
	}
	if err := providerConfigError(errs); err != nil {
		return err
	}
	if len(e.cfg.filters) > 0 {
		errs = append(errs, fmt.Errorf("MC_TE_FILTERS %v matched no device with an active port", e.cfg.filters))
	}
	// No device this transport can run on: the engine's configuration (the transport, the
	// filters, the provider) does not fit this machine.
	return fmt.Errorf("%w: rdma_twosided: %w", ErrConfig, ibv.JoinErrors(append([]error{ibv.ErrNoDevice}, errs...)...))
}

// providerConfigError: when a provider's configuration (its environment variables) is
// why no device opened, the engine's error is a configuration error: it wraps ErrConfig,
// ibv.ErrNoDevice and each provider's error, and names the variable once, e.g.
// "notify: bad configuration: rdma_twosided: soft provider: TWOSIDED_SOFT_DEVICES = 0:
// must be 1..64". nil when no error of errs is a configuration error.
func providerConfigError(errs []error) error {
	var msgs []string
	wrapped := []error{ErrConfig, ibv.ErrNoDevice}
	for _, err := range errs {
		if errors.Is(err, soft.ErrConfig) {
			msgs = append(msgs, "soft provider: "+strings.TrimPrefix(err.Error(), soft.ErrConfig.Error()+": "))
			wrapped = append(wrapped, err)
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	return &wrapError{msg: ErrConfig.Error() + ": rdma_twosided: " + strings.Join(msgs, "; "), errs: wrapped}
}

// wrapError is an error with its own message that wraps errs: for causes whose messages
// would repeat what the message says already.
type wrapError struct {
	msg  string
	errs []error
}

func (w *wrapError) Error() string   { return w.msg }
func (w *wrapError) Unwrap() []error { return w.errs }

// closeDevice deallocates the PD and closes the device, once the channels being made on it
// (connect workers) are adopted or released: it waits for them up to connectDrainWait, and
// past that leaves the close to the last of them (a verb in flight cannot be interrupted,
// and the device must outlive it).
func (e *Engine) closeDevice() {
	pd, dev := e.pd, e.dev
	e.pd, e.dev = nil, nil
	release := func() {
		if pd != nil {
			_ = pd.Dealloc()
		}
		if dev != nil {
			_ = dev.Close()
		}
	}
	if st := e.cfg.dev; st != nil {
		st.reopen.wg.Wait() // a fatal device being opened again: opening is quick
		if !st.workers.stopAndWait(connectDrainWait, release) {
			e.cfg.logger.Warn().Str("device", e.devName).Int("channels", st.workers.inFlight()).
				Msg("rdma_twosided: close: channels still being made: the device closes once they are released")
		}
		return
	}
	release()
}

// deviceState is the rdma_twosided device's state that changes while the engine runs: the
// source GID in force and what the device's async events did (async.go). Loop-owned but for
// the counters, which are atomic.
type deviceState struct {
	gidRequested int   // gid_index as configured: -1 = auto
	port         uint8 // the port channels use
	gid          ibv.GIDEntry
	portDown     bool        // a PORT_ERR not yet followed by PORT_ACTIVE
	fatal        bool        // a DEVICE_FATAL
	down         atomic.Bool // portDown || fatal, for any goroutine
	asyncFd      int         // the loop's duplicate of the async fd; -1: not watched
	events       deviceEventCounters
	workers      connectWorkers // channels being made off the loop on the device (connect_worker.go)
	provider     string         // the device's provider, to open it again after DEVICE_FATAL
	reopen       reopenState    // async.go: reopening a fatal device
}

// useGID makes gid the source GID of every channel made from now on: the GID advertised in
// their handshakes and the sgid_index of their address vectors both come from this one
// entry (the engine's channel config carries its index, and ctrlchannel reads the GID at
// that index). It logs the choice, once per device and again when it changes.
func (e *Engine) useGID(gid ibv.GIDEntry, port ibv.PortAttr) {
	st := e.cfg.dev
	if st.gid == gid && st.gid.Index == e.cfg.gidIndex {
		return
	}
	how := "auto"
	if st.gidRequested >= 0 {
		how = "gid_index (MC_GID_INDEX)"
	}
	st.gid = gid
	e.cfg.gidIndex = gid.Index
	e.cfg.logger.Info().Str("device", e.devName).Uint8("port", port.Num).Str("link_layer", port.LinkLayer).
		Int("gid_index", gid.Index).Stringer("gid_type", gid.Type).Stringer("gid", gid.GID).Str("chosen_by", how).
		Msg("rdma_twosided: source GID of the ctrl channels")
}

// GID is the source GID the engine's ctrl channels use now (index, type and address), and
// false on an engine without an RDMA device (the oob transport).
func (e *Engine) GID() (ibv.GIDEntry, bool) {
	if e.cfg.dev == nil {
		return ibv.GIDEntry{}, false
	}
	if e.loop == nil || e.loop.InLoop() {
		return e.cfg.dev.gid, true
	}
	got := make(chan ibv.GIDEntry, 1)
	if err := e.loop.SubmitWait(context.Background(), func() { got <- e.cfg.dev.gid }); err != nil {
		return e.cfg.dev.gid, true // the loop stopped: nothing changes it any more
	}
	select {
	case g := <-got:
		return g, true
	case <-e.loop.Done():
		return e.cfg.dev.gid, true
	}
}

// channelPD is the engine's protection domain: it gives every ctrl channel made on it the
// QP attributes of the engine's configuration (ctrlchannel.Defaults): traffic class, SL,
// P_Key index, max inline data, retry count and ACK timeout.
type channelPD struct {
	ibv.PD
	qp qpKnobs
	st *deviceState
}

// ChannelDefaults fills the QP attributes cfg leaves zero.
func (p *channelPD) ChannelDefaults(cfg *ctrlchannel.Config) {
	k := p.qp
	if cfg.TrafficClass == 0 && k.trafficClass > 0 {
		cfg.TrafficClass = uint8(k.trafficClass)
	}
	if cfg.SL == 0 && k.serviceLevel > 0 {
		cfg.SL = uint8(k.serviceLevel)
	}
	if cfg.PKeyIndex == 0 {
		cfg.PKeyIndex = uint16(k.pkeyIndex)
	}
	if cfg.MaxInline == 0 {
		cfg.MaxInline = k.maxInline
		if k.maxInline == 0 {
			cfg.MaxInline = -1 // none
		}
	}
	if cfg.RetryCnt == 0 {
		cfg.RetryCnt = uint8(k.retryCount)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = uint8(k.ackTimeout)
	}
}
