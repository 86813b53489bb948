package bench

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/twosided/twosided/internal/tracepoint"
)

// Scenarios, in table order.
const (
	ScenarioLatency = "latency" // sequential notifies: one-way and call latency
	ScenarioBurst   = "burst"   // pipelined one-way, message-size sweep
	ScenarioBidi    = "bidi"    // both directions at once
	ScenarioFanin   = "fanin"   // N senders, one receiver
	ScenarioFanout  = "fanout"  // one sender, N receivers
	ScenarioIdle    = "idle"    // K peers connected, no traffic: wake-ups/s and CPU
	ScenarioConnect = "connect" // time to establish K channels, cold
)

// Scenarios lists every scenario in table order.
var Scenarios = []string{ScenarioLatency, ScenarioBurst, ScenarioBidi, ScenarioFanin, ScenarioFanout, ScenarioIdle, ScenarioConnect}

// runSpec is one run: one scenario over one transport at one size.
type runSpec struct {
	Scenario, Transport string
	Procs               int
	Size, Peers, Count  int
	Warmup, Window      int
	Duration            time.Duration // idle: the idle time; otherwise a cap on the measured phase
	BusyPoll            time.Duration
	Provider            string // ibv provider of rdma_twosided and the verbs floors; "": as notify picks
	KeepaliveOff        bool   // engines without keepalive
	NoEcho              bool   // latency, two processes: the round trip ends at the ACK
	// Server is a bench server's address: the receiving side runs there (Procs 2), and the
	// local nodes listen on Host, this host's address on the route to it.
	Server, Host string
	// Timed: a pipelined run that sends until Duration ends (Count is only a ceiling).
	Timed bool
}

// run is the state of one run: its nodes (local, and in the child), sinks and meters.
type run struct {
	ctx  context.Context
	spec runSpec
	exe  string
	args []string
	opts nodeOpts

	sSink, rSink *sink
	senders      []node
	receivers    []node // local receivers (one process)
	peers        []string
	child        *child

	cpu0      time.Duration
	wake0     uint64
	t0        int64
	childWarm int64
	childSent int64 // bidi: what the receiving side sent back
}

func newRun(ctx context.Context, spec runSpec, exe string, args []string) *run {
	return &run{
		ctx: ctx, spec: spec, exe: exe, args: args,
		opts: nodeOpts{busyPoll: int64(spec.BusyPoll), size: spec.Size, window: spec.Window, provider: spec.Provider, noKA: spec.KeepaliveOff, host: spec.Host,
			single: spec.Scenario == ScenarioLatency || spec.Scenario == ScenarioIdle || spec.Scenario == ScenarioConnect},
		sSink: newSink(), rSink: newSink(),
	}
}

func (r *run) local() []node { return append(append([]node(nil), r.senders...), r.receivers...) }

// setup creates nSenders local sending nodes and nReceivers receiving nodes, here (one
// process) or in a child process (two); cs carries the child's extra duties.
func (r *run) setup(nSenders, nReceivers int, cs childSpec) error {
	for range nSenders {
		n, err := newNode(r.spec.Transport, r.opts, r.sSink)
		if err != nil {
			return err
		}
		r.senders = append(r.senders, n)
	}
	if r.spec.Procs == 1 {
		for range nReceivers {
			n, err := newNode(r.spec.Transport, r.opts, r.rSink)
			if err != nil {
				return err
			}
			r.receivers = append(r.receivers, n)
		}
		r.peers = addrs(r.receivers)
		return nil
	}
	cs.Transport, cs.Receivers = r.spec.Transport, nReceivers
	cs.Size, cs.Window, cs.BusyPollNS, cs.Single = r.spec.Size, r.spec.Window, int64(r.spec.BusyPoll), r.opts.single
	cs.Provider, cs.NoKA = r.spec.Provider, r.spec.KeepaliveOff
	cs.Parent = addrs(r.senders)
	ctx, cancel := context.WithTimeout(r.ctx, 30*time.Second)
	defer cancel()
	var (
		c     *child
		peers []string
		err   error
	)
	if r.spec.Server != "" {
		c, peers, err = startRemote(ctx, r.spec.Server, cs)
	} else {
		c, peers, err = startChild(ctx, r.exe, r.args, cs)
	}
	if err != nil {
		return err
	}
	if len(peers) != nReceivers {
		c.kill()
		return fmt.Errorf("%w: %d receivers listening, want %d", errChild, len(peers), nReceivers)
	}
	r.child, r.peers = c, peers
	return nil
}

