package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/notify"
	"github.com/twosided/twosided/notify/directory"
	"github.com/twosided/twosided/oob"
	"github.com/twosided/twosided/reactor/limits"
)

func init() {
	register(&command{
		Name:    "doctor",
		Summary: "Check the RDMA path: devices, ports, GIDs, a loopback RC SEND/RECV, a notify echo over rdma_twosided, a remote engine (--peer); hints and one verdict line.",
		Usage:   "[--peer host:port|server-name [--metadata conn] [--listen host:port]] [--provider name] [--device name] [--timeout d] [--allow-soft] [--json]",
		Run:     runDoctor,
	})
}

// doctorHelp is printed under the usage line by --help.
const doctorHelp = `
doctor lists every device of the providers built in (ports: state, link layer, active MTU,
LID, the P_Key index the QPs use, the GID table and the source GID twosided uses, as
ibv.SelectGID picks it with MC_GID_INDEX), then on each device with an active port:
  loopback  two RC QPs of the device connected to each other, one SEND, its RECV checked
  echo      two notify engines in this process over rdma_twosided on that device, one
            notify each way, and the path each took: the ctrl channel or OOB fallback
  peer      with --peer host:port: an engine on the best device sends one notify to a remote
            engine (twosided serve --transport rdma_twosided there): the OOB handshake,
            the ctrl channel and the path the notify took
Every step is bounded by --timeout. The MC_* environment applies as it does to an engine
(MC_GID_INDEX, MC_MTU, MC_IB_TC, MC_IB_SL, MC_PKEY_INDEX, MC_IB_PORT, MC_HANDSHAKE_PORT).
When a step fails, "hint:" lines say what to set; the last line is the verdict.

Exit status: 0 only when the NIC path works: a device of the verbs provider (libibverbs)
passes the loopback and the echo over the ctrl channel (and the peer check, with --peer).
The soft provider (RC over TCP, always built in) is no NIC: with it alone doctor exits 1
with "verdict: FAIL: no RDMA device ...", unless --allow-soft accepts it (tests, machines
that are meant to run on it) and no NIC has an active port (an engine would take that NIC
first, so its failure stays the verdict). 1: the path does not work; 2: a bad command line.`

func runDoctor(ctx context.Context, fs *flag.FlagSet, args []string, stdout io.Writer) error {
	var o doctorOptions
	fs.StringVar(&o.peer, "peer", "", "also check a remote engine at this OOB address (host:port of twosided serve --transport rdma_twosided), or of this server name with --metadata")
	var df dirFlags
	df.define(fs)
	fs.StringVar(&o.provider, "provider", "", "check only this provider's devices: soft or verbs (default every provider)")
	fs.StringVar(&o.device, "device", "", "check only the device of this name (default every device)")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "bound of each step (opening a device, the loopback, the echo, the peer check)")
	fs.BoolVar(&o.allowSoft, "allow-soft", false, "accept the soft provider (RC over TCP) as the device: exit 0 when it works and no NIC has an active port")
	fs.StringVar(&o.listen, "listen", "", "OOB listen address of the engine of the peer check (default from MC_HANDSHAKE_PORT, else 127.0.0.1:0)")
	asJSON := fs.Bool("json", false, "print the report as JSON (the verdict and hints included)")
	usage := fs.Usage
	fs.Usage = func() { usage(); fmt.Fprintln(fs.Output(), doctorHelp) }
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if o.timeout <= 0 {
		return usageError(fs, fmt.Sprintf("--timeout %v: must be positive", o.timeout))
	}
	if o.peer != "" {
		_, _, aerr := net.SplitHostPort(o.peer)
		meta := df.metadata
		if meta == "" {
			meta = os.Getenv("MC_METADATA_SERVER")
		}
		cid := df.clusterID
		if cid == "" {
			cid = os.Getenv("MC_METADATA_CLUSTER_ID")
		}
		switch {
		case aerr != nil && meta == "":
			return usageError(fs, fmt.Sprintf("--peer %q: not host:port (%v); a server name needs --metadata or MC_METADATA_SERVER", o.peer, aerr))
		case meta != "" && meta != directory.P2PHandshake:
			addr, err := resolvePeerName(ctx, meta, cid, o.peer, o.timeout)
			switch {
			case err == nil:
				o.peerName, o.peer = o.peer, addr
			case aerr == nil && errors.Is(err, notify.ErrPeerUnknown):
				// a host:port that is no server name is an address, as for the engine
			default:
				return fmt.Errorf("doctor: --peer %s: %w", o.peer, err)
			}
		}
	}
	rep := doctor(ctx, o, ibv.Providers())
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		writeDoctor(stdout, rep)
	}
	if !rep.OK {
		return errDoctorFailed
	}
	return nil
}

// errDoctorFailed makes the exit status 1; the verdict line has said why.
var errDoctorFailed = errors.New("the RDMA path does not work (see the verdict)")

type doctorOptions struct {
	peer, provider, device, listen string
	peerName                       string // --peer's server name; peer is then its address
	timeout                        time.Duration
	allowSoft                      bool
}

// doctorReport is what doctor prints, as text or JSON.
type doctorReport struct {
	// OK is the exit status: true only when the NIC path works (or the soft one, with
	// --allow-soft).
	OK      bool   `json:"ok"`
	Verdict string `json:"verdict"`
	// Config is the MC_* settings in force, as an engine reads them.
	Config    map[string]string `json:"config"`
	Timeout   string            `json:"timeout"`
	Providers []doctorProvider  `json:"providers"`
	Peer      *doctorStep       `json:"peer,omitempty"`
	Hints     []string          `json:"hints,omitempty"`
	Notes     []string          `json:"notes,omitempty"`
}

type doctorProvider struct {
	Name    string         `json:"name"`
	Built   bool           `json:"built"`
	Error   string         `json:"error,omitempty"`
	Devices []doctorDevice `json:"devices"`
}

