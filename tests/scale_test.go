package tests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/twosided/twosided/notify"
)

// scaleEnv makes the test binary run runScale: one hub engine and N engines in one process,
// on the soft provider with in-process delivery off (every packet over the device's TCP
// connections, so the sockets' wake-up paths are what the kernel's nested-epoll limits count).
const scaleEnv = "TWOSIDED_TEST_SCALE_ENGINES"

// TestScaleThousandEngines: 1 000 engines and a hub in one process, every one with an
// rdma_twosided channel to the hub, so the hub's reactor watches 1 000 completion channels
// and the process holds 1 001 loops. Before a soft device's progress set was nested in one
// channel's fd at a time, the 26th engine of a process failed with "watch cq: reactor:
// epoll_ctl add fd N: invalid argument" (the kernel's cap on wake-up paths per file). Every
// engine then sends a second notify on its channel and the hub receives all 2 000, in order
// per engine. It runs in a child process: the soft provider reads TWOSIDED_SOFT_INPROC once.
func TestScaleThousandEngines(t *testing.T) {
	const engines = 1000
	var rl unix.Rlimit
	require.NoError(t, unix.Getrlimit(unix.RLIMIT_NOFILE, &rl))
	if need := uint64(16*engines + 256); rl.Max < need {
		t.Skipf("RLIMIT_NOFILE hard limit %d is below the %d fds this test may open", rl.Max, need)
	}
	ctx := ctxFor(t, 8*time.Minute)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), scaleEnv+"="+strconv.Itoa(engines), "TWOSIDED_SOFT_INPROC=0")
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	t.Log("\n" + out.String())
	require.NoError(t, err)
	require.Contains(t, out.String(), fmt.Sprintf("SCALE OK engines=%d channels=%d delivered=%d", engines, engines, 2*engines))
}

// runScale is the child of TestScaleThousandEngines. It prints what went wrong, or one
// "SCALE OK" line with the counts.
func runScale(arg string) int {
	n, err := strconv.Atoi(arg)
	if err != nil || n < 1 {
		fmt.Println("scale: bad engine count", arg)
		return 1
	}
	if err := scale(n); err != nil {
		fmt.Println("scale:", err)
		return 1
	}
	return 0
}

func scale(n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	start := time.Now()
	common := []notify.Option{
		notify.WithTransport(notify.TransportRDMATwoSided), notify.WithListenAddr("127.0.0.1:0"),
		notify.WithProvider("soft"), notify.WithKeepalive(0), notify.WithRecvCount(4),
		notify.WithOOBFallback(false), // a notify that is not on a channel fails
	}
	var mu sync.Mutex
	last := map[string]int{} // sender -> the last notify number delivered
	var delivered, backwards atomic.Int64
	hub, err := notify.New(append(common, notify.WithHandler(func(m notify.Notify) {
		sender, is, _ := strings.Cut(string(m.Msg), ":")
		i, _ := strconv.Atoi(is)
		mu.Lock()
		if l, ok := last[sender]; ok && i <= l {
			backwards.Add(1)
		}
		last[sender] = i
		mu.Unlock()
		delivered.Add(1)
	}))...)
	if err != nil {
		return fmt.Errorf("hub: %w", err)
	}
	all := []*notify.Engine{hub}
	defer func() { closeAll(all) }()
	for i := 0; i < n; i++ {
		e, err := notify.New(common...)
		if err != nil {
			return fmt.Errorf("engine %d of %d: %w", i+1, n, err)
		}
		all = append(all, e)
	}
	made := time.Since(start)
	// Connect in waves: every engine's first notify makes its channel, 32 handshakes at once.
	send := func(round int) error {
		const wave = 32
		errs := make(chan error, n)
		sem := make(chan struct{}, wave)
		for i, e := range all[1:] {
			sem <- struct{}{}
			go func() {
				defer func() { <-sem }()
				msg := fmt.Sprintf("e%d:%d", i, round)
				if err := e.SendNotify(ctx, hub.Addr(), notify.Notify{Name: "scale", Msg: []byte(msg)}); err != nil {
					errs <- fmt.Errorf("engine %d, notify %d: %w", i+1, round, err)
				}
			}()
		}
		for i := 0; i < wave; i++ {
			sem <- struct{}{}
		}
		close(errs)
		var all []error
		for err := range errs {
			if len(all) < 5 {
				all = append(all, err)
			}
		}
		return errors.Join(all...)
	}
	if err := send(1); err != nil {
		return err
	}
	connected := time.Since(start)
	if err := send(2); err != nil {
		return err
	}
	st := hub.Stats()
	fmt.Printf("scale: %d engines made in %v, connected by %v, hub: channels up %d, peers %d, fallbacks %d\n",
		n, made.Round(time.Millisecond), connected.Round(time.Millisecond), st.ChannelsUp, st.PeerCount, st.Limits.Fallbacks)
	for deadline := time.Now().Add(time.Minute); delivered.Load() < int64(2*n) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if b := backwards.Load(); b != 0 {
		return fmt.Errorf("%d notifies delivered twice or out of order", b)
	}
	fmt.Printf("SCALE OK engines=%d channels=%d delivered=%d\n", n, st.ChannelsUp, delivered.Load())
	return nil
}

// closeAll closes engines 64 at a time, each within 30 s (what acknowledged notifies are
// still held drains first: Close says goodbye before it cuts).
func closeAll(engines []*notify.Engine) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for _, e := range engines {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = e.Close(ctx)
		}()
	}
	wg.Wait()
}
