package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/reactor/limits"
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
	gidIndex := int(limits.GIDIndex.Default)
	if s, ok := os.LookupEnv(limits.GIDIndex.Env); ok && strings.TrimSpace(s) != "" {
		v, err := limits.GIDIndex.ParseEnv(s)
		if err != nil {
			return err
		}
		gidIndex = int(v)
	}
	rep, err := listDevices(ibv.Providers(), *provider, gidIndex)
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
	Built bool `json:"built"`
	// Library is the file the provider's shared library was loaded from (verbs:
	// libibverbs, dlopened at run time); LibraryError says why it could not be loaded
	// (dlerror's text). Both are empty for a provider that loads none.
	Library      string         `json:"library,omitempty"`
	LibraryError string         `json:"library_error,omitempty"`
	Devices      []deviceReport `json:"devices"`
	Error        string         `json:"error,omitempty"`
}

type deviceReport struct {
	Name     string `json:"name"`
	NodeGUID string `json:"node_guid"`
	// GIDNote says where the GIDs of a soft device come from: it has them only while open
	// (see openForGIDs).
	GIDNote string       `json:"gid_note,omitempty"`
	Ports   []portReport `json:"ports"`
}

type portReport struct {
	Port      uint8  `json:"port"`
	State     string `json:"state"`
	MaxMTU    int    `json:"max_mtu"`
	ActiveMTU int    `json:"active_mtu"`
	LID       uint16 `json:"lid"`
	// GIDIndex, GIDType and GID are the source GID an engine's ctrl channels use on this
	// port (ibv.SelectGID: MC_GID_INDEX when set, else the automatic choice): the GID
	// advertised in handshakes and the QP's sgid_index. GIDIndex is -1 and GIDError says
	// why when there is none.
	GIDIndex  int         `json:"gid_index"`
	GIDType   string      `json:"gid_type"`
	GID       string      `json:"gid"`
	GIDChoice string      `json:"gid_chosen_by"` // "auto" or "MC_GID_INDEX"
	GIDError  string      `json:"gid_error,omitempty"`
	GIDs      []gidReport `json:"gids,omitempty"`
	LinkLayer string      `json:"link_layer"`
}