type doctorDevice struct {
	Name     string       `json:"name"`
	Provider string       `json:"provider"`
	NodeGUID string       `json:"node_guid"`
	Error    string       `json:"error,omitempty"`
	Ports    []doctorPort `json:"ports"`
	// Echo is the engine-level notify echo on this device (nil: no active port).
	Echo *doctorStep `json:"echo,omitempty"`
	// OK: a port's loopback and the echo over the ctrl channel both passed.
	OK bool `json:"ok"`
}

type doctorPort struct {
	Port      uint8  `json:"port"`
	State     string `json:"state"`
	LinkLayer string `json:"link_layer"`
	ActiveMTU int    `json:"active_mtu"`
	MaxMTU    int    `json:"max_mtu"`
	LID       uint16 `json:"lid"`
	// PKeyIndex is the P_Key table index twosided's QPs use (MC_PKEY_INDEX); PKey its value
	// where the kernel shows it (sysfs), else empty.
	PKeyIndex int    `json:"pkey_index"`
	PKey      string `json:"pkey,omitempty"`
	// The source GID a ctrl channel on this port would use (ibv.SelectGID with
	// MC_GID_INDEX): index -1 and GIDError when there is none.
	GIDIndex  int         `json:"gid_index"`
	GIDType   string      `json:"gid_type,omitempty"`
	GID       string      `json:"gid,omitempty"`
	GIDAddr   string      `json:"gid_addr,omitempty"` // the GID as an IPv6 address
	GIDChoice string      `json:"gid_chosen_by"`
	GIDError  string      `json:"gid_error,omitempty"`
	GIDs      []doctorGID `json:"gids"`
	// Loopback is the RC SEND/RECV between two QPs of this port (nil: the port is not
	// active or has no source GID).
	Loopback *doctorStep `json:"loopback,omitempty"`
}

type doctorGID struct {
	Index int    `json:"index"`
	Type  string `json:"type"`
	GID   string `json:"gid"`
	Addr  string `json:"addr"`
}

// doctorStep is one check's outcome.
type doctorStep struct {
	Name   string `json:"name"` // loopback, echo, peer
	OK     bool   `json:"ok"`
	Status string `json:"status"` // OK or FAIL
	Detail string `json:"detail"`
	Error  string `json:"error,omitempty"`
	// Path is what the echo's or peer's notifies took: "channel" (every one over the ctrl
	// channel), "oob" (OOB fallback) or "none" (not delivered).
	Path      string  `json:"path,omitempty"`
	ElapsedMS float64 `json:"elapsed_ms"`
	// Summary is the failure in a few words, for the verdict.
	Summary string `json:"summary,omitempty"`
}

// doctorConfig is the MC_* environment doctor applies to its own QPs and reports.
type doctorConfig struct {
	gidIndex, mtu, tc, sl, pkeyIndex, ibPort int
	shown                                    map[string]string
	errs                                     []string
}

func readDoctorConfig() doctorConfig {
	c := doctorConfig{shown: map[string]string{}}
	get := func(l *limits.Limit) int {
		v := l.Default
		if s, ok := os.LookupEnv(l.Env); ok && strings.TrimSpace(s) != "" {
			p, err := l.ParseEnv(s)
			if err != nil {
				c.errs = append(c.errs, err.Error())
			} else {
				v = p
			}
		}
		shown := strconv.FormatInt(v, 10)
		for _, sp := range l.Special {
			if sp.Value == v && sp.Word != "" {
				shown = sp.Word
			}
		}
		if l == &limits.HandshakePort && v == 0 {
			shown = "unset"
		}
		c.shown[l.Env] = shown
		return int(v)
	}
	c.gidIndex = get(&limits.GIDIndex)
	c.mtu = get(&limits.MTU)
	c.tc = get(&limits.TrafficClass)
	c.sl = get(&limits.ServiceLevel)
	c.pkeyIndex = get(&limits.PKeyIndex)
	c.ibPort = get(&limits.IBPort)
	get(&limits.HandshakePort)
	return c
}

// hints collects hint lines once each, in order.
type hints struct{ lines []string }

func (h *hints) add(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	for _, l := range h.lines {
		if l == s {
			return
		}
	}
	h.lines = append(h.lines, s)
}

func doctor(ctx context.Context, o doctorOptions, providers []ibv.Provider) doctorReport {
	cfg := readDoctorConfig()
	rep := doctorReport{Config: cfg.shown, Timeout: o.timeout.String(), Providers: []doctorProvider{}}
	var h hints
	if len(cfg.errs) > 0 {
		rep.Verdict = "FAIL: bad configuration: " + strings.Join(cfg.errs, "; ")
		h.add("fix or unset the variables named in the verdict (docs/configuration.md lists their ranges)")
		rep.Hints = h.lines
		return rep
	}
	var open []ibv.Context // held to the end: a soft device keeps its GID while open
	defer func() {
		for _, c := range open {
			_ = c.Close()
		}
	}()
	haveVerbs := false
	for _, p := range providers {
		if p.Name() == verbsProvider {
			haveVerbs = true
		}
		if o.provider != "" && p.Name() != o.provider {
			continue
		}
		pr := doctorProvider{Name: p.Name(), Built: true, Devices: []doctorDevice{}}
		devs, err := p.GetDeviceList()
		if err != nil {
			pr.Error = err.Error()
		}
		for _, d := range devs {
			if o.device != "" && d.Name != o.device {
				continue
			}
			dd, c := inspectDevice(ctx, o, cfg, p, d, &h)
			if c != nil {
				open = append(open, c)
			}
			pr.Devices = append(pr.Devices, dd)
		}
		rep.Providers = append(rep.Providers, pr)
	}
	if !haveVerbs && (o.provider == "" || o.provider == verbsProvider) {
		rep.Providers = append(rep.Providers, doctorProvider{Name: verbsProvider, Devices: []doctorDevice{},
			Error: "not built in (build with -tags rdma)"})
	}
	if o.provider != "" && len(rep.Providers) == 0 {
		rep.Verdict = fmt.Sprintf("FAIL: --provider %q: %v", o.provider, ibv.ErrNoProvider)
		rep.Hints = h.lines
		return rep
	}

	// The device of the verdict and of the peer check: a working NIC first, then (with
	// --allow-soft) a working soft device.
	best, bestPort := pickDevice(rep.Providers, o.allowSoft)
	if o.peer != "" {
		target := best
		if target == nil {
			target = firstActive(rep.Providers, o.allowSoft)
		}
		if target != nil {
			st := peerCheck(ctx, o, *target, &h)
			rep.Peer = &st
		} else {
			rep.Peer = &doctorStep{Name: "peer", Status: "FAIL", Path: "none",
				Detail: "not run: no device with an active port"}
		}
	}
	rep.OK, rep.Verdict = verdict(rep, o, best, bestPort)
	if !haveVerbs {
		rep.Notes = append(rep.Notes, "the verbs provider (libibverbs) is not built in: build with -tags rdma to check a NIC")
	}
	rep.Hints = h.lines
	return rep
}

