package main

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/ibv/soft"
)

// fakeProvider stands in for a provider in listDevices' table tests.
type fakeProvider struct {
	name string
	devs []ibv.DeviceInfo
	err  error
}

func (p fakeProvider) Name() string                             { return p.name }
func (p fakeProvider) GetDeviceList() ([]ibv.DeviceInfo, error) { return p.devs, p.err }
func (p fakeProvider) Open(string) (ibv.Context, error)         { return nil, ibv.ErrNoDevice }

// fakeLibProvider is a provider that loads a library, as the verbs provider loads
// libibverbs.
type fakeLibProvider struct {
	fakeProvider
	path string
	err  error
}

func (p fakeLibProvider) Library() (string, error) { return p.path, p.err }

var fakeSoft = fakeProvider{name: "soft", devs: []ibv.DeviceInfo{{
	Name: "soft0", Provider: "soft", NodeGUID: 0x0002c90300001234,
	Ports: []ibv.PortAttr{{
		Num: 1, State: ibv.PortActive, MaxMTU: ibv.MTU4096, ActiveMTU: ibv.MTU1024, LID: 7,
		GIDIndex: 3, GID: ibv.GID{0: 0xfe, 1: 0x80, 15: 1}, LinkLayer: "Ethernet",
	}},
}}}

func TestListDevices(t *testing.T) {
	noKernel := fmt.Errorf("%w: ibv_get_device_list: function not implemented (no kernel RDMA support)", ibv.ErrNoDevice)
	tests := []struct {
		name      string
		providers []ibv.Provider
		only      string
		wantNames []string
		wantNotes []string
		wantErr   error
	}{
		{"verbs not built in", []ibv.Provider{fakeSoft}, "", []string{"soft", "verbs"},
			[]string{"no RDMA device: the verbs provider is not built in (build with -tags rdma); using the soft provider"}, nil},
		{"verbs without device", []ibv.Provider{fakeSoft, fakeProvider{name: "verbs", err: noKernel}}, "", []string{"soft", "verbs"},
			[]string{"no RDMA device: ibv_get_device_list: function not implemented (no kernel RDMA support); using the soft provider"}, nil},
		{"verbs with device", []ibv.Provider{fakeSoft, fakeProvider{name: "verbs", devs: fakeSoft.devs}}, "", []string{"soft", "verbs"}, nil, nil},
		{"only soft", []ibv.Provider{fakeSoft}, "soft", []string{"soft"}, nil, nil},
		{"only verbs, not built in", []ibv.Provider{fakeSoft}, "verbs", []string{"verbs"},
			[]string{"no RDMA device: the verbs provider is not built in (build with -tags rdma); using the soft provider"}, nil},
		{"unknown provider", []ibv.Provider{fakeSoft}, "nope", nil, nil, ibv.ErrNoProvider},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep, err := listDevices(tt.providers, tt.only, -1)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			var names []string
			for _, p := range rep.Providers {
				names = append(names, p.Name)
			}
			require.Equal(t, tt.wantNames, names)
			require.Equal(t, tt.wantNotes, rep.Notes)
		})
	}
}

