package soak

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Remote agents. A host that takes part in a soak runs an agent host (`twosided soak
// --agent-host --listen ip:port`): it starts agent processes of its own binary when the
// parent asks, relays their lines, and signals them and writes their softverbs control
// files on the parent's word, so every fault stays a fault of a process the soak started.
// One TCP connection per agent process, its lifetime the process's:
//
//	parent → host: "!ports 1 <n>"          n free addresses on the host (answer "!addrs a,b,…")
//	               "!spawn 1 <spec JSON>"  start an agent with that spec, then relay:
//	               "{…}"                   a command line for the agent's stdin
//	               "!sig <n>"              send signal n (KILL, STOP, CONT) to the agent
//	               "!ctl <line>"           write the agent's softverbs control file
//	host → parent: "{…}"                   a line of the agent's stdout
//	               "!err <text>"           a line of its stderr
//	               "!exit <text>"          it exited ("" or how); the host closes
//	               "!error <text>"         the host refused the request; it closes
//
// Closing the connection kills the agent.

const remoteVersion = "1"

// Bounds of the agent host, against a parent that misbehaves.
const (
	hostMaxConns = 256
	hostMaxPorts = 64
	hostDialTO   = 10 * time.Second
)

// ErrRemote wraps the errors of remote agents and agent hosts.
var ErrRemote = errors.New("soak: remote agent")

// agentRun is one running agent process: a child here, or one of an agent host.
type agentRun interface {
	Signal(syscall.Signal) error
	// Device writes the agent's softverbs control file (line: its whole content).
	Device(line string) error
	// Wait returns how the process ended, once its stdout has ended.
	Wait() error
}

type localRun struct {
	cmd *exec.Cmd
	ctl string // "" without device faults
}

func (r *localRun) Signal(s syscall.Signal) error { return r.cmd.Process.Signal(s) }
func (r *localRun) Wait() error                   { return r.cmd.Wait() }
func (r *localRun) Device(line string) error {
	if r.ctl == "" {
		return nil
	}
	return os.WriteFile(r.ctl, []byte(line+"\n"), 0o600)
}

// remoteRun is an agent of an agent host, through its connection.
type remoteRun struct {
	c    net.Conn
	mu   sync.Mutex // one line at a time on c
	done chan struct{}
	err  error // how it ended (after done)
}

func (r *remoteRun) line(s string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, err := io.WriteString(r.c, s+"\n")
	return err
}

func (r *remoteRun) Signal(s syscall.Signal) error {
	if s == syscall.SIGKILL {
		// The host answers with the exit; a host gone silent must not hold the parent's
		// reader for ever.
		_ = r.c.SetReadDeadline(time.Now().Add(hostDialTO))
	}
	return r.line("!sig " + strconv.Itoa(int(s)))
}
func (r *remoteRun) Device(line string) error { return r.line("!ctl " + line) }
func (r *remoteRun) Wait() error {
	<-r.done
	return r.err
}

// lineWriter writes whole lines to a remoteRun (a signal never lands inside a command).
type lineWriter struct {
	r       *remoteRun
	partial []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.partial = append(w.partial, p...)
	for {
		i := strings.IndexByte(string(w.partial), '\n')
		if i < 0 {
			return len(p), nil
		}
		if err := w.r.line(string(w.partial[:i])); err != nil {
			return 0, err
		}
		w.partial = append(w.partial[:0], w.partial[i+1:]...)
	}
}

func (w *lineWriter) Close() error { return nil } // the connection closes with the process

func dialHost(host string) (net.Conn, *bufio.Reader, error) {
	c, err := net.DialTimeout("tcp", host, hostDialTO)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: agent host %s: %v", ErrRemote, host, err)
	}
	r := bufio.NewReaderSize(c, 64<<10)
	return c, r, nil
}

// readLine reads one line of at most MaxLine+64 bytes, without its newline.
func readLine(r *bufio.Reader) (string, error) {
	var b []byte
	for {
		chunk, isPrefix, err := r.ReadLine()
		if err != nil {
			return "", err
		}
		b = append(b, chunk...)
		if len(b) > MaxLine+64 {
			return "", fmt.Errorf("a line over %d bytes", MaxLine+64)
		}
		if !isPrefix {
			return string(b), nil
		}
	}
}

