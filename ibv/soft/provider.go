package soft

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twosided/twosided/ibv"
)

// Environment variables read by the registered provider.
const (
	EnvDevices = "TWOSIDED_SOFT_DEVICES"
	EnvAddr    = "TWOSIDED_SOFT_ADDR"
	EnvPhantom = "TWOSIDED_SOFT_PHANTOM"
	EnvInProc  = "TWOSIDED_SOFT_INPROC"
	// EnvNICThread = 1 makes every connection's NIC goroutine do all receive work (the
	// provider's former model); by default the consumer's polls do it (see the package doc).
	EnvNICThread = "TWOSIDED_SOFT_NIC_THREAD"
	// EnvGIDTable = mlx5 gives every port an mlx5-like RoCE GID table (WithGIDTable).
	EnvGIDTable = "TWOSIDED_SOFT_GID_TABLE"
)

// PhantomName is the phantom device: listed, port DOWN, unusable.
const PhantomName = "soft_phantom"

// MaxDevices bounds the device count.
const MaxDevices = 64

// ErrConfig is wrapped by every configuration error.
var ErrConfig = errors.New("soft: bad configuration")

type config struct {
	devices int
	addr    string
	phantom bool
	// coalesce holds back a SEND while its QP has unacknowledged ones in flight, up to
	// coalesceMax, and sends the batch when an ACK arrives (Nagle-like doorbell batching).
	coalesce bool
	// inproc delivers packets between devices of this provider by direct calls (as a NIC's
	// internal loopback does) instead of through their TCP connection.
	inproc bool
	// nicThread makes the connections' NIC goroutines read every packet; otherwise the
	// consumer's GetEvent and Poll do (manual progress) and the NIC goroutine is a backstop.
	nicThread bool
	// gidTable: the ports' GID table (GIDTableSingle or GIDTableMLX5).
	gidTable GIDTable
}

// GIDTable is the shape of a soft port's GID table.
type GIDTable uint8

const (
	// GIDTableSingle (the default): one entry, index 0, RoCE v2, the device's GID.
	GIDTableSingle GIDTable = iota
	// GIDTableMLX5: as an mlx5 RoCE port on an IPv4 netdev: 0 RoCE v1 and 1 RoCE v2 of a
	// link-local fe80:: GID, 2 RoCE v1 and 3 RoCE v2 of the device's GID (its IPv4 form).
	// An address vector must then name the right index: a link-local source towards an
	// IPv4 destination is refused at RTR, as the kernel's RoCE address resolution does.
	GIDTableMLX5
)

func defaultConfig() config {
	return config{devices: 2, addr: "127.0.0.1:0", coalesce: true, inproc: true}
}

// Option configures a provider made by New.
type Option func(*config)

// WithDevices sets the number of devices soft0 … soft(n-1) (1..MaxDevices; default 2).
func WithDevices(n int) Option { return func(c *config) { c.devices = n } }

// WithListenAddr sets the TCP listen address of the devices (IPv4 host:port; default
// 127.0.0.1:0). Port 0 picks a free port per device; port p gives device i port p+i.
func WithListenAddr(addr string) Option { return func(c *config) { c.addr = addr } }

// WithPhantom adds (or not) the phantom device soft_phantom, whose port is DOWN.
func WithPhantom(on bool) Option { return func(c *config) { c.phantom = on } }

// WithCoalesce turns doorbell batching on (the default) or off: with it on, a SEND posted
// while earlier SENDs of its QP await their ACK is held back (up to 32) and written in one
// batch when an ACK arrives; with it off, every PostSend writes to the socket at once.
func WithCoalesce(on bool) Option { return func(c *config) { c.coalesce = on } }

// WithInProcess makes traffic between two devices of this provider skip TCP (the default,
// true: the sender's goroutine places the bytes, as a NIC's internal loopback would) or go
// through their TCP connection like traffic between processes (false). Devices of other
// processes are always reached over TCP.
func WithInProcess(on bool) Option { return func(c *config) { c.inproc = on } }

// WithGIDTable sets the shape of every port's GID table (default GIDTableSingle).
func WithGIDTable(t GIDTable) Option { return func(c *config) { c.gidTable = t } }

// WithNICThread(true) makes each connection's NIC goroutine read and answer every packet,
// waking once per packet beside the consumer; the default, false, lets the consumer's
// GetEvent and Poll do the receive work (manual progress, as UCX's tcp transport and
// libfabric's FI_PROGRESS_MANUAL), the NIC goroutine stepping in only when no consumer does.
func WithNICThread(on bool) Option { return func(c *config) { c.nicThread = on } }

