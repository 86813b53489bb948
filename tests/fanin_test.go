package tests

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/notify"
)

// Fan-in: processes of sender engines, each engine one sequential sender, against one
// receiver in the test process. The children print "ACK <sender> <i>" for every
// acknowledged notify; the parent checks acknowledged => delivered, once, in each sender's
// order.

const (
	faninEnv       = "TWOSIDED_TEST_FANIN_ENGINES" // child: how many engines
	faninTargetEnv = "TWOSIDED_TEST_FANIN_TARGET"
	faninTagEnv    = "TWOSIDED_TEST_FANIN_TAG"
	faninTransEnv  = "TWOSIDED_TEST_FANIN_TRANSPORT"
)

// runFanin is the child: n engines send "<tag>-<k>:<i>" sequentially to the target until
// stdin says "CLOSE" (or closes); then every engine is closed and "CLOSED" printed.
func runFanin(count string) int {
	n, err := strconv.Atoi(count)
	if err != nil || n < 1 {
		fmt.Fprintln(os.Stderr, "fanin: bad count", count)
		return 1
	}
	target, tag := os.Getenv(faninTargetEnv), os.Getenv(faninTagEnv)
	tr := os.Getenv(faninTransEnv)
	var engines []*notify.Engine
	for i := 0; i < n; i++ {
		e, err := notify.New(notify.WithTransport(tr), notify.WithListenAddr("127.0.0.1:0"), notify.WithoutProcsReserve())
		if err != nil {
			fmt.Fprintln(os.Stderr, "fanin:", err)
			return 1
		}
		engines = append(engines, e)
	}
	var outMu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	say := func(s string) {
		outMu.Lock()
		_, _ = out.WriteString(s + "\n")
		_ = out.Flush()
		outMu.Unlock()
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for k, e := range engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sender := fmt.Sprintf("%s-%d", tag, k)
			for i := 0; !stop.Load(); i++ {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				err := e.SendNotify(ctx, target, notify.Notify{Name: "fanin", Msg: []byte(sender + ":" + strconv.Itoa(i))})
				cancel()
				if err == nil {
					say("ACK " + sender + " " + strconv.Itoa(i))
				}
			}
		}()
	}
	say("UP")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	stop.Store(true)
	wg.Wait()
	closeAll(engines)
	say("CLOSED")
	return 0
}

// faninProc is a child process of fan-in senders.
type faninProc struct {
	cmd    *exec.Cmd
	stdin  interface{ Close() error }
	acks   map[string][]int // sender -> its acknowledged notifies, in send order
	mu     sync.Mutex
	up     chan struct{}
	closed chan struct{}
}

func startFanin(t *testing.T, transport, target, tag string, engines int) *faninProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), faninEnv+"="+strconv.Itoa(engines), faninTargetEnv+"="+target,
		faninTagEnv+"="+tag, faninTransEnv+"="+transport)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &faninProc{cmd: cmd, stdin: stdin, acks: map[string][]int{}, up: make(chan struct{}), closed: make(chan struct{})}
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
	})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "UP":
				close(p.up)
			case line == "CLOSED":
				close(p.closed)
			case strings.HasPrefix(line, "ACK "):
				f := strings.Fields(line)
				i, _ := strconv.Atoi(f[2])
				p.mu.Lock()
				p.acks[f[1]] = append(p.acks[f[1]], i)
				p.mu.Unlock()
			}
		}
	}()
	select {
	case <-p.up:
	case <-time.After(60 * time.Second):
		t.Fatal("fan-in process not up within 60 s")
	}
	return p
}

// closeAndWait tells the senders to stop and close their engines, and waits for it.
func (p *faninProc) closeAndWait(t testing.TB) {
	t.Helper()
	_ = p.stdin.Close()
	select {
	case <-p.closed:
	case <-time.After(60 * time.Second):
		t.Fatal("fan-in process did not close within 60 s")
	}
}

// acked returns each sender's acknowledged notifies, in send order.
func (p *faninProc) acked() map[string][]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string][]int, len(p.acks))
	for k, v := range p.acks {
		out[k] = append([]int(nil), v...)
	}
	return out
}

func ackCount(procs ...*faninProc) (n int) {
	for _, p := range procs {
		for _, v := range p.acked() {
			n += len(v)
		}
	}
	return n
}

// faninCheck checks what rcv delivered against what the senders saw acknowledged: every
// acknowledged notify delivered, none twice, each sender's in its order (a notify that
// failed may be missing: a sender's numbers may skip, never go back).
func faninCheck(t *testing.T, delivered []string, procs ...*faninProc) (acked int) {
	t.Helper()
	last := map[string]int{}
	seen := map[string]map[int]bool{}
	backwards := 0
	for _, m := range delivered {
		sender, is, ok := strings.Cut(m, ":")
		require.True(t, ok, "delivered %q", m)
		i, err := strconv.Atoi(is)
		require.NoError(t, err)
		if l, ok := last[sender]; ok && i <= l {
			backwards++ // a duplicate or out of order
		}
		last[sender] = i
		if seen[sender] == nil {
			seen[sender] = map[int]bool{}
		}
		seen[sender][i] = true
	}
	lost := 0
	for _, p := range procs {
		for sender, is := range p.acked() {
			acked += len(is)
			for _, i := range is {
				if !seen[sender][i] {
					lost++
					if lost <= 10 {
						t.Errorf("sender %s: notify %d acknowledged, never delivered", sender, i)
					}
				}
			}
		}
	}
	require.Zero(t, lost, "acknowledged notifies never delivered")
	require.Zero(t, backwards, "duplicates or reordering within a sender")
	return acked
}

