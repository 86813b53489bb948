package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/twosided/twosided/notify"
)

// The receiving side of a two-process run is this binary again, started with childEnv set
// to a JSON childSpec. Control is one JSON object per line: requests on the child's stdin,
// replies on its stdout. The child prints {"addrs":[...]} when its nodes listen, then
// answers "start" (baseline taken, bidi senders running) and "stop" (its figures; it then
// closes its nodes and exits). It exits on its own when stdin closes or after childLife.

const childEnv = "TWOSIDED_BENCH_CHILD"

const childLife = 10 * time.Minute

// childSpec is what the child builds.
type childSpec struct {
	Transport  string   `json:"transport"`
	Receivers  int      `json:"receivers"`
	Size       int      `json:"size"`
	Window     int      `json:"window"`
	BusyPollNS int64    `json:"busy_poll_ns"`
	Echo       bool     `json:"echo"`         // send every delivery's sequence number back to Parent[0]
	Parent     []string `json:"parent"`       // the parent's receiving nodes
	SendCount  int64    `json:"send_count"`   // bidi: notifies to send to Parent[0] after start
	SendNS     int64    `json:"send_ns"`      // bidi: stop sending this long after start (0: when SendCount are sent)
	Single     bool     `json:"single"`       // one client per node (nodeOpts.single)
	Provider   string   `json:"provider"`     // nodeOpts.provider
	NoKA       bool     `json:"no_keepalive"` // nodeOpts.noKA
}

type childRequest struct {
	Cmd    string `json:"cmd"`              // start, stop
	Expect int64  `json:"expect,omitempty"` // stop: deliveries to wait for first
}

type childReply struct {
	Addrs     []string `json:"addrs,omitempty"`
	Warm      int64    `json:"warm,omitempty"`
	CPUNS     int64    `json:"cpu_ns,omitempty"`
	Wakeups   uint64   `json:"wakeups,omitempty"`
	Delivered int64    `json:"delivered,omitempty"`
	Sent      int64    `json:"sent,omitempty"`
	Errors    int64    `json:"errors,omitempty"`
	Err       string   `json:"err,omitempty"`
}

// ChildMain runs the receiving side of a two-process run when this process was started
// as one, and then exits; otherwise it returns at once. Call it first in main (and in
// TestMain of tests that run two-process benchmarks).
func ChildMain() {
	if code, ok := directoryChild(); ok { // a sender of the directory scenario (directory.go)
		os.Exit(code)
	}
	raw, ok := os.LookupEnv(childEnv)
	if !ok {
		return
	}
	var spec childSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		_ = json.NewEncoder(os.Stdout).Encode(childReply{Err: fmt.Sprintf("bench child: spec: %v", err)})
		os.Exit(1)
	}
	if err := spec.validate(); err != nil {
		_ = json.NewEncoder(os.Stdout).Encode(childReply{Err: err.Error()})
		os.Exit(1)
	}
	code := runChild(context.Background(), spec, "", newCtrlScanner(os.Stdin), os.Stdout)
	if err := DumpTracepoints("child"); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(code)
}

