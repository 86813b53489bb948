package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/ibv/soft"
	"github.com/twosided/twosided/notify"
)

// runDoctorJSON runs `twosided doctor --json args...` and returns its exit status and the
// parsed report.
func runDoctorJSON(t *testing.T, args ...string) (int, doctorReport, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), append([]string{"doctor", "--json"}, args...), &out, &errOut)
	var rep doctorReport
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep), "stdout: %s\nstderr: %s", out.String(), errOut.String())
	return code, rep, out.String() + errOut.String()
}

func findDevice(t *testing.T, rep doctorReport, name string) doctorDevice {
	t.Helper()
	for _, p := range rep.Providers {
		for _, d := range p.Devices {
			if d.Name == name {
				return d
			}
		}
	}
	require.Failf(t, "device not in the report", "%s: %+v", name, rep.Providers)
	return doctorDevice{}
}

// On the soft provider, accepted by --allow-soft: every device's ports, GIDs, loopback and
// echo (over the ctrl channel both ways) pass, exit status 0 and an OK verdict.
func TestDoctorSoft(t *testing.T) {
	code, rep, out := runDoctorJSON(t, "--allow-soft", "--provider", "soft")
	require.Equal(t, 0, code, out)
	require.True(t, rep.OK, out)
	require.True(t, strings.HasPrefix(rep.Verdict, "OK: rdma_twosided works on soft0 port 1 (GID 0, RoCE v2, "), rep.Verdict)
	require.Contains(t, rep.Verdict, "--allow-soft")
	d := findDevice(t, rep, "soft0")
	require.True(t, d.OK, out)
	require.Len(t, d.Ports, 1)
	p := d.Ports[0]
	require.Equal(t, "PORT_ACTIVE", p.State)
	require.Equal(t, "Ethernet", p.LinkLayer)
	require.Equal(t, 0, p.GIDIndex)
	require.Equal(t, "RoCE v2", p.GIDType)
	require.Equal(t, "auto", p.GIDChoice)
	require.NotEmpty(t, p.GIDs)
	require.NotNil(t, p.Loopback, out)
	require.True(t, p.Loopback.OK, out)
	require.Equal(t, "OK", p.Loopback.Status)
	require.NotNil(t, d.Echo, out)
	require.True(t, d.Echo.OK, out)
	require.Equal(t, "channel", d.Echo.Path, out)
	require.Empty(t, rep.Hints, out)
	require.Equal(t, "auto", rep.Config["MC_GID_INDEX"])

	// The text form: the steps and the verdict as its last line.
	var text, errOut bytes.Buffer
	require.Equal(t, 0, run(context.Background(), []string{"doctor", "--allow-soft", "--provider", "soft"}, &text, &errOut), errOut.String())
	lines := strings.Split(strings.TrimSuffix(text.String(), "\n"), "\n")
	require.True(t, strings.HasPrefix(lines[len(lines)-1], "verdict: OK: rdma_twosided works on soft0 port 1"), text.String())
	require.Contains(t, text.String(), "loopback: OK: RC SEND/RECV between two QPs of soft0 port 1")
	require.Contains(t, text.String(), "echo: OK: one notify each way between two engines on soft0: A→B over the ctrl channel, B→A over the ctrl channel")
	require.Contains(t, text.String(), "<- used (auto)")
}

// The soft provider is no NIC: without --allow-soft the verdict says there is no RDMA
// device, and the exit status is 1, though the soft path works.
func TestDoctorSoftIsNoNIC(t *testing.T) {
	code, rep, out := runDoctorJSON(t, "--provider", "soft")
	require.Equal(t, 1, code, out)
	require.False(t, rep.OK)
	require.True(t, strings.HasPrefix(rep.Verdict, "FAIL: no RDMA device: "), rep.Verdict)
	require.Contains(t, rep.Verdict, "the soft provider works on soft0 (--allow-soft accepts it)")
	require.True(t, findDevice(t, rep, "soft0").OK, out)
}

// A peer address nobody listens on: the local checks pass, the peer check fails at once
// (connection refused), exit status 1, a hint names the OOB port and MC_HANDSHAKE_PORT.
func TestDoctorPeerUnreachable(t *testing.T) {
	code, rep, out := runDoctorJSON(t, "--allow-soft", "--device", "soft0", "--peer", "127.0.0.1:1")
	require.Equal(t, 1, code, out)
	require.False(t, rep.OK)
	require.NotNil(t, rep.Peer, out)
	require.False(t, rep.Peer.OK)
	require.Equal(t, "none", rep.Peer.Path)
	require.True(t, strings.HasPrefix(rep.Verdict, "FAIL: peer 127.0.0.1:1: its OOB port 1 is unreachable"), rep.Verdict)
	require.Contains(t, rep.Verdict, "locally, rdma_twosided works on soft0 port 1", "the local path is still reported")
	var hint string
	for _, h := range rep.Hints {
		if strings.Contains(h, "MC_HANDSHAKE_PORT") {
			hint = h
		}
	}
	require.NotEmpty(t, hint, "hints: %q", rep.Hints)
	require.Contains(t, hint, "OOB (handshake) port 1")
}