// inspectDevice opens d, reads its ports and runs the loopback on each active port and the
// echo on the device. The open context is returned to be closed at the end.
func inspectDevice(ctx context.Context, o doctorOptions, cfg doctorConfig, p ibv.Provider, d ibv.DeviceInfo, h *hints) (doctorDevice, ibv.Context) {
	g := d.NodeGUID
	dd := doctorDevice{Name: d.Name, Provider: p.Name(), Ports: []doctorPort{},
		NodeGUID: fmt.Sprintf("%04x:%04x:%04x:%04x", g>>48, g>>32&0xffff, g>>16&0xffff, g&0xffff)}
	c, err := bounded(ctx, o.timeout, "open "+d.Name, func(context.Context) (ibv.Context, error) { return p.Open(d.Name) })
	ports := d.Ports
	if err != nil {
		dd.Error = fmt.Sprintf("open: %v", err)
		h.add("%s cannot be opened (%v): check the driver (ibv_devinfo -d %s, dmesg) or exclude it with MC_TE_FILTERS", d.Name, err, d.Name)
	} else {
		for i, pa := range ports {
			// The port as the open device sees it (a soft device has its GID only once open).
			if q, err := c.QueryPort(pa.Num); err == nil {
				ports[i] = q
			}
		}
	}
	anyActive := false
	hintsBefore := len(h.lines)
	for _, pa := range ports {
		dp := portOf(pa, cfg, p.Name(), d.Name)
		if pa.State != ibv.PortActive {
			h.add("%s port %d is %s: bring the link up (ibstat, ip link, the cable or the switch port), or choose another port (MC_IB_PORT) or device (MC_TE_FILTERS)",
				d.Name, pa.Num, pa.State)
		} else {
			anyActive = true
			if dp.GIDError != "" {
				gidHint(h, d.Name, pa, cfg)
			} else if c != nil {
				if dp.GIDType == ibv.GIDTypeRoCEv1.String() {
					h.add("%s port %d sends RoCE v1 (GID %d): it is not routed beyond the L2 segment, and a peer that sends RoCE v2 (Mooncake's MC_GID_INDEX=3 on mlx5) cannot connect; enable RoCE v2 on the NIC, or set MC_GID_INDEX to a RoCE v1 entry on every node",
						d.Name, pa.Num, dp.GIDIndex)
				}
				st := loopback(ctx, o.timeout, p, d.Name, pa, cfg, h)
				dp.Loopback = &st
			}
		}
		dd.Ports = append(dd.Ports, dp)
	}
	if anyActive && err == nil {
		hinted := len(h.lines) > hintsBefore // the port's own hint says more than the echo's
		st := echo(ctx, o.timeout, p.Name(), d.Name, hinted, h)
		dd.Echo = &st
		for _, dp := range dd.Ports {
			if dp.Loopback != nil && dp.Loopback.OK && st.OK {
				dd.OK = true
			}
		}
	}
	return dd, c
}

func portOf(pa ibv.PortAttr, cfg doctorConfig, provider, dev string) doctorPort {
	dp := doctorPort{Port: pa.Num, State: pa.State.String(), LinkLayer: pa.LinkLayer, ActiveMTU: pa.ActiveMTU.Bytes(),
		MaxMTU: pa.MaxMTU.Bytes(), LID: pa.LID, PKeyIndex: cfg.pkeyIndex, GIDIndex: -1, GIDChoice: "auto", GIDs: []doctorGID{}}
	if provider == verbsProvider {
		if b, err := os.ReadFile(fmt.Sprintf("/sys/class/infiniband/%s/ports/%d/pkeys/%d", dev, pa.Num, cfg.pkeyIndex)); err == nil {
			dp.PKey = strings.TrimSpace(string(b))
		}
	}
	if cfg.gidIndex >= 0 {
		dp.GIDChoice = limits.GIDIndex.Env
	}
	for _, e := range pa.GIDTable() {
		dp.GIDs = append(dp.GIDs, doctorGID{Index: e.Index, Type: e.Type.String(), GID: e.GID.String(), Addr: gidAddr(e.GID)})
	}
	if sel, err := ibv.SelectGID(pa, cfg.gidIndex); err != nil {
		dp.GIDError = err.Error()
	} else {
		dp.GIDIndex, dp.GIDType, dp.GID, dp.GIDAddr = sel.Index, sel.Type.String(), sel.GID.String(), gidAddr(sel.GID)
	}
	return dp
}

// gidAddr is a GID as an IPv6 address, e.g. ::ffff:127.0.0.1.
func gidAddr(g ibv.GID) string { return netip.AddrFrom16(g).String() }

