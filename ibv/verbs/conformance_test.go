//go:build rdma

package verbs

import (
	"os"
	"strings"
	"testing"

	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/ibv/conformance"
)

// EnvConformanceDevices names the two devices the conformance suite runs between, as
// "devA,devB" (e.g. "mlx5_0,mlx5_1"). By default it runs over loopback on the first device
// whose port 1 is active, which works on any fabric.
const EnvConformanceDevices = "TWOSIDED_VERBS_CONFORMANCE_DEVICES"

func TestConformance(t *testing.T) {
	devA, devB := "", ""
	if v := os.Getenv(EnvConformanceDevices); v != "" {
		a, b, ok := strings.Cut(v, ",")
		if !ok || a == "" || b == "" {
			t.Fatalf("%s=%q: want two device names separated by a comma", EnvConformanceDevices, v)
		}
		devA, devB = a, b
	} else {
		dev := activeDevice(t)
		for _, p := range dev.Ports {
			if p.Num == 1 && p.State == ibv.PortActive {
				devA, devB = dev.Name, dev.Name
			}
		}
		if devA == "" {
			t.Skipf("the conformance suite uses port 1; %s has no active port 1", dev.Name)
		}
	}
	// No fault injection on hardware: the suite skips what needs it.
	conformance.Run(t, conformance.Fixture{Provider: Provider{}, DevA: devA, DevB: devB})
}
