package reactor

import (
	"flag"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

var idlePeriod = flag.Duration("reactor.idle", 200*time.Millisecond,
	"how long TestIdleNoWakeups watches an idle loop (e.g. -reactor.idle=10s)")

// idleWakeups registers fds idle socketpairs (and no timer) with a fresh loop and returns
// how many times the loop's blocking epoll_wait returned during period: an idle loop must
// sleep through it (0), with no tick of any kind.
func idleWakeups(t testing.TB, fds int, period time.Duration) (wakeups, interrupts uint64) {
	t.Helper()
	l := newLoop(t)
	peers := make([]int, 0, fds)
	t.Cleanup(func() {
		for _, fd := range peers {
			_ = unix.Close(fd)
		}
	})
	var addErr error
	onLoop(t, l, func() {
		for i := 0; i < fds && addErr == nil; i++ {
			a, b, err := socketpairErr()
			if err != nil {
				addErr = err
				return
			}
			peers = append(peers, b)
			addErr = l.Add(a, Readable, func(Events) {})
		}
	})
	require.NoError(t, addErr)
	onLoop(t, l, func() {})
	// Settled: asleep with no wake-up pending (a producer's eventfd write can trail the func
	// it announced, which the loop may have found on its own).
	require.Eventually(t, func() bool {
		pfd := []unix.PollFd{{Fd: int32(l.wfd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, 0)
		return err == nil && n == 0 && l.state.Load() == asleep
	}, waitBound, time.Millisecond)
	before := l.Stats()
	<-time.After(period)
	after := l.Stats()
	return after.Wakeups - before.Wakeups, after.Interrupts - before.Interrupts
}

func socketpairErr() (int, int, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, -1, err
	}
	return fds[0], fds[1], nil
}

// Counting, not timing: with 100 idle fds and no timers the loop never wakes.
func TestIdleNoWakeups(t *testing.T) {
	wakeups, interrupts := idleWakeups(t, 100, *idlePeriod)
	t.Logf("idle %v, 100 fds: %d wake-ups, %d EINTR", *idlePeriod, wakeups, interrupts)
	require.Zero(t, wakeups)
}

// BenchmarkIdleWakeups reports the wake-ups of an idle loop with 100 fds over 10 s; it runs
// one 10 s period whatever b.N (run it alone: -run=^$ -bench=IdleWakeups).
func BenchmarkIdleWakeups(b *testing.B) {
	w, intr := idleWakeups(b, 100, 10*time.Second)
	b.ReportMetric(float64(w), "wakeups/10s")
	b.ReportMetric(float64(intr), "eintr/10s")
}
