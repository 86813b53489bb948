//go:build rdma

package verbs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/ibv/conformance"
	"github.com/twosided/twosided/ibv/softverbs/svctl"
)

// EnvConformanceDevices names the two devices the conformance suite runs between, as
// "devA,devB" (e.g. "mlx5_0,mlx5_1"). By default it runs over loopback on the first device
// whose port 1 is active, which works on any fabric; over softverbs, between its first two
// devices.
const EnvConformanceDevices = "TWOSIDED_VERBS_CONFORMANCE_DEVICES"

// softverbsEnv is what the suite asks of softverbs (ibv/softverbs), which reads its
// configuration when libibverbs is first used, so it is set before any test runs: two
// devices and a phantom one (its port DOWN), and a control file through which the suite cuts
// links and kills devices. rdma-core ignores these variables; one set already is kept.
var softverbsEnv = map[string]string{
	"SOFTVERBS_DEVICES": "2",
	"SOFTVERBS_PHANTOM": "1",
	"SOFTVERBS_CTL":     filepath.Join(os.TempDir(), fmt.Sprintf("twosided-verbs-test-%d.ctl", os.Getpid())),
}

func init() {
	for k, v := range softverbsEnv {
		if _, ok := os.LookupEnv(k); !ok {
			if err := os.Setenv(k, v); err != nil {
				panic(err)
			}
		}
	}
}

func TestConformance(t *testing.T) {
	f := conformance.Fixture{Provider: Provider{}}
	lib, err := Provider{}.Library()
	if err != nil {
		t.Skipf("needs libibverbs: %v", err)
	}
	dev := activeDevice(t)
	devs, _ := Provider{}.GetDeviceList()
	sv := svctl.IsSoftverbs(lib, dev.Name)
	if v := os.Getenv(EnvConformanceDevices); v != "" {
		a, b, ok := strings.Cut(v, ",")
		if !ok || a == "" || b == "" {
			t.Fatalf("%s=%q: want two device names separated by a comma", EnvConformanceDevices, v)
		}
		f.DevA, f.DevB = a, b
	} else {
		for _, d := range devs {
			if !port1Active(d) {
				continue
			}
			switch {
			case f.DevA == "":
				f.DevA, f.DevB = d.Name, d.Name
			case sv && f.DevB == f.DevA:
				f.DevB = d.Name // softverbs devices all reach each other
			}
		}
		if f.DevA == "" {
			t.Skipf("the conformance suite uses port 1; %s has no active port 1", dev.Name)
		}
	}
	// A phantom: a listed device whose port is DOWN (softverbs's SOFTVERBS_PHANTOM, or a NIC
	// without a cable).
	for _, d := range devs {
		if _, active := d.ActivePort(); !active && len(d.Ports) > 0 && d.Ports[0].State == ibv.PortDown {
			f.Phantom = d.Name
			break
		}
	}
	// Fault injection and counters over softverbs only; on hardware the suite skips what
	// needs them.
	if sv && svctl.IsSoftverbs(lib, f.DevA) && svctl.IsSoftverbs(lib, f.DevB) {
		f.Faults = newSoftverbsFaults(t, lib)
	}
	t.Logf("devices %s, %s; phantom %q; faults: %v", f.DevA, f.DevB, f.Phantom, f.Faults != nil)
	conformance.Run(t, f)
}

func port1Active(d ibv.DeviceInfo) bool {
	for _, p := range d.Ports {
		if p.Num == 1 && p.State == ibv.PortActive {
			return true
		}
	}
	return false
}

// softverbsFaults is conformance.Faults over softverbs: a link is cut as a cable pulled
// between two back-to-back NICs (both ports DOWN, nothing sent or received, connected QPs
// retry), a device is killed as a NIC's fatal error kills it (DEVICE_FATAL, every QP of every
// context open on it flushed, nothing sent or received) and then comes back for new contexts,
// as after a driver's recovery; counters are the devices' hw_counters. Each fault is in
// force when its method returns. A NIC cannot land a CQE without a WR, so InjectWC is
// unsupported.
type softverbsFaults struct {
	lib string
	ctl *svctl.Control
}