// The verbs provider says where libibverbs was loaded from, or why it was not (once: the
// device list's error, which says the same, is not repeated).
func TestDevicesLibrary(t *testing.T) {
	const why = `libibverbs not loaded: dlopen "/nonexistent/libibverbs.so.1" (TWOSIDED_LIBIBVERBS): ` +
		"/nonexistent/libibverbs.so.1: cannot open shared object file: No such file or directory"
	missing := fakeLibProvider{fakeProvider{name: "verbs", err: fmt.Errorf("%w: %w", ibv.ErrNoDevice, errors.New(why))}, "", errors.New(why)}
	rep, err := listDevices([]ibv.Provider{missing}, "verbs", -1)
	require.NoError(t, err)
	require.Equal(t, why, rep.Providers[0].LibraryError)
	require.Empty(t, rep.Providers[0].Library)
	require.Equal(t, []string{"no RDMA device: " + why + "; using the soft provider"}, rep.Notes)
	var out bytes.Buffer
	writeDevices(&out, rep)
	require.Equal(t, "provider: verbs\n"+
		"\tlibrary:\t"+why+"\n"+
		"\n"+
		"no RDMA device: "+why+"; using the soft provider\n", out.String())

	noKernel := fmt.Errorf("%w: ibv_get_device_list: function not implemented (no kernel RDMA support)", ibv.ErrNoDevice)
	loaded := fakeLibProvider{fakeProvider{name: "verbs", err: noKernel}, "/usr/lib/x86_64-linux-gnu/libibverbs.so.1", nil}
	rep, err = listDevices([]ibv.Provider{loaded}, "verbs", -1)
	require.NoError(t, err)
	require.Equal(t, "/usr/lib/x86_64-linux-gnu/libibverbs.so.1", rep.Providers[0].Library)
	out.Reset()
	writeDevices(&out, rep)
	require.Equal(t, "provider: verbs\n"+
		"\tlibrary:\tlibibverbs loaded from /usr/lib/x86_64-linux-gnu/libibverbs.so.1\n"+
		"\terror:\t"+noKernel.Error()+"\n"+
		"\n"+
		"no RDMA device: ibv_get_device_list: function not implemented (no kernel RDMA support); using the soft provider\n", out.String())

	b, err := json.Marshal(rep)
	require.NoError(t, err)
	require.Contains(t, string(b), `"library":"/usr/lib/x86_64-linux-gnu/libibverbs.so.1"`)
}

func TestWriteDevices(t *testing.T) {
	rep, err := listDevices([]ibv.Provider{fakeSoft}, "", -1)
	require.NoError(t, err)
	var out bytes.Buffer
	writeDevices(&out, rep)
	want := "provider: soft\n" +
		"hca_id:\tsoft0\n" +
		"\tprovider:\t\tsoft\n" +
		"\tnode_guid:\t\t0002:c903:0000:1234\n" +
		"\tphys_port_cnt:\t\t1\n" +
		"\t\tport:\t1\n" +
		"\t\t\tstate:\t\t\tPORT_ACTIVE\n" +
		"\t\t\tmax_mtu:\t\t4096\n" +
		"\t\t\tactive_mtu:\t\t1024\n" +
		"\t\t\tport_lid:\t\t7\n" +
		"\t\t\tlink_layer:\t\tEthernet\n" +
		"\t\t\tsource GID:\t\tindex 3, unknown, fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:01 (auto)\n" +
		"\n" +
		"provider: verbs\n" +
		"\terror:\tnot built in (build with -tags rdma)\n" +
		"\n" +
		"no RDMA device: the verbs provider is not built in (build with -tags rdma); using the soft provider\n"
	require.Equal(t, want, out.String())
}

// runCmd runs the binary's dispatcher as main does.
func runCmd(args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = run(context.Background(), args, &o, &e)
	return code, o.String(), e.String()
}

func TestDevicesCommand(t *testing.T) {
	code, out, errOut := runCmd("devices")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "hca_id:\tsoft0\n")
	if _, err := ibv.LookupProvider("verbs"); err != nil {
		require.Contains(t, out, "no RDMA device: the verbs provider is not built in (build with -tags rdma); using the soft provider\n")
	}

	code, out, errOut = runCmd("devices", "--json", "--provider", "soft")
	require.Equal(t, 0, code, errOut)
	var rep devicesReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.Len(t, rep.Providers, 1)
	require.Equal(t, "soft", rep.Providers[0].Name)
	require.NotEmpty(t, rep.Providers[0].Devices)
	require.Equal(t, "soft0", rep.Providers[0].Devices[0].Name)
}

func TestDevicesCommandErrors(t *testing.T) {
	code, _, errOut := runCmd("devices", "--provider", "nope")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, `--provider "nope": no such ibv provider`)

	code, _, errOut = runCmd("devices", "--bogus")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "flag provided but not defined: -bogus")

	code, _, errOut = runCmd("devices", "extra")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "unexpected arguments")
}

