// Package conformance is the verbs conformance suite of twosided: one named subtest per RC
// semantic that the layers above ibv rely on (ordering, RNR, retries, length and protection
// errors, the QP state machine, flushing, queue limits, completion channels, CQ overrun,
// forged packets, phantom devices). Providers run it from their own tests:
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, conformance.Fixture{Provider: p, DevA: "soft0", DevB: "soft1"})
//	}
//
// Status: an internal layer of twosided, kept importable for the providers' tests
// (ibv/soft, ibv/verbs). Its API may change without notice; applications use package
// notify. docs/design.md describes how the layers fit together.
//
// It owns only test logic over the ibv API; it must not import a provider. Tests that need
// fault injection or device counters skip when Fixture.Faults is nil, or when the Faults
// method they need answers an error wrapping errors.ErrUnsupported.
//
// # Spec cases and provider-specific cases
//
// Most cases check what every RC NIC guarantees (the InfiniBand specification's RC
// semantics, as libibverbs exposes them): they must pass on any provider, hardware
// included. A case with Case.Provider set checks how one provider does something the
// specification leaves open, or that NICs do their own way; it runs only on that provider
// and its Case.Why names the reason. The spec cases assume nothing a NIC may do
// differently: each side sources its address vector from its own GID (ibv.SelectGID of its
// own port, never the remote's index), posting in RESET/INIT/RTR is not expected to fail
// (mlx5 queues such WRs), and a SEND from a QP other than the connected one is only
// expected never to be acknowledged to its sender (an RC responder matches packets by
// destination QPN and may place it).
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

// Faults is the fault injection a provider may offer: ibv/soft offers all of it; ibv/verbs
// over softverbs (ibv/softverbs) all but InjectWC. A method the provider cannot do returns an
// error wrapping errors.ErrUnsupported, and the suite skips what needs it.
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
	// Provider, when set, makes the case provider-specific: it runs only on the provider of
	// that name (ibv.Provider.Name) and skips elsewhere, saying Why.
	Provider string
	// Why says what the specification leaves open, or what NICs do differently.
	Why string
}

// Spec reports whether the case checks what every RC NIC guarantees.
func (c Case) Spec() bool { return c.Provider == "" }

// Cases lists the suite, in the order Run runs it.
var Cases = []Case{
	{Name: "TestReliableInOrder", Run: testReliableInOrder},
	{Name: "TestSendCompletesAfterPlacement", Run: testSendCompletesAfterPlacement},
	{Name: "TestRNRRetryExceeded", Run: testRNRRetryExceeded},
	{Name: "TestRNRCounted", Run: testRNRCounted},
	{Name: "TestRNRRetryForever", Run: testRNRRetryForever},
	{Name: "TestRetryExceededCutLink", Run: testRetryExceededCutLink},
	{Name: "TestCutLinkRestored", Run: testCutLinkRestored},
	{Name: "TestRetryExceededDeadPeer", Run: testRetryExceededDeadPeer},
	{Name: "TestLenErr", Run: testLenErr},
	{Name: "TestProtErr", Run: testProtErr},
	{Name: "TestStateMachine", Run: testStateMachine},
	{Name: "TestPostStateChecked", Run: testPostStateChecked},
	{Name: "TestFlushOnErr", Run: testFlushOnErr},
	{Name: "TestSendQueueFull", Run: testSendQueueFull},
	{Name: "TestRecvQueueFull", Run: testRecvQueueFull},
	{Name: "TestUnsignaledHoldSlot", Run: testUnsignaledHoldSlot},
	{Name: "TestSqSigAll", Run: testSqSigAll},
	{Name: "TestCompChannelArmOnce", Run: testCompChannelArmOnce},
	{Name: "TestCQDestroyBusy", Run: testCQDestroyBusy},
	{Name: "TestInjectWC", Run: testInjectWC, Provider: "soft",
		Why: "lands a CQE through ibv/soft's InjectWC test hook: an RC NIC makes CQEs only from WRs, so no other " +
			"provider has such a hook; what the CQE then does (polled, an armed CQ's channel fires once) is the " +
			"spec's, checked with real traffic by TestCompChannelArmOnce and TestCQDestroyBusy"},
	{Name: "TestCQOverrun", Run: testCQOverrun},
	{Name: "TestForeignSourceNotAcked", Run: testForeignSourceNotAcked},
	{Name: "TestForgedPacketDropped", Run: testForgedPacketDropped, Provider: "soft",
		Why: "a SEND from a QP other than the connected one: an RC responder matches packets by destination QPN " +
			"(the BTH carries no source QPN, and RoCE NICs do not check the source GID against the QP's), so mlx5 " +
			"and softverbs place it when its PSN fits; ibv/soft drops it and counts ForgedDropped"},
	{Name: "TestPhantomDeviceDown", Run: testPhantomDeviceDown},
	{Name: "TestMR", Run: testMR},
}

// Run runs every case as a subtest of t, named as in Cases (e.g. "TestRNRCounted").
func Run(t *testing.T, f Fixture) {
	t.Helper()
	if f.Provider == nil || f.DevA == "" || f.DevB == "" {
		t.Fatal("conformance: Fixture needs Provider, DevA and DevB")
	}
	for _, c := range Cases {
		t.Run(c.Name, func(t *testing.T) {
			if !c.Spec() && f.Provider.Name() != c.Provider {
				t.Skipf("provider-specific (%s): %s", c.Provider, c.Why)
			}
			c.Run(t, f)
		})
	}
}