// clients makes n clients on node from, each sending to peers.
func (r *run) clients(from node, n int, peers []string) ([]client, error) {
	var cs []client
	for range n {
		c, err := from.newClient(peers)
		if err != nil {
			closeClients(cs)
			return nil, err
		}
		cs = append(cs, c)
	}
	return cs, nil
}

// begin starts the measured phase: the child takes its baseline first.
func (r *run) begin() error {
	if r.child != nil {
		var rep childReply
		if err := r.child.request(r.ctx, childRequest{Cmd: "start"}, &rep); err != nil {
			return err
		}
		r.childWarm = rep.Warm
	}
	r.cpu0, r.wake0, r.t0 = cpuTime(), sumWakeups(r.local()), nanotime()
	return nil
}

// end waits until the receivers have expect deliveries, ends the measured phase and fills
// res's rates. bytes is the payload moved.
func (r *run) end(res *Result, expect, bytes int64) error {
	var err error
	if r.child == nil {
		wctx, cancel := context.WithTimeout(r.ctx, 30*time.Second)
		err = r.rSink.wait(wctx, expect)
		cancel()
	}
	var rep childReply
	stop := func() {
		if cerr := r.child.request(r.ctx, childRequest{Cmd: "stop", Expect: expect}, &rep); cerr != nil {
			err = cerr
		}
	}
	// bidi: the receiving side's direction ends when its sends are done; the phase lasts
	// until then (one control round trip more, measured on this clock only).
	stopFirst := r.child != nil && r.spec.Scenario == ScenarioBidi
	if stopFirst {
		stop()
	}
	elapsed := nanotime() - r.t0
	cpu := cpuTime() - r.cpu0
	wake := sumWakeups(r.local()) - r.wake0
	res.WakeupsSelf = wake
	var childCPU int64
	if r.child != nil {
		if !stopFirst {
			stop()
		}
		childCPU = rep.CPUNS
		wake += rep.Wakeups
		res.WakeupsChild = rep.Wakeups
		res.Errors += rep.Errors
		if stopFirst {
			r.childSent = rep.Sent
			res.Notifies += rep.Sent
			bytes += rep.Sent * int64(max(r.spec.Size, minSize))
		}
	}
	res.fill(elapsed, bytes, int64(cpu), childCPU, wake)
	return err
}

func (r *run) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if r.child != nil {
		r.child.finish(ctx)
	}
	_ = closeNodes(ctx, r.local())
}

func (r *run) result() *Result {
	s := r.spec
	return &Result{Scenario: s.Scenario, Transport: s.Transport, Procs: s.Procs, Size: max(s.Size, minSize),
		Peers: s.Peers, Window: s.Window, BusyPollUS: float64(s.BusyPoll) / 1e3}
}

func (r *run) deadline() int64 {
	if r.spec.Duration <= 0 {
		return 0
	}
	return nanotime() + int64(r.spec.Duration)
}

func setErr(res *Result, err error) {
	if err != nil && res.FirstError == "" {
		res.FirstError = err.Error()
	}
}

// runOne runs spec and returns its figures.
func runOne(ctx context.Context, spec runSpec, exe string, args []string) (*Result, error) {
	r := newRun(ctx, spec, exe, args)
	defer r.close()
	switch spec.Scenario {
	case ScenarioLatency:
		return r.latency()
	case ScenarioBurst:
		return r.pipelined(1, 1, false)
	case ScenarioBidi:
		return r.bidi()
	case ScenarioFanin:
		return r.pipelined(spec.Peers, 1, false)
	case ScenarioFanout:
		return r.pipelined(1, spec.Peers, true)
	case ScenarioIdle:
		return r.idle()
	case ScenarioConnect:
		return r.connect()
	}
	return nil, fmt.Errorf("%w: scenario %q: want one of %v", ErrConfig, spec.Scenario, Scenarios)
}

