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
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/notify"
)

// A slow receiver (a receive queue of 1, an application that takes a millisecond per
// notify) and senders in two processes that keep a window of SendNotifyAsync in flight
// each, over OOB: the receiver holds what it cannot take and answers the rest "busy". The
// senders must follow the receiver's pace, not flood it with tries: every notify delivered
// once, in order, none failed, and few busy answers per delivered notify, whatever the
// window.

const (
	windowedEnv       = "TWOSIDED_TEST_WINDOWED_ENGINES" // child: how many engines
	windowedTargetEnv = "TWOSIDED_TEST_WINDOWED_TARGET"
	windowedTagEnv    = "TWOSIDED_TEST_WINDOWED_TAG"
	windowedSpecEnv   = "TWOSIDED_TEST_WINDOWED_SPEC" // "<window>/<count>"
)

// runWindowed is the child: n engines each send count notifies "<tag>-<k>:<i>" to the
// target, at most window in flight, and print "ACK <sender> <i>" or "FAIL <sender> <i>
// <error>" per result, then "DONE" once all are answered; on a line (or EOF) on stdin the
// engines close and "CLOSED" is printed.
func runWindowed(count string) int {
	n, err := strconv.Atoi(count)
	w, c, ok := strings.Cut(os.Getenv(windowedSpecEnv), "/")
	window, err1 := strconv.Atoi(w)
	per, err2 := strconv.Atoi(c)
	if err != nil || n < 1 || !ok || err1 != nil || err2 != nil || window < 1 || per < 1 {
		fmt.Fprintln(os.Stderr, "windowed: bad arguments", count, os.Getenv(windowedSpecEnv))
		return 1
	}
	target, tag := os.Getenv(windowedTargetEnv), os.Getenv(windowedTagEnv)
	var engines []*notify.Engine
	for i := 0; i < n; i++ {
		e, err := notify.New(notify.WithTransport(notify.TransportOOB), notify.WithListenAddr("127.0.0.1:0"), notify.WithoutProcsReserve())
		if err != nil {
			fmt.Fprintln(os.Stderr, "windowed:", err)
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
	// A first notify each makes the pair (sends that wait for a handshake are capped at
	// max_pending_sends); it is not counted.
	for _, e := range engines {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := e.SendNotify(ctx, target, notify.Notify{Name: "w", Msg: []byte("warm")})
		cancel()
		if err != nil {
			fmt.Fprintln(os.Stderr, "windowed: warm-up:", err)
			return 1
		}
	}
	say("UP")
	var wg sync.WaitGroup
	for k, e := range engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sender := fmt.Sprintf("%s-%d", tag, k)
			slots := make(chan struct{}, window)
			var answered sync.WaitGroup
			for i := 0; i < per; i++ {
				slots <- struct{}{}
				answered.Add(1)
				done := func(err error) {
					if err == nil {
						say("ACK " + sender + " " + strconv.Itoa(i))
					} else {
						say("FAIL " + sender + " " + strconv.Itoa(i) + " " + strings.ReplaceAll(err.Error(), "\n", " "))
					}
					<-slots
					answered.Done()
				}
				if err := e.SendNotifyAsync(target, notify.Notify{Name: "w", Msg: []byte(sender + ":" + strconv.Itoa(i))}, done); err != nil {
					done(err)
				}
			}
			answered.Wait()
		}()
	}
	wg.Wait()
	say("DONE")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	closeAll(engines)
	say("CLOSED")
	return 0
}

// windowedProc is a child process of windowed senders.
type windowedProc struct {
	*faninProc
	done  chan struct{}
	fails []string
}

func startWindowed(t testing.TB, target, tag string, engines, window, count int) *windowedProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), windowedEnv+"="+strconv.Itoa(engines), windowedTargetEnv+"="+target,
		windowedTagEnv+"="+tag, windowedSpecEnv+"="+strconv.Itoa(window)+"/"+strconv.Itoa(count))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &windowedProc{faninProc: &faninProc{cmd: cmd, stdin: stdin, acks: map[string][]int{}, up: make(chan struct{}),
		closed: make(chan struct{})}, done: make(chan struct{})}
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
	})
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "UP":
				close(p.up)
			case line == "DONE":
				close(p.done)
			case line == "CLOSED":
				close(p.closed)
			case strings.HasPrefix(line, "ACK "):
				f := strings.Fields(line)
				i, _ := strconv.Atoi(f[2])
				p.mu.Lock()
				p.acks[f[1]] = append(p.acks[f[1]], i)
				p.mu.Unlock()
			case strings.HasPrefix(line, "FAIL "):
				p.mu.Lock()
				p.fails = append(p.fails, line)
				p.mu.Unlock()
			}
		}
	}()
	select {
	case <-p.up:
	case <-time.After(60 * time.Second):
		t.Fatal("windowed process not up within 60 s")
	}
	return p
}

func (p *windowedProc) failed() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.fails...)
}

// slowFanin is one run: 16 senders in two processes, each count notifies with window in
// flight, to a receiver with a queue of 1 and an application that takes pace per notify.
type slowFanin struct {
	delivered []string
	elapsed   time.Duration // from the first delivery to the last
	busy      uint64        // busy answers of the receiver (engine and OOB node)
	fails     []string
	procs     []*faninProc
	senderHWM int // the largest peak RSS of the sender processes, KiB
}

// peakRSS is process pid's peak resident set (VmHWM), KiB; 0 when unknown.
func peakRSS(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return kb
		}
	}
	return 0
}