// runChild serves one receiving side: its nodes listen on host ("": 127.0.0.1), requests
// come from in, replies go to out. A child process and a bench server's session run it.
func runChild(parent context.Context, spec childSpec, host string, sc *bufio.Scanner, out io.Writer) int {
	ctx, cancel := context.WithTimeout(parent, childLife)
	defer cancel()
	enc := json.NewEncoder(out)
	fail := func(err error) int {
		_ = enc.Encode(childReply{Err: err.Error()})
		return 1
	}
	o := nodeOpts{busyPoll: spec.BusyPollNS, size: spec.Size, window: spec.Window, single: spec.Single, provider: spec.Provider, noKA: spec.NoKA, host: host}
	s := newSink()
	var nodes []node
	defer func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ccancel()
		_ = closeNodes(cctx, nodes)
	}()
	for range spec.Receivers {
		n, err := newNode(spec.Transport, o, s)
		if err != nil {
			return fail(err)
		}
		nodes = append(nodes, n)
	}
	var bg sync.WaitGroup
	defer bg.Wait()
	defer cancel()
	if en, ok := firstEngine(nodes); spec.Echo && ok && en.transport != TransportOOBClassic {
		// An engine answers on its reactor thread, from the handler, with no hand-off to a
		// goroutine: the echo costs what a reply from a handler costs.
		parent, size := spec.Parent[0], spec.Size
		// The latency scenario echoes one notify at a time; SendNotifyAsync reads its message
		// until done, so a small ring of buffers, reused by sequence number, suffices and the
		// echo allocates nothing.
		var ring [16][]byte
		for i := range ring {
			ring[i] = newMsg(size)
		}
		done := func(err error) { // one closure for every echo: the echo allocates nothing
			if err != nil {
				s.bad.Add(1)
			}
		}
		s.echoNow = func(seq uint64) {
			msg := ring[seq%uint64(len(ring))]
			putSeq(msg, seq)
			if len(msg) >= seqLen+stampLen {
				putSeq(msg[seqLen:], uint64(monoNow())) // the handler's stamp, for the breakdown
			}
			if err := en.e.SendNotifyAsync(parent, notify.Notify{Name: benchName, Msg: msg}, done); err != nil {
				s.bad.Add(1)
			}
		}
	} else if spec.Echo && isEchoFloor(spec.Transport) && len(nodes) > 0 {
		// The echo floors answer as an engine's handler does, on the receiving thread: the
		// echo goes on this side's own connection (floor-echo: a TCP connection;
		// floor-verbs-echo: a QP of the node's device) and its answer is read before the
		// message's own answer is sent (the node's connection thread, locked to its OS
		// thread, is the one thread that uses the client).
		var fc client
		var err error
		if spec.Transport == FloorEcho {
			fc, err = newFloorClient(false, spec.Parent[:1])
		} else if vn, ok := nodes[0].(*verbsNode); ok && vn.dev.provider == "soft" {
			// The soft provider makes progress on the thread that waits on its device's
			// first channel (manual progress, ibv/soft's doc); the echo's thread waits on
			// its second, so every packet would wait for the provider's backstop (ms).
			err = fmt.Errorf("%w: %s: the soft provider makes progress only for a thread that waits on the device's first channel, and the echo waits on a second: run it on a libibverbs device (--provider verbs, -tags rdma)", ErrConfig, spec.Transport)
		} else {
			fc, err = nodes[0].newClient(spec.Parent[:1])
		}
		if err != nil {
			return fail(err)
		}
		// Closed before the nodes (deferred after them), once the runs are over: their
		// threads wait for a message then, not in the client.
		defer fc.close()
		msg := newMsg(spec.Size)
		s.echoNow = func(seq uint64) {
			putSeq(msg, seq)
			if err := fc.send(ctx, 0, msg); err != nil {
				s.bad.Add(1)
			}
		}
	} else if spec.Echo && len(nodes) > 0 {
		s.echo = make(chan uint64, 1024)
		c, err := nodes[0].newClient(spec.Parent[:1])
		if err != nil {
			return fail(err)
		}
		bg.Add(1)
		go func() {
			defer bg.Done()
			echoLoop(ctx, c, s, spec.Size)
		}()
	}
	if err := enc.Encode(childReply{Addrs: addrs(nodes)}); err != nil {
		return 1
	}
	var (
		cpu0  time.Duration
		wake0 uint64
		pump  *pumpResult
		done  = make(chan struct{})
	)
	for sc.Scan() {
		req, err := decodeRequest(sc.Bytes())
		if err != nil {
			return fail(err)
		}
		switch req.Cmd {
		case "start":
			var warm int64
			var workers []client
			if spec.SendCount > 0 && len(nodes) > 0 {
				for range max(1, spec.Window) {
					c, err := nodes[0].newClient(spec.Parent[:1])
					if err != nil {
						return fail(err)
					}
					workers = append(workers, c)
				}
				w, err := warmUp(ctx, workers, 1, 0, spec.Size)
				if err != nil {
					return fail(err)
				}
				warm = w
			}
			cpu0, wake0 = cpuTime(), sumWakeups(nodes)
			if err := enc.Encode(childReply{Warm: warm}); err != nil {
				return 1
			}
			if len(workers) > 0 {
				bg.Add(1)
				go func() {
					defer bg.Done()
					defer close(done)
					deadline := int64(0)
					if spec.SendNS > 0 {
						deadline = nanotime() + spec.SendNS // this process's clock only
					}
					pump = runPump(ctx, workers, 1, spec.SendCount, spec.Size, deadline)
				}()
			} else {
				close(done)
			}
		case "stop":
			var rep childReply
			select {
			case <-done:
			case <-ctx.Done():
			}
			wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
			if err := s.wait(wctx, req.Expect); err != nil {
				rep.Err = err.Error()
			}
			wcancel()
			rep.CPUNS = int64(cpuTime() - cpu0)
			rep.Wakeups = sumWakeups(nodes) - wake0
			rep.Delivered = s.count()
			if pump != nil {
				rep.Sent, rep.Errors = pump.sent, pump.errors
				if pump.firstErr != nil && rep.Err == "" {
					rep.Err = pump.firstErr.Error()
				}
			}
			if err := enc.Encode(rep); err != nil {
				return 1
			}
			return 0
		default:
			return fail(fmt.Errorf("bench child: request: unknown cmd %q", req.Cmd))
		}
	}
	return 0
}

