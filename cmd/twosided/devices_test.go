package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv"
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
