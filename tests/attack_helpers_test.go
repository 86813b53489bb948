package tests

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/notify"
	"github.com/twosided/twosided/oob"
	"github.com/twosided/twosided/reactor"
)

// Helpers of the attack tests: an attacker speaks the OOB port's Mooncake framing (u64
// little-endian length counting the type byte, one type byte, JSON) on raw sockets, or
// uses an oob.Node as a client; the victim is a notify engine, judged by its Stats, the
// process's heap and fds, and whether a good peer is still served.

// OOB frame types.
const (
	typConnection = 0
	typNotify     = 2
)

// heapAfterGC is the live heap once garbage is collected.
func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// openFDs counts this process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

const mib = 1 << 20

// dialFrom connects to addr from the loopback address src ("" any): an attacker on another
// address than the good peers (127.0.0.0/8 is all loopback).
func dialFrom(src, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	if src != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
	}
	return d.Dial("tcp", addr)
}

func writeFrame(c net.Conn, typ byte, body []byte) error {
	f := binary.LittleEndian.AppendUint64(make([]byte, 0, 9+len(body)), uint64(len(body)+1))
	f = append(append(f, typ), body...)
	_, err := c.Write(f)
	return err
}

func readFrame(c net.Conn) (byte, []byte, error) {
	var hdr [9]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.LittleEndian.Uint64(hdr[:8])
	if n == 0 || n > 16*mib {
		return 0, nil, fmt.Errorf("reply length %d", n)
	}
	body := make([]byte, n-1)
	if _, err := io.ReadFull(c, body); err != nil {
		return 0, nil, err
	}
	return hdr[8], body, nil
}

// rawExchange sends one request on a new connection from src, as Mooncake's classic client
// does, and returns the reply's JSON, which must carry the request's type. Safe from any
// goroutine.
func rawExchange(src, addr string, typ byte, body []byte) (string, error) {
	rt, reply, err := rawExchangeAny(src, addr, typ, body)
	if err == nil && rt != typ {
		return reply, fmt.Errorf("reply type %d to a request of type %d", rt, typ)
	}
	return reply, err
}

// rawExchangeAny is rawExchange whatever type the reply carries.
func rawExchangeAny(src, addr string, typ byte, body []byte) (byte, string, error) {
	c, err := dialFrom(src, addr)
	if err != nil {
		return 0, "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	if err := writeFrame(c, typ, body); err != nil {
		return 0, "", err
	}
	rt, reply, err := readFrame(c)
	return rt, string(reply), err
}

// attackerNode is an OOB node an attacker drives as a client (its own handler answers
// nothing useful).
func attackerNode(t *testing.T) *oob.Node { return attackerNodeWith(t, nopHandler{}) }

// attackerNodeWith is an OOB node serving h.
func attackerNodeWith(t *testing.T, h oob.Handler) *oob.Node {
	t.Helper()
	loop, err := reactor.New()
	require.NoError(t, err)
	n, err := oob.Listen(loop, oob.Config{ListenAddr: "127.0.0.1:0"}, h)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = n.Close(context.Background())
		_ = loop.Stop(context.Background())
	})
	return n
}

// goodSends sends n notifies named name from good to peer, one after another, each of which
// must be acknowledged; it returns each send's latency.
func goodSends(t *testing.T, ctx context.Context, good *notify.Engine, peer, name string, first, n int) []time.Duration {
	t.Helper()
	lat := make([]time.Duration, 0, n)
	for i := first; i < first+n; i++ {
		t0 := time.Now()
		err := good.SendNotify(ctx, peer, notify.Notify{Name: name, Msg: []byte(strconv.Itoa(i))})
		require.NoError(t, err, "the good peer's notify %d", i)
		lat = append(lat, time.Since(t0))
	}
	return lat
}

// recvNamed takes from rcv the next n notifies named name (others, an attacker's, are
// counted and dropped) and checks they carry first..first+n-1 in order, once each, from
// the peer named from.
func recvNamed(t *testing.T, ctx context.Context, rcv *notify.Engine, name, from string, first, n int) (others int) {
	t.Helper()
	want := first
	for want < first+n {
		m, err := rcv.Recv(ctx)
		require.NoError(t, err, "waiting for %s %d", name, want)
		if m.Name != name {
			others++
			continue
		}
		require.Equal(t, strconv.Itoa(want), string(m.Msg), "%s: out of order, duplicated or lost", name)
		if from != "" {
			require.Equal(t, from, m.Peer)
		}
		want++
	}
	return others
}

// served checks that good's next n notifies to rcv are acknowledged and delivered once,
// in order; it returns their latencies.
func served(t *testing.T, ctx context.Context, good, rcv *notify.Engine, name string, first, n int) []time.Duration {
	t.Helper()
	lat := goodSends(t, ctx, good, rcv.Addr(), name, first, n)
	recvNamed(t, ctx, rcv, name, good.Addr(), first, n)
	return lat
}