func (r *run) latency() (*Result, error) {
	s := r.spec
	floor := isFloor(s.Transport)
	// An echo: the engines' latency run in two processes, and floor-echo and
	// floor-verbs-echo, its references on raw sockets and on the verbs device (the other
	// floors' round trip is one message and its answer).
	echo := s.Procs == 2 && (!floor || isEchoFloor(s.Transport)) && !s.NoEcho
	if err := r.setup(1, 1, childSpec{Echo: echo}); err != nil {
		return nil, err
	}
	cs, err := r.clients(r.senders[0], 1, r.peers[:1])
	if err != nil {
		return nil, err
	}
	c := cs[0]
	defer c.close()
	if c.lockThread() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
	}
	warm := s.Warmup
	total := warm + s.Count
	t0 := make([]atomic.Int64, total)
	switch {
	case s.Procs == 1:
		r.rSink.timed(t0, uint64(warm))
	case echo:
		r.sSink.timed(t0, uint64(warm))
	}
	var st *stamps
	if echo && !floor && s.Server == "" && s.Size >= seqLen+stampLen { // CLOCK_MONOTONIC of one host; an engine's hops
		st = newStamps(total)
		r.sSink.mu.Lock()
		r.sSink.peerAt, r.sSink.echoAt = make([]atomic.Int64, total), make([]atomic.Int64, total)
		r.sSink.mu.Unlock()
	}
	res := r.result()
	call := NewHist()
	msg := newMsg(s.Size)
	var ok int64 // sends that succeeded, warm-up included
	var bytes int64
	deadline := int64(0)
	for i := range total {
		if i == warm {
			if err := r.begin(); err != nil {
				return nil, err
			}
			deadline = r.deadline()
		}
		if i > warm && deadline > 0 && nanotime() > deadline {
			break
		}
		putSeq(msg, uint64(i))
		if st != nil {
			st.send[i] = monoNow()
		}
		tracepoint.Mark(tracepoint.Submit, i)
		start := nanotime()
		t0[i].Store(start)
		err := c.send(r.ctx, 0, msg)
		d := nanotime() - start
		if st != nil {
			st.ret[i] = monoNow()
		}
		if err != nil {
			if i < warm {
				return nil, fmt.Errorf("bench: %s latency warm-up: %w", s.Transport, err)
			}
			res.Errors++
			setErr(res, err)
			if r.ctx.Err() != nil {
				break
			}
			continue
		}
		ok++
		if echo {
			if err := r.sSink.wait(r.ctx, ok); err != nil {
				return nil, err
			}
			if st != nil {
				st.resume[i] = monoNow()
			}
		}
		if i >= warm {
			call.Record(d)
			res.Notifies++
			bytes += int64(len(msg))
		}
	}
	err = r.end(res, ok, bytes)
	res.Call = call.Summary(1)
	switch {
	case s.Procs == 1:
		res.OneWay, res.OneWayMethod = r.rSink.latency().Summary(1), "one clock"
	case echo:
		res.OneWay, res.OneWayMethod = r.sSink.latency().Summary(2), "rtt/2 (echo notify)"
		if st != nil && res.Notifies > 0 {
			if hops := st.breakdown(r.sSink, warm); hops != nil {
				n := float64(res.Notifies)
				res.Breakdown = &Breakdown{Hops: hops, SenderWakeupsPerN: float64(res.WakeupsSelf) / n,
					ReceiverWakeupsPerN: float64(res.WakeupsChild) / n}
			}
		}
	default:
		res.OneWay, res.OneWayMethod = call.Summary(2), "rtt/2 (ack)"
	}
	return res, err
}

// pipelined runs burst (1, 1), fanin (K senders, 1 receiver) and fanout (1 sender, K
// receivers): every sender node has Window clients each with one send in flight.
func (r *run) pipelined(nSenders, nReceivers int, spread bool) (*Result, error) {
	s := r.spec
	if s.Transport == FloorStream {
		return r.stream()
	}
	if isVerbsFloor(s.Transport) {
		return r.verbsStream()
	}
	if err := r.setup(nSenders, nReceivers, childSpec{}); err != nil {
		return nil, err
	}
	peers := r.peers[:1]
	if spread {
		peers = r.peers
	}
	var workers []client
	defer func() { closeClients(workers) }()
	for _, n := range r.senders {
		cs, err := r.clients(n, s.Window, peers)
		if err != nil {
			return nil, err
		}
		workers = append(workers, cs...)
	}
	warm, err := warmUp(r.ctx, workers, len(peers), s.Warmup, s.Size)
	if err != nil {
		return nil, fmt.Errorf("bench: %s %s warm-up: %w", s.Transport, s.Scenario, err)
	}
	if err := r.begin(); err != nil {
		return nil, err
	}
	p := runPump(r.ctx, workers, len(peers), int64(s.Count), s.Size, r.deadline())
	res := r.result()
	res.Notifies, res.Errors = p.sent, p.errors
	setErr(res, p.firstErr)
	err = r.end(res, warm+p.sent, p.bytes)
	res.Call = p.call.Summary(1)
	return res, err
}