// gidHint says what to set when a port has no usable source GID.
func gidHint(h *hints, dev string, pa ibv.PortAttr, cfg doctorConfig) {
	auto, autoErr := ibv.SelectGID(pa, -1)
	var v2 []string
	for _, e := range pa.GIDTable() {
		if e.Type == ibv.GIDTypeRoCEv2 && !e.GID.IsZero() {
			v2 = append(v2, strconv.Itoa(e.Index))
		}
	}
	switch {
	case cfg.gidIndex >= 0 && autoErr == nil:
		h.add("MC_GID_INDEX=%d is no usable GID of %s port %d: unset MC_GID_INDEX (auto picks index %d, %s, %s) or set one of the valid entries",
			cfg.gidIndex, dev, pa.Num, auto.Index, auto.Type, gidAddr(auto.GID))
	case pa.LinkLayer == "Ethernet" && len(pa.GIDTable()) == 0:
		h.add("%s port %d has an empty GID table: give its netdev an IP address (ip addr add … dev <netdev>); RoCE GIDs follow the addresses", dev, pa.Num)
	default:
		h.add("%s port %d has no GID its link layer (%s) can use: check the GID types (/sys/class/infiniband/%s/ports/%d/gid_attrs/types/) and set MC_GID_INDEX to a usable one",
			dev, pa.Num, pa.LinkLayer, dev, pa.Num)
	}
	if pa.LinkLayer == "Ethernet" && len(v2) == 0 && len(pa.GIDTable()) > 0 {
		h.add("%s port %d lists no RoCE v2 GID: both sides must then use RoCE v1 (MC_GID_INDEX on each), or enable RoCE v2 on the NIC", dev, pa.Num)
	}
}

// errStepTimeout is wrapped by the error of a step that did not end within --timeout.
var errStepTimeout = errors.New("no answer")

// bounded runs f with a context bounded by d and returns its result, or an error naming
// what when d passes first (f then goes on in the background and cleans up after itself).
func bounded[T any](ctx context.Context, d time.Duration, what string, f func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := f(ctx)
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		var zero T
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return zero, fmt.Errorf("%s: %w within %v (--timeout)", what, errStepTimeout, d)
		}
		return zero, fmt.Errorf("%s: %w", what, ctx.Err())
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// loopback connects two RC QPs of one port to each other (each the other's destination,
// through the port's own source GID) and checks one SEND arrives in the other's RECV. It
// opens its own context, so that a hung verb cannot hold up the rest.
func loopback(ctx context.Context, timeout time.Duration, p ibv.Provider, dev string, pa ibv.PortAttr, cfg doctorConfig, h *hints) doctorStep {
	st := doctorStep{Name: "loopback", Status: "FAIL", Path: "none"}
	gid, _ := ibv.SelectGID(pa, cfg.gidIndex)
	mtu := pa.ActiveMTU
	if cfg.mtu > 0 {
		if m, err := ibv.MTUFromBytes(cfg.mtu); err == nil {
			mtu = ibv.MinMTU(mtu, m)
		}
	}
	start := time.Now()
	stage, err := bounded(ctx, timeout, "verbs calls", func(ctx context.Context) (string, error) {
		return runLoopback(ctx, p, dev, pa, gid, mtu, cfg)
	})
	st.ElapsedMS = ms(time.Since(start))
	where := fmt.Sprintf("%s port %d", dev, pa.Num)
	if err != nil {
		st.Error = err.Error()
		st.Detail = fmt.Sprintf("RC SEND/RECV between two QPs of %s (GID %d, path MTU %d) failed: %v", where, gid.Index, mtu.Bytes(), err)
		switch {
		case errors.Is(err, errStepTimeout):
			h.add("%s: a verb did not return within --timeout (modify to RTR resolves the GID's address: check the netdev's neighbour/ARP, the GID's address, and that the driver is healthy)", where)
		case stage == "rtr":
			h.add("%s: the QP could not reach RTR with GID index %d (%s) and path MTU %d: set MC_GID_INDEX to another entry of the table (RoCE v2 of the interface's IPv4 address first) and MC_MTU to one the link carries (1024 for an Ethernet MTU of 1500, 4096 for jumbo frames)",
				where, gid.Index, gid.Type, mtu.Bytes())
		case stage == "completion":
			h.add("%s: the SEND did not complete: with MC_IB_TC/MC_IB_SL set the fabric must carry that class (unset them, or use the lossless class the switches are configured for); check MC_MTU against the link's MTU", where)
		default:
			h.add("%s: the loopback failed before any traffic (%v): check the driver and its limits (ulimit -l for memory registration)", where, err)
		}
		return st
	}
	st.OK, st.Status, st.Path = true, "OK", "loopback"
	st.Detail = fmt.Sprintf("RC SEND/RECV between two QPs of %s: %s (GID %d, %s, path MTU %d)", where, stage, gid.Index, gid.Type, mtu.Bytes())
	return st
}