// TestFaninCloseDeliversHeld: a receiver not reading yet, its queue full, its channels
// paused and holding what their NICs acknowledged; 16 senders in two processes close. Every
// acknowledged notify is delivered after the senders are gone.
func TestFaninCloseDeliversHeld(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			rcv := newEngine(t, tr, notify.WithRecvQueue(1))
			a := startFanin(t, tr, rcv.Addr(), "a", 8)
			b := startFanin(t, tr, rcv.Addr(), "b", 8)
			// Over channels each sender has a notify acknowledged (the NIC's ACK) before the
			// paused receiver stops credit; over OOB a notify is answered when it is taken,
			// so with the queue full one is.
			want := 16
			if tr == notify.TransportOOB {
				want = 1
			}
			require.True(t, waitUntil(30*time.Second, func() bool { return len(a.acked())+len(b.acked()) >= want }),
				"senders had notifies acknowledged")
			a.closeAndWait(t)
			b.closeAndWait(t)
			got := recvAll(ctxFor(t, 60*time.Second), rcv, 2*time.Second)
			acked := faninCheck(t, got, a, b)
			t.Logf("%s: %d acknowledged, %d delivered", tr, acked, len(got))
		})
	}
}

// TestFaninRecvQueueBound: 32 senders in two processes and a slow consumer of a queue of 4,
// on each transport and mixed (an rdma_twosided receiver, 16 senders on channels and 16 over
// OOB). The queue never holds more than its bound plus one channel's receive ring (what a
// channel's NIC acknowledged before the pause reached it), and nothing acknowledged is lost.
func TestFaninRecvQueueBound(t *testing.T) {
	const capacity, recvCount = 4, 64
	cases := []struct{ name, rcv, a, b string }{
		{notify.TransportOOB, notify.TransportOOB, notify.TransportOOB, notify.TransportOOB},
		{notify.TransportRDMATwoSided, notify.TransportRDMATwoSided, notify.TransportRDMATwoSided, notify.TransportRDMATwoSided},
		{"mixed", notify.TransportRDMATwoSided, notify.TransportRDMATwoSided, notify.TransportOOB},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rcv := newEngine(t, c.rcv, notify.WithRecvQueue(capacity), notify.WithRecvCount(recvCount))
			a := startFanin(t, c.a, rcv.Addr(), "a", 16)
			b := startFanin(t, c.b, rcv.Addr(), "b", 16)
			var got []string
			maxQ := 0
			ctx := ctxFor(t, 120*time.Second)
			for end := time.Now().Add(4 * time.Second); time.Now().Before(end); {
				maxQ = max(maxQ, rcv.Stats().Queued)
				rctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
				n, err := rcv.Recv(rctx)
				cancel()
				if err == nil {
					got = append(got, string(n.Msg))
				}
				time.Sleep(time.Millisecond) // a slow consumer
			}
			a.closeAndWait(t)
			b.closeAndWait(t)
			for _, m := range recvAll(ctx, rcv, 2*time.Second) {
				got = append(got, m)
			}
			acked := faninCheck(t, got, a, b)
			st := rcv.Stats()
			t.Logf("%s: %d acknowledged (a %d, b %d), %d delivered, queue at most %d (bound %d), OOB answered busy %d",
				c.name, acked, ackCount(a), ackCount(b), len(got), maxQ, capacity, st.OOBBusy)
			require.LessOrEqual(t, maxQ, capacity+recvCount, "the receive queue's bound")
			if c.name == "mixed" {
				require.Positive(t, ackCount(b), "the OOB senders had notifies acknowledged")
			}
		})
	}
}

// TestCloseDeliversHeld: the single-sender form of TestFaninCloseDeliversHeld. A receiver
// with a queue of 1, not reading yet; ten SendNotifyAsync are acknowledged (over
// rdma_twosided nine of them sit in the paused channel, acknowledged by its NIC); the sender
// closes. All ten are delivered afterwards, in order.
func TestCloseDeliversHeld(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			rcv := newEngine(t, tr, notify.WithRecvQueue(1))
			snd, err := notify.New(notify.WithTransport(tr), notify.WithListenAddr("127.0.0.1:0"))
			require.NoError(t, err)
			const n = 10
			results := make(chan error, n)
			for i := 0; i < n; i++ {
				require.NoError(t, snd.SendNotifyAsync(rcv.Addr(), notify.Notify{Name: "held", Msg: []byte(strconv.Itoa(i))},
					func(err error) { results <- err }))
			}
			// Over rdma_twosided every notify is answered (its NIC's ACK); over OOB one is, and
			// the rest, held while the queue is full, are answered only when taken.
			want := n
			if tr == notify.TransportOOB {
				want = 1
			}
			acked := 0
			for i := 0; i < want; i++ {
				select {
				case err := <-results:
					require.NoError(t, err)
					acked++
				case <-time.After(30 * time.Second):
					t.Fatalf("%d of %d notifies acknowledged within 30 s", acked, want)
				}
			}
			require.NoError(t, snd.Close(ctxFor(t, 30*time.Second)))
			got := recvAll(ctxFor(t, 60*time.Second), rcv, time.Second)
			sent := make([]string, n)
			for i := range sent {
				sent[i] = strconv.Itoa(i)
			}
			t.Logf("%s: %d acknowledged before Close, %d delivered after it", tr, acked, len(got))
			require.Equal(t, sent[:len(got)], got, "delivered in order, once")
			require.GreaterOrEqual(t, len(got), acked, "acknowledged => delivered")
		})
	}
}