func TestHelp(t *testing.T) {
	code, _, errOut := runCmd("devices", "--help")
	require.Equal(t, 0, code)
	require.Contains(t, errOut, "usage: twosided devices [--provider name] [--json]")
	require.Contains(t, errOut, "-provider")
	require.Contains(t, errOut, "-json")

	code, out, _ := runCmd("help", "devices")
	require.Equal(t, 0, code)
	require.Contains(t, out, "usage: twosided devices")

	code, out, _ = runCmd("--help")
	require.Equal(t, 0, code)
	require.Contains(t, out, "devices")

	code, _, errOut = runCmd()
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "usage: twosided <command>")

	code, _, errOut = runCmd("frobnicate")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `unknown command "frobnicate"`)
}

// The source GID shown is ibv.SelectGID's, the one an engine uses: the RoCE v2 IPv4 entry
// of an mlx5-like table, or MC_GID_INDEX's entry; an empty index is shown with its error.
func TestDevicesSourceGID(t *testing.T) {
	ll := ibv.GID{0: 0xfe, 1: 0x80, 8: 2, 15: 1}
	v4 := ibv.GID{10: 0xff, 11: 0xff, 12: 10, 15: 7}
	dev := ibv.DeviceInfo{Name: "mlx5_0", Provider: "verbs", Ports: []ibv.PortAttr{{
		Num: 1, State: ibv.PortActive, LinkLayer: "Ethernet", GIDIndex: 3, GID: v4,
		GIDs: []ibv.GIDEntry{{Index: 0, Type: ibv.GIDTypeRoCEv1, GID: ll}, {Index: 1, Type: ibv.GIDTypeRoCEv2, GID: ll},
			{Index: 2, Type: ibv.GIDTypeRoCEv1, GID: v4}, {Index: 3, Type: ibv.GIDTypeRoCEv2, GID: v4}},
	}}}
	p := fakeProvider{name: "verbs", devs: []ibv.DeviceInfo{dev}}
	for _, tt := range []struct {
		req       int
		wantIndex int
		wantType  string
		wantErr   string
	}{{-1, 3, "RoCE v2", ""}, {2, 2, "RoCE v1", ""}, {7, -1, "", "gid index 7 on port 1: empty"}} {
		rep, err := listDevices([]ibv.Provider{p}, "verbs", tt.req)
		require.NoError(t, err)
		pt := rep.Providers[0].Devices[0].Ports[0]
		require.Equal(t, tt.wantIndex, pt.GIDIndex)
		require.Equal(t, tt.wantType, pt.GIDType)
		require.Len(t, pt.GIDs, 4)
		if tt.wantErr != "" {
			require.Contains(t, pt.GIDError, tt.wantErr)
		}
		var out bytes.Buffer
		writeDevices(&out, rep)
		require.Contains(t, out.String(), "source GID:")
	}
}

// envNoLibChild marks TestWithoutLibibverbs' child process.
const envNoLibChild = "TWOSIDED_TEST_NOLIB_CHILD"

