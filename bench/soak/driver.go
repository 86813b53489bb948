package soak

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twosided/twosided/notify"
	"github.com/twosided/twosided/reactor/limits"
)

// Config is a soak run.
type Config struct {
	Duration   time.Duration
	Seed       uint64
	Faults     []string // kinds of AllFaults
	Procs      int      // agent processes
	Transports []string // one engine per transport in every agent
	Provider   string   // the rdma_twosided engines' provider ("soft", "verbs"; "": as notify picks)
	Plant      string   // lose, dup, reorder, leak: in agent 0's first incarnation
	// FaultEvery: the mean time between faults.
	FaultEvery time.Duration
	Mix        Mix
	// DeviceCtlDir: where the agents' softverbs control files go (device faults); "": no
	// device faults.
	DeviceCtlDir string
	// MinDelivered: the run goes on past Duration until the agents delivered this many
	// notifies (a short test's bound on work, not on time; ctx still ends it).
	MinDelivered uint64
	// Command returns the command that runs an agent with args (its flags, --spec
	// included): the binary itself with `soak --agent`, or a test binary.
	Command func(args []string) *exec.Cmd
	// Progress gets a line every ProgressEvery (nil or 0: none); Log gets the agents'
	// stderr and log lines (nil: kept only for a report).
	Progress      io.Writer
	ProgressEvery time.Duration
	Log           io.Writer
	// Remote: agent hosts (`twosided soak --agent-host`), one agent each (name one twice
	// for two), beside the Procs local agents. BindIP: the IP local engines listen on
	// (default 127.0.0.1; with remote agents, one they can reach).
	Remote []string
	BindIP string
	// RecoveryBound: a restarted engine must be reached (a notify to it acknowledged)
	// within this of its coming up (default DefaultRecoveryBound).
	RecoveryBound time.Duration
	// StallBound: the recovery bound of a pair whose sender's async sends waited for credit
	// when its receiver was killed (a kill of the paused variant waits for that): the
	// restarted receiver must have a notify of that sender acknowledged within this of its
	// coming up (default DefaultStallBound).
	StallBound time.Duration
	// SampleEvery: how often the agents say what they hold; ResWarmup: how long after
	// its start an agent's first sample becomes its baseline (defaults 10 s and 10 s).
	SampleEvery, ResWarmup time.Duration
}

// DefaultRecoveryBound: the dead-peer bound of the contract (a dead receiver found within
// about 5 s) plus what the run's other faults may add meanwhile (a consumer paused up to
// 3.1 s, a process stopped up to 2.1 s, a slow consumer), with room for a loaded machine.
const DefaultRecoveryBound = 20 * time.Second

// DefaultStallBound: a receiver killed while a sender's sends wait for its credit is
// restarted at once on its address, and nothing but the dead-peer bound (a dead receiver
// found within about 5 s, a half keepalive interval after its death plus the answer of its
// address) stands between its restart and that sender's next notify; the bound adds what
// other faults may add meanwhile (the sender stopped up to 2.1 s) and room for a loaded
// machine. The keepalive's no-credit rule alone (15 s of starvation, 20-27 s in all on the
// verbs provider) is past it.
const DefaultStallBound = 12 * time.Second

// stallWaitMS: how long past its pause a kill of the paused variant waits for a sender
// stalled on its credit before it kills anyway.
const stallWaitMS = 3000

// Leak bounds: once the run's operations have ended, an agent holding more than
// leakFactor × its baseline + leakSlack goroutines or fds, or leakFactor × its RSS +
// leakRSSKiB, leaks. Generous: they catch what grows with the run's length (per notify,
// per fault, per peer ever seen), never a working set's noise.
const (
	leakFactor = 2
	leakSlack  = 100
	leakRSSKiB = 256 << 10
)

// AgentRes is an agent incarnation's resources: its baseline (its first sample after the
// warm-up) and its last sample, taken once the run's operations ended.
type AgentRes struct {
	Agent int  `json:"agent"`
	Base  *Res `json:"base"`
	Final *Res `json:"final"`
}

type resTrack struct {
	gen         int
	spawned     time.Time
	base, final *Res
}

// Result is what a run found; it is also the --json file.
type Result struct {
	Seed            uint64         `json:"seed"`
	Duration        float64        `json:"duration_s"`
	Procs           int            `json:"procs"`
	Transports      []string       `json:"transports"`
	Provider        string         `json:"provider,omitempty"`
	Ops             uint64         `json:"ops"`
	Calls           uint64         `json:"calls"`
	Acked           uint64         `json:"acked"`
	Maybe           uint64         `json:"maybe_delivered"`
	Failed          uint64         `json:"failed"`
	Delivered       uint64         `json:"delivered"`
	NotifiesChecked uint64         `json:"notifies_checked"`
	Faults          map[string]int `json:"faults"`
	Violations      map[string]int `json:"violations"`
	Allowances      map[string]int `json:"allowances"`
	// Held: the killed engines whose acknowledged losses were held to what they could hold.
	Held HeldStats `json:"killed_held"`
	// Hostile: what the hostile client sent (frames, connections) and how many of its
	// requests were refused in so many words.
	Hostile map[string]uint64 `json:"hostile,omitempty"`
	// Recovery: from a killed process's restart to the first notify a peer got acknowledged
	// by one of its engines, in milliseconds.
	Recovery RecoveryStats `json:"recovery_ms"`
	// Reach: for every pair with a new engine, from its coming up to the pair's first
	// acknowledged notify, in milliseconds; StalledReach: of those, the pairs whose sender's
	// sends waited for credit when the receiver was killed (StalledKills such kills).
	Reach        RecoveryStats `json:"reach_ms"`
	StalledReach RecoveryStats `json:"stalled_reach_ms"`
	StalledKills int           `json:"stalled_kills"`
	// StalledSlow: stalled pairs judged slow_recovery; StalledGone: stalled pairs whose
	// sender or restarted receiver was killed or closed before an ack.
	StalledSlow int `json:"stalled_slow"`
	StalledGone int `json:"stalled_gone"`
	// Answers: the handlers' answers (among the calls, deliveries and notifies checked above).
	Answers AnswerStats `json:"answers"`
	// Resources: each agent's baseline and final sample (those that lived past the warm-up).
	Resources []AgentRes  `json:"resources,omitempty"`
	Details   []Violation `json:"violation_details,omitempty"`
	Verdict   string      `json:"verdict"`
}

// AnswerStats counts the answers handlers made (answer.go): Engines, the incarnations begun
// that answer; the answers' calls, their results, their deliveries, and those checked (an
// acknowledged answer delivered).
type AnswerStats struct {
	Engines   int    `json:"engines"`
	Calls     uint64 `json:"calls"`
	Acked     uint64 `json:"acked"`
	Maybe     uint64 `json:"maybe_delivered"`
	Failed    uint64 `json:"failed"`
	Delivered uint64 `json:"delivered"`
	Checked   uint64 `json:"checked"`
}

