package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/twosided/twosided/bench"
)

func init() {
	register(&command{
		Name: "bench",
		Summary: "Benchmark notify transports (rdma_twosided, oob, oob-classic) against TCP floors\n" +
			"(floor-block, floor-spin); rdma_twosided on the soft provider, or on a libibverbs device\n" +
			"(--provider verbs, -tags rdma). With no flags: the default suite, two processes, a few minutes.\n" +
			"Between two hosts: bench --server on one, bench --client HOST:18515 on the other (round trips only).",
		Usage: "[--scenario list] [--transport list] [--procs 1|2] [-n count] [-s sizes] [--peers k]\n" +
			"       [-D duration] [--busy-poll 50us] [--window w] [--provider soft|verbs] [--keepalive-off] [--no-echo] [--json file] [--plot file.svg]\n" +
			"       [--repeat 3] [--burst-time 1s] [--anchors ucx] [--client host:port]\n" +
			"   or: bench --server [host:port]   (the receiving side for --client on another host; default port 18515)",
		Run: runBench,
	})
}

// sizeList is a comma list of byte sizes with an optional K/KiB or M/MiB suffix.
type sizeList []int

func (s *sizeList) String() string {
	parts := make([]string, len(*s))
	for i, n := range *s {
		parts[i] = strconv.Itoa(n)
	}
	return strings.Join(parts, ",")
}

func (s *sizeList) Set(v string) error {
	*s = (*s)[:0]
	for _, f := range strings.Split(v, ",") {
		n, err := parseSize(strings.TrimSpace(f))
		if err != nil {
			return err
		}
		*s = append(*s, n)
	}
	return nil
}

func parseSize(f string) (int, error) {
	mult := 1
	u := strings.ToUpper(f)
	for _, suf := range []struct {
		s string
		m int
	}{{"KIB", 1 << 10}, {"MIB", 1 << 20}, {"K", 1 << 10}, {"M", 1 << 20}, {"B", 1}} {
		if strings.HasSuffix(u, suf.s) {
			u, mult = strings.TrimSuffix(u, suf.s), suf.m
			break
		}
	}
	n, err := strconv.Atoi(u)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("size %q: want a positive byte count, e.g. 64, 4K, 64KiB", f)
	}
	return n * mult, nil
}

// list is a comma-separated flag value.
type list []string

func (l *list) String() string { return strings.Join(*l, ",") }

func (l *list) Set(v string) error {
	*l = (*l)[:0]
	for _, f := range strings.Split(v, ",") {
		if f = strings.TrimSpace(f); f != "" {
			*l = append(*l, f)
		}
	}
	return nil
}

// serverFlag is --server: alone it listens on every address at the default port; with a
// value (--server host:port, --server=host:port, a host or :port) there.
type serverFlag struct {
	set  bool
	addr string
}

func (f *serverFlag) String() string { return f.addr }

func (f *serverFlag) IsBoolFlag() bool { return true }

func (f *serverFlag) Set(v string) error {
	f.set = true
	switch v {
	case "true", "":
		f.addr = fmt.Sprintf(":%d", bench.DefaultServerPort)
		return nil
	case "false":
		f.set = false
		return nil
	}
	if _, _, err := net.SplitHostPort(v); err != nil {
		v = net.JoinHostPort(v, strconv.Itoa(bench.DefaultServerPort)) // a host alone
	}
	f.addr = v
	return nil
}

// joinServerAddr turns "--server host:port" into "--server=host:port": --server is also
// a flag on its own, which the flag package would end at.
func joinServerAddr(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if (a == "--server" || a == "-server") && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			out = append(out, a+"="+args[i+1])
			i++
			continue
		}
		out = append(out, a)
	}
	return out
}