// runLoopback does the loopback's verbs; on failure the stage names where: "setup", "rtr"
// or "completion"; on success it says what was checked.
func runLoopback(ctx context.Context, p ibv.Provider, dev string, pa ibv.PortAttr, gid ibv.GIDEntry, mtu ibv.MTU, cfg doctorConfig) (stage string, err error) {
	var cleanup []func()
	defer func() {
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
	}()
	c, err := p.Open(dev)
	if err != nil {
		return "setup", fmt.Errorf("open: %w", err)
	}
	cleanup = append(cleanup, func() { _ = c.Close() })
	pd, err := c.AllocPD()
	if err != nil {
		return "setup", fmt.Errorf("alloc pd: %w", err)
	}
	cleanup = append(cleanup, func() { _ = pd.Dealloc() })
	cq, err := c.CreateCQ(16, nil)
	if err != nil {
		return "setup", fmt.Errorf("create cq: %w", err)
	}
	cleanup = append(cleanup, func() { _ = cq.Destroy() })
	buf := make([]byte, 8192)
	mr, err := pd.RegMR(buf, ibv.AccessLocalWrite)
	if err != nil {
		return "setup", fmt.Errorf("reg mr: %w", err)
	}
	cleanup = append(cleanup, func() { _ = mr.Dereg() })
	var qps [2]ibv.QP
	for i := range qps {
		qp, err := pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, Type: ibv.QPTypeRC,
			Cap: ibv.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			return "setup", fmt.Errorf("create qp: %w", err)
		}
		cleanup = append(cleanup, func() { _ = qp.Destroy() })
		if err := qp.Modify(&ibv.QPAttr{QPState: ibv.QPSInit, PortNum: pa.Num, PKeyIndex: uint16(cfg.pkeyIndex), QPAccessFlags: ibv.AccessLocalWrite},
			ibv.AttrState|ibv.AttrPKeyIndex|ibv.AttrPort|ibv.AttrAccessFlags); err != nil {
			return "setup", fmt.Errorf("qp %d to INIT (pkey index %d): %w", qp.QPNum(), cfg.pkeyIndex, err)
		}
		qps[i] = qp
	}
	a, b := qps[0], qps[1]
	msg := []byte("twosided doctor loopback")
	copy(buf, msg)
	const recvAt = 4096
	if _, err := b.PostRecv(&ibv.RecvWR{WRID: 2, SGList: []ibv.SGE{{Addr: mr.Addr() + recvAt, Length: 4096, LKey: mr.LKey()}}}); err != nil {
		return "setup", fmt.Errorf("post recv: %w", err)
	}
	for _, pair := range [][2]ibv.QP{{a, b}, {b, a}} {
		q, peer := pair[0], pair[1]
		ah := ibv.AHAttr{DLID: pa.LID, PortNum: pa.Num, SL: uint8(max(cfg.sl, 0))}
		if pa.LinkLayer == "Ethernet" || pa.LID == 0 {
			ah.IsGlobal, ah.DGID, ah.SGIDIndex, ah.HopLimit = true, gid.GID, uint8(gid.Index), 16
			ah.TrafficClass = uint8(max(cfg.tc, 0))
		}
		if err := q.Modify(&ibv.QPAttr{QPState: ibv.QPSRTR, PathMTU: mtu, DestQPNum: peer.QPNum(), MaxDestRdAtomic: 1, MinRNRTimer: 12, AHAttr: ah},
			ibv.AttrState|ibv.AttrAV|ibv.AttrPathMTU|ibv.AttrDestQPN|ibv.AttrRqPSN|ibv.AttrMaxDestRdAtomic|ibv.AttrMinRNRTimer); err != nil {
			return "rtr", fmt.Errorf("qp %d to RTR: %w", q.QPNum(), err)
		}
		if err := q.Modify(&ibv.QPAttr{QPState: ibv.QPSRTS, Timeout: 14, RetryCnt: 7, RnrRetry: 7, MaxRdAtomic: 1},
			ibv.AttrState|ibv.AttrTimeout|ibv.AttrRetryCnt|ibv.AttrRnrRetry|ibv.AttrSqPSN|ibv.AttrMaxQPRdAtomic); err != nil {
			return "rtr", fmt.Errorf("qp %d to RTS: %w", q.QPNum(), err)
		}
	}
	if _, err := a.PostSend(&ibv.SendWR{WRID: 1, Opcode: ibv.WRSend, SendFlags: ibv.SendSignaled,
		SGList: []ibv.SGE{{Addr: mr.Addr(), Length: uint32(len(msg)), LKey: mr.LKey()}}}); err != nil {
		return "setup", fmt.Errorf("post send: %w", err)
	}
	var sent, recvd *ibv.WC
	wcs := make([]ibv.WC, 4)
	for sent == nil || recvd == nil {
		n, err := cq.Poll(wcs)
		if err != nil {
			return "completion", fmt.Errorf("poll cq: %w", err)
		}
		for i := range wcs[:n] {
			wc := wcs[i]
			if err := wc.Err(); err != nil {
				return "completion", fmt.Errorf("wr %d on qp %d: %w", wc.WRID, wc.QPNum, err)
			}
			switch wc.WRID {
			case 1:
				sent = &wc
			case 2:
				recvd = &wc
			}
		}
		if n > 0 {
			continue
		}
		select {
		case <-ctx.Done():
			return "completion", fmt.Errorf("no completion of the SEND and its RECV (got send %v, recv %v)", sent != nil, recvd != nil)
		case <-time.After(200 * time.Microsecond):
		}
	}
	if recvd.ByteLen != uint32(len(msg)) || string(buf[recvAt:recvAt+len(msg)]) != string(msg) {
		return "completion", fmt.Errorf("the RECV holds %d bytes %q, want %q", recvd.ByteLen, buf[recvAt:recvAt+int(recvd.ByteLen)], msg)
	}
	return fmt.Sprintf("%d bytes from QP %d to QP %d", len(msg), a.QPNum(), b.QPNum()), nil
}

// echoResult is what one engine pair's echo found.
type echoResult struct {
	paths  [2]string // A→B, B→A
	detail string
	gid    ibv.GIDEntry
}

// echo runs two rdma_twosided engines on one device in this process and sends one notify
// each way; it reports the path each took.
func echo(ctx context.Context, timeout time.Duration, provider, dev string, hinted bool, h *hints) doctorStep {
	st := doctorStep{Name: "echo", Status: "FAIL", Path: "none"}
	start := time.Now()
	r, err := bounded(ctx, timeout, "engines", func(ctx context.Context) (echoResult, error) {
		return runEcho(ctx, provider, dev)
	})
	st.ElapsedMS = ms(time.Since(start))
	if err != nil {
		st.Error = err.Error()
		st.Detail = fmt.Sprintf("notify echo over rdma_twosided on %s failed: %v", dev, err)
		if hinted {
			return st
		}
		h.add("%s: two engines on this device could not exchange a notify: rerun with the MC_* variables of your application; MC_TE_FILTERS must name this device for it to be used", dev)
		return st
	}
	st.Detail = fmt.Sprintf("one notify each way between two engines on %s: A→B over %s, B→A over %s%s", dev, pathName(r.paths[0]), pathName(r.paths[1]), r.detail)
	st.Path = "channel"
	if r.paths[0] != "channel" || r.paths[1] != "channel" {
		st.Path = "oob"
		h.add("%s: notifies fell back to OOB: the ctrl channel was not made; try MC_GID_INDEX (another RoCE v2 entry), MC_MTU=1024, and unset MC_IB_TC/MC_IB_SL", dev)
		return st
	}
	st.OK, st.Status = true, "OK"
	return st
}