// RecoveryStats summarizes recovery times.
type RecoveryStats struct {
	Count  int     `json:"count"`
	Min    float64 `json:"min"`
	Median float64 `json:"median"`
	Max    float64 `json:"max"`
}

// ErrViolation is returned by Run when the contract was broken.
var ErrViolation = errors.New("soak: the delivery contract was broken")

type agentProc struct {
	idx      int
	host     string // its agent host; "": a child of this process
	gen      int    // spawns so far
	run      agentRun
	in       chan []byte
	inDone   chan struct{}
	alive    bool // spawned and not killed or exited
	stopped  bool // SIGSTOPped
	bye      bool
	inClosed bool
	exited   chan struct{}
	stderr   *tailBuffer
	slots    []string
	killAt   time.Time
	downMS   int
	taken    string // its process's count file (taken.go), "" when none
}

type driverStream struct {
	from, to string
	agent    int
	gen      *StreamGen
	busy     bool
	closing  bool
}

type agentMsg struct {
	agent, gen int
	ev         Event
	eof        bool
	err        error
}

type timed struct {
	at time.Time
	fn func()
}

// TraceEnv names a file to which the parent writes every event it judges, with its step:
// the whole history of a violation, for its study.
const TraceEnv = "TWOSIDED_SOAK_TRACE"

type driver struct {
	trace    io.Writer // every judged event (TraceEnv), or nil
	cfg      Config
	c        *Checker
	agents   []*agentProc
	addrs    map[string]string // slot -> host:port
	incs     map[string]int    // slot -> its latest incarnation
	live     map[string]string // slot -> engine id up
	tr       map[string]string // slot -> transport
	streams  map[streamKey]*driverStream
	msgs     chan agentMsg
	later    []timed
	running  bool
	faults   map[string]int
	ops      uint64
	recovery []time.Duration
	restarts map[string]time.Time    // slot -> restart awaiting its first ack
	reach    map[reachPair]time.Time // pairs with a new engine awaiting an ack, since it came up
	// The paused kill's stall: agents whose kill waits for a sender stalled on their credit
	// (by agent, the incarnation), the stalled senders of each killed slot until its new
	// engine comes up, and the pairs judged by StallBound.
	stallWatch   map[int]int
	stallKills   map[string][]string
	stallReach   map[reachPair]bool
	stalledKills int
	stalledSlow  int // stalled pairs judged slow
	stalledGone  int // stalled pairs whose sender or receiver went before an ack
	reachTimes   []time.Duration
	stallTimes   []time.Duration
	res          []resTrack // by agent
	final        bool       // the final samples are asked for
	readers      sync.WaitGroup
	plantSet     bool
	ctx          context.Context
	hostile      HostileStats
	attacks      sync.WaitGroup // hostile bursts under way
	takenDir     string         // the agents' count files; "": none
	answering    int            // incarnations begun that answer from their handler
}

// Run runs a soak and returns what it found; the error wraps ErrViolation when the contract
// was broken.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if cfg.Procs < 0 || cfg.Procs+len(cfg.Remote) < 1 || len(cfg.Transports) == 0 || cfg.Command == nil {
		return Result{}, errors.New("soak: needs procs, transports and a command")
	}
	if cfg.Mix.MaxSize <= 0 {
		cfg.Mix.MaxSize = notify.MaxIDLen // tiny, only when unset in tests
	}
	if cfg.FaultEvery <= 0 {
		cfg.FaultEvery = 3 * time.Second
	}
	d := &driver{
		cfg: cfg, c: NewChecker(), addrs: map[string]string{}, incs: map[string]int{}, live: map[string]string{},
		tr: map[string]string{}, streams: map[streamKey]*driverStream{}, msgs: make(chan agentMsg, 4096),
		faults: map[string]int{}, restarts: map[string]time.Time{}, reach: map[reachPair]time.Time{},
		stallWatch: map[int]int{}, stallKills: map[string][]string{}, stallReach: map[reachPair]bool{},
		res: make([]resTrack, cfg.Procs+len(cfg.Remote)),
	}
	if d.cfg.RecoveryBound <= 0 {
		d.cfg.RecoveryBound = DefaultRecoveryBound
	}
	if d.cfg.StallBound <= 0 {
		d.cfg.StallBound = DefaultStallBound
	}
	if d.cfg.SampleEvery <= 0 {
		d.cfg.SampleEvery = 10 * time.Second
	}
	if d.cfg.ResWarmup <= 0 {
		d.cfg.ResWarmup = 10 * time.Second
	}
	for _, k := range cfg.Faults {
		d.faults[k] = 0
	}
	// Ports are drawn at random, not from the seed: a replay must not collide with a run
	// beside it.
	bind := cmp.Or(cfg.BindIP, "127.0.0.1")
	for _, h := range cfg.Remote {
		if loopback(bind) && !loopback(h) {
			return Result{}, fmt.Errorf("%w: the agent host %s cannot reach engines on %s: set --bind to an IP of this host it reaches", ErrRemote, h, bind)
		}
	}
	addrs, err := freeAddrsOn(bind, cfg.Procs*len(cfg.Transports), seededNow())
	if err != nil {
		return Result{}, err
	}
	// One request per agent host for all its agents' ports, so that none is given twice.
	perHost := map[string]int{}
	for _, h := range cfg.Remote {
		perHost[h]++
	}
	hostAddrs := map[string][]string{}
	for h, k := range perHost {
		if hostAddrs[h], err = hostPorts(h, k*len(cfg.Transports)); err != nil {
			return Result{}, err
		}
	}
	for i := range cfg.Procs + len(cfg.Remote) {
		ap := &agentProc{idx: i, stderr: &tailBuffer{max: 16 << 10}}
		var mine []string
		if i < cfg.Procs {
			mine = addrs[i*len(cfg.Transports):]
		} else {
			ap.host = cfg.Remote[i-cfg.Procs]
			mine = hostAddrs[ap.host]
			hostAddrs[ap.host] = mine[len(cfg.Transports):]
		}
		for j, tr := range cfg.Transports {
			slot := SlotName(i, j)
			d.addrs[slot], d.tr[slot] = mine[j], tr
			ap.slots = append(ap.slots, slot)
		}
		d.agents = append(d.agents, ap)
	}
	if path := os.Getenv(TraceEnv); path != "" {
		f, err := os.Create(path)
		if err != nil {
			return Result{}, fmt.Errorf("%s: %w", TraceEnv, err)
		}
		bw := bufio.NewWriterSize(f, 1<<20)
		d.trace = bw
		defer func() { _ = bw.Flush(); _ = f.Close() }()
	}
	if dir, err := os.MkdirTemp("", "twosided-soak-taken-"); err == nil {
		d.takenDir = dir
		defer os.RemoveAll(dir)
	} else {
		d.logf("no count files (%v): a kill's losses are allowed without their bound", err)
	}
	start := time.Now()
	err = d.run(ctx)
	d.c.Finish()
	res := d.result(time.Since(start))
	if err == nil && d.c.Total() > 0 {
		err = fmt.Errorf("%w: %d violations (seed %d)", ErrViolation, d.c.Total(), cfg.Seed)
	}
	if err != nil && !errors.Is(err, ErrViolation) {
		res.Verdict = "ERROR: " + err.Error()
	}
	return res, err
}

