package soft

import (
	"fmt"

	"github.com/twosided/twosided/ibv"
)

// InjectWC lands wc on a soft CQ as the NIC would, signalling its channel when armed. Tests
// use it to race completions against the consumer's arm-and-poll.
func InjectWC(c ibv.CQ, wc ibv.WC) error {
	x, ok := c.(*cq)
	if !ok || x == nil {
		return fmt.Errorf("soft: inject wc: cq: not a soft CQ: %w", ibv.ErrInvalid)
	}
	x.mu.Lock()
	gone := x.destroyed
	x.mu.Unlock()
	if gone {
		return fmt.Errorf("soft: inject wc: cq: %w", ibv.ErrClosed)
	}
	if !x.push(&wc, true) {
		return fmt.Errorf("soft: inject wc: cq overrun: %w", ibv.ErrNoMem)
	}
	return nil
}

// DeviceCounters reads the statistics of the device behind a soft context.
func DeviceCounters(ctx ibv.Context) (Counters, error) {
	x, ok := ctx.(*context)
	if !ok || x == nil {
		return Counters{}, fmt.Errorf("soft: counters: ctx: not a soft context: %w", ibv.ErrInvalid)
	}
	return x.d.ctr.snapshot(), nil
}

// Counters reads the statistics of an open device by name (e.g. an engine's Stats().Device).
func (p *Provider) Counters(name string) (Counters, error) {
	d, err := p.lookup(name)
	if err != nil {
		return Counters{}, err
	}
	return d.ctr.snapshot(), nil
}

// SetPortState takes an open device's port DOWN (it drops every packet, and its contexts get
// EventPortErr) or back to ACTIVE (EventPortActive).
func (p *Provider) SetPortState(name string, up bool) error {
	d, err := p.lookup(name)
	if err != nil {
		return err
	}
	if d.phantom {
		return fmt.Errorf("soft: set port state %s: the phantom port stays DOWN: %w", name, ibv.ErrInvalid)
	}
	d.mu.Lock()
	changed := d.portDown == up
	d.portDown = !up
	d.mu.Unlock()
	if !changed {
		return nil
	}
	ev := ibv.EventPortActive
	if !up {
		ev = ibv.EventPortErr
	}
	p.faultMu.Lock()
	if up {
		p.downPorts--
	} else {
		p.downPorts++
	}
	p.recount()
	p.faultMu.Unlock()
	for _, x := range d.contexts() {
		x.raise(ibv.AsyncEvent{Type: ev, Port: 1})
	}
	return nil
}

// SetGIDTable changes the shape of an open device's GID table (WithGIDTable) and raises
// EventGIDChange on its contexts, as a NIC does when an address is added or removed.
func (p *Provider) SetGIDTable(name string, t GIDTable) error {
	d, err := p.lookup(name)
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.gidTable = t
	d.mu.Unlock()
	for _, x := range d.contexts() {
		x.raise(ibv.AsyncEvent{Type: ibv.EventGIDChange, Port: 1})
	}
	return nil
}

// RaiseAsyncEvent queues ev on every context of an open device, as the NIC would raise it
// (e.g. EventDeviceFatal).
func (p *Provider) RaiseAsyncEvent(name string, ev ibv.AsyncEvent) error {
	d, err := p.lookup(name)
	if err != nil {
		return err
	}
	for _, x := range d.contexts() {
		x.raise(ev)
	}
	return nil
}

// SetRTRHook makes every modify to RTR of a QP of an open device call hook first, on the
// caller's goroutine and outside every lock of the provider; nil removes it. A hook that
// blocks is a slow RTR, as RoCE's address resolution in the kernel makes it on a NIC (tests
// of callers that must not stall meanwhile).
func (p *Provider) SetRTRHook(name string, hook func()) error {
	d, err := p.lookup(name)
	if err != nil {
		return err
	}
	if hook == nil {
		d.rtrHook.Store(nil)
		return nil
	}
	d.rtrHook.Store(&hook)
	return nil
}
