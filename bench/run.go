package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/twosided/twosided/ibv"
)

// ErrConfig is wrapped by every bad Config; the message names the field and why.
var ErrConfig = errors.New("bench: bad configuration")

// Config is one benchmark invocation. The zero value of a field means its default.
type Config struct {
	Scenarios  []string      // default: all, in table order
	Transports []string      // default: all
	Procs      int           // 1: sender and receiver in one process; 2 (default): two
	Count      int           // notifies per run; default 2000 (burst: at most 16 MiB per run)
	Sizes      []int         // message bytes; burst sweeps all, other scenarios use the first
	Peers      int           // fanin senders, fanout/idle/connect peers; default 4, idle 8, connect 16
	Window     int           // sends in flight per sender (pipelined scenarios); default 16
	Warmup     int           // sequential warm-up notifies; default 32
	Duration   time.Duration // idle time (default 1 s); a cap on every other measured phase (default 10 s)
	BusyPoll   time.Duration // reactor busy-poll budget; floor-spin is its reference
	// Provider is the ibv provider rdma_twosided and the verbs floors run on ("soft",
	// "verbs"); empty: the device an engine picks (real providers before the soft one).
	Provider string
	// KeepaliveOff runs the engines without keepalive (notify.WithKeepalive(0)); by default
	// they probe idle channels every 5 s, which an idle run with many peers counts.
	KeepaliveOff bool
	// NoEcho: in the latency scenario with two processes, a round trip is one notify and its
	// acknowledgement (SendNotify's return), with no echo notify back: the floors' exchange
	// (a message and its ack), so that CPU per notify and rtt/2 compare like for like.
	NoEcho     bool
	RunTimeout time.Duration // bound on one run; default 2 min

	// Repeat runs each pipelined run (burst, bidi, fanin, fanout) this many times; the
	// table shows the median's figures and the spread of ops/s. Default 3.
	Repeat int
	// BurstTime is how long a pipelined run sends when Count is 0 (default 1 s): its
	// figures are then a steady state, not a warm-up's. With Count set, a run sends Count.
	BurstTime time.Duration

	// Server runs the receiving side on a bench server (host:port, `twosided bench
	// --server`) instead of a child process; only round trips cross between the hosts.
	Server string
	// Anchors lists outside references run beside ours: "ucx" (ucx_perftest over UCX's
	// tcp transport, on loopback, or between the hosts with Server).
	Anchors []string

	JSONPath string    // write every figure and the settings here
	PlotPath string    // write an SVG of latency CDFs and throughput vs size here
	Progress io.Writer // a progress line for runs longer than 2 s; nil: none

	// Executable and ChildArgs start the receiving process of a two-process run: the
	// binary itself by default, with ChildArgs (default: "bench"); the child is told its
	// role by the environment and must call ChildMain first.
	Executable string
	ChildArgs  []string

	host string // with Server: this host's address on the route to it
}

// DefaultSizes is the burst sweep of the default suite.
var DefaultSizes = []int{16, 256, 4096, 65536}

const (
	timedCeiling    = 1 << 40
	classicCeiling  = 5000
	defaultCount    = 2000
	defaultSize     = 64
	burstBytesLimit = 16 << 20
	maxSize         = 64 << 10
)