// hostPorts asks the agent host at host for n free addresses.
func hostPorts(host string, n int) ([]string, error) {
	c, r, err := dialHost(host)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(hostDialTO))
	if _, err := fmt.Fprintf(c, "!ports %s %d\n", remoteVersion, n); err != nil {
		return nil, fmt.Errorf("%w: agent host %s: %v", ErrRemote, host, err)
	}
	l, err := readLine(r)
	if err != nil {
		return nil, fmt.Errorf("%w: agent host %s: no answer to a ports request (is it `twosided soak --agent-host`?): %v", ErrRemote, host, err)
	}
	if msg, ok := strings.CutPrefix(l, "!error "); ok {
		return nil, fmt.Errorf("%w: agent host %s refused: %s", ErrRemote, host, msg)
	}
	list, ok := strings.CutPrefix(l, "!addrs ")
	addrs := strings.Split(list, ",")
	if !ok || len(addrs) != n {
		return nil, fmt.Errorf("%w: agent host %s: answered %.80q to a ports request", ErrRemote, host, l)
	}
	for _, a := range addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, fmt.Errorf("%w: agent host %s: bad address %.80q", ErrRemote, host, a)
		}
	}
	return addrs, nil
}

// spawnRemote starts an agent with spec on the agent host at host: its stdin, stdout and
// stderr lines go through the connection.
func spawnRemote(host string, spec []byte, stderr io.Writer) (agentRun, io.WriteCloser, io.Reader, error) {
	c, r, err := dialHost(host)
	if err != nil {
		return nil, nil, nil, err
	}
	rr := &remoteRun{c: c, done: make(chan struct{})}
	if err := rr.line("!spawn " + remoteVersion + " " + string(spec)); err != nil {
		c.Close()
		return nil, nil, nil, fmt.Errorf("%w: agent host %s: %v", ErrRemote, host, err)
	}
	pr, pw := io.Pipe()
	go func() {
		defer close(rr.done)
		defer c.Close()
		for {
			l, err := readLine(r)
			if err != nil {
				rr.err = fmt.Errorf("%w: agent host %s: the connection ended: %v", ErrRemote, host, err)
				break
			}
			if msg, ok := strings.CutPrefix(l, "!exit "); ok || l == "!exit" {
				if msg != "" {
					rr.err = fmt.Errorf("agent on %s: %s", host, msg)
				}
				break
			}
			if msg, ok := strings.CutPrefix(l, "!error "); ok {
				rr.err = fmt.Errorf("%w: agent host %s refused: %s", ErrRemote, host, msg)
				break
			}
			if msg, ok := strings.CutPrefix(l, "!err "); ok {
				_, _ = io.WriteString(stderr, msg+"\n")
				continue
			}
			if _, err := io.WriteString(pw, l+"\n"); err != nil {
				break
			}
		}
		_ = pw.Close()
	}()
	return rr, &lineWriter{r: rr}, pr, nil
}

// AgentHost serves remote agents: see the protocol above.
type AgentHost struct {
	// Advertise is the IP the host's engines listen on and peers reach them at.
	Advertise string
	// Command returns the command that runs an agent with args (--spec and its JSON).
	Command func(args []string) *exec.Cmd
	// Log gets a line per agent started and ended (nil: none).
	Log io.Writer
}

// Serve serves l until ctx ends; every agent it started is killed then.
func (h *AgentHost) Serve(ctx context.Context, l net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { <-ctx.Done(); l.Close() }()
	sem := make(chan struct{}, hostMaxConns)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		select {
		case sem <- struct{}{}:
		default:
			_, _ = io.WriteString(c, "!error too many agents\n")
			c.Close()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			h.serve(ctx, c)
		}()
	}
}

func (h *AgentHost) logf(format string, args ...any) {
	if h.Log != nil {
		fmt.Fprintf(h.Log, "soak agent host: "+format+"\n", args...)
	}
}

