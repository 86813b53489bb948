package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/twosided/twosided/ibv"
)

func init() {
	register(&command{
		Name:    "devices",
		Summary: "List ibv providers, their devices and ports, like ibv_devinfo.",
		Usage:   "[--provider name] [--json]",
		Run:     runDevices,
	})
}

func runDevices(_ context.Context, fs *flag.FlagSet, args []string, stdout io.Writer) error {
	provider := fs.String("provider", "", "list only this provider's devices: soft or verbs (default every provider)")
	asJSON := fs.Bool("json", false, "print the listing as JSON")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	rep, err := listDevices(ibv.Providers(), *provider)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		writeDevices(stdout, rep)
	}
	if rep.deviceCount() == 0 {
		return fmt.Errorf("%w listed", ibv.ErrNoDevice)
	}
	return nil
}

// devicesReport is what `twosided devices` prints, as text or JSON.
type devicesReport struct {
	Providers []providerReport `json:"providers"`
	// Notes are plain-language lines about what is missing, e.g. why there is no RDMA device.
	Notes []string `json:"notes,omitempty"`
}

type providerReport struct {
	Name string `json:"name"`
	// Built is false for the verbs provider in a binary built without -tags rdma.
	Built   bool           `json:"built"`
	Devices []deviceReport `json:"devices"`
	Error   string         `json:"error,omitempty"`
}

type deviceReport struct {
	Name     string       `json:"name"`
	NodeGUID string       `json:"node_guid"`
	Ports    []portReport `json:"ports"`
}

type portReport struct {
	Port      uint8  `json:"port"`
	State     string `json:"state"`
	MaxMTU    int    `json:"max_mtu"`
	ActiveMTU int    `json:"active_mtu"`
	LID       uint16 `json:"lid"`
	GIDIndex  int    `json:"gid_index"`
	GID       string `json:"gid"`
	LinkLayer string `json:"link_layer"`
}

func (r devicesReport) deviceCount() int {
	n := 0
	for _, p := range r.Providers {
		n += len(p.Devices)
	}
	return n
}

// verbsProvider is the libibverbs provider's name; it is registered only with -tags rdma.
const verbsProvider = "verbs"

// listDevices queries every provider of providers (or only the one named only) and says
// plainly when there is no RDMA device and why.
func listDevices(providers []ibv.Provider, only string) (devicesReport, error) {
	var rep devicesReport
	var selected []ibv.Provider
	var names []string
	haveVerbs := false
	for _, p := range providers {
		names = append(names, p.Name())
		if p.Name() == verbsProvider {
			haveVerbs = true
		}
		if only == "" || p.Name() == only {
			selected = append(selected, p)
		}
	}
	if only != "" && len(selected) == 0 && only != verbsProvider {
		sort.Strings(names)
		return rep, fmt.Errorf("--provider %q: %w (registered: %s)", only, ibv.ErrNoProvider, strings.Join(names, ", "))
	}
	for _, p := range selected {
		pr := providerReport{Name: p.Name(), Built: true, Devices: []deviceReport{}}
		devs, err := p.GetDeviceList()
		if err != nil {
			pr.Error = err.Error()
		}
		for _, d := range devs {
			pr.Devices = append(pr.Devices, newDeviceReport(d))
		}
		rep.Providers = append(rep.Providers, pr)
		if p.Name() == verbsProvider && err != nil {
			reason := strings.TrimPrefix(err.Error(), ibv.ErrNoDevice.Error()+": ")
			rep.Notes = append(rep.Notes, fmt.Sprintf("no RDMA device: %s; using the soft provider", reason))
		}
	}
	if !haveVerbs && (only == "" || only == verbsProvider) {
		rep.Providers = append(rep.Providers, providerReport{
			Name: verbsProvider, Devices: []deviceReport{},
			Error: "not built in (build with -tags rdma)",
		})
		rep.Notes = append(rep.Notes,
			"no RDMA device: the verbs provider is not built in (build with -tags rdma); using the soft provider")
	}
	return rep, nil
}

func newDeviceReport(d ibv.DeviceInfo) deviceReport {
	g := d.NodeGUID
	dr := deviceReport{
		Name:     d.Name,
		NodeGUID: fmt.Sprintf("%04x:%04x:%04x:%04x", g>>48, g>>32&0xffff, g>>16&0xffff, g&0xffff),
		Ports:    []portReport{},
	}
	for _, p := range d.Ports {
		dr.Ports = append(dr.Ports, portReport{
			Port:      p.Num,
			State:     p.State.String(),
			MaxMTU:    p.MaxMTU.Bytes(),
			ActiveMTU: p.ActiveMTU.Bytes(),
			LID:       p.LID,
			GIDIndex:  p.GIDIndex,
			GID:       p.GID.String(),
			LinkLayer: p.LinkLayer,
		})
	}
	return dr
}

// writeDevices prints rep in ibv_devinfo's layout: per provider a header line, then one
// block per device; a blank line ends every block.
func writeDevices(w io.Writer, rep devicesReport) {
	for _, p := range rep.Providers {
		fmt.Fprintf(w, "provider: %s\n", p.Name)
		if p.Error != "" {
			fmt.Fprintf(w, "\terror:\t%s\n", p.Error)
		}
		if len(p.Devices) == 0 {
			fmt.Fprintln(w)
		}
		for _, d := range p.Devices {
			fmt.Fprintf(w, "hca_id:\t%s\n", d.Name)
			fmt.Fprintf(w, "\tprovider:\t\t%s\n", p.Name)
			fmt.Fprintf(w, "\tnode_guid:\t\t%s\n", d.NodeGUID)
			fmt.Fprintf(w, "\tphys_port_cnt:\t\t%d\n", len(d.Ports))
			for _, pt := range d.Ports {
				fmt.Fprintf(w, "\t\tport:\t%d\n", pt.Port)
				fmt.Fprintf(w, "\t\t\tstate:\t\t\t%s\n", pt.State)
				fmt.Fprintf(w, "\t\t\tmax_mtu:\t\t%d\n", pt.MaxMTU)
				fmt.Fprintf(w, "\t\t\tactive_mtu:\t\t%d\n", pt.ActiveMTU)
				fmt.Fprintf(w, "\t\t\tport_lid:\t\t%d\n", pt.LID)
				fmt.Fprintf(w, "\t\t\tgid_index:\t\t%d\n", pt.GIDIndex)
				fmt.Fprintf(w, "\t\t\tGID:\t\t\t%s\n", pt.GID)
				fmt.Fprintf(w, "\t\t\tlink_layer:\t\t%s\n", pt.LinkLayer)
			}
			fmt.Fprintln(w)
		}
	}
	for _, n := range rep.Notes {
		fmt.Fprintln(w, n)
	}
}