func (c *Config) normalize() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s: %s", ErrConfig, field, fmt.Sprintf(format, args...)))
	}
	if len(c.Scenarios) == 0 || slices.Equal(c.Scenarios, []string{"all"}) {
		c.Scenarios = Scenarios
	}
	for _, s := range c.Scenarios {
		if !slices.Contains(Scenarios, s) {
			bad("scenario", "%q: want one of %s or all", s, strings.Join(Scenarios, ", "))
		}
	}
	switch {
	case len(c.Transports) == 0:
		c.Transports = Transports
	case slices.Equal(c.Transports, []string{"all"}):
		c.Transports = AllTransports
	}
	for _, t := range c.Transports {
		if !slices.Contains(AllTransports, t) {
			bad("transport", "%q: want one of %s or all", t, strings.Join(AllTransports, ", "))
		}
	}
	switch c.Procs {
	case 0:
		c.Procs = 2
	case 1, 2:
	default:
		bad("procs", "%d: want 1 or 2", c.Procs)
	}
	if c.Count < 0 {
		bad("count", "%d: must be positive", c.Count)
	}
	for _, s := range c.Sizes {
		if s < 1 || s > maxSize {
			bad("size", "%d out of range 1..%d", s, maxSize)
		}
	}
	if c.Peers < 0 || c.Peers > 256 {
		bad("peers", "%d out of range 1..256", c.Peers)
	}
	if c.Window < 0 || c.Window > 1024 {
		bad("window", "%d out of range 1..1024", c.Window)
	}
	if c.Window == 0 {
		c.Window = 16
	}
	if c.Warmup < 0 {
		bad("warmup", "%d: must not be negative", c.Warmup)
	}
	if c.Warmup == 0 {
		c.Warmup = 32
	}
	if c.Duration < 0 {
		bad("duration", "%v: must not be negative", c.Duration)
	}
	if c.BusyPoll < 0 || c.BusyPoll > time.Second {
		bad("busy-poll", "%v out of range 0..1s", c.BusyPoll)
	}
	if c.Provider != "" {
		if _, err := ibv.LookupProvider(c.Provider); err != nil {
			names := []string{}
			for _, p := range ibv.Providers() {
				names = append(names, p.Name())
			}
			bad("provider", "%q: not built into this binary (built in: %s; the verbs provider needs -tags rdma)", c.Provider, strings.Join(names, ", "))
		}
	}
	if c.RunTimeout <= 0 {
		c.RunTimeout = 2 * time.Minute
	}
	switch {
	case c.Repeat == 0:
		c.Repeat = 3
	case c.Repeat < 0 || c.Repeat > 100:
		bad("repeat", "%d out of range 1..100", c.Repeat)
	}
	switch {
	case c.BurstTime == 0:
		c.BurstTime = time.Second
	case c.BurstTime < 0 || c.BurstTime > 10*time.Minute:
		bad("burst-time", "%v out of range 0..10m", c.BurstTime)
	}
	if c.Server != "" {
		if _, _, err := net.SplitHostPort(c.Server); err != nil {
			bad("client", "%q: want host:port of a `twosided bench --server`: %v", c.Server, err)
		}
		if c.Procs == 1 {
			bad("procs", "1: a run against a bench server (--client) has two processes, one per host")
		}
	}
	for _, a := range c.Anchors {
		if a != AnchorUCX {
			bad("anchors", "%q: want %s", a, AnchorUCX)
		}
	}
	if len(c.ChildArgs) == 0 {
		c.ChildArgs = []string{"bench"}
	}
	if c.Executable == "" && c.Procs == 2 {
		exe, err := os.Executable()
		if err != nil {
			bad("executable", "cannot find this binary to re-execute: %v", err)
		}
		c.Executable = exe
	}
	return errors.Join(errs...)
}