func runSlowFanin(t testing.TB, window, count int, pace time.Duration) slowFanin {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	opts := []notify.Option{notify.WithTransport(notify.TransportOOB), notify.WithListenAddr("127.0.0.1:0"), notify.WithRecvQueue(1)}
	rcv, err := notify.New(opts...)
	require.NoError(t, err)
	defer func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer ccancel()
		require.NoError(t, rcv.Close(cctx))
	}()
	total := 16 * count
	var mu sync.Mutex
	var got []string
	var first, last time.Time
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		for {
			n, err := rcv.Recv(ctx)
			if err != nil {
				return
			}
			if string(n.Msg) == "warm" {
				continue
			}
			mu.Lock()
			got = append(got, string(n.Msg))
			last = time.Now()
			if len(got) == 1 {
				first = last
			}
			k := len(got)
			mu.Unlock()
			if k == total {
				return
			}
			time.Sleep(pace) // a slow application
		}
	}()
	st0 := rcv.Stats()
	a := startWindowed(t, rcv.Addr(), "a", 8, window, count)
	b := startWindowed(t, rcv.Addr(), "b", 8, window, count)
	for _, p := range []*windowedProc{a, b} {
		select {
		case <-p.done:
		case <-ctx.Done():
			t.Fatalf("senders without every result: %d acknowledged, %d failed", ackCount(a.faninProc, b.faninProc), len(a.failed())+len(b.failed()))
		}
	}
	fails := append(a.failed(), b.failed()...)
	hwm := max(peakRSS(a.cmd.Process.Pid), peakRSS(b.cmd.Process.Pid))
	if len(fails) == 0 {
		select {
		case <-recvDone:
		case <-ctx.Done():
			t.Fatal("acknowledged notifies not delivered")
		}
	}
	a.closeAndWait(t)
	b.closeAndWait(t)
	st := rcv.Stats()
	cancel()
	<-recvDone
	mu.Lock()
	defer mu.Unlock()
	return slowFanin{delivered: got, elapsed: last.Sub(first), fails: fails, procs: []*faninProc{a.faninProc, b.faninProc},
		busy: st.OOBBusy - st0.OOBBusy + st.OOB.BusyRefused - st0.OOB.BusyRefused, senderHWM: hwm}
}

// TestSlowReceiverPacesWindowedSenders: a window of 64 notifies in flight per sender, 16
// senders, a receiver that holds 64 OOB notifies while its queue is full. Each notify the
// peer answered "busy" used to be sent again on a timer of its own (up to 50 ms apart), so
// the tries grew with what was in flight, not with what the receiver took: tens of busy
// answers per delivered notify, and sends that failed at their deadline.
func TestSlowReceiverPacesWindowedSenders(t *testing.T) {
	const window, count = 64, 200
	r := runSlowFanin(t, window, count, time.Millisecond)
	for i, f := range r.fails {
		if i == 10 {
			break
		}
		t.Errorf("failed: %s", f)
	}
	require.Zero(t, len(r.fails), "sends failed")
	acked := faninCheck(t, r.delivered, r.procs...)
	t.Logf("window %d: %d acknowledged, %d delivered in %v (%.0f/s), %d busy answers (%.2f per delivered)",
		window, acked, len(r.delivered), r.elapsed, float64(len(r.delivered))/r.elapsed.Seconds(), r.busy,
		float64(r.busy)/float64(max(len(r.delivered), 1)))
	require.Equal(t, 16*count, acked, "every notify acknowledged")
	require.Len(t, r.delivered, 16*count, "every notify delivered once")
	require.LessOrEqual(t, r.busy, uint64(2*len(r.delivered)), "busy answers per delivered notify")
}

// BenchmarkSlowReceiverWindow measures TestSlowReceiverPacesWindowedSenders' run at a
// window of 4 and of 1024 (16 senders × TWOSIDED_BENCH_SLOW_COUNT notifies, default 1500):
// delivered/s, busy answers per delivered notify, failed sends. One run per iteration:
//
//	go test ./tests/ -run '^$' -bench SlowReceiverWindow -benchtime 1x -count 3
func BenchmarkSlowReceiverWindow(b *testing.B) {
	count := 1500
	if v, err := strconv.Atoi(os.Getenv("TWOSIDED_BENCH_SLOW_COUNT")); err == nil && v > 0 {
		count = v
	}
	for _, window := range []int{4, 1024} {
		b.Run("window="+strconv.Itoa(window), func(b *testing.B) {
			var delivered, fails, maybe, hwm int
			var busy uint64
			var elapsed time.Duration
			for i := 0; i < b.N; i++ {
				r := runSlowFanin(b, window, count, time.Millisecond)
				delivered += len(r.delivered)
				fails += len(r.fails)
				busy += r.busy
				elapsed += r.elapsed
				hwm = max(hwm, r.senderHWM)
				for _, f := range r.fails {
					if strings.Contains(f, "may have been delivered") {
						maybe++
					}
				}
			}
			b.ReportMetric(float64(delivered)/elapsed.Seconds(), "delivered/s")
			b.ReportMetric(float64(busy)/float64(max(delivered, 1)), "busy/delivered")
			b.ReportMetric(float64(fails)/float64(b.N), "failed/op")
			b.ReportMetric(float64(maybe)/float64(b.N), "maybe-failed/op")
			b.ReportMetric(float64(hwm)/1024, "sender-peak-MiB")
		})
	}
}