func newSoftverbsFaults(t *testing.T, lib string) *softverbsFaults {
	path := os.Getenv("SOFTVERBS_CTL")
	if path == "" {
		t.Log("softverbs without SOFTVERBS_CTL (set before libibverbs loaded): no fault injection")
		return nil
	}
	_, statErr := os.Stat(path)
	ctl, err := svctl.NewControl(path)
	require.NoError(t, err)
	t.Cleanup(func() {
		if errors.Is(statErr, os.ErrNotExist) {
			require.NoError(t, os.Remove(path))
			return
		}
		require.NoError(t, ctl.Reset())
	})
	return &softverbsFaults{lib: lib, ctl: ctl}
}

const faultWait = 10 * time.Second

// eventually retries check until it succeeds or faultWait passes, returning its last error.
func eventually(check func() error) error {
	deadline := time.Now().Add(faultWait)
	for {
		err := check()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitPort waits until dev's port 1 is in state st. Opening a context makes softverbs read
// its control file at once.
func (f *softverbsFaults) waitPort(dev string, st ibv.PortState) error {
	return eventually(func() error {
		ctx, err := Provider{}.Open(dev)
		if err != nil {
			return err
		}
		defer ctx.Close()
		p, err := ctx.QueryPort(1)
		if err != nil {
			return err
		}
		if p.State != st {
			return fmt.Errorf("softverbs: %s port 1 is %s, not %s", dev, p.State, st)
		}
		return nil
	})
}

func (f *softverbsFaults) setPorts(state string, want ibv.PortState, devs ...string) error {
	for _, d := range devs {
		var err error
		if state == "" {
			err = f.ctl.Unset(d, "port")
		} else {
			err = f.ctl.Set(d, "port", state)
		}
		if err != nil {
			return err
		}
	}
	for _, d := range devs {
		if err := f.waitPort(d, want); err != nil {
			return err
		}
	}
	return nil
}

func (f *softverbsFaults) CutLink(a, b string) error {
	return f.setPorts("down", ibv.PortDown, a, b)
}

func (f *softverbsFaults) RestoreLink(a, b string) error {
	return f.setPorts("", ibv.PortActive, a, b)
}

func (f *softverbsFaults) KillDevice(name string) error {
	if err := f.ctl.Set(name, "fatal", "1"); err != nil {
		return err
	}
	if err := eventually(func() error {
		ctx, err := Provider{}.Open(name)
		if err == nil {
			ctx.Close()
			return fmt.Errorf("softverbs: %s still opens after fatal", name)
		}
		if !errors.Is(err, syscall.EIO) {
			return err
		}
		return nil
	}); err != nil {
		return err
	}
	// Dead: every context open on it stays dead. The device comes back for new ones.
	if err := f.ctl.Unset(name, "fatal"); err != nil {
		return err
	}
	return f.waitPort(name, ibv.PortActive)
}

func (f *softverbsFaults) InjectWC(ibv.CQ, ibv.WC) error {
	return fmt.Errorf("softverbs: a NIC lands no CQE without a WR: %w", errors.ErrUnsupported)
}

func (f *softverbsFaults) Counters(ctx ibv.Context) (conformance.Counters, error) {
	dev := ctx.Device().Name
	var c conformance.Counters
	for _, x := range []struct {
		name string
		to   *uint64
	}{
		{svctl.RNRNakSent, &c.RNRNaksSent},
		{svctl.RNRNakReceived, &c.RNRNaksRecv},
		{svctl.LocalAckTimeout, &c.RetryTimeouts},
	} {
		v, err := svctl.Counter(f.lib, dev, x.name)
		if err != nil {
			return conformance.Counters{}, err
		}
		*x.to = v
	}
	// ForgedDropped stays 0: an RC responder places a SEND from another QP when its PSN
	// fits; softverbs drops none for its source.
	return c, nil
}