// specs expands the configuration into runs, in table order.
func (c *Config) specs() []runSpec {
	var out []runSpec
	size := defaultSize
	if len(c.Sizes) > 0 {
		size = c.Sizes[0]
	}
	for _, sc := range c.Scenarios {
		for _, t := range c.Transports {
			if t == FloorStream && sc != ScenarioBurst {
				continue // the pipelined floor of one sender and one receiver
			}
			if (t == FloorEpoll || t == FloorLoop || t == FloorNode || t == FloorURing || isEchoFloor(t)) && sc != ScenarioLatency {
				continue // the reference ping-pongs: latency only
			}
			if isVerbsFloor(t) && sc != ScenarioBurst && sc != ScenarioLatency {
				continue // ibv_rc_pingpong's two figures: ping-pong and a window in flight
			}
			s := runSpec{Scenario: sc, Transport: t, Procs: c.Procs, Size: size, Count: c.Count,
				Warmup: c.Warmup, Window: c.Window, Duration: c.Duration, BusyPoll: c.BusyPoll, Peers: c.Peers, Provider: c.Provider,
				KeepaliveOff: c.KeepaliveOff, NoEcho: c.NoEcho, Server: c.Server, Host: c.host}
			if s.Count == 0 {
				s.Count = defaultCount
			}
			if s.Duration == 0 {
				s.Duration = 10 * time.Second
				if sc == ScenarioIdle {
					s.Duration = time.Second
				}
			}
			if s.Peers == 0 {
				switch sc {
				case ScenarioIdle:
					s.Peers = 8
				case ScenarioConnect:
					s.Peers = 16
				case ScenarioFanin, ScenarioFanout:
					s.Peers = 4
				default:
					s.Peers = 1
				}
			}
			if isPipelined(sc) && c.Count == 0 {
				// Steady state: send for BurstTime; the count is only a ceiling (one TCP
				// connection per notify for oob-classic: bounded by the ephemeral ports).
				s.Timed, s.Duration, s.Count = true, c.BurstTime, timedCeiling
				if t == TransportOOBClassic {
					s.Count = classicCeiling
				}
			}
			switch sc {
			case ScenarioLatency, ScenarioBidi:
				s.Peers = 1
			case ScenarioBurst:
				s.Peers = 1
				sizes := c.Sizes
				if len(sizes) == 0 {
					sizes = DefaultSizes
				}
				for _, sz := range sizes {
					b := s
					b.Size = sz
					if c.Count == 0 && !s.Timed {
						b.Count = min(s.Count, max(64, burstBytesLimit/max(sz, minSize)))
					}
					out = append(out, b)
				}
				continue
			}
			out = append(out, s)
		}
	}
	return out
}

// Settings describe the machine and the invocation of a report. Count, Peers, Sizes and
// Duration are as asked (0 or empty: each scenario's default); every Result carries the
// values its run used.
type Settings struct {
	GoVersion  string   `json:"go_version"`
	GOOS       string   `json:"goos"`
	GOARCH     string   `json:"goarch"`
	NumCPU     int      `json:"num_cpu"`
	GOMAXPROCS int      `json:"gomaxprocs"`
	Provider   string   `json:"provider"`
	Commit     string   `json:"commit"`
	Started    string   `json:"started"`
	Procs      int      `json:"procs"`
	Scenarios  []string `json:"scenarios"`
	Transports []string `json:"transports"`
	Count      int      `json:"count"`
	Sizes      []int    `json:"sizes,omitempty"`
	Peers      int      `json:"peers"`
	Window     int      `json:"window"`
	Warmup     int      `json:"warmup"`
	DurationS  float64  `json:"duration_s"`
	BusyPollUS float64  `json:"busy_poll_us"`
	Keepalive  bool     `json:"keepalive"`
	NoEcho     bool     `json:"no_echo,omitempty"` // latency: round trips end at the ACK
	Floor      string   `json:"floor"`             // the floor ratios are taken against
	Repeat     int      `json:"repeat"`            // runs of each pipelined figure
	BurstTimeS float64  `json:"burst_time_s"`
	// Server: the bench server of a two-host run (--client), as it described itself.
	Server *ServerInfo `json:"server,omitempty"`
	Client string      `json:"client,omitempty"` // this host's address on the route to it
	// CPUCheck: how evenly this host's CPUs ran a fixed loop before and after the runs.
	CPUCheck *CPUCheck `json:"cpu_check,omitempty"`
}

// Report is the outcome of Run: the settings, every run's figures and the runs that failed.
type Report struct {
	Settings Settings  `json:"settings"`
	Results  []*Result `json:"results"`
	Failures []Failure `json:"failures,omitempty"`
	// Anchors: outside references run beside ours (--anchors ucx).
	Anchors  []*Anchor `json:"anchors,omitempty"`
	ElapsedS float64   `json:"elapsed_s"`
}

// Failure is a run that produced no figures.
type Failure struct {
	Scenario  string `json:"scenario"`
	Transport string `json:"transport"`
	Size      int    `json:"size"`
	Error     string `json:"error"`
}

