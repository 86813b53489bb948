package soft_test

import (
	"testing"

	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/ibv/conformance"
	"github.com/twosided/twosided/ibv/soft"
)

// faults adapts a soft provider to the suite's Faults.
type faults struct{ p *soft.Provider }

func (f faults) CutLink(a, b string) error     { return f.p.CutLink(a, b) }
func (f faults) RestoreLink(a, b string) error { return f.p.RestoreLink(a, b) }
func (f faults) KillDevice(name string) error  { return f.p.KillDevice(name) }
func (f faults) InjectWC(cq ibv.CQ, wc ibv.WC) error {
	return soft.InjectWC(cq, wc)
}

func (f faults) Counters(ctx ibv.Context) (conformance.Counters, error) {
	c, err := soft.DeviceCounters(ctx)
	return conformance.Counters{RNRNaksSent: c.RNRNaksSent, RNRNaksRecv: c.RNRNaksRecv,
		RetryTimeouts: c.RetryTimeouts, ForgedDropped: c.ForgedDropped}, err
}

func TestConformance(t *testing.T) {
	p := soft.New(soft.WithDevices(2), soft.WithPhantom(true))
	conformance.Run(t, conformance.Fixture{Provider: p, DevA: "soft0", DevB: "soft1",
		Phantom: soft.PhantomName, Faults: faults{p}})
}

func TestConformanceTCP(t *testing.T) {
	p := soft.New(soft.WithDevices(2), soft.WithInProcess(false))
	conformance.Run(t, conformance.Fixture{Provider: p, DevA: "soft0", DevB: "soft1", Faults: faults{p}})
}

func TestConformanceTCPLoopback(t *testing.T) {
	p := soft.New(soft.WithDevices(1), soft.WithInProcess(false))
	conformance.Run(t, conformance.Fixture{Provider: p, DevA: "soft0", DevB: "soft0", Faults: faults{p}})
}

func TestConformanceLoopback(t *testing.T) {
	p := soft.New(soft.WithDevices(1))
	conformance.Run(t, conformance.Fixture{Provider: p, DevA: "soft0", DevB: "soft0", Faults: faults{p}})
}

func TestConformanceNoCoalesce(t *testing.T) {
	p := soft.New(soft.WithDevices(2), soft.WithCoalesce(false), soft.WithInProcess(false))
	conformance.Run(t, conformance.Fixture{Provider: p, DevA: "soft0", DevB: "soft1", Faults: faults{p}})
}

// The former model: NIC goroutines do all receive work, the consumer's polls none.
func TestConformanceNICThread(t *testing.T) {
	p := soft.New(soft.WithDevices(2), soft.WithInProcess(false), soft.WithNICThread(true))
	conformance.Run(t, conformance.Fixture{Provider: p, DevA: "soft0", DevB: "soft1", Faults: faults{p}})
}