// A soft port taken down (SetPortState): the verdict names the device and the port, exit
// status 1, no loopback or echo is tried there, a hint says to bring the link up.
func TestDoctorSoftPortDown(t *testing.T) {
	// SetPortState works on an open device: hold it open across the check.
	c, err := soft.Default().Open("soft0")
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()) }()
	require.NoError(t, soft.Default().SetPortState("soft0", false))
	defer func() { require.NoError(t, soft.Default().SetPortState("soft0", true)) }()

	code, rep, out := runDoctorJSON(t, "--allow-soft", "--device", "soft0")
	require.Equal(t, 1, code, out)
	require.False(t, rep.OK)
	require.Equal(t, "FAIL: soft0 port 1 is PORT_DOWN", rep.Verdict)
	d := findDevice(t, rep, "soft0")
	require.Equal(t, "PORT_DOWN", d.Ports[0].State)
	require.Nil(t, d.Ports[0].Loopback)
	require.Nil(t, d.Echo)
	require.NotEmpty(t, rep.Hints)
	require.Contains(t, rep.Hints[0], "soft0 port 1 is PORT_DOWN: bring the link up")
}

// A NIC that cannot be opened, and one whose port has no usable GID: each gives its own
// verdict (doctor over stand-in providers).
func TestDoctorNICFaults(t *testing.T) {
	ctx := context.Background()
	o := doctorOptions{timeout: 5 * time.Second}

	broken := fakeProvider{name: verbsProvider, devs: []ibv.DeviceInfo{{Name: "mlx5_0", Provider: verbsProvider,
		Ports: []ibv.PortAttr{{Num: 1, State: ibv.PortActive, ActiveMTU: ibv.MTU1024, MaxMTU: ibv.MTU4096, LinkLayer: "Ethernet",
			GIDs: []ibv.GIDEntry{{Index: 0, Type: ibv.GIDTypeRoCEv1, GID: ibv.GID{0: 0xfe, 1: 0x80, 15: 1}}}}}}}}
	rep := doctor(ctx, o, []ibv.Provider{broken})
	require.False(t, rep.OK)
	require.True(t, strings.HasPrefix(rep.Verdict, "FAIL: mlx5_0: open: "), rep.Verdict)
	require.Contains(t, strings.Join(rep.Hints, "\n"), "mlx5_0 cannot be opened")

	// MC_GID_INDEX naming an empty entry: the verdict says which port has no source GID and
	// the hint what auto would pick.
	t.Setenv("MC_GID_INDEX", "5")
	opened := openable{fakeProvider: broken}
	rep = doctor(ctx, o, []ibv.Provider{opened})
	require.False(t, rep.OK)
	require.True(t, strings.HasPrefix(rep.Verdict, "FAIL: mlx5_0 port 1 has no source GID: "), rep.Verdict)
	require.Contains(t, strings.Join(rep.Hints, "\n"), "MC_GID_INDEX=5 is no usable GID of mlx5_0 port 1: unset MC_GID_INDEX (auto picks index 0, RoCE v1")
	require.Equal(t, "5", rep.Config["MC_GID_INDEX"])

	// A bad MC_* value: the verdict names it before anything is tried.
	t.Setenv("MC_MTU", "1000")
	rep = doctor(ctx, o, []ibv.Provider{opened})
	require.False(t, rep.OK)
	require.True(t, strings.HasPrefix(rep.Verdict, "FAIL: bad configuration: "), rep.Verdict)
	require.Contains(t, rep.Verdict, "MC_MTU")
}

// openable is a stand-in provider whose devices open (as a context that only answers
// QueryPort) but whose verbs do nothing else.
type openable struct{ fakeProvider }

func (p openable) Open(name string) (ibv.Context, error) {
	for _, d := range p.devs {
		if d.Name == name {
			return stubContext{d}, nil
		}
	}
	return nil, ibv.ErrNoDevice
}

type stubContext struct{ d ibv.DeviceInfo }

func (c stubContext) Device() ibv.DeviceInfo { return c.d }
func (c stubContext) QueryPort(port uint8) (ibv.PortAttr, error) {
	for _, p := range c.d.Ports {
		if p.Num == port {
			return p, nil
		}
	}
	return ibv.PortAttr{}, ibv.ErrInvalid
}
func (stubContext) AllocPD() (ibv.PD, error)                      { return nil, ibv.ErrInvalid }
func (stubContext) CreateCompChannel() (ibv.CompChannel, error)   { return nil, ibv.ErrInvalid }
func (stubContext) CreateCQ(int, ibv.CompChannel) (ibv.CQ, error) { return nil, ibv.ErrInvalid }
func (stubContext) AsyncFd() int                                  { return -1 }
func (stubContext) GetAsyncEvent() (ibv.AsyncEvent, error) {
	return ibv.AsyncEvent{}, ibv.ErrWouldBlock
}
func (stubContext) AckAsyncEvent(ibv.AsyncEvent) {}
func (stubContext) Close() error                 { return nil }