// Run runs the configured suite, prints the table on out and writes the JSON and SVG
// files asked for. A run that fails is reported and the suite goes on; Run's error is
// about the configuration and the output files.
func Run(ctx context.Context, cfg Config, out io.Writer) (*Report, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	var info *ServerInfo
	if cfg.Server != "" {
		// Reachable, a bench server, the same protocol version: said before any run.
		i, host, err := probeServer(ctx, cfg.Server)
		if err != nil {
			return nil, err
		}
		info, cfg.host = i, host
		softAddrFor(netip.MustParseAddr(host)) // soft devices reachable from the server
	}
	rep := &Report{Settings: settingsOf(&cfg)}
	rep.Settings.Server = info
	rep.Settings.CPUCheck = newCPUCheck()
	specs := cfg.specs()
	prog := newProgress(cfg.Progress, len(specs))
	defer prog.stop()
	start := nanotime()
	for i, s := range specs {
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
		prog.set(i, s)
		repeat := 1
		if isPipelined(s.Scenario) {
			repeat = cfg.Repeat
		}
		var reps []*Result
		for range repeat {
			rctx, cancel := context.WithTimeout(ctx, cfg.RunTimeout)
			res, err := runOne(rctx, s, cfg.Executable, cfg.ChildArgs)
			cancel()
			if err != nil && res == nil {
				rep.Failures = append(rep.Failures, Failure{Scenario: s.Scenario, Transport: s.Transport, Size: s.Size, Error: err.Error()})
				break
			}
			setErr(res, err)
			reps = append(reps, res)
		}
		if len(reps) > 0 {
			rep.Results = append(rep.Results, mergeRepeats(reps))
		}
	}
	prog.stop()
	if slices.Contains(cfg.Anchors, AnchorUCX) {
		rep.Anchors = runUCXAnchors(ctx, &cfg, rep)
	}
	rep.ElapsedS = float64(nanotime()-start) / 1e9
	rep.Settings.CPUCheck.finish()
	compareFloors(rep.Results, rep.Settings.Floor)
	writeTable(out, rep)
	var errs []error
	if cfg.JSONPath != "" {
		if err := writeJSON(cfg.JSONPath, rep); err != nil {
			errs = append(errs, err)
		}
	}
	if cfg.PlotPath != "" {
		if err := writePlot(cfg.PlotPath, rep); err != nil {
			errs = append(errs, err)
		}
	}
	return rep, errors.Join(errs...)
}

func settingsOf(c *Config) Settings {
	s := Settings{GoVersion: runtime.Version(), GOOS: runtime.GOOS, GOARCH: runtime.GOARCH,
		NumCPU: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), Provider: deviceInUse(c.Provider), Commit: commit(),
		Started: time.Now().UTC().Format(time.RFC3339), Procs: c.Procs, Scenarios: c.Scenarios,
		Transports: c.Transports, Count: c.Count, Sizes: c.Sizes, Peers: c.Peers, Window: c.Window,
		Warmup: c.Warmup, DurationS: c.Duration.Seconds(), BusyPollUS: float64(c.BusyPoll) / 1e3, Keepalive: !c.KeepaliveOff, NoEcho: c.NoEcho, Floor: FloorBlock,
		Repeat: c.Repeat, BurstTimeS: c.BurstTime.Seconds(), Client: c.host}
	if c.BusyPoll > 0 {
		s.Floor = FloorSpin
	}
	return s
}

// deviceInUse names the provider and device an rdma_twosided engine of this binary takes
// (as notify picks it: a device with an active port, real providers before the soft one;
// only provider's when it is set), e.g. "verbs:mlx5_0" or "soft:soft0".
func deviceInUse(provider string) string {
	devs, err := ibv.GetDeviceList()
	if err != nil {
		return "none: " + err.Error()
	}
	best := ""
	for _, d := range devs {
		if _, ok := d.ActivePort(); !ok || (provider != "" && d.Provider != provider) {
			continue
		}
		if d.Provider != "soft" {
			return d.Provider + ":" + d.Name
		}
		if best == "" {
			best = d.Provider + ":" + d.Name
		}
	}
	if best == "" {
		return "none"
	}
	return best
}