// gidReport is one valid entry of a port's GID table.
type gidReport struct {
	Index int    `json:"index"`
	Type  string `json:"type"`
	GID   string `json:"gid"`
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
// gidIndex is MC_GID_INDEX (-1: auto).
func listDevices(providers []ibv.Provider, only string, gidIndex int) (devicesReport, error) {
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
		if lp, ok := p.(libraryProvider); ok {
			if path, lerr := lp.Library(); lerr != nil {
				pr.LibraryError = lerr.Error()
			} else {
				pr.Library = path
			}
		}
		for _, d := range devs {
			d, note := openForGIDs(p, d)
			dr := newDeviceReport(d, gidIndex)
			dr.GIDNote = note
			pr.Devices = append(pr.Devices, dr)
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

// openForGIDs returns d as an open context sees it when d is a soft device with an active
// port that lists no GID, and a note that says so. A soft device's GID is its listen
// address, which it has only while it is open, so its listing has no GID table and
// SelectGID found "no usable GID" where an engine uses index 0 (RoCE v2; 3 of an mlx5-shaped
// table). The listing opens the device (a listener on 127.0.0.1, closed at once) to show the
// table an engine's device has: its shape, the source GID's index and type; the GIDs
// themselves are this open's, since every open listens anew. Other devices are returned as
// they are, with no note.
func openForGIDs(p ibv.Provider, d ibv.DeviceInfo) (ibv.DeviceInfo, string) {
	if p.Name() != "soft" {
		return d, ""
	}
	need := false
	for _, pa := range d.Ports {
		if pa.State == ibv.PortActive && len(pa.GIDTable()) == 0 {
			need = true
		}
	}
	if !need {
		return d, ""
	}
	c, err := p.Open(d.Name)
	if err != nil {
		return d, fmt.Sprintf("a soft device has its GID (its listen address) only while open, and opening %s failed: %v", d.Name, err)
	}
	defer func() { _ = c.Close() }()
	ports := append([]ibv.PortAttr(nil), d.Ports...)
	for i, pa := range ports {
		if q, err := c.QueryPort(pa.Num); err == nil {
			ports[i] = q
		}
	}
	d.Ports = ports
	return d, "from opening it here: a soft device's GID is its listen address, new at each open"
}

func newDeviceReport(d ibv.DeviceInfo, gidIndex int) deviceReport {
	g := d.NodeGUID
	dr := deviceReport{
		Name:     d.Name,
		NodeGUID: fmt.Sprintf("%04x:%04x:%04x:%04x", g>>48, g>>32&0xffff, g>>16&0xffff, g&0xffff),
		Ports:    []portReport{},
	}
	for _, p := range d.Ports {
		pr := portReport{
			Port:      p.Num,
			State:     p.State.String(),
			MaxMTU:    p.MaxMTU.Bytes(),
			ActiveMTU: p.ActiveMTU.Bytes(),
			LID:       p.LID,
			GIDIndex:  -1,
			GIDChoice: "auto",
			LinkLayer: p.LinkLayer,
		}
		if gidIndex >= 0 {
			pr.GIDChoice = limits.GIDIndex.Env
		}
		if sel, err := ibv.SelectGID(p, gidIndex); err != nil {
			pr.GIDError = err.Error()
		} else {
			pr.GIDIndex, pr.GIDType, pr.GID = sel.Index, sel.Type.String(), sel.GID.String()
		}
		for _, g := range p.GIDs {
			pr.GIDs = append(pr.GIDs, gidReport{Index: g.Index, Type: g.Type.String(), GID: g.GID.String()})
		}
		dr.Ports = append(dr.Ports, pr)
	}
	return dr
}

// writeDevices prints rep in ibv_devinfo's layout: per provider a header line, then one
// block per device; a blank line ends every block.
func writeDevices(w io.Writer, rep devicesReport) {
	for _, p := range rep.Providers {
		fmt.Fprintf(w, "provider: %s\n", p.Name)
		switch {
		case p.LibraryError != "":
			// The device list's error says the same after "no RDMA device: ".
			fmt.Fprintf(w, "\tlibrary:\t%s\n", p.LibraryError)
		case p.Library != "":
			fmt.Fprintf(w, "\tlibrary:\tlibibverbs loaded from %s\n", p.Library)
		}
		if p.Error != "" && p.LibraryError == "" {
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
			if d.GIDNote != "" {
				fmt.Fprintf(w, "\tGIDs:\t\t\t%s\n", d.GIDNote)
			}
			for _, pt := range d.Ports {
				fmt.Fprintf(w, "\t\tport:\t%d\n", pt.Port)
				fmt.Fprintf(w, "\t\t\tstate:\t\t\t%s\n", pt.State)
				fmt.Fprintf(w, "\t\t\tmax_mtu:\t\t%d\n", pt.MaxMTU)
				fmt.Fprintf(w, "\t\t\tactive_mtu:\t\t%d\n", pt.ActiveMTU)
				fmt.Fprintf(w, "\t\t\tport_lid:\t\t%d\n", pt.LID)
				fmt.Fprintf(w, "\t\t\tlink_layer:\t\t%s\n", pt.LinkLayer)
				for _, g := range pt.GIDs {
					fmt.Fprintf(w, "\t\t\tGID[%3d]:\t\t%s, %s\n", g.Index, g.GID, g.Type)
				}
				if pt.GIDError != "" {
					fmt.Fprintf(w, "\t\t\tsource GID:\t\tnone (%s): %s\n", pt.GIDChoice, pt.GIDError)
					continue
				}
				fmt.Fprintf(w, "\t\t\tsource GID:\t\tindex %d, %s, %s (%s)\n", pt.GIDIndex, pt.GIDType, pt.GID, pt.GIDChoice)
			}
			fmt.Fprintln(w)
		}
	}
	for _, n := range rep.Notes {
		fmt.Fprintln(w, n)
	}
}