func (c config) validate(devVar, addrVar string) (netip.AddrPort, error) {
	if c.devices < 1 || c.devices > MaxDevices {
		return netip.AddrPort{}, fmt.Errorf("%w: %s = %d: must be 1..%d", ErrConfig, devVar, c.devices, MaxDevices)
	}
	ap, err := netip.ParseAddrPort(c.addr)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%w: %s = %q: %v", ErrConfig, addrVar, c.addr, err)
	}
	if !ap.Addr().Unmap().Is4() {
		return netip.AddrPort{}, fmt.Errorf("%w: %s = %q: must be an IPv4 address (it is encoded in the GID)", ErrConfig, addrVar, c.addr)
	}
	if ap.Port() != 0 && int(ap.Port())+c.devices-1 > 65535 {
		return netip.AddrPort{}, fmt.Errorf("%w: %s = %q: ports %d..%d do not fit", ErrConfig, addrVar, c.addr, ap.Port(), int(ap.Port())+c.devices-1)
	}
	return ap, nil
}

// configFromEnv reads the registered provider's variables.
func configFromEnv() (config, error) {
	c := defaultConfig()
	if v, ok := os.LookupEnv(EnvDevices); ok {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			return c, fmt.Errorf("%w: %s = %q: not an integer", ErrConfig, EnvDevices, v)
		}
		c.devices = n
	}
	if v, ok := os.LookupEnv(EnvAddr); ok {
		c.addr = strings.TrimSpace(v)
	}
	if v, ok := os.LookupEnv(EnvPhantom); ok {
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return c, fmt.Errorf("%w: %s = %q: want 0/1/true/false", ErrConfig, EnvPhantom, v)
		}
		c.phantom = b
	}
	if v, ok := os.LookupEnv(EnvInProc); ok {
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return c, fmt.Errorf("%w: %s = %q: want 0/1/true/false", ErrConfig, EnvInProc, v)
		}
		c.inproc = b
	}
	if v, ok := os.LookupEnv(EnvNICThread); ok {
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return c, fmt.Errorf("%w: %s = %q: want 0/1/true/false", ErrConfig, EnvNICThread, v)
		}
		c.nicThread = b
	}
	if v, ok := os.LookupEnv(EnvGIDTable); ok {
		switch strings.ToLower(strings.TrimSpace(v)) {
		case "", "single":
			c.gidTable = GIDTableSingle
		case "mlx5":
			c.gidTable = GIDTableMLX5
		default:
			return c, fmt.Errorf("%w: %s = %q: want single or mlx5", ErrConfig, EnvGIDTable, v)
		}
	}
	if _, err := c.validate(EnvDevices, EnvAddr); err != nil {
		return c, err
	}
	return c, nil
}

// Provider is a soft provider: a set of devices sharing fault state. The registered one is
// Default(); New makes isolated ones.
type Provider struct {
	fromEnv bool
	opts    config

	mu      sync.Mutex
	devices map[string]*device // live devices (open contexts), by name

	faultsOn  atomic.Int32 // number of cut or delayed links; 0 skips the checks
	faultMu   sync.RWMutex
	cuts      map[[2]ibv.GID]bool
	downPorts int
	delays    map[[2]ibv.GID]time.Duration
}

var defaultProvider = &Provider{fromEnv: true}

func init() { ibv.Register(defaultProvider) }

// Default is the provider registered as "soft", configured from the environment.
func Default() *Provider { return defaultProvider }

// New builds a provider that is not registered: its devices, listeners and faults are its own.
func New(opts ...Option) *Provider {
	c := defaultConfig()
	for _, o := range opts {
		o(&c)
	}
	return &Provider{opts: c}
}

// Name is "soft".
func (p *Provider) Name() string { return "soft" }

func (p *Provider) config() (config, netip.AddrPort, error) {
	if p.fromEnv {
		c, err := configFromEnv()
		if err != nil {
			return c, netip.AddrPort{}, err
		}
		ap, err := c.validate(EnvDevices, EnvAddr)
		return c, ap, err
	}
	ap, err := p.opts.validate("WithDevices", "WithListenAddr")
	return p.opts, ap, err
}

func deviceName(i int) string { return "soft" + strconv.Itoa(i) }