func (h *AgentHost) serve(ctx context.Context, c net.Conn) {
	defer c.Close()
	r := bufio.NewReaderSize(c, 64<<10)
	var wmu sync.Mutex
	say := func(s string) {
		wmu.Lock()
		defer wmu.Unlock()
		_, _ = io.WriteString(c, s+"\n")
	}
	_ = c.SetReadDeadline(time.Now().Add(hostDialTO))
	first, err := readLine(r)
	if err != nil {
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	verb, rest, _ := strings.Cut(first, " ")
	ver, arg, _ := strings.Cut(rest, " ")
	if ver != remoteVersion {
		say(fmt.Sprintf("!error version %.20q: this host speaks %s", ver, remoteVersion))
		return
	}
	switch verb {
	case "!ports":
		n, err := strconv.Atoi(arg)
		if err != nil || n < 1 || n > hostMaxPorts {
			say(fmt.Sprintf("!error ports: %.20q is not 1..%d", arg, hostMaxPorts))
			return
		}
		addrs, err := freeAddrsOn(h.Advertise, n, seededNow())
		if err != nil {
			say("!error " + err.Error())
			return
		}
		say("!addrs " + strings.Join(addrs, ","))
	case "!spawn":
		spec, err := ParseAgentSpec(arg)
		if err != nil {
			say("!error " + err.Error())
			return
		}
		h.run(ctx, c, r, spec, arg, say)
	default:
		say(fmt.Sprintf("!error unknown request %.20q", verb))
	}
}

// run starts the agent and relays until it exits or the parent goes.
func (h *AgentHost) run(ctx context.Context, c net.Conn, r *bufio.Reader, spec AgentSpec, raw string, say func(string)) {
	ctl, err := os.CreateTemp("", "twosided-soak-ctl-")
	if err != nil {
		say("!error " + err.Error())
		return
	}
	ctlPath := ctl.Name()
	_, _ = ctl.WriteString("port=up\n")
	ctl.Close()
	defer os.Remove(ctlPath)
	cmd := h.Command([]string{"--spec", raw})
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, "SOFTVERBS_CTL="+ctlPath)
	stdin, err1 := cmd.StdinPipe()
	stdout, err2 := cmd.StdoutPipe()
	stderr, err3 := cmd.StderrPipe()
	if err := errors.Join(err1, err2, err3); err != nil {
		say("!error " + err.Error())
		return
	}
	if err := cmd.Start(); err != nil {
		say("!error start: " + err.Error())
		return
	}
	h.logf("agent %d (pid %d) started for %s", spec.Index, cmd.Process.Pid, c.RemoteAddr())
	var relay sync.WaitGroup
	relay.Add(2)
	go func() { // stdout → parent
		defer relay.Done()
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 0, 64<<10), MaxLine)
		for sc.Scan() {
			say(sc.Text())
		}
	}()
	go func() { // stderr → parent
		defer relay.Done()
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 0, 4<<10), 64<<10)
		for sc.Scan() {
			say("!err " + sc.Text())
		}
	}()
	gone := make(chan struct{}) // the parent's side ended: the agent is killed
	go func() {
		defer close(gone)
		for {
			l, err := readLine(r)
			if err != nil {
				return
			}
			switch {
			case strings.HasPrefix(l, "!sig "):
				n, err := strconv.Atoi(strings.TrimPrefix(l, "!sig "))
				if err == nil && (syscall.Signal(n) == syscall.SIGKILL || syscall.Signal(n) == syscall.SIGSTOP || syscall.Signal(n) == syscall.SIGCONT) {
					_ = cmd.Process.Signal(syscall.Signal(n))
				}
			case strings.HasPrefix(l, "!ctl "):
				_ = os.WriteFile(ctlPath, []byte(strings.TrimPrefix(l, "!ctl ")+"\n"), 0o600)
			case strings.HasPrefix(l, "{"):
				if _, err := io.WriteString(stdin, l+"\n"); err != nil {
					return
				}
			}
		}
	}()
	exited := make(chan struct{})
	go func() {
		select {
		case <-gone:
		case <-ctx.Done():
		case <-exited:
			return
		}
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
	}()
	relay.Wait()
	err = cmd.Wait()
	close(exited)
	h.logf("agent %d (pid %d) ended: %v", spec.Index, cmd.Process.Pid, err)
	if err != nil {
		say("!exit " + err.Error())
	} else {
		say("!exit")
	}
}

// hostIP is the host part of addr.
func hostIP(addr string) string {
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return h
}

// loopback reports whether addr's host is a loopback IP.
func loopback(addr string) bool {
	ip := net.ParseIP(hostIP(addr))
	return ip != nil && ip.IsLoopback()
}