// servedUntil serves good's notifies "good" first, first+1, ... to rcv in rounds of 20
// until done is closed; it returns their latencies and the next number.
func servedUntil(t *testing.T, ctx context.Context, good, rcv *notify.Engine, done <-chan struct{}, first int) ([]time.Duration, int) {
	t.Helper()
	var lat []time.Duration
	for {
		select {
		case <-done:
			return lat, first
		default:
		}
		lat = append(lat, served(t, ctx, good, rcv, "good", first, 20)...)
		first += 20
	}
}

// pct is the q-quantile of d (0 < q ≤ 1).
func pct(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(q*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// logLatency logs p50/p99 of a good peer's sends, unloaded and under attack (a figure for
// the notes, never asserted).
func logLatency(t *testing.T, what string, calm, loaded []time.Duration) {
	t.Helper()
	t.Logf("%s: good peer p50 %v → %v, p99 %v → %v (unloaded → under attack; ratio p99 %.2f)", what,
		pct(calm, .5), pct(loaded, .5), pct(calm, .99), pct(loaded, .99),
		float64(pct(loaded, .99))/float64(max(pct(calm, .99), 1)))
}

// ghostHandshake is a Connection request naming a ctrl channel at a QPN nobody has. session
// 0 leaves ts_session out (a Mooncake engine).
func ghostHandshake(name string, qpn uint32, session uint64) []byte {
	s := fmt.Sprintf(`{"local_nic_path":%q,"peer_nic_path":"__ctrl__","qp_num":[],"local_lid":0,`+
		`"local_gid":"3039:0000:0000:0000:0000:ffff:7f00:0001","ctrl_channel":true,"notify_qp_num":%d,"notify_rq_depth":64`,
		name+"@ghost", qpn)
	if session != 0 {
		s += fmt.Sprintf(`,"ts_session":%d,"ts_token":%d`, session, session^0x5a5a)
	}
	return []byte(s + "}")
}

// ---- sender processes that can be killed -9 ----

const (
	// sendersEnv makes the test binary a process of N rdma_twosided engines that each send
	// one notify to sendersTargetEnv, print "UP", and wait to be killed.
	sendersEnv       = "TWOSIDED_TEST_ATTACK_SENDERS"
	sendersTargetEnv = "TWOSIDED_TEST_ATTACK_TARGET"
)

// runSenders is the child side of startSenders.
func runSenders(count string) int {
	n, err := strconv.Atoi(count)
	if err != nil || n < 1 {
		fmt.Fprintln(os.Stderr, "senders: bad count", count)
		return 1
	}
	target := os.Getenv(sendersTargetEnv)
	var engines []*notify.Engine
	for i := 0; i < n; i++ {
		e, err := notify.New(notify.WithTransport(notify.TransportRDMATwoSided), notify.WithListenAddr("127.0.0.1:0"),
			notify.WithOOBFallback(false), notify.WithoutProcsReserve())
		if err != nil {
			fmt.Fprintln(os.Stderr, "senders:", err)
			return 1
		}
		engines = append(engines, e)
	}
	for i, e := range engines {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := e.SendNotify(ctx, target, notify.Notify{Name: "doomed", Msg: []byte(strconv.Itoa(i))})
		cancel()
		if err != nil {
			fmt.Fprintln(os.Stderr, "senders:", err)
			return 1
		}
	}
	fmt.Println("UP")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // until killed, or the parent goes
	return 0
}

// senderProc is a child process of engines with channels to a target.
type senderProc struct{ cmd *exec.Cmd }

// startSenders starts a process of n engines that each send a notify to target; it fails
// when the process exits before they all succeeded.
func startSenders(t *testing.T, n int, target string) (*senderProc, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), sendersEnv+"="+strconv.Itoa(n), sendersTargetEnv+"="+target)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &senderProc{cmd: cmd}
	t.Cleanup(func() {
		_ = stdin.Close()
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			_ = p.cmd.Wait()
		}
	})
	up := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.TrimSpace(sc.Text()) == "UP" {
				up <- true
				return
			}
		}
		up <- false
	}()
	select {
	case ok := <-up:
		if !ok {
			p.kill()
			return nil, fmt.Errorf("sender process exited before its engines were up: %s", strings.TrimSpace(stderr.String()))
		}
	case <-time.After(60 * time.Second):
		t.Fatal("sender process not up within 60 s")
	}
	return p, nil
}

// kill ends the process as kill -9 does.
func (p *senderProc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_ = p.cmd.Wait()
}

// isAny reports whether err wraps one of targets.
func isAny(err error, targets ...error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}