func TestDoctorBadFlags(t *testing.T) {
	for _, args := range [][]string{{"doctor", "--timeout", "0s"}, {"doctor", "--peer", "nohostport"}} {
		var out, errOut bytes.Buffer
		require.Equal(t, 2, run(context.Background(), args, &out, &errOut), args)
		require.Contains(t, errOut.String(), "Run 'twosided doctor --help' for usage.")
	}
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run(context.Background(), []string{"help", "doctor"}, &out, &errOut))
	require.Contains(t, out.String(), "Exit status: 0 only when the NIC path works")
	require.Contains(t, out.String(), "-allow-soft")
}

// A remote engine over rdma_twosided (on another soft device of this process): the
// handshake, the ctrl channel and the notify over it; exit status 0.
func TestDoctorPeer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	peer, err := notify.New(notify.WithTransport(notify.TransportRDMATwoSided), notify.WithProvider("soft"),
		notify.WithDeviceFilters("soft1"), notify.WithListenAddr("127.0.0.1:0"), notify.WithoutProcsReserve())
	require.NoError(t, err)
	defer func() { _ = peer.Close(ctx) }()
	code, rep, out := runDoctorJSON(t, "--allow-soft", "--device", "soft0", "--peer", peer.Addr())
	require.Equal(t, 0, code, out)
	require.True(t, rep.OK, out)
	require.NotNil(t, rep.Peer)
	require.True(t, rep.Peer.OK, out)
	require.Equal(t, "channel", rep.Peer.Path)
	require.Contains(t, rep.Verdict, "and with peer "+peer.Addr()+" over the ctrl channel")
	n, err := peer.Recv(ctx)
	require.NoError(t, err)
	require.Equal(t, "twosided-doctor", n.Name)
}

// A remote engine on the oob transport: the notify arrives, but over OOB: the peer check
// fails, the hint says the peer must run rdma_twosided.
func TestDoctorPeerOOBOnly(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	peer, err := notify.New(notify.WithTransport(notify.TransportOOB), notify.WithListenAddr("127.0.0.1:0"), notify.WithoutProcsReserve())
	require.NoError(t, err)
	defer func() { _ = peer.Close(ctx) }()
	code, rep, out := runDoctorJSON(t, "--allow-soft", "--device", "soft0", "--peer", peer.Addr())
	require.Equal(t, 1, code, out)
	require.False(t, rep.OK)
	require.NotNil(t, rep.Peer)
	require.Equal(t, "oob", rep.Peer.Path, out)
	require.True(t, strings.HasPrefix(rep.Verdict, "FAIL: peer "+peer.Addr()+": the notify went over OOB"), rep.Verdict)
	require.Contains(t, strings.Join(rep.Hints, "\n"), "MC_USE_RDMA_TWOSIDED=1")
}

// --allow-soft accepts a working soft device only where no NIC has an active port: an
// engine takes such a NIC first, so a NIC that fails its loopback stays the verdict; a NIC
// whose port is down is skipped by engines, and the verdict says so beside the soft OK.
func TestDoctorAllowSoftBesideNIC(t *testing.T) {
	okStep := &doctorStep{Name: "loopback", OK: true, Status: "OK"}
	softDev := doctorDevice{Name: "soft0", Provider: "soft", OK: true, Echo: &doctorStep{OK: true, Path: "channel"},
		Ports: []doctorPort{{Port: 1, State: "PORT_ACTIVE", GIDIndex: 0, GIDType: "RoCE v2", GIDAddr: "::1", Loopback: okStep}}}
	rtrFailed := doctorDevice{Name: "mlx5_0", Provider: verbsProvider, Echo: &doctorStep{Error: "refused"},
		Ports: []doctorPort{{Port: 1, State: "PORT_ACTIVE", Loopback: &doctorStep{Error: "qp 7 to RTR: invalid argument"}}}}
	portDown := doctorDevice{Name: "mlx5_0", Provider: verbsProvider, Ports: []doctorPort{{Port: 1, State: "PORT_DOWN"}}}
	o := doctorOptions{allowSoft: true}
	for _, tc := range []struct {
		nic    doctorDevice
		ok     bool
		prefix string
	}{
		{rtrFailed, false, "FAIL: mlx5_0 port 1: loopback: qp 7 to RTR: invalid argument"},
		{portDown, true, "OK: rdma_twosided works on soft0 port 1 (GID 0, RoCE v2, ::1) (soft provider"},
	} {
		rep := doctorReport{Providers: []doctorProvider{
			{Name: "soft", Built: true, Devices: []doctorDevice{softDev}},
			{Name: verbsProvider, Built: true, Devices: []doctorDevice{tc.nic}},
		}}
		best, port := pickDevice(rep.Providers, true)
		ok, v := verdict(rep, o, best, port)
		require.Equal(t, tc.ok, ok, v)
		require.True(t, strings.HasPrefix(v, tc.prefix), v)
		if ok {
			require.True(t, strings.HasSuffix(v, "; the NIC does not: mlx5_0 port 1 is PORT_DOWN"), v)
		}
	}
}