// freeAddrs picks n distinct free loopback addresses for the engines. The ports come from
// below the kernel's ephemeral range (32768 and up on Linux by default), so that no
// connection's local port takes one between the pick and an agent's (re)start, and each is
// held until all are picked, so that no two are the same.
func freeAddrs(n int, r *rand.Rand) ([]string, error) { return freeAddrsOn("127.0.0.1", n, r) }

// seededNow is a generator seeded from the clock and the process: ports are not the
// schedule's, and two runs side by side must not draw the same.
func seededNow() *rand.Rand {
	return rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(os.Getpid())))
}

// freeAddrsOn is freeAddrs on the IP ip.
func freeAddrsOn(ip string, n int, r *rand.Rand) ([]string, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	for tries := 0; len(ls) < n; tries++ {
		if tries == 1000 {
			return nil, fmt.Errorf("soak: %d free ports on %s in 20000–32767: found %d", n, ip, len(ls))
		}
		l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(20000+r.IntN(12768))))
		if err == nil {
			ls = append(ls, l)
		}
	}
	addrs := make([]string, n)
	for i, l := range ls {
		addrs[i] = l.Addr().String()
	}
	return addrs, nil
}

func (d *driver) step(ev Event) {
	d.c.Step(ev)
	if d.trace != nil {
		fmt.Fprintf(d.trace, "%d %+v\n", d.c.step, ev)
	}
}

func (d *driver) run(ctx context.Context) (err error) {
	ctx, cancel := context.WithCancel(ctx)
	d.ctx = ctx
	defer func() { cancel(); d.attacks.Wait() }()
	defer d.teardown()
	for _, ap := range d.agents {
		if err := d.spawn(ap); err != nil {
			return err
		}
	}
	d.running = true
	end := time.NewTimer(d.cfg.Duration)
	defer end.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var progress <-chan time.Time
	if d.cfg.Progress != nil && d.cfg.ProgressEvery > 0 {
		pt := time.NewTicker(d.cfg.ProgressEvery)
		defer pt.Stop()
		progress = pt.C
	}
	sample := time.NewTicker(d.cfg.SampleEvery)
	defer sample.Stop()
	start := time.Now()
	fg := NewFaultGen(d.cfg.Seed, d.cfg.Faults, len(d.agents), len(d.cfg.Transports), int(d.cfg.FaultEvery/time.Millisecond))
	d.nextFault(fg)
	ended := false
	for d.running {
		select {
		case m := <-d.msgs:
			d.handle(m)
		case <-tick.C:
			d.runDue()
			d.judgeRecovery()
		case <-sample.C:
			for _, ap := range d.agents {
				if ap.alive && !ap.stopped {
					d.send(ap, Event{K: CmdSample})
				}
			}
		case <-progress:
			d.progress(time.Since(start))
		case <-end.C:
			ended = true
		case <-ctx.Done():
			d.running = false
		}
		if ended && d.c.Delivered >= d.cfg.MinDelivered {
			d.running = false
		}
	}
	return d.wind(start)
}

// wind ends a run: no new operations or faults; stopped agents continue; every operation
// under way finishes; every agent closes its engines (drained) and exits.
func (d *driver) wind(start time.Time) error {
	d.later = nil
	for _, ap := range d.agents {
		if ap.alive && d.deviceFaults() { // the device faults under way end
			_ = ap.run.Device("port=up")
		}
		if ap.stopped && ap.alive {
			_ = ap.run.Signal(syscall.SIGCONT)
			ap.stopped = false
		}
	}
	guard := time.NewTimer(3 * time.Minute) // a hang guard, not a measurement
	defer guard.Stop()
	busy := func() bool {
		for _, st := range d.streams {
			if st.busy && d.agents[st.agent].alive {
				return true
			}
		}
		for _, ap := range d.agents {
			if ap.alive && !d.ready(ap) {
				return true // a restart or reopen under way
			}
		}
		return false
	}
	for busy() {
		select {
		case m := <-d.msgs:
			d.handle(m)
		case <-guard.C:
			d.hang("the run's last operations did not finish within 3 minutes of its end")
			return nil
		}
	}
	d.judgeRecovery()
	if err := d.finalSamples(guard.C); err != nil {
		return nil
	}
	for _, ap := range d.agents {
		if ap.alive {
			d.send(ap, Event{K: CmdStop})
		}
	}
	for {
		left := false
		for _, ap := range d.agents {
			left = left || (ap.alive && !ap.bye)
		}
		if !left {
			break
		}
		select {
		case m := <-d.msgs:
			d.handle(m)
		case <-guard.C:
			d.hang("agents did not close their engines within 3 minutes of the run's end")
			return nil
		}
	}
	if d.cfg.Progress != nil && d.cfg.ProgressEvery > 0 {
		d.progress(time.Since(start))
	}
	return nil
}

// finalSamples asks every live agent what it holds once the operations have ended, and
// judges it against its baseline.
func (d *driver) finalSamples(guard <-chan time.Time) error {
	d.final = true
	for _, ap := range d.agents {
		if ap.alive {
			d.send(ap, Event{K: CmdSample, Op: sampleFinal})
		}
	}
	for {
		left := false
		for _, ap := range d.agents {
			left = left || (ap.alive && d.res[ap.idx].gen == ap.gen && d.res[ap.idx].final == nil)
		}
		if !left {
			break
		}
		select {
		case m := <-d.msgs:
			d.handle(m)
		case <-guard:
			d.hang("agents did not say what they hold within 3 minutes of the run's end")
			return errors.New("no final samples")
		}
	}
	for _, ap := range d.agents {
		t := d.res[ap.idx]
		if !ap.alive || t.gen != ap.gen || t.base == nil || t.final == nil {
			continue
		}
		b, f := t.base, t.final
		var grown []string
		if f.Goroutines > leakFactor*b.Goroutines+leakSlack {
			grown = append(grown, fmt.Sprintf("goroutines %d → %d", b.Goroutines, f.Goroutines))
		}
		if f.FDs > leakFactor*b.FDs+leakSlack {
			grown = append(grown, fmt.Sprintf("fds %d → %d", b.FDs, f.FDs))
		}
		if f.RSSKiB > leakFactor*b.RSSKiB+leakRSSKiB {
			grown = append(grown, fmt.Sprintf("RSS %d → %d KiB", b.RSSKiB, f.RSSKiB))
		}
		if len(grown) > 0 {
			d.step(Event{K: KindLeak, Eng: EngineID(ap.slots[0], d.incs[ap.slots[0]]),
				Err: fmt.Sprintf("agent %d, once the operations ended: %s (peers %d → %d, channels %d → %d)",
					ap.idx, strings.Join(grown, ", "), b.Peers, f.Peers, b.Channels, f.Channels)})
		}
	}
	return nil
}