func pathName(p string) string {
	if p == "channel" {
		return "the ctrl channel"
	}
	return "OOB (fallback)"
}

func doctorEngine(provider, dev, listen string) (*notify.Engine, error) {
	opts := []notify.Option{notify.WithTransport(notify.TransportRDMATwoSided), notify.WithProvider(provider),
		notify.WithDeviceFilters(dev), notify.WithoutProcsReserve()}
	if listen != "" {
		opts = append(opts, notify.WithListenAddr(listen))
	}
	return notify.FromEnv(opts...)
}

func runEcho(ctx context.Context, provider, dev string) (echoResult, error) {
	var r echoResult
	var engines [2]*notify.Engine
	defer func() {
		for _, e := range engines {
			if e != nil {
				_ = closeEngine(e)
			}
		}
	}()
	for i := range engines {
		e, err := doctorEngine(provider, dev, "127.0.0.1:0")
		if err != nil {
			return r, fmt.Errorf("engine on %s: %w", dev, err)
		}
		engines[i] = e
	}
	if g, ok := engines[0].GID(); ok {
		r.gid = g
	}
	for i, pair := range [][2]*notify.Engine{{engines[0], engines[1]}, {engines[1], engines[0]}} {
		from, to := pair[0], pair[1]
		before := from.Stats()
		name := [2]string{"doctor-ping", "doctor-pong"}[i]
		if err := from.SendNotify(ctx, to.Addr(), notify.Notify{Name: name, Msg: []byte("twosided doctor")}); err != nil {
			return r, fmt.Errorf("send %s: %w", name, err)
		}
		n, err := to.Recv(ctx)
		if err != nil {
			return r, fmt.Errorf("receive %s: %w", name, err)
		}
		if n.Name != name {
			return r, fmt.Errorf("received %q, want %q", n.Name, name)
		}
		after := from.Stats()
		r.paths[i] = sentPath(before, after)
	}
	s := engines[0].Stats()
	for _, p := range s.Peers {
		if p.Channel != nil {
			r.detail = fmt.Sprintf(" (QPN %d ↔ %d, path MTU %d, GID %d, %s, %s)", p.LocalQPN, p.RemoteQPN, p.Channel.PathMTU,
				r.gid.Index, r.gid.Type, gidAddr(r.gid.GID))
			break
		}
	}
	return r, nil
}

// sentPath is the path of the one notify sent between two stats snapshots of its sender.
func sentPath(before, after notify.Stats) string {
	switch {
	case after.Channels.NotifiesSent > before.Channels.NotifiesSent && after.OOB.NotifySent == before.OOB.NotifySent:
		return "channel"
	case after.OOB.NotifySent > before.OOB.NotifySent:
		return "oob"
	}
	return "unknown"
}

// peerLabel names the peer in messages: its server name and address, or its address.
func (o doctorOptions) peerLabel() string {
	if o.peerName != "" {
		return o.peerName + " (" + o.peer + ")"
	}
	return o.peer
}

