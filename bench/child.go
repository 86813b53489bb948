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
	SendCount  int      `json:"send_count"`   // bidi: notifies to send to Parent[0] after start
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
	os.Exit(runChild(raw, os.Stdin, os.Stdout))
}

func runChild(raw string, in io.Reader, out io.Writer) int {
	ctx, cancel := context.WithTimeout(context.Background(), childLife)
	defer cancel()
	enc := json.NewEncoder(out)
	fail := func(err error) int {
		_ = enc.Encode(childReply{Err: err.Error()})
		return 1
	}
	var spec childSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		return fail(fmt.Errorf("bench child: spec: %w", err))
	}
	o := nodeOpts{busyPoll: spec.BusyPollNS, size: spec.Size, window: spec.Window, single: spec.Single, provider: spec.Provider, noKA: spec.NoKA}
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
		s.echoNow = func(seq uint64) {
			msg := ring[seq%uint64(len(ring))]
			putSeq(msg, seq)
			if len(msg) >= seqLen+stampLen {
				putSeq(msg[seqLen:], uint64(monoNow())) // the handler's stamp, for the breakdown
			}
			if err := en.e.SendNotifyAsync(parent, notify.Notify{Name: benchName, Msg: msg}, func(err error) {
				if err != nil {
					s.bad.Add(1)
				}
			}); err != nil {
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
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		var req childRequest
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			return fail(fmt.Errorf("bench child: request: %w", err))
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
					pump = runPump(ctx, workers, 1, int64(spec.SendCount), spec.Size, 0)
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

// child is the parent's handle on a running child process.
type child struct {
	cmd    *exec.Cmd
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
		sc := bufio.NewScanner(stdout)
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
			return fmt.Errorf("%w: exited: %s", errChild, c.stderr.String())
		}
		if err := json.Unmarshal(line, rep); err != nil {
			return fmt.Errorf("%w: reply %q: %w", errChild, line, err)
		}
		if rep.Err != "" {
			return fmt.Errorf("%w: %s", errChild, rep.Err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: no reply: %w", errChild, ctx.Err())
	}
}

func (c *child) request(ctx context.Context, req childRequest, rep *childReply) error {
	b, _ := json.Marshal(req)
	if _, err := c.stdin.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("%w: %s: %w", errChild, req.Cmd, err)
	}
	return c.read(ctx, rep)
}

// finish closes the child's stdin and waits for it to exit, killing it past ctx.
func (c *child) finish(ctx context.Context) {
	_ = c.stdin.Close()
	select {
	case <-c.done:
	case <-ctx.Done():
		c.kill()
	}
}

func (c *child) kill() {
	_ = c.stdin.Close()
	_ = c.cmd.Process.Kill()
	for range c.lines {
	}
	<-c.done
}