// reachPair is a pair of slots, one of which has a new engine, that has not yet had a
// notify acknowledged since it came up.
type reachPair struct{ from, to string }

// awaitReach starts the recovery bound of slot's new engine: within it, a notify of it to
// every live engine, and one of every live engine to it, must be acknowledged.
func (d *driver) awaitReach(slot string) {
	now := time.Now()
	for other, id := range d.live {
		if other == slot {
			continue
		}
		if !Receiver(d.cfg.Seed, d.live[slot]) {
			d.reach[reachPair{slot, other}] = now
		}
		if !Receiver(d.cfg.Seed, id) {
			d.reach[reachPair{other, slot}] = now
		}
	}
}

// forgetReach drops the pairs of slot, whose engine is gone (killed, closed).
func (d *driver) forgetReach(slot string) {
	for p := range d.reach {
		if p.from == slot || p.to == slot {
			if d.stallReach[p] {
				d.stalledGone++
			}
			delete(d.reach, p)
			delete(d.stallReach, p)
		}
	}
}

// judgeRecovery reports each pair with a new engine that has not had a notify acknowledged
// within the recovery bound of the engine's coming up.
func (d *driver) judgeRecovery() {
	now := time.Now()
	for p, up := range d.reach {
		if bound, _ := d.reachBound(p); now.Sub(up) > bound {
			d.slowRecovery(p, now.Sub(up))
		}
	}
}

// reachBound is pair p's recovery bound, and why when it is not RecoveryBound.
func (d *driver) reachBound(p reachPair) (time.Duration, string) {
	if d.stallReach[p] {
		return d.cfg.StallBound, ", whose sends waited for credit when it was killed"
	}
	return d.cfg.RecoveryBound, ""
}

// slowRecovery reports pair p, whose first acknowledged notify had not come el after its
// new engine came up, and forgets it.
func (d *driver) slowRecovery(p reachPair, el time.Duration) {
	bound, why := d.reachBound(p)
	if d.stallReach[p] {
		d.stalledSlow++
	}
	d.step(Event{K: KindSlowRecovery, Eng: d.live[p.from], Slot: p.to,
		Err: fmt.Sprintf("no notify of %s to %s%s was acknowledged in the %v since one of them came up (bound %v)",
			d.live[p.from], d.live[p.to], why, el.Round(time.Millisecond), bound)})
	delete(d.reach, p)
	delete(d.stallReach, p)
}

// ready says whether every slot of ap has an engine up with its latest incarnation.
func (d *driver) ready(ap *agentProc) bool {
	for _, slot := range ap.slots {
		if d.live[slot] != EngineID(slot, d.incs[slot]) {
			return false
		}
	}
	return true
}

func (d *driver) hang(what string) {
	d.step(Event{K: KindHang, Eng: EngineID("a0e0", 0), Err: what})
	d.killAll()
}

func (d *driver) teardown() {
	d.killAll()
	done := make(chan struct{})
	go func() { d.readers.Wait(); close(done) }()
	for {
		select {
		case m := <-d.msgs: // the run is over: what still comes is dropped
			if ap := d.agents[m.agent]; m.eof && m.gen == ap.gen {
				d.closeIn(ap)
			}
		case <-done:
			// Every reader has exited, so every process has been reaped; an EOF may
			// still sit in the buffer, so end every stdin writer here rather than
			// through its message, and wait for them (bounded: their pipes' readers
			// are gone, so a write fails at once).
			for _, ap := range d.agents {
				if ap.in != nil {
					d.closeIn(ap)
				}
			}
			bound := time.NewTimer(10 * time.Second)
			defer bound.Stop()
			for _, ap := range d.agents {
				if ap.inDone == nil {
					continue
				}
				select {
				case <-ap.inDone:
				case <-bound.C:
					d.logf("agent %d: its stdin writer did not end within 10 s", ap.idx)
					return
				}
			}
			return
		}
	}
}

func (d *driver) killAll() {
	for _, ap := range d.agents {
		if ap.alive {
			d.kill(ap, false)
		}
	}
}

func (d *driver) spawn(ap *agentProc) error {
	ap.gen++
	spec := AgentSpec{Index: ap.idx, Provider: d.cfg.Provider, Seed: d.cfg.Seed}
	if slices.Contains(d.cfg.Faults, FaultCut) {
		for _, addr := range d.addrs {
			if _, p, err := net.SplitHostPort(addr); err == nil {
				n, _ := strconv.Atoi(p)
				spec.OOBPorts = append(spec.OOBPorts, n)
			}
		}
		slices.Sort(spec.OOBPorts)
	}
	if ap.idx == 0 && !d.plantSet {
		spec.Plant, d.plantSet = d.cfg.Plant, true
	}
	spec.Names = map[string][]string{}
	for slot := range d.addrs {
		spec.Names[slot] = d.names(slot)
	}
	for _, slot := range ap.slots {
		d.incs[slot]++
		spec.Engines = append(spec.Engines, AgentEngine{Slot: slot, Inc: d.incs[slot], Addr: d.addrs[slot], Transport: d.tr[slot]})
		d.step(d.begin(slot))
	}
	if ap.host == "" && d.takenDir != "" {
		path := filepath.Join(d.takenDir, fmt.Sprintf("agent%d.%d", ap.idx, ap.gen))
		if err := newTakenFile(path, len(ap.slots)); err != nil {
			return fmt.Errorf("soak: %w", err)
		}
		spec.Taken, ap.taken = path, path
	}
	raw, _ := json.Marshal(spec)
	ap.stderr.reset()
	var stderr io.Writer = ap.stderr
	if d.cfg.Log != nil {
		stderr = io.MultiWriter(ap.stderr, d.cfg.Log)
	}
	var (
		run    agentRun
		stdin  io.WriteCloser
		stdout io.Reader
		err    error
	)
	if ap.host != "" {
		run, stdin, stdout, err = spawnRemote(ap.host, raw, stderr)
		if err != nil {
			return err
		}
		if d.deviceFaults() {
			_ = run.Device("port=up")
		}
	} else {
		cmd := d.cfg.Command([]string{"--spec", string(raw)})
		lr := &localRun{cmd: cmd, ctl: d.ctlPath(ap)}
		if lr.ctl != "" {
			if err := os.WriteFile(lr.ctl, []byte("port=up\n"), 0o600); err != nil {
				return fmt.Errorf("soak: %w", err)
			}
			if cmd.Env == nil {
				cmd.Env = os.Environ()
			}
			cmd.Env = append(cmd.Env, "SOFTVERBS_CTL="+lr.ctl)
		}
		if stdin, err = cmd.StdinPipe(); err != nil {
			return err
		}
		if stdout, err = cmd.StdoutPipe(); err != nil {
			return err
		}
		cmd.Stderr = stderr
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("soak: start agent %d: %w", ap.idx, err)
		}
		run = lr
	}
	ap.run, ap.alive, ap.stopped, ap.bye, ap.inClosed = run, true, false, false, false
	d.res[ap.idx] = resTrack{gen: ap.gen, spawned: time.Now()}
	ap.in, ap.inDone, ap.exited = make(chan []byte, 1<<14), make(chan struct{}), make(chan struct{})
	go func(in chan []byte, done chan struct{}) { // writes never block the driver
		defer close(done)
		w := bufio.NewWriter(stdin)
		for b := range in {
			if _, err := w.Write(b); err != nil {
				break
			}
			if len(in) == 0 && w.Flush() != nil {
				break
			}
		}
		_ = stdin.Close()
		for range in { // drain, so that a sender never blocks
		}
	}(ap.in, ap.inDone)
	d.readers.Add(1)
	gen, idx, exited := ap.gen, ap.idx, ap.exited
	go func() {
		defer d.readers.Done()
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 0, 64<<10), MaxLine)
		for sc.Scan() {
			ev, err := Decode(sc.Bytes())
			d.msgs <- agentMsg{agent: idx, gen: gen, ev: ev, err: err}
		}
		err := run.Wait()
		close(exited)
		d.msgs <- agentMsg{agent: idx, gen: gen, eof: true, err: err}
	}()
	return nil
}

