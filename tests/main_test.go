// Package tests holds twosided's end-to-end tests: the seed's rdma_notify suite on the soft
// provider, in one process and across two processes, over both transports.
package tests

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/twosided/twosided/notify"
)

// peerEnv makes the test binary run as a peer process: an engine that echoes every notify
// back to its sender with the name prefixed by "echo:".
const (
	peerEnv     = "TWOSIDED_TEST_PEER_TRANSPORT"
	peerAddrEnv = "TWOSIDED_TEST_PEER_ADDR" // listen address (default 127.0.0.1:0)
	peerModeEnv = "TWOSIDED_TEST_PEER_MODE" // "echo" (default), "record": print "GOT <msg>" per notify, or "hold": never read
	// peerQueueEnv, in hold mode: the receive queue's bound (WithRecvQueue).
	peerQueueEnv = "TWOSIDED_TEST_PEER_QUEUE"
	// peerStallEnv, in record mode: "D/N" stalls the peer's reactor for D every N notifies.
	peerStallEnv = "TWOSIDED_TEST_PEER_STALL"
)

func TestMain(m *testing.M) {
	if tr := os.Getenv(peerEnv); tr != "" {
		os.Exit(runPeer(tr))
	}
	if n := os.Getenv(sendersEnv); n != "" {
		os.Exit(runSenders(n))
	}
	if n := os.Getenv(faninEnv); n != "" {
		os.Exit(runFanin(n))
	}
	if n := os.Getenv(windowedEnv); n != "" {
		os.Exit(runWindowed(n))
	}
	if n := os.Getenv(scaleEnv); n != "" {
		os.Exit(runScale(n))
	}
	goleak.VerifyTestMain(m)
}

func runPeer(transport string) int {
	addr := os.Getenv(peerAddrEnv)
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	opts := []notify.Option{notify.WithTransport(transport), notify.WithListenAddr(addr)}
	hold := os.Getenv(peerModeEnv) == "hold"
	if hold {
		q, _ := strconv.Atoi(os.Getenv(peerQueueEnv))
		opts = append(opts, notify.WithRecvQueue(max(q, 1)))
	}
	if os.Getenv(peerModeEnv) == "record" {
		var stall time.Duration
		every, count := 0, 0
		if v := os.Getenv(peerStallEnv); v != "" {
			d, n, _ := strings.Cut(v, "/")
			stall, _ = time.ParseDuration(d)
			every, _ = strconv.Atoi(n)
		}
		// Print on the reactor thread, before the next notify is taken: what is printed was
		// delivered.
		opts = append(opts, notify.WithHandler(func(n notify.Notify) {
			_, _ = os.Stdout.WriteString("GOT " + string(n.Msg) + "\n")
			if count++; every > 0 && count%every == 0 {
				time.Sleep(stall) // the reactor stalls, as a loaded process's would
			}
		}))
	}
	e, err := notify.New(opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "peer:", err)
		return 1
	}
	fmt.Println("ADDR", e.Addr())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() { // the parent closing our stdin ends us too
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		stop()
	}()
	if hold {
		<-ctx.Done() // what arrives stays in the queue (or its channel) until the end
	}
	for !hold {
		n, err := e.Recv(ctx)
		if err != nil {
			break
		}
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if err := e.SendNotify(sctx, n.Peer, notify.Notify{Name: "echo:" + n.Name, Msg: n.Msg}); err != nil {
			fmt.Fprintln(os.Stderr, "peer: echo:", err)
		}
		cancel()
	}
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = e.Close(cctx)
	return 0
}

// peerProc is a peer engine in a child process.
type peerProc struct {
	cmd   *exec.Cmd
	addr  string
	stdin interface{ Close() error }
	got   chan string // record mode: the messages it printed
}

func startPeerProc(t *testing.T, transport string, env ...string) *peerProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), peerEnv+"="+transport), env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &peerProc{cmd: cmd, stdin: stdin, got: make(chan string, 1<<16)}
	t.Cleanup(p.stop)
	lines := make(chan string, 1)
	go func() {
		defer close(p.got)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "ADDR "); ok {
				lines <- a
				close(lines)
			} else if m, ok := strings.CutPrefix(sc.Text(), "GOT "); ok {
				p.got <- m
			}
		}
	}()
	select {
	case a, ok := <-lines:
		if !ok {
			t.Fatal("peer process exited before printing its address")
		}
		p.addr = a
	case <-time.After(20 * time.Second):
		t.Fatal("peer process did not print its address within 20s")
	}
	return p
}

func (p *peerProc) stop() {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.stdin.Close()
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

// kill ends the peer process as kill -9 would.
func (p *peerProc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_ = p.cmd.Wait()
}

// received collects what a killed or stopped record-mode peer printed.
func (p *peerProc) received() []string {
	var out []string
	for m := range p.got {
		out = append(out, m)
	}
	return out
}