// GetDeviceList lists soft0 … and the phantom device. The GID of a device is known once it is
// open (its listener exists); before that the port's GID is zero.
func (p *Provider) GetDeviceList() ([]ibv.DeviceInfo, error) {
	c, _, err := p.config()
	if err != nil {
		return nil, err
	}
	out := make([]ibv.DeviceInfo, 0, c.devices+1)
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := 0; i < c.devices; i++ {
		name := deviceName(i)
		if d := p.devices[name]; d != nil {
			out = append(out, d.info())
			continue
		}
		out = append(out, deviceInfo(name, uint64(i), ibv.PortActive, ibv.GID{}, c.gidTable))
	}
	if c.phantom {
		out = append(out, deviceInfo(PhantomName, 0xff, ibv.PortDown, ibv.GID{}, c.gidTable))
	}
	return out, nil
}

func deviceInfo(name string, idx uint64, st ibv.PortState, gid ibv.GID, table GIDTable) ibv.DeviceInfo {
	mtu := ibv.MTU4096
	if st != ibv.PortActive {
		mtu = ibv.MTU256
	}
	port := ibv.PortAttr{Num: 1, State: st, MaxMTU: ibv.MTU4096, ActiveMTU: mtu, LID: 0, LinkLayer: "Ethernet",
		GIDs: gidTable(gid, table)}
	if e, err := ibv.SelectGID(port, -1); err == nil {
		port.GIDIndex, port.GID = e.Index, e.GID
	}
	return ibv.DeviceInfo{
		Name:     name,
		Provider: "soft",
		NodeGUID: 0x50f7_0000_0000_0000 | uint64(os.Getpid())<<16 | idx,
		Ports:    []ibv.PortAttr{port},
	}
}

// gidTable is a port's GID table for the device GID gid (none before the device is open).
func gidTable(gid ibv.GID, t GIDTable) []ibv.GIDEntry {
	if gid.IsZero() {
		return nil
	}
	if t != GIDTableMLX5 {
		return []ibv.GIDEntry{{Index: 0, Type: ibv.GIDTypeRoCEv2, GID: gid}}
	}
	ll := linkLocalGID(gid)
	return []ibv.GIDEntry{
		{Index: 0, Type: ibv.GIDTypeRoCEv1, GID: ll},
		{Index: 1, Type: ibv.GIDTypeRoCEv2, GID: ll},
		{Index: 2, Type: ibv.GIDTypeRoCEv1, GID: gid},
		{Index: 3, Type: ibv.GIDTypeRoCEv2, GID: gid},
	}
}

// linkLocalGID is the fe80:: GID of a device's mlx5-like table: the port and IPv4 address
// of its GID in the interface identifier, so that it is unique per device.
func linkLocalGID(gid ibv.GID) ibv.GID {
	var ll ibv.GID
	ll[0], ll[1], ll[8] = 0xfe, 0x80, 0x02
	copy(ll[10:12], gid[0:2])
	copy(ll[12:16], gid[12:16])
	return ll
}

// ipv4Family reports whether g is an IPv4 GID of a soft device (::ffff:a.b.c.d with the
// device's TCP port in bytes 0..1) or an IPv4-mapped one.
func ipv4Family(g ibv.GID) bool {
	for _, b := range g[2:10] {
		if b != 0 {
			return false
		}
	}
	return g[10] == 0xff && g[11] == 0xff
}