func runBench(ctx context.Context, fs *flag.FlagSet, args []string, stdout io.Writer) error {
	bench.ChildMain() // a two-process run re-executes "twosided bench" as its receiving side
	var cfg bench.Config
	var scenarios, transports, anchors list
	var sizes sizeList
	var server serverFlag
	fs.Var(&scenarios, "scenario", "scenarios, comma list: "+strings.Join(bench.Scenarios, ", ")+" (default all)")
	fs.Var(&transports, "transport", "transports, comma list: "+strings.Join(bench.AllTransports, ", ")+" (default all but floor-epoll, floor-loop, floor-node, floor-uring, floor-echo and the verbs floors: floor-verbs, floor-verbs-spin, floor-verbs-echo)")
	fs.IntVar(&cfg.Procs, "procs", 2, "1: sender and receiver in one process (one clock); 2: the receivers in a child process")
	fs.IntVar(&cfg.Count, "count", 0, "notifies per run (default 2000; burst at most 16 MiB per run)")
	fs.IntVar(&cfg.Count, "n", 0, "short for --count (perftest's -n)")
	fs.Var(&sizes, "size", "message sizes in bytes, comma list (burst sweeps them; others use the first; default 64, burst 16,256,4K,64K)")
	fs.Var(&sizes, "s", "short for --size (perftest's -s)")
	fs.IntVar(&cfg.Peers, "peers", 0, "fanin senders, fanout/idle/connect peers (default 4; idle 8; connect 16)")
	fs.IntVar(&cfg.Window, "window", 0, "sends in flight per sender in pipelined scenarios (default 16)")
	fs.IntVar(&cfg.Warmup, "warmup", 0, "warm-up notifies before each measured phase (default 32)")
	fs.DurationVar(&cfg.Duration, "duration", 0, "idle time (default 1s) and a cap on every other measured phase (default 10s)")
	fs.DurationVar(&cfg.Duration, "D", 0, "short for --duration (perftest's -D)")
	fs.DurationVar(&cfg.BusyPoll, "busy-poll", 0, "reactor busy-poll budget, e.g. 50us (floor-spin is its reference)")
	fs.BoolVar(&cfg.NoEcho, "no-echo", false, "latency with two processes: a round trip is one notify and its ACK (SendNotify's return), no echo back, as the floors' message and ack; one-way is rtt/2 of that")
	fs.BoolVar(&cfg.KeepaliveOff, "keepalive-off", false, "engines without keepalive (by default they probe idle channels every 5 s, which idle counts)")
	fs.StringVar(&cfg.Provider, "provider", "", "ibv provider of rdma_twosided and the verbs floors: soft, or verbs (built with -tags rdma); default: the device an engine picks (a libibverbs device with an active port in a -tags rdma build, else soft)")
	fs.DurationVar(&cfg.RunTimeout, "timeout", 0, "bound on one run (default 2m)")
	fs.StringVar(&cfg.JSONPath, "json", "", "write every figure and the run's settings to this file")
	fs.StringVar(&cfg.PlotPath, "plot", "", "write latency CDFs and throughput vs size to this SVG file")
	fs.IntVar(&cfg.Repeat, "repeat", 3, "runs of each pipelined figure (burst, bidi, fanin, fanout); the table shows the median and the spread")
	fs.DurationVar(&cfg.BurstTime, "burst-time", time.Second, "how long each pipelined run sends when -n is not given (a steady state)")
	fs.Var(&anchors, "anchors", "outside references beside ours: ucx (ucx_perftest ucp_am_lat and ucp_am_bw over UCX_TLS=tcp, on loopback or, with --client, between the hosts; skipped when not installed)")
	fs.StringVar(&cfg.Server, "client", "", "run against a bench server on another host (host:port of `twosided bench --server`): the receivers run there, only round trips are timed")
	fs.Var(&server, "server", "serve the receiving side to --client runs from other hosts, on [host:port] (default :18515), until interrupted")
	if err := parseFlags(fs, joinServerAddr(args)); err != nil {
		return err
	}
	if server.set {
		return serveBench(ctx, fs, server.addr, stdout)
	}
	cfg.Scenarios, cfg.Transports, cfg.Sizes, cfg.Anchors = scenarios, transports, sizes, anchors
	cfg.ChildArgs = []string{"bench"}
	if w := fs.Output(); isTerminalWriter(w) {
		cfg.Progress = w // a status line while the suite runs (bench shows it after 2 s)
	}
	rep, err := bench.Run(ctx, cfg, stdout)
	if derr := bench.DumpTracepoints("parent"); derr != nil && err == nil {
		err = derr
	}
	if err != nil {
		return err
	}
	if len(rep.Failures) > 0 {
		return fmt.Errorf("%d of %d runs failed", len(rep.Failures), len(rep.Failures)+len(rep.Results))
	}
	return nil
}

// serveBench runs a bench server until ctx ends (Ctrl-C).
func serveBench(ctx context.Context, fs *flag.FlagSet, addr string, stdout io.Writer) error {
	var other []string
	fs.Visit(func(f *flag.Flag) {
		if f.Name != "server" {
			other = append(other, "--"+f.Name)
		}
	})
	if len(other) > 0 {
		return usageError(fs, fmt.Sprintf("--server takes no run flags (%s): the client chooses the runs", strings.Join(other, ", ")))
	}
	srv, err := bench.NewServer(addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "twosided bench server: listening on %s (protocol %s v%d); on the other host: twosided bench --client THIS_HOST:%s; Ctrl-C stops it\n",
		srv.Addr(), bench.ProtoName, bench.ProtoVersion, listenPort(srv.Addr()))
	return srv.Serve(ctx, stdout)
}

func listenPort(addr string) string {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return p
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