// closeIn ends the writer of ap's stdin once its process is gone.
func (d *driver) closeIn(ap *agentProc) {
	if !ap.inClosed {
		ap.inClosed = true
		close(ap.in)
	}
}

// deviceFaults says whether the run injects softverbs' device faults.
func (d *driver) deviceFaults() bool {
	return d.cfg.Provider == "verbs" && slices.Contains(d.cfg.Faults, FaultDevice)
}

// ctlPath is local agent ap's softverbs control file, "" without device faults.
func (d *driver) ctlPath(ap *agentProc) string {
	if d.cfg.DeviceCtlDir == "" || !d.deviceFaults() {
		return ""
	}
	return filepath.Join(d.cfg.DeviceCtlDir, fmt.Sprintf("agent%d.ctl", ap.idx))
}

func (d *driver) send(ap *agentProc, ev Event) {
	if !ap.alive || ap.inClosed {
		return
	}
	select {
	case ap.in <- Encode(ev):
	default: // cannot happen: one op per stream is out at a time
		d.logf("agent %d: its command queue is full", ap.idx)
	}
}

func (d *driver) logf(format string, args ...any) {
	if d.cfg.Log != nil {
		fmt.Fprintf(d.cfg.Log, "soak: "+format+"\n", args...)
	}
}

func (d *driver) handle(m agentMsg) {
	ap := d.agents[m.agent]
	if m.gen != ap.gen {
		return // a killed incarnation's last words
	}
	if m.eof {
		d.closeIn(ap)
		if ap.alive && !ap.bye {
			// Exited on its own: a crash of the engine or of the agent.
			ap.alive = false
			for _, slot := range ap.slots {
				d.step(Event{K: KindKill, Slot: slot, Inc: d.incs[slot]})
			}
			d.step(Event{K: KindCrash, Eng: EngineID(ap.slots[0], d.incs[ap.slots[0]]),
				Err: fmt.Sprintf("agent %d exited on its own (%v); its stderr ends: %s", ap.idx, m.err, ap.stderr.String())})
			d.dropStreams(ap)
		}
		ap.alive = false
		d.readTaken(ap)
		if !ap.killAt.IsZero() && d.running {
			at := ap.killAt.Add(time.Duration(ap.downMS) * time.Millisecond)
			ap.killAt = time.Time{}
			d.at(at, func() { d.restart(ap) })
		}
		return
	}
	if m.err != nil {
		d.step(Event{K: KindCrash, Eng: EngineID(ap.slots[0], d.incs[ap.slots[0]]), Err: fmt.Sprintf("agent %d wrote a bad line: %v", ap.idx, m.err)})
		return
	}
	ev := m.ev
	switch ev.K {
	case KindLog:
		d.logf("agent %d: %s", ap.idx, ev.Err)
		return
	case KindBye:
		ap.bye = true
		return
	case KindStalled:
		d.stalled(ev)
		return
	case KindBegin, KindKill, KindDispatch, KindFault, KindTaken:
		d.step(Event{K: KindCrash, Eng: EngineID(ap.slots[0], d.incs[ap.slots[0]]), Err: fmt.Sprintf("agent %d wrote an event only the parent makes: %s", ap.idx, ev.K)})
		return
	case KindRes:
		t := &d.res[ap.idx]
		if t.gen != ap.gen {
			return
		}
		if d.final {
			t.final = ev.Res
		} else if t.base == nil && time.Since(t.spawned) >= d.cfg.ResWarmup {
			t.base = ev.Res
		}
		return
	}
	d.step(ev)
	switch ev.K {
	case KindUp:
		d.live[ev.Slot] = ev.Eng
		d.forgetReach(ev.Slot)
		if d.running {
			d.awaitReach(ev.Slot)
		}
		for _, snd := range d.stallKills[ev.Slot] {
			from, _, _ := ParseEngineID(snd)
			p := reachPair{from, ev.Slot}
			if _, ok := d.reach[p]; ok && d.live[p.from] == snd {
				d.stallReach[p] = true
			}
		}
		delete(d.stallKills, ev.Slot)
		if !d.running || Receiver(d.cfg.Seed, ev.Eng) {
			return
		}
		for slot := range d.addrs {
			if slot == ev.Slot {
				continue
			}
			st := &driverStream{from: ev.Eng, to: slot, agent: ap.idx, gen: NewStreamGen(d.cfg.Seed, ev.Eng, slot, d.cfg.Mix)}
			d.streams[streamKey{from: ev.Eng, slot: slot}] = st
			d.dispatch(st)
		}
	case KindClosed:
		slot, _, _ := ParseEngineID(ev.Eng)
		if d.live[slot] == ev.Eng {
			delete(d.live, slot)
			d.forgetReach(slot)
		}
		for k := range d.streams {
			if k.from == ev.Eng {
				delete(d.streams, k)
			}
		}
	case KindOpDone:
		if st := d.streams[streamKey{from: ev.Eng, slot: ev.Slot}]; st != nil {
			st.busy = false
			if d.running && !st.closing {
				d.dispatch(st)
			}
		}
	case KindResult:
		if ev.Answer {
			return // recovery is judged by the scheduled streams' acks, as before answers
		}
		if t, ok := d.restarts[ev.Slot]; ok && ev.Class == ClassOK {
			d.recovery = append(d.recovery, time.Since(t))
			delete(d.restarts, ev.Slot)
		}
		if ev.Class == ClassOK {
			if slot, _, err := ParseEngineID(ev.Eng); err == nil && d.live[slot] == ev.Eng {
				p := reachPair{slot, ev.Slot}
				if up, ok := d.reach[p]; ok {
					el := time.Since(up)
					d.reachTimes = append(d.reachTimes, el)
					if d.stallReach[p] {
						d.stallTimes = append(d.stallTimes, el)
					}
					// Judged here too: no tick judges while the run winds down.
					if bound, _ := d.reachBound(p); el > bound {
						d.slowRecovery(p, el)
					}
				}
				delete(d.reach, p)
				delete(d.stallReach, p)
			}
		}
	}
}

