// Package conformance is the verbs conformance suite of twosided: one named subtest per RC
// semantic that the layers above ibv rely on (ordering, RNR, retries, length and protection
// errors, the QP state machine, flushing, queue limits, completion channels, CQ overrun,
// forged packets, phantom devices). Providers run it from their own tests:
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, conformance.Fixture{Provider: p, DevA: "soft0", DevB: "soft1"})
//	}
//
// It owns only test logic over the ibv API; it must not import a provider. Tests that need
// fault injection or device counters skip when Fixture.Faults is nil.
package conformance

import (
	"testing"

	"github.com/twosided/twosided/ibv"
)

// Fixture is what a provider hands the suite.
type Fixture struct {
	// Provider opens the devices.
	Provider ibv.Provider
	// DevA and DevB are two devices with an active port that can reach each other. DevB may
	// equal DevA: the suite then runs over loopback (and skips what needs two devices).
	DevA, DevB string
	// Phantom, when set, names a listed device whose port is DOWN.
	Phantom string
	// Faults, when set, lets the suite cut links, kill devices, inject CQEs and read counters.
	Faults Faults
}

// Faults is the fault injection a provider may offer (ibv/soft does).
type Faults interface {
	// CutLink drops every packet between two devices, both ways, until RestoreLink.
	CutLink(a, b string) error
	RestoreLink(a, b string) error
	// KillDevice makes a device die as its process would; its contexts then only Close.
	KillDevice(name string) error
	// InjectWC lands a CQE on a CQ as the NIC would.
	InjectWC(cq ibv.CQ, wc ibv.WC) error
	// Counters reads the statistics of the device behind ctx.
	Counters(ctx ibv.Context) (Counters, error)
}

// Counters are the device statistics the suite checks.
type Counters struct {
	RNRNaksSent   uint64 // RNR NAKs answered by this device's responders
	RNRNaksRecv   uint64 // RNR NAKs received by this device's requesters
	RetryTimeouts uint64 // local ACK timeouts
	ForgedDropped uint64 // packets dropped for coming from a GID/QPN the QP is not connected to
}

// Case is one conformance test.
type Case struct {
	Name string
	Run  func(t *testing.T, f Fixture)
}

// Cases lists the suite, in the order Run runs it.
var Cases = []Case{
	{"TestReliableInOrder", testReliableInOrder},
	{"TestSendCompletesAfterPlacement", testSendCompletesAfterPlacement},
	{"TestRNRRetryExceeded", testRNRRetryExceeded},
	{"TestRNRCounted", testRNRCounted},
	{"TestRNRRetryForever", testRNRRetryForever},
	{"TestRetryExceededCutLink", testRetryExceededCutLink},
	{"TestCutLinkRestored", testCutLinkRestored},
	{"TestRetryExceededDeadPeer", testRetryExceededDeadPeer},
	{"TestLenErr", testLenErr},
	{"TestProtErr", testProtErr},
	{"TestStateMachine", testStateMachine},
	{"TestFlushOnErr", testFlushOnErr},
	{"TestSendQueueFull", testSendQueueFull},
	{"TestRecvQueueFull", testRecvQueueFull},
	{"TestUnsignaledHoldSlot", testUnsignaledHoldSlot},
	{"TestSqSigAll", testSqSigAll},
	{"TestCompChannelArmOnce", testCompChannelArmOnce},
	{"TestCQDestroyBusy", testCQDestroyBusy},
	{"TestInjectWC", testInjectWC},
	{"TestCQOverrun", testCQOverrun},
	{"TestForgedPacketDropped", testForgedPacketDropped},
	{"TestPhantomDeviceDown", testPhantomDeviceDown},
	{"TestMR", testMR},
}

// Run runs every case as a subtest of t, named as in Cases (e.g. "TestRNRCounted").
func Run(t *testing.T, f Fixture) {
	t.Helper()
	if f.Provider == nil || f.DevA == "" || f.DevB == "" {
		t.Fatal("conformance: Fixture needs Provider, DevA and DevB")
	}
	for _, c := range Cases {
		t.Run(c.Name, func(t *testing.T) { c.Run(t, f) })
	}
}