// bidi sends Count notifies each way at once; the figures count both directions.
func (r *run) bidi() (*Result, error) {
	s := r.spec
	cs := childSpec{SendCount: int64(s.Count)}
	if s.Timed {
		cs.SendNS = int64(s.Duration)
	}
	if err := r.setup(1, 1, cs); err != nil {
		return nil, err
	}
	a := r.senders[0]
	ab, err := r.clients(a, s.Window, r.peers[:1])
	defer func() { closeClients(ab) }()
	if err != nil {
		return nil, err
	}
	var ba []client
	defer func() { closeClients(ba) }()
	if s.Procs == 1 {
		if ba, err = r.clients(r.receivers[0], s.Window, []string{a.addr()}); err != nil {
			return nil, err
		}
	}
	warmAB, err := warmUp(r.ctx, ab, 1, s.Warmup, s.Size)
	if err != nil {
		return nil, fmt.Errorf("bench: %s bidi warm-up: %w", s.Transport, err)
	}
	var warmBA int64
	if ba != nil {
		if warmBA, err = warmUp(r.ctx, ba, 1, s.Warmup, s.Size); err != nil {
			return nil, fmt.Errorf("bench: %s bidi warm-up: %w", s.Transport, err)
		}
	}
	if err := r.begin(); err != nil {
		return nil, err
	}
	if r.child != nil {
		warmBA = r.childWarm
	}
	deadline := r.deadline()
	back := make(chan *pumpResult, 1)
	if ba != nil {
		go func() { back <- runPump(r.ctx, ba, 1, int64(s.Count), s.Size, deadline) }()
	}
	p := runPump(r.ctx, ab, 1, int64(s.Count), s.Size, deadline)
	res := r.result()
	res.Notifies, res.Errors = p.sent, p.errors
	setErr(res, p.firstErr)
	bytes := p.bytes
	var expectBA int64
	if ba != nil {
		q := <-back
		res.Notifies += q.sent
		res.Errors += q.errors
		setErr(res, q.firstErr)
		p.call.Merge(q.call)
		bytes += q.bytes
		expectBA = warmBA + q.sent
	}
	var werr error
	if ba != nil {
		wctx, cancel := context.WithTimeout(r.ctx, 30*time.Second)
		werr = r.sSink.wait(wctx, expectBA)
		cancel()
	}
	err = r.end(res, warmAB+p.sent, bytes) // with a child: counts its direction too
	if r.child != nil {
		// The child's sends completed before its stop reply: its notifies are here.
		wctx, cancel := context.WithTimeout(r.ctx, 30*time.Second)
		werr = r.sSink.wait(wctx, warmBA+r.childSent)
		cancel()
	}
	if werr != nil && err == nil {
		err = werr
	}
	res.Call = p.call.Summary(1)
	return res, err
}

// idle connects Peers peers, then measures wake-ups and CPU for Duration with no traffic.
func (r *run) idle() (*Result, error) {
	s := r.spec
	if err := r.setup(1, s.Peers, childSpec{}); err != nil {
		return nil, err
	}
	cs, err := r.clients(r.senders[0], 1, r.peers)
	if err != nil {
		return nil, err
	}
	defer closeClients(cs)
	warm, err := warmUp(r.ctx, cs, len(r.peers), 0, s.Size)
	if err != nil {
		return nil, fmt.Errorf("bench: %s idle connect: %w", s.Transport, err)
	}
	if err := r.begin(); err != nil {
		return nil, err
	}
	t := time.NewTimer(s.Duration)
	select {
	case <-t.C:
	case <-r.ctx.Done():
		t.Stop()
	}
	res := r.result()
	err = r.end(res, warm, 0)
	return res, err
}

// connect times the first notify to each of Peers cold peers, one after another.
func (r *run) connect() (*Result, error) {
	s := r.spec
	if err := r.setup(1, s.Peers, childSpec{}); err != nil {
		return nil, err
	}
	cs, err := r.clients(r.senders[0], 1, r.peers)
	if err != nil {
		return nil, err
	}
	c := cs[0]
	defer c.close()
	if c.lockThread() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
	}
	if err := r.begin(); err != nil {
		return nil, err
	}
	res := r.result()
	h := NewHist()
	msg := newMsg(s.Size)
	var bytes int64
	for p := range r.peers {
		start := nanotime()
		if err := c.send(r.ctx, p, msg); err != nil {
			res.Errors++
			setErr(res, err)
			continue
		}
		h.Record(nanotime() - start)
		res.Notifies++
		bytes += int64(len(msg))
	}
	err = r.end(res, res.Notifies, bytes)
	res.Connect = h.Summary(1)
	return res, err
}