func (d *driver) dispatch(st *driverStream) {
	ev := st.gen.Next()
	ev.Eng, ev.Slot, ev.Names = st.from, st.to, d.names(st.to)
	st.busy = true
	d.ops++
	d.step(Event{K: KindDispatch, Eng: ev.Eng, Slot: ev.Slot, Op: ev.Op, Window: ev.Window, Sends: ev.Sends})
	d.send(d.agents[st.agent], ev)
}

// names are the names slot's engine is sent to by: its address and, on loopback, the same
// port as localhost (two names of one peer), or its address alone (--one-name, or another
// host, where localhost is this one).
func (d *driver) names(slot string) []string {
	_, port, _ := net.SplitHostPort(d.addrs[slot])
	names := []string{d.addrs[slot], net.JoinHostPort("localhost", port)}
	if d.cfg.Mix.OneName || !loopback(d.addrs[slot]) {
		names = names[:1]
	}
	return names
}

func (d *driver) dropStreams(ap *agentProc) {
	for k, st := range d.streams {
		if st.agent == ap.idx {
			delete(d.streams, k)
		}
	}
	for _, slot := range ap.slots {
		delete(d.live, slot)
		d.forgetReach(slot)
	}
}

func (d *driver) at(t time.Time, fn func()) { d.later = append(d.later, timed{t, fn}) }

func (d *driver) runDue() {
	now := time.Now()
	due := d.later[:0:0]
	keep := d.later[:0]
	for _, t := range d.later {
		if !t.at.After(now) {
			due = append(due, t)
		} else {
			keep = append(keep, t)
		}
	}
	d.later = keep
	for _, t := range due {
		if d.running {
			t.fn()
		}
	}
}

func (d *driver) nextFault(fg *FaultGen) {
	f, ok := fg.Next()
	if !ok {
		return
	}
	d.at(time.Now().Add(time.Duration(f.AfterMS)*time.Millisecond), func() {
		d.inject(f)
		d.nextFault(fg)
	})
}

func (d *driver) inject(f Fault) {
	ap := d.agents[f.Agent]
	if !ap.alive || !d.ready(ap) {
		return // down, starting or reopening: the fault is skipped
	}
	if (f.Kind == FaultKill || f.Kind == FaultStop || f.Kind == FaultReopen) && d.stallHeld(ap.idx) {
		// A stalled pair waits for its ack: its sender and receiver live until it is judged,
		// or a kill would end the wait unjudged (kills come every few seconds, the stall
		// it looks for lasts 15 s and more).
		return
	}
	note := func(what string) {
		d.faults[f.Kind]++
		d.step(Event{K: KindFault, Err: what})
	}
	switch f.Kind {
	case FaultKill:
		if ap.stopped {
			return
		}
		if f.Variant == KillPaused {
			// Its consumers pause, so that its short queues fill and its credits stop; it is
			// killed once a sender's async sends to it wait for credit (nothing on the wire,
			// so no completion can fail), and restarted at once on its addresses. Without
			// such a sender by the end of the pause and stallWaitMS, it is killed anyway.
			wait := f.US/1000 + stallWaitMS
			note(fmt.Sprintf("agent %d's consumers pause; it is killed -9 once a sender waits for its credit, or in %d ms, down %d ms", ap.idx, wait, f.MS))
			for _, slot := range ap.slots {
				d.send(ap, Event{K: CmdPause, Slot: slot, MS: wait + 1000})
			}
			gen := ap.gen
			d.stallWatch[ap.idx] = gen
			for _, o := range d.agents {
				if o != ap && o.alive && !o.stopped {
					for _, slot := range ap.slots {
						d.send(o, Event{K: CmdWatchStall, Slot: slot, Addr: d.addrs[slot], MS: wait})
					}
				}
			}
			d.at(time.Now().Add(time.Duration(wait)*time.Millisecond), func() {
				if g, ok := d.stallWatch[ap.idx]; ok && g == gen {
					delete(d.stallWatch, ap.idx)
				} else {
					return // killed at a stall, or its watch ended
				}
				if ap.gen == gen && ap.alive && !ap.stopped {
					d.step(Event{K: KindFault, Err: fmt.Sprintf("kill -9 agent %d, paused, no sender stalled on its credit", ap.idx)})
					ap.downMS = f.MS
					d.kill(ap, true)
				}
			})
			return
		}
		note(fmt.Sprintf("kill -9 agent %d, down %d ms", ap.idx, f.MS))
		ap.downMS = f.MS
		d.kill(ap, true)
	case FaultStop:
		if ap.stopped {
			return
		}
		note(fmt.Sprintf("SIGSTOP agent %d for %d ms", ap.idx, f.MS))
		_ = ap.run.Signal(syscall.SIGSTOP)
		ap.stopped = true
		gen := ap.gen
		d.at(time.Now().Add(time.Duration(f.MS)*time.Millisecond), func() {
			if ap.gen == gen && ap.alive && ap.stopped {
				_ = ap.run.Signal(syscall.SIGCONT)
				ap.stopped = false
			}
		})
	case FaultReopen:
		if ap.stopped {
			return
		}
		old := d.live[f.Slot]
		d.incs[f.Slot]++
		note(fmt.Sprintf("close %s mid-stream and reopen it as %s", old, EngineID(f.Slot, d.incs[f.Slot])))
		d.step(d.begin(f.Slot))
		for k, st := range d.streams {
			if k.from == old {
				st.closing = true
			}
		}
		d.send(ap, Event{K: CmdReopen, Slot: f.Slot, Inc: d.incs[f.Slot]})
	case FaultDevice:
		if !d.deviceFaults() || (ap.host == "" && d.ctlPath(ap) == "") {
			return
		}
		note(fmt.Sprintf("agent %d's device: %s for %d ms", ap.idx, f.Device, f.MS))
		if err := ap.run.Device(f.Device); err != nil {
			d.logf("device fault: %v", err)
		}
		gen := ap.gen
		d.at(time.Now().Add(time.Duration(f.MS)*time.Millisecond), func() {
			if ap.gen == gen && ap.alive {
				_ = ap.run.Device(f.End)
			}
		})
	case FaultCut:
		if ap.stopped {
			return
		}
		note(fmt.Sprintf("agent %d cuts its engines' OOB connections", ap.idx))
		d.send(ap, Event{K: CmdCut})
	case FaultHostile:
		target := d.addrs[f.Slot]
		var as []Identity
		for slot, id := range d.live {
			if slot != f.Slot {
				as = append(as, Identity{ID: id, Addr: d.addrs[slot]})
			}
		}
		sort.Slice(as, func(i, j int) bool { return as[i].ID < as[j].ID })
		note(fmt.Sprintf("a hostile client attacks %s (%s) for %d ms: %s", d.live[f.Slot], target, f.MS, f.Variant))
		r := seeded(d.cfg.Seed, "hostile", strconv.Itoa(d.faults[FaultHostile]))
		d.attacks.Add(1)
		go func() {
			defer d.attacks.Done()
			runHostile(d.ctx, f.Variant, target, as, r, time.Duration(f.MS)*time.Millisecond, &d.hostile)
		}()
	case FaultPause:
		note(fmt.Sprintf("%s's consumer pauses %d ms", d.live[f.Slot], f.MS))
		d.send(ap, Event{K: CmdPause, Slot: f.Slot, MS: f.MS})
	case FaultSlow:
		note(fmt.Sprintf("%s's consumer slows to %d µs a notify for %d ms", d.live[f.Slot], f.US, f.MS))
		d.send(ap, Event{K: CmdSlow, Slot: f.Slot, US: f.US})
		gen, slot := ap.gen, f.Slot
		d.at(time.Now().Add(time.Duration(f.MS)*time.Millisecond), func() {
			if ap.gen == gen {
				d.send(ap, Event{K: CmdSlow, Slot: slot})
			}
		})
	}
}