// The binary starts and works on a host without libibverbs: it does not link it (no NEEDED
// entry, no ibv_ symbol), and, run with TWOSIDED_LIBIBVERBS pointing nowhere (as if
// rdma-core were not installed), version and devices say why the verbs provider has no
// device and notifies go over oob and over rdma_twosided on the soft provider. Without -tags
// rdma the same holds, the verbs provider being not compiled in.
func TestWithoutLibibverbs(t *testing.T) {
	if os.Getenv(envNoLibChild) != "" {
		t.Skip("this is the child")
	}
	exe, err := os.Executable()
	require.NoError(t, err)
	f, err := elf.Open(exe)
	require.NoError(t, err)
	defer f.Close()
	libs, err := f.ImportedLibraries()
	require.NoError(t, err)
	for _, l := range libs {
		require.NotContains(t, l, "libibverbs", "NEEDED %s", l)
	}

	cmd := exec.Command(exe, "-test.run=^TestWithoutLibibverbsChild$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "TWOSIDED_LIBIBVERBS=/nonexistent/libibverbs.so.1", envNoLibChild+"=1")
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", b)
	require.Contains(t, string(b), "--- PASS: TestWithoutLibibverbsChild ", "%s", b)
}

func TestWithoutLibibverbsChild(t *testing.T) {
	if os.Getenv(envNoLibChild) == "" {
		t.Skip("run by TestWithoutLibibverbs")
	}
	_, verbsErr := ibv.LookupProvider(verbsProvider)
	compiled := verbsErr == nil
	const why = `libibverbs not loaded: dlopen "/nonexistent/libibverbs.so.1" (TWOSIDED_LIBIBVERBS): /nonexistent/libibverbs.so.1: `

	code, out, errOut := runCmd("version")
	require.Equal(t, 0, code, errOut)
	if compiled {
		require.Contains(t, out, "\nverbs:     compiled in, "+why)
	} else {
		require.Contains(t, out, "\nverbs:     not compiled in (build with -tags rdma)\n")
	}

	code, out, errOut = runCmd("devices")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "hca_id:\tsoft0\n")
	if compiled {
		require.Contains(t, out, "provider: verbs\n\tlibrary:\t"+why)
		require.Contains(t, out, "\nno RDMA device: "+why)
	}

	if compiled {
		// doctor's verdict names what is missing, once, and fails: the NIC path does not work.
		code, out, _ = runCmd("doctor")
		require.NotEqual(t, 0, code, out)
		require.Contains(t, out, "verdict: FAIL: no RDMA device: "+why)
		require.NotContains(t, out, "no RDMA device: no RDMA device")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tr := range []string{"oob", "rdma_twosided"} {
		addr, served := startServe(t, ctx, "--transport", tr, "--expect", "2")
		code, out, errOut = runCmd("send", "--peer", addr, "--transport", tr, "-n", "2", "--quiet")
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, "sent 2, failed 0, transport "+tr)
		r := <-served
		require.Equal(t, 0, r.code, r.stderr)
	}
}

// A soft device has its GID only while open (its listen address), so its listing has no
// GID table; devices opens it to show the source GID an engine takes, instead of "no usable
// GID": index 0, RoCE v2, the IPv4-mapped GID, or index 3 of an mlx5-shaped table.
func TestDevicesSoftGID(t *testing.T) {
	code, out, errOut := runCmd("devices", "--provider", "soft")
	require.Equal(t, 0, code, errOut)
	require.NotContains(t, out, "no usable GID")
	require.Contains(t, out, "hca_id:\tsoft0\n")
	require.Contains(t, out, "\tGIDs:\t\t\tfrom opening it here: a soft device's GID is its listen address, new at each open\n")
	require.Regexp(t, "\t\t\tGID\\[  0\\]:\t\t[0-9a-f]{2}:[0-9a-f]{2}(:00){8}:ff:ff:7f:00:00:01, RoCE v2\n", out)
	require.Contains(t, out, "\t\t\tsource GID:\t\tindex 0, RoCE v2, ")

	p := soft.New(soft.WithDevices(1), soft.WithPhantom(true), soft.WithGIDTable(soft.GIDTableMLX5))
	rep, err := listDevices([]ibv.Provider{p}, "soft", -1)
	require.NoError(t, err)
	devs := rep.Providers[0].Devices
	require.Len(t, devs, 2)
	pt := devs[0].Ports[0]
	require.NotEmpty(t, devs[0].GIDNote)
	require.Empty(t, pt.GIDError)
	require.Len(t, pt.GIDs, 4)
	require.Equal(t, 3, pt.GIDIndex)
	require.Equal(t, "RoCE v2", pt.GIDType)
	require.True(t, strings.HasSuffix(pt.GID, ":ff:ff:7f:00:00:01"), pt.GID)
	// The phantom device (port DOWN) is not opened: it has no GID and says why.
	require.Equal(t, soft.PhantomName, devs[1].Name)
	require.Empty(t, devs[1].GIDNote)
	require.Contains(t, devs[1].Ports[0].GIDError, "no usable GID")

	// The listing closed what it opened.
	_, err = p.DeviceGID("soft0")
	require.ErrorIs(t, err, ibv.ErrNoDevice)
}