// commit is the source revision: git rev-parse, else the build's vcs.revision, else
// "unknown".
func commit() string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if b, err := exec.CommandContext(ctx, "git", "rev-parse", "HEAD").Output(); err == nil {
		if s := strings.TrimSpace(string(b)); s != "" {
			return s
		}
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, kv := range bi.Settings {
			if kv.Key == "vcs.revision" && kv.Value != "" {
				return kv.Value
			}
		}
	}
	return "unknown"
}

// compareFloors sets VsFloor on every run that has a floor run of the same scenario, size
// and peers.
func compareFloors(rs []*Result, floor string) {
	for _, r := range rs {
		if isFloor(r.Transport) {
			continue
		}
		want := floor
		if r.Scenario == ScenarioBurst && hasFloor(rs, FloorStream, r) {
			want = FloorStream // pipelined against pipelined
		}
		if r.Transport == TransportRDMA {
			// On the same device, the verbs floor is the reference: what the engine adds to
			// the NIC and its library. Spinning against spinning, events against events.
			vf, other := FloorVerbs, FloorVerbsSpin
			if floor == FloorSpin {
				vf, other = other, vf
			}
			switch {
			case hasFloor(rs, vf, r):
				want = vf
			case hasFloor(rs, other, r):
				want = other
			}
		}
		for _, f := range rs {
			if f.Transport != want || f.Scenario != r.Scenario || f.Size != r.Size || f.Peers != r.Peers {
				continue
			}
			switch r.Scenario {
			case ScenarioLatency:
				if r.OneWay != nil && f.OneWay != nil && f.OneWay.P50 > 0 {
					r.VsFloor, r.VsFloorOf = r.OneWay.P50/f.OneWay.P50, "one-way p50 / "+want
				}
			case ScenarioConnect:
				if r.Connect != nil && f.Connect != nil && f.Connect.P50 > 0 {
					r.VsFloor, r.VsFloorOf = r.Connect.P50/f.Connect.P50, "connect p50 / "+floor
				}
			case ScenarioIdle:
			default:
				if r.OpsPerSec > 0 && f.OpsPerSec > 0 {
					r.VsFloor, r.VsFloorOf = f.OpsPerSec/r.OpsPerSec, want+" ops/s / ops/s"
				}
			}
		}
	}
}

// hasFloor reports whether rs holds a run of floor with r's scenario, size and peers.
func hasFloor(rs []*Result, floor string, r *Result) bool {
	for _, f := range rs {
		if f.Transport == floor && f.Scenario == r.Scenario && f.Size == r.Size && f.Peers == r.Peers {
			return true
		}
	}
	return false
}

func isPipelined(sc string) bool {
	return sc == ScenarioBurst || sc == ScenarioBidi || sc == ScenarioFanin || sc == ScenarioFanout
}

// mergeRepeats returns the run of median ops/s, with every run's ops/s, their spread, and
// the errors of them all.
func mergeRepeats(reps []*Result) *Result {
	if len(reps) == 1 {
		return reps[0]
	}
	sorted := slices.Clone(reps)
	slices.SortStableFunc(sorted, func(a, b *Result) int {
		switch {
		case a.OpsPerSec < b.OpsPerSec:
			return -1
		case a.OpsPerSec > b.OpsPerSec:
			return 1
		}
		return 0
	})
	m := sorted[len(sorted)/2]
	m.OpsRepeats = nil
	var errs int64
	first := ""
	for _, r := range reps {
		m.OpsRepeats = append(m.OpsRepeats, r.OpsPerSec)
		errs += r.Errors
		if first == "" {
			first = r.FirstError
		}
	}
	m.Errors, m.FirstError = errs, first
	m.OpsMin, m.OpsMax = sorted[0].OpsPerSec, sorted[len(sorted)-1].OpsPerSec
	return m
}