func firstEngine(nodes []node) (*engineNode, bool) {
	if len(nodes) == 0 {
		return nil, false
	}
	en, ok := nodes[0].(*engineNode)
	return en, ok
}

// echoLoop sends every sequence number the sink hands over back to the parent.
func echoLoop(ctx context.Context, c client, s *sink, size int) {
	defer c.close()
	msg := newMsg(size)
	for {
		select {
		case seq := <-s.echo:
			putSeq(msg, seq)
			if err := c.send(ctx, 0, msg); err != nil {
				s.bad.Add(1)
			}
		case <-ctx.Done():
			return
		}
	}
}

// child is the parent's handle on a running child process, or on a session of a bench
// server (remote: its address; cmd nil; stdin the control connection).
type child struct {
	cmd    *exec.Cmd
	remote string
	conn   io.Closer // the control connection of a remote session
	stdin  io.WriteCloser
	lines  chan []byte
	stderr *syncBuffer
	done   chan struct{}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.b.Len() < 64<<10 {
		b.b.Write(p)
	}
	return len(p), nil
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

var errChild = errors.New("bench: child process")

// startChild starts the receiving side and returns its nodes' addresses.
func startChild(ctx context.Context, exe string, args []string, spec childSpec) (*child, []string, error) {
	raw, err := json.Marshal(spec)
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
	c := &child{cmd: cmd, lines: make(chan []byte, 4), stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stderr = c.stderr
	c.stdin, err = cmd.StdinPipe()
	if err != nil {
		return nil, nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("%w: start %s: %w", errChild, exe, err)
	}
	go func() {
		sc := newCtrlScanner(stdout)
		for sc.Scan() {
			c.lines <- bytes.Clone(sc.Bytes())
		}
		close(c.lines)
		_ = cmd.Wait() // only once stdout is drained, as os/exec asks
		close(c.done)
	}()
	var rep childReply
	if err := c.read(ctx, &rep); err != nil {
		c.kill()
		return nil, nil, err
	}
	return c, rep.Addrs, nil
}

func (c *child) read(ctx context.Context, rep *childReply) error {
	select {
	case line, ok := <-c.lines:
		if !ok {
			if c.remote != "" {
				return fmt.Errorf("%w: --client %s: the server closed the control connection", ErrServerLost, c.remote)
			}
			return fmt.Errorf("%w: exited: %s", errChild, c.stderr.String())
		}
		r, err := decodeReply(line)
		if err != nil {
			return c.wrap(err)
		}
		*rep = r
		if rep.Err != "" {
			if c.remote != "" {
				return fmt.Errorf("%w: --client %s: %s", ErrServerRun, c.remote, rep.Err)
			}
			return fmt.Errorf("%w: %s", errChild, rep.Err)
		}
		return nil
	case <-ctx.Done():
		return c.wrap(fmt.Errorf("no reply: %w", ctx.Err()))
	}
}

func (c *child) wrap(err error) error {
	if c.remote != "" {
		return fmt.Errorf("%w: --client %s: %w", ErrServerLost, c.remote, err)
	}
	return fmt.Errorf("%w: %w", errChild, err)
}

func (c *child) request(ctx context.Context, req childRequest, rep *childReply) error {
	b, _ := json.Marshal(req)
	if _, err := c.stdin.Write(append(b, '\n')); err != nil {
		return c.wrap(fmt.Errorf("%s: %w", req.Cmd, err))
	}
	return c.read(ctx, rep)
}

// finish closes the child's stdin and waits for it to exit, killing it past ctx.
func (c *child) finish(ctx context.Context) {
	_ = c.stdin.Close()
	select {
	case <-c.done:
		if c.conn != nil {
			_ = c.conn.Close()
		}
	case <-ctx.Done():
		c.kill()
	}
}

func (c *child) kill() {
	_ = c.stdin.Close()
	if c.cmd != nil {
		_ = c.cmd.Process.Kill()
	}
	if c.conn != nil {
		_ = c.conn.Close()
	}
	for range c.lines {
	}
	<-c.done
}
