package notify

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/twosided/twosided/ibv"
	_ "github.com/twosided/twosided/ibv/soft" // the software RC provider, always present
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
		d, err := p.GetDeviceList()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p.Name(), err))
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
		pd, err := ctx.AllocPD()
		if err != nil {
			_ = ctx.Close()
			errs = append(errs, fmt.Errorf("alloc pd on %s: %w", d.Name, err))
			continue
		}
		if e.cfg.ibPort == 1 && port.Num != 1 {
			e.cfg.ibPort = int(port.Num)
		}
		e.dev, e.pd, e.devName = ctx, pd, d.Name
		if d.Provider == "soft" {
			softNotice.Do(func() {
				e.cfg.logger.Info().Str("device", d.Name).Msg("no RDMA device usable: using the soft provider (RC over TCP)")
			})
		}
		return nil
	}
	if len(e.cfg.filters) > 0 {
		errs = append(errs, fmt.Errorf("MC_TE_FILTERS %v matched no device with an active port", e.cfg.filters))
	}
	return fmt.Errorf("notify: rdma_twosided: %w", errors.Join(append([]error{ibv.ErrNoDevice}, errs...)...))
}

func (e *Engine) closeDevice() {
	if e.pd != nil {
		_ = e.pd.Dealloc()
		e.pd = nil
	}
	if e.dev != nil {
		_ = e.dev.Close()
		e.dev = nil
	}
}