// stallHeld says whether agent i is the sender or the receiver of a stalled kill's pair
// still waiting for its new engine or its first ack.
func (d *driver) stallHeld(i int) bool {
	of := func(slot string) int { a, _, _ := ParseSlot(slot); return a }
	for victim, snds := range d.stallKills {
		if of(victim) == i {
			return true
		}
		for _, snd := range snds {
			if slot, _, _ := ParseEngineID(snd); of(slot) == i {
				return true
			}
		}
	}
	for p := range d.stallReach {
		if of(p.from) == i || of(p.to) == i {
			return true
		}
	}
	return false
}

// stalled: an agent says a sender's async sends to ev.Slot wait for credit. If that slot's
// agent waits to be killed at such a stall (a paused kill), it is killed now and restarted
// at once; the pair of that sender and the restarted engine is judged by StallBound.
func (d *driver) stalled(ev Event) {
	i, _, err := ParseSlot(ev.Slot)
	if err != nil || i >= len(d.agents) {
		return
	}
	ap := d.agents[i]
	gen, ok := d.stallWatch[i]
	if !ok || gen != ap.gen || !ap.alive || ap.stopped || !d.running {
		return
	}
	if slot, _, err := ParseEngineID(ev.Eng); err != nil || d.live[slot] != ev.Eng {
		return // the sender is gone meanwhile
	}
	delete(d.stallWatch, i)
	d.stalledKills++
	d.step(Event{K: KindFault, Err: fmt.Sprintf("kill -9 agent %d, paused, while %s's async sends to %s wait for credit (%s); restarted at once",
		ap.idx, ev.Eng, d.live[ev.Slot], ev.Err)})
	d.stallKills[ev.Slot] = append(d.stallKills[ev.Slot], ev.Eng)
	ap.downMS = 0
	d.kill(ap, true)
}

// begin is the event that starts slot's latest incarnation, with what it may hold when
// killed: its receive queue bound, how its application takes notifies, and the RECV ring of
// a channel (none over oob).
func (d *driver) begin(slot string) Event {
	inc := d.incs[slot]
	ev := Event{K: KindBegin, Slot: slot, Inc: inc, Queue: RecvQueue(d.cfg.Seed, slot, inc), Consumer: Consumer(d.cfg.Seed, slot, inc)}
	if Answering(d.cfg.Seed, slot, inc) {
		d.answering++
	}
	if ev.Queue == 0 {
		ev.Queue = int(limits.RecvQueue.Default)
	}
	if d.tr[slot] == notify.TransportRDMATwoSided {
		ev.Ring = int(limits.RecvCount.Default)
	}
	return ev
}

// readTaken tells the checker, once ap's process is reaped, how many delivery events each
// of its last incarnations put on their way (KindTaken), and removes the count file.
func (d *driver) readTaken(ap *agentProc) {
	if ap.taken == "" {
		return
	}
	path := ap.taken
	ap.taken = ""
	defer os.Remove(path)
	incs, counts, err := readTaken(path, len(ap.slots))
	if err != nil {
		d.logf("agent %d: %v", ap.idx, err)
		return
	}
	for i, slot := range ap.slots {
		if incs[i] != 0 && incs[i] == d.incs[slot] {
			d.step(Event{K: KindTaken, Eng: EngineID(slot, incs[i]), N: counts[i]})
		}
	}
}

// kill sends SIGKILL; the restart comes when the process is reaped (handle, eof).
func (d *driver) kill(ap *agentProc, restart bool) {
	if !ap.alive {
		return
	}
	_ = ap.run.Signal(syscall.SIGKILL)
	ap.alive = false
	for _, slot := range ap.slots {
		d.step(Event{K: KindKill, Slot: slot, Inc: d.incs[slot]})
	}
	d.dropStreams(ap)
	if restart {
		ap.killAt = time.Now()
	}
}

func (d *driver) restart(ap *agentProc) {
	if ap.alive {
		return
	}
	if err := d.spawn(ap); err != nil {
		d.step(Event{K: KindCrash, Eng: EngineID(ap.slots[0], d.incs[ap.slots[0]]), Err: "restart: " + err.Error()})
		return
	}
	for _, slot := range ap.slots {
		d.restarts[slot] = time.Now()
	}
}

func (d *driver) faultCount() int {
	n := 0
	for _, v := range d.faults {
		n += v
	}
	return n
}

func (d *driver) progress(el time.Duration) {
	fmt.Fprintf(d.cfg.Progress, "soak %s: ops %d, calls %d, acked %d, checked %d, answers %d, faults %d, violations %d\n",
		el.Round(time.Second), d.ops, d.c.Calls, d.c.Acked, d.c.Checked, d.c.Answers.Calls, d.faultCount(), d.c.Total())
}