// Open opens a device; the first open of a device creates its TCP listener. A device lives
// while it has open contexts; after the last Close it is gone and a later Open makes a fresh
// one (with a new port when the port was chosen by the system).
func (p *Provider) Open(name string) (ibv.Context, error) {
	c, ap, err := p.config()
	if err != nil {
		return nil, err
	}
	idx := -1
	if name == PhantomName && c.phantom {
		idx = 0xff
	} else if strings.HasPrefix(name, "soft") {
		if n, err := strconv.Atoi(name[4:]); err == nil && n >= 0 && n < c.devices && deviceName(n) == name {
			idx = n
		}
	}
	if idx < 0 {
		return nil, fmt.Errorf("soft: open %q: %w", name, ibv.ErrNoDevice)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	d := p.devices[name]
	if d == nil {
		lap := ap
		if ap.Port() != 0 && idx != 0xff {
			lap = netip.AddrPortFrom(ap.Addr(), ap.Port()+uint16(idx))
		}
		d, err = newDevice(p, name, uint64(idx), idx == 0xff, lap, c)
		if err != nil {
			return nil, err
		}
		if p.devices == nil {
			p.devices = make(map[string]*device)
		}
		p.devices[name] = d
	}
	return d.open(), nil
}

// release drops the device from the provider once its last context closed.
func (p *Provider) release(d *device) {
	p.mu.Lock()
	if p.devices[d.name] == d {
		delete(p.devices, d.name)
	}
	p.mu.Unlock()
}

// deviceByGID is the live device of this provider with that GID, or nil.
func (p *Provider) deviceByGID(gid ibv.GID) *device {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, d := range p.devices {
		if d.gid == gid && !d.phantom && !d.isDead() {
			return d
		}
	}
	return nil
}

func (p *Provider) lookup(name string) (*device, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	d := p.devices[name]
	if d == nil {
		return nil, fmt.Errorf("soft: device %q is not open: %w", name, ibv.ErrNoDevice)
	}
	return d, nil
}

func linkKey(a, b ibv.GID) [2]ibv.GID {
	if string(a[:]) > string(b[:]) {
		a, b = b, a
	}
	return [2]ibv.GID{a, b}
}

// linkState reports whether packets from a to b are cut, and the delay added to them.
func (p *Provider) linkState(a, b ibv.GID) (cut bool, delay time.Duration) {
	if p.faultsOn.Load() == 0 {
		return false, 0
	}
	p.faultMu.RLock()
	cut, delay = p.cuts[[2]ibv.GID{a, b}], p.delays[linkKey(a, b)]
	p.faultMu.RUnlock()
	return cut, delay
}

// linkGIDs is the directed pair (a, b) of two open devices' GIDs.
func (p *Provider) linkGIDs(a, b string) ([2]ibv.GID, error) {
	da, err := p.lookup(a)
	if err != nil {
		return [2]ibv.GID{}, err
	}
	db, err := p.lookup(b)
	if err != nil {
		return [2]ibv.GID{}, err
	}
	return [2]ibv.GID{da.gid, db.gid}, nil
}

func (p *Provider) cut(k [2]ibv.GID) {
	p.faultMu.Lock()
	if p.cuts == nil {
		p.cuts = make(map[[2]ibv.GID]bool)
	}
	p.cuts[k] = true
	p.recount()
	p.faultMu.Unlock()
}

// CutPath drops every packet from open device from to open device to (one way: the other
// direction still flows, e.g. SENDs arrive but their ACKs are lost), until RestoreLink.
func (p *Provider) CutPath(from, to string) error {
	k, err := p.linkGIDs(from, to)
	if err != nil {
		return err
	}
	p.cut(k)
	return nil
}

func (p *Provider) recount() {
	p.faultsOn.Store(int32(len(p.cuts) + len(p.delays) + p.downPorts))
}

// CutLink drops every packet between open devices a and b, both ways, until RestoreLink.
// TCP connections stay up, as a NIC's link would when a switch drops.
func (p *Provider) CutLink(a, b string) error {
	k, err := p.linkGIDs(a, b)
	if err != nil {
		return err
	}
	p.cut(k)
	p.cut([2]ibv.GID{k[1], k[0]})
	return nil
}

// RestoreLink undoes CutLink, CutPath (both directions) and DelayLink between a and b.
func (p *Provider) RestoreLink(a, b string) error {
	k, err := p.linkGIDs(a, b)
	if err != nil {
		return err
	}
	p.faultMu.Lock()
	delete(p.cuts, k)
	delete(p.cuts, [2]ibv.GID{k[1], k[0]})
	delete(p.delays, linkKey(k[0], k[1]))
	p.recount()
	p.faultMu.Unlock()
	return nil
}

// DelayLink holds every packet between a and b for d before it is written (order kept).
func (p *Provider) DelayLink(a, b string, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("soft: delay link %s-%s: delay %v: must be positive: %w", a, b, d, ibv.ErrInvalid)
	}
	k, err := p.linkGIDs(a, b)
	if err != nil {
		return err
	}
	p.faultMu.Lock()
	if p.delays == nil {
		p.delays = make(map[[2]ibv.GID]time.Duration)
	}
	p.delays[linkKey(k[0], k[1])] = d
	p.recount()
	p.faultMu.Unlock()
	return nil
}

// KillDevice makes an open device die as its process would: its listener and connections
// close, its QPs stop answering and sending. Its contexts stay valid only for Close; once all
// are closed, a later Open makes a fresh device.
func (p *Provider) KillDevice(name string) error {
	d, err := p.lookup(name)
	if err != nil {
		return err
	}
	d.kill()
	return nil
}

// DeviceGID is the GID of an open device.
func (p *Provider) DeviceGID(name string) (ibv.GID, error) {
	d, err := p.lookup(name)
	if err != nil {
		return ibv.GID{}, err
	}
	return d.gid, nil
}
