package tests

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/twosided/twosided/notify"
)

// cutOOB shuts down, both ways, every connected TCP socket of this process with port at
// either end, as a reset path would cut them (the soak's cut fault does the same). It
// returns how many it cut.
func cutOOB(port int) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd <= 2 {
			continue
		}
		if typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE); err != nil || typ != unix.SOCK_STREAM {
			continue
		}
		if p, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL); err != nil || p != unix.IPPROTO_TCP {
			continue
		}
		peer, err := unix.Getpeername(fd)
		if err != nil {
			continue
		}
		local, err := unix.Getsockname(fd)
		if err != nil {
			continue
		}
		if inetPort(peer) == port || inetPort(local) == port {
			if unix.Shutdown(fd, unix.SHUT_RDWR) == nil {
				n++
			}
		}
	}
	return n
}

func inetPort(sa unix.Sockaddr) int {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return a.Port
	case *unix.SockaddrInet6:
		return a.Port
	}
	return -1
}

// OOB connections to and from the receiver's port are cut again and again while a sender
// streams notifies with ids, one at a time (each retried with its id until it is
// acknowledged) and in SendNotifyAsync windows. Whatever a cut hits (a request written and
// unanswered, a reply, a connection in its hello, a handshake), the receiver delivers
// every acknowledged notify exactly once, those acknowledged at their first try in the
// order they were sent, and nothing the sender did not send (no empty notify).
func TestOOBCutsKeepExactlyOnceInOrder(t *testing.T) {
	a, b := newEngine(t, notify.TransportOOB), newEngine(t, notify.TransportOOB)
	ap, err := netip.ParseAddrPort(b.Addr())
	require.NoError(t, err)
	port := int(ap.Port())
	ctx := ctxFor(t, 2*time.Minute) // a hang guard only

	const rounds, window = 60, 16
	var (
		mu        sync.Mutex
		delivered = map[string]int{}
		order     []int
		bad       []string
	)
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		for {
			n, err := b.Recv(ctx)
			if err != nil {
				return
			}
			mu.Lock()
			var i int
			if _, err := fmt.Sscanf(n.Name, "cut/%d", &i); err != nil || n.ID != n.Name || string(n.Msg) != n.Name {
				bad = append(bad, fmt.Sprintf("name %q id %q msg %q peer %q", n.Name, n.ID, n.Msg, n.Peer))
			} else {
				delivered[n.ID]++
				order = append(order, i)
			}
			mu.Unlock()
		}
	}()

	// The cutter cuts once per tick; the sender ticks after each of its sends, so the cuts
	// keep pace with the stream (whatever the load) and land wherever its requests are.
	tick := make(chan struct{}, 1)
	stop := make(chan struct{})
	cutDone := make(chan int)
	go func() {
		cuts := 0
		for {
			select {
			case <-stop:
				cutDone <- cuts
				return
			case <-tick:
				cuts += cutOOB(port)
			}
		}
	}()
	ticked := func() {
		select {
		case tick <- struct{}{}:
		default:
		}
	}

	mk := func(i int) notify.Notify {
		name := "cut/" + strconv.Itoa(i)
		return notify.Notify{Name: name, Msg: []byte(name), ID: name}
	}
	firstTry := map[int]bool{}
	// send retries n with its id until it is acknowledged.
	send := func(i int, err error) {
		for attempt := 0; err != nil; attempt++ {
			require.Less(t, attempt, 1000, "notify %d never acknowledged: %v", i, err)
			require.NoError(t, ctx.Err())
			sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			err = a.SendNotify(sctx, b.Addr(), mk(i))
			cancel()
		}
	}
	next := 0
	for r := 0; r < rounds; r++ {
		// One at a time.
		for k := 0; k < window; k++ {
			sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			err := a.SendNotify(sctx, b.Addr(), mk(next))
			cancel()
			ticked()
			firstTry[next] = err == nil
			send(next, err)
			next++
		}
		// A window of asynchronous sends; the failed ones again, with their ids.
		errs := make([]error, window)
		var wg sync.WaitGroup
		for k := 0; k < window; k++ {
			wg.Add(1)
			k := k
			if err := a.SendNotifyAsync(b.Addr(), mk(next+k), func(err error) { errs[k] = err; wg.Done() }); err != nil {
				errs[k] = err
				wg.Done()
			}
			if k%4 == 3 {
				ticked()
			}
		}
		wg.Wait()
		for k := 0; k < window; k++ {
			firstTry[next+k] = errs[k] == nil
			send(next+k, errs[k])
		}
		next += window
	}
	close(stop)
	cuts := <-cutDone
	require.Positive(t, cuts)

	// Every notify was acknowledged: wait until each arrived (bounded by ctx).
	for {
		mu.Lock()
		got := len(delivered)
		mu.Unlock()
		if got == next || ctx.Err() != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, bad, "notifies the sender never sent")
	for i := 0; i < next; i++ {
		id := mk(i).ID
		require.Equal(t, 1, delivered[id], "notify %s delivered %d times", id, delivered[id])
	}
	var acked []int
	for _, i := range order {
		if firstTry[i] {
			acked = append(acked, i)
		}
	}
	require.True(t, slices.IsSorted(acked), "notifies acknowledged at their first try delivered out of order")
	t.Logf("%d notifies, %d cut sockets, %d acknowledged at their first try", next, cuts, len(acked))
}