func (d *driver) result(el time.Duration) Result {
	r := Result{
		Seed: d.cfg.Seed, Duration: el.Seconds(), Procs: len(d.agents), Transports: d.cfg.Transports, Provider: d.cfg.Provider,
		Ops: d.ops, Calls: d.c.Calls, Acked: d.c.Acked, Maybe: d.c.Maybe, Failed: d.c.Failed, Delivered: d.c.Delivered,
		NotifiesChecked: d.c.Checked, Faults: d.faults, Violations: d.c.Violations, Allowances: d.c.Allowances, Details: d.c.Details,
		Held: d.c.Held, Answers: d.c.Answers,
	}
	r.Answers.Engines = d.answering
	if n := d.hostile.Conns.Load(); n > 0 {
		r.Hostile = map[string]uint64{"conns": n, "frames": d.hostile.Frames.Load(), "refused": d.hostile.Refused.Load()}
	}
	if n := len(d.recovery); n > 0 {
		rs := slices.Clone(d.recovery)
		slices.Sort(rs)
		ms := func(x time.Duration) float64 { return float64(x.Microseconds()) / 1000 }
		r.Recovery = RecoveryStats{Count: n, Min: ms(rs[0]), Median: ms(rs[n/2]), Max: ms(rs[n-1])}
	}
	r.Reach, r.StalledReach, r.StalledKills = msStats(d.reachTimes), msStats(d.stallTimes), d.stalledKills
	r.StalledSlow, r.StalledGone = d.stalledSlow, d.stalledGone
	for i, t := range d.res {
		if t.base != nil && t.final != nil {
			r.Resources = append(r.Resources, AgentRes{Agent: i, Base: t.base, Final: t.final})
		}
	}
	r.Verdict = "PASS"
	if d.c.Total() > 0 {
		r.Verdict = "FAIL"
	}
	return r
}

// msStats summarizes durations in milliseconds.
func msStats(ds []time.Duration) RecoveryStats {
	n := len(ds)
	if n == 0 {
		return RecoveryStats{}
	}
	rs := slices.Clone(ds)
	slices.Sort(rs)
	ms := func(x time.Duration) float64 { return float64(x.Microseconds()) / 1000 }
	return RecoveryStats{Count: n, Min: ms(rs[0]), Median: ms(rs[n/2]), Max: ms(rs[n-1])}
}

// Report writes the verdict: the figures and, on a violation, the seed, the schedule around
// each violation and its stream's history.
func (r Result) Report(w io.Writer, replay string) {
	fmt.Fprintf(w, "soak %s: %.0f s, seed %d, %d procs, %s; ops %d, calls %d (acked %d, maybe %d, failed %d), delivered %d, notifies checked %d\n",
		r.Verdict, r.Duration, r.Seed, r.Procs, strings.Join(r.Transports, "+"), r.Ops, r.Calls, r.Acked, r.Maybe, r.Failed, r.Delivered, r.NotifiesChecked)
	fmt.Fprintf(w, "  answers from handlers: %d answering engines; calls %d (acked %d, maybe %d, failed %d), delivered %d, checked %d\n",
		r.Answers.Engines, r.Answers.Calls, r.Answers.Acked, r.Answers.Maybe, r.Answers.Failed, r.Answers.Delivered, r.Answers.Checked)
	fmt.Fprintf(w, "  faults: %s\n  allowances: %s\n  violations: %s\n", counts(r.Faults), counts(r.Allowances), counts(r.Violations))
	fmt.Fprintf(w, "  killed engines held to what they could hold: %d, %d acknowledged notifies lost with them, at most %d%% of a bound\n",
		r.Held.Checked, r.Held.Lost, r.Held.MostUsed)
	if r.Held.Most != "" {
		fmt.Fprintf(w, "    the most: %s\n", r.Held.Most)
	}
	if len(r.Hostile) > 0 {
		fmt.Fprintf(w, "  hostile client: %d connections, %d frames, %d refused in so many words\n", r.Hostile["conns"], r.Hostile["frames"], r.Hostile["refused"])
	}
	for _, a := range r.Resources {
		fmt.Fprintf(w, "  agent %d, baseline → end: goroutines %d → %d, fds %d → %d, RSS %d → %d MiB, peers %d → %d, channels %d → %d\n",
			a.Agent, a.Base.Goroutines, a.Final.Goroutines, a.Base.FDs, a.Final.FDs, a.Base.RSSKiB>>10, a.Final.RSSKiB>>10,
			a.Base.Peers, a.Final.Peers, a.Base.Channels, a.Final.Channels)
	}
	if r.Recovery.Count > 0 {
		fmt.Fprintf(w, "  recovery after restart: %d, min %.0f ms, median %.0f ms, max %.0f ms\n", r.Recovery.Count, r.Recovery.Min, r.Recovery.Median, r.Recovery.Max)
	}
	if r.Reach.Count > 0 {
		fmt.Fprintf(w, "  pairs with a new engine, first ack after it came up: %d, min %.0f ms, median %.0f ms, max %.0f ms\n", r.Reach.Count, r.Reach.Min, r.Reach.Median, r.Reach.Max)
	}
	fmt.Fprintf(w, "  kills while a sender waited for credit: %d (that sender and the restarted engine: %d slow, %d gone before an ack)", r.StalledKills, r.StalledSlow, r.StalledGone)
	if r.StalledReach.Count > 0 {
		fmt.Fprintf(w, "; first acks: %d, min %.0f ms, median %.0f ms, max %.0f ms", r.StalledReach.Count, r.StalledReach.Min, r.StalledReach.Median, r.StalledReach.Max)
	}
	fmt.Fprintln(w)
	for i, v := range r.Details {
		fmt.Fprintf(w, "\nviolation %d: %s at step %d, stream %s: %s\n  schedule before it:\n", i+1, v.Kind, v.Step, v.Stream, v.Detail)
		for _, s := range v.Schedule {
			fmt.Fprintf(w, "    %s\n", s)
		}
		fmt.Fprintf(w, "  the stream's history:\n")
		for _, s := range v.History {
			fmt.Fprintf(w, "    %s\n", s)
		}
		if len(v.First) > 0 {
			fmt.Fprintf(w, "  the schedule at the stream's first event:\n")
			for _, s := range v.ScheduleAtFirst {
				fmt.Fprintf(w, "    %s\n", s)
			}
			fmt.Fprintf(w, "  the stream's first events:\n")
			for _, s := range v.First {
				fmt.Fprintf(w, "    %s\n", s)
			}
		}
	}
	if r.Verdict == "FAIL" && replay != "" {
		fmt.Fprintf(w, "\nreplay the schedule: %s\n", replay)
	}
}

func counts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(k + " " + strconv.Itoa(m[k]))
	}
	return b.String()
}

// WriteJSON writes r to path.
func (r Result) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// tailBuffer keeps the last max bytes written (an agent's stderr).
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) reset() {
	t.mu.Lock()
	t.b = t.b[:0]
	t.mu.Unlock()
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