// resolvePeerName looks a server name up in the metadata service meta, within timeout.
// The error wraps notify.ErrConfig (a bad connection string), notify.ErrPeerUnknown (not
// registered, or a value that does not decode) or directory.ErrUnavailable, and names the
// service and the key.
func resolvePeerName(ctx context.Context, meta, clusterID, name string, timeout time.Duration) (string, error) {
	d, err := directory.Open(meta, directory.Config{ClusterID: clusterID})
	if err != nil {
		return "", fmt.Errorf("%w: metadata: %v", notify.ErrConfig, err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		_ = d.Close(cctx)
	}()
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	addr, err := d.Resolve(rctx, name)
	switch {
	case err == nil:
		return addr, nil
	case errors.Is(err, directory.ErrNotFound), errors.Is(err, directory.ErrBadValue), errors.Is(err, directory.ErrBadName):
		return "", fmt.Errorf("%w: %s: %w", notify.ErrPeerUnknown, name, err)
	}
	return "", fmt.Errorf("resolving %s: %w", name, err)
}

// peerResult is what the peer check found.
type peerResult struct {
	path   string
	detail string
}

// peerCheck sends one notify from an engine on dev to the remote engine o.peer.
func peerCheck(ctx context.Context, o doctorOptions, dev doctorDevice, h *hints) doctorStep {
	st := doctorStep{Name: "peer", Status: "FAIL", Path: "none"}
	start := time.Now()
	r, err := bounded(ctx, o.timeout, "peer "+o.peer, func(ctx context.Context) (peerResult, error) {
		return runPeer(ctx, o, dev)
	})
	st.ElapsedMS = ms(time.Since(start))
	_, port, _ := net.SplitHostPort(o.peer)
	if err != nil {
		st.Error = err.Error()
		st.Detail = fmt.Sprintf("one notify from an engine on %s to %s failed: %v%s", dev.Name, o.peerLabel(), err, r.detail)
		if errors.Is(err, oob.ErrNotSent) || errors.Is(err, notify.ErrPeerUnreachable) || errors.Is(err, oob.ErrPeerUnreachable) ||
			errors.Is(err, notify.ErrTimeout) || errors.Is(err, errStepTimeout) {
			st.Summary = fmt.Sprintf("its OOB port %s is unreachable (%s)", port, lastCause(err))
			h.add("%s: its OOB (handshake) port %s does not answer: run `twosided serve --transport rdma_twosided --listen 0.0.0.0:%s` there, allow TCP port %s through its firewall, or set MC_HANDSHAKE_PORT on the peer to a port the firewall opens and pass that port to --peer",
				o.peer, port, port, port)
		} else {
			st.Summary = "the notify failed: " + lastCause(err)
			h.add("%s: the peer answered but the notify failed (%v): check MC_OOB auth keys (TWOSIDED_OOB_AUTH_KEY_FILE) and that both sides run the same MC_RDMA_NOTIFY_BUFFER_SIZE", o.peer, err)
		}
		return st
	}
	st.Path = r.path
	st.Detail = fmt.Sprintf("one notify from an engine on %s to %s over %s%s", dev.Name, o.peerLabel(), pathName(r.path), r.detail)
	if r.path != "channel" {
		h.add("%s: the notify went over OOB, not RDMA: the peer must run rdma_twosided (MC_USE_RDMA_TWOSIDED=1 or --transport rdma_twosided); if it does, the QPs could not connect: set the same MC_GID_INDEX type (RoCE v2) and MC_MTU on both sides, and MC_IB_TC/MC_IB_SL to the class the fabric carries", o.peer)
		return st
	}
	st.OK, st.Status = true, "OK"
	return st
}

func runPeer(ctx context.Context, o doctorOptions, dev doctorDevice) (peerResult, error) {
	var r peerResult
	e, err := doctorEngine(dev.Provider, dev.Name, o.listen)
	if err != nil {
		return r, fmt.Errorf("engine on %s: %w", dev.Name, err)
	}
	defer func() { _ = closeEngine(e) }()
	before := e.Stats()
	err = e.SendNotify(ctx, o.peer, notify.Notify{Name: "twosided-doctor", Msg: []byte("twosided doctor from " + e.Addr())})
	after := e.Stats()
	hs := fmt.Sprintf("; OOB: %d connects, %d failed, %d handshakes failed", after.OOB.Dialed, after.OOB.DialFailed, after.Limits.HandshakesFailed)
	for _, p := range after.Peers {
		hs += fmt.Sprintf("; peer %s: %s", p.Peer, p.State)
		if p.Channel != nil {
			hs += fmt.Sprintf(", channel QPN %d ↔ %d, path MTU %d", p.LocalQPN, p.RemoteQPN, p.Channel.PathMTU)
		}
		if p.Session == 0 && p.State != "idle" {
			hs += " (a Mooncake engine)"
		}
		if p.LastError != "" {
			hs += ", last error: " + p.LastError
		}
	}
	r.detail = " (" + strings.TrimPrefix(hs, "; ") + ")"
	if err != nil {
		return r, err
	}
	r.path = sentPath(before, after)
	return r, nil
}

// pickDevice is the first device that passed every local step: a NIC (the verbs provider)
// first, then with allowSoft a soft device. port is its first port whose loopback passed.
// A soft device counts only when no NIC has an active port: an engine takes such a NIC
// before any soft device (notify's device choice), so that NIC's failure is the verdict.
func pickDevice(provs []doctorProvider, allowSoft bool) (*doctorDevice, *doctorPort) {
	nicActive := false
	for _, p := range provs {
		for _, d := range p.Devices {
			if p.Name != "soft" && d.Echo != nil {
				nicActive = true
			}
		}
	}
	for _, soft := range []bool{false, true} {
		if soft && (!allowSoft || nicActive) {
			break
		}
		for i := range provs {
			if (provs[i].Name == "soft") != soft {
				continue
			}
			for j := range provs[i].Devices {
				d := &provs[i].Devices[j]
				if !d.OK {
					continue
				}
				for k := range d.Ports {
					if p := &d.Ports[k]; p.Loopback != nil && p.Loopback.OK {
						return d, p
					}
				}
			}
		}
	}
	return nil, nil
}

// firstActive is the first device with an active port, NICs first.
func firstActive(provs []doctorProvider, allowSoft bool) *doctorDevice {
	for _, soft := range []bool{false, true} {
		for i := range provs {
			if (provs[i].Name == "soft") != soft {
				continue
			}
			for j := range provs[i].Devices {
				d := &provs[i].Devices[j]
				if d.Echo != nil {
					return d
				}
			}
		}
	}
	return nil
}

// verdict decides the exit status and says why in one line.
func verdict(rep doctorReport, o doctorOptions, best *doctorDevice, port *doctorPort) (bool, string) {
	if best != nil {
		what := fmt.Sprintf("rdma_twosided works on %s port %d (GID %d, %s, %s)", best.Name, port.Port, port.GIDIndex, port.GIDType, port.GIDAddr)
		if port.GIDType == ibv.GIDTypeRoCEv1.String() {
			what += "; RoCE v1 only: peers on this L2 segment that send RoCE v1 (see the hint)"
		}
		if best.Provider == "soft" {
			what += " (soft provider: RC over TCP, no RDMA NIC; accepted by --allow-soft)"
			var nics []doctorDevice
			for _, p := range rep.Providers {
				if p.Name != "soft" {
					nics = append(nics, p.Devices...)
				}
			}
			if len(nics) > 0 {
				what += "; the NIC does not: " + deviceWhy(nics)
			}
		}
		if rep.Peer != nil {
			if !rep.Peer.OK {
				return false, fmt.Sprintf("FAIL: peer %s: %s (locally, %s)", o.peer, peerWhy(*rep.Peer), what)
			}
			what += ", and with peer " + o.peer + " over the ctrl channel"
		}
		return true, "OK: " + what
	}
	// Nothing works: say why, of the NIC when there is one, else of the soft devices.
	var nics, softs []doctorDevice
	var nicErr string
	builtVerbs := false
	for _, p := range rep.Providers {
		if p.Name == "soft" {
			softs = append(softs, p.Devices...)
			continue
		}
		if p.Built {
			builtVerbs = true
		}
		nics = append(nics, p.Devices...)
		if p.Error != "" {
			nicErr = p.Error
		}
	}
	if len(nics) > 0 {
		return false, "FAIL: " + deviceWhy(nics)
	}
	if !o.allowSoft {
		why := "the verbs provider is not built in (build with -tags rdma)"
		if builtVerbs {
			why = "libibverbs lists none"
			if nicErr != "" {
				// The provider's error starts with its sentinel's text: say it once.
				why = strings.TrimPrefix(nicErr, "no RDMA device: ")
			}
		}
		if o.provider == "soft" {
			why = "--provider soft checks the soft provider alone"
		}
		s := "FAIL: no RDMA device: " + why
		for _, d := range softs {
			if d.OK {
				s += "; the soft provider works on " + d.Name + " (--allow-soft accepts it)"
				break
			}
		}
		return false, s
	}
	if len(softs) > 0 {
		return false, "FAIL: " + deviceWhy(softs)
	}
	if o.device != "" {
		return false, fmt.Sprintf("FAIL: no device %q", o.device)
	}
	return false, "FAIL: no RDMA device and no soft device"
}

// deviceWhy is the first reason the first device of devs fails.
func deviceWhy(devs []doctorDevice) string {
	var reasons []string
	for _, d := range devs {
		if d.Error != "" {
			reasons = append(reasons, d.Name+": "+d.Error)
			continue
		}
		active := false
		for _, p := range d.Ports {
			switch {
			case p.State != ibv.PortActive.String():
				reasons = append(reasons, fmt.Sprintf("%s port %d is %s", d.Name, p.Port, p.State))
			case p.GIDError != "":
				active = true
				why, _, _ := strings.Cut(p.GIDError, " (the port's GIDs")
				reasons = append(reasons, fmt.Sprintf("%s port %d has no source GID: %s", d.Name, p.Port, why))
			case p.Loopback != nil && !p.Loopback.OK:
				active = true
				reasons = append(reasons, fmt.Sprintf("%s port %d: loopback: %s", d.Name, p.Port, p.Loopback.Error))
			default:
				active = true
			}
		}
		if !active && len(d.Ports) > 0 {
			reasons = append(reasons, d.Name+" has no active port")
		}
		if d.Echo != nil && !d.Echo.OK {
			if d.Echo.Error != "" {
				reasons = append(reasons, fmt.Sprintf("%s: echo: %s", d.Name, d.Echo.Error))
			} else {
				reasons = append(reasons, fmt.Sprintf("%s: echo: notifies fell back to OOB (no ctrl channel)", d.Name))
			}
		}
		if len(reasons) > 0 {
			break
		}
	}
	if len(reasons) == 0 {
		return "no device works"
	}
	return reasons[0]
}

// lastCause is the innermost part of an error's message: what follows its last ": ".
func lastCause(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 {
		return s[i+2:]
	}
	return s
}

func peerWhy(st doctorStep) string {
	if st.Summary != "" {
		return st.Summary
	}
	if st.Error != "" {
		return st.Error
	}
	if st.Path == "oob" {
		return "the notify went over OOB, not the ctrl channel"
	}
	return st.Detail
}

// writeDoctor prints the report as text.
func writeDoctor(w io.Writer, rep doctorReport) {
	fmt.Fprintf(w, "twosided doctor (each step bounded by %s)\n", rep.Timeout)
	var cfg []string
	for _, k := range []string{"MC_GID_INDEX", "MC_MTU", "MC_IB_TC", "MC_IB_SL", "MC_PKEY_INDEX", "MC_IB_PORT", "MC_HANDSHAKE_PORT"} {
		if v, ok := rep.Config[k]; ok {
			cfg = append(cfg, k+"="+v)
		}
	}
	if len(cfg) > 0 {
		fmt.Fprintf(w, "config: %s\n", strings.Join(cfg, " "))
	}
	for _, p := range rep.Providers {
		fmt.Fprintf(w, "\nprovider %s: %d device(s)", p.Name, len(p.Devices))
		if p.Error != "" {
			fmt.Fprintf(w, ": %s", p.Error)
		}
		fmt.Fprintln(w)
		for _, d := range p.Devices {
			fmt.Fprintf(w, "  device %s (node_guid %s)\n", d.Name, d.NodeGUID)
			if d.Error != "" {
				fmt.Fprintf(w, "    error: %s\n", d.Error)
			}
			for _, pt := range d.Ports {
				fmt.Fprintf(w, "    port %d: %s, %s, active_mtu %d (max %d), lid %d, pkey_index %d", pt.Port, pt.State, pt.LinkLayer,
					pt.ActiveMTU, pt.MaxMTU, pt.LID, pt.PKeyIndex)
				if pt.PKey != "" {
					fmt.Fprintf(w, " (pkey %s)", pt.PKey)
				}
				fmt.Fprintln(w)
				for _, g := range pt.GIDs {
					mark := ""
					if g.Index == pt.GIDIndex {
						mark = "   <- used (" + pt.GIDChoice + ")"
					}
					fmt.Fprintf(w, "      GID[%3d] %-8s %s%s\n", g.Index, g.Type, g.Addr, mark)
				}
				if pt.GIDError != "" {
					fmt.Fprintf(w, "      source GID: none (%s): %s\n", pt.GIDChoice, pt.GIDError)
				}
				if pt.Loopback != nil {
					writeStep(w, "      ", *pt.Loopback)
				}
			}
			if d.Echo != nil {
				writeStep(w, "    ", *d.Echo)
			}
		}
	}
	if rep.Peer != nil {
		fmt.Fprintln(w)
		writeStep(w, "", *rep.Peer)
	}
	if len(rep.Notes) > 0 || len(rep.Hints) > 0 {
		fmt.Fprintln(w)
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	for _, h := range rep.Hints {
		fmt.Fprintf(w, "hint: %s\n", h)
	}
	fmt.Fprintf(w, "verdict: %s\n", rep.Verdict)
}

func writeStep(w io.Writer, indent string, st doctorStep) {
	fmt.Fprintf(w, "%s%s: %s: %s (%.1f ms)\n", indent, st.Name, st.Status, st.Detail, st.ElapsedMS)
}
