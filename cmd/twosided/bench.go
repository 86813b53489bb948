package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/twosided/twosided/bench"
)

func init() {
	register(&command{
		Name: "bench",
		Summary: "Benchmark notify transports (rdma_twosided, oob, oob-classic) against TCP floors\n" +
			"(floor-block, floor-spin); rdma_twosided on the soft provider, or on a libibverbs device\n" +
			"(--provider verbs, -tags rdma). With no flags: the default suite, two processes, ~30 s.",
		Usage: "[--scenario list] [--transport list] [--procs 1|2] [-n count] [-s sizes] [--peers k]\n" +
			"       [-D duration] [--busy-poll 50us] [--window w] [--provider soft|verbs] [--keepalive-off] [--json file] [--plot file.svg]",
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

func runBench(ctx context.Context, fs *flag.FlagSet, args []string, stdout io.Writer) error {
	bench.ChildMain() // a two-process run re-executes "twosided bench" as its receiving side
	var cfg bench.Config
	var scenarios, transports list
	var sizes sizeList
	fs.Var(&scenarios, "scenario", "scenarios, comma list: "+strings.Join(bench.Scenarios, ", ")+" (default all)")
	fs.Var(&transports, "transport", "transports, comma list: "+strings.Join(bench.AllTransports, ", ")+" (default all but the verbs floors)")
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
	fs.BoolVar(&cfg.KeepaliveOff, "keepalive-off", false, "engines without keepalive (by default they probe idle channels every 5 s, which idle counts)")
	fs.StringVar(&cfg.Provider, "provider", "", "ibv provider of rdma_twosided and the verbs floors: soft, or verbs (built with -tags rdma); default: the device an engine picks (a libibverbs device with an active port in a -tags rdma build, else soft)")
	fs.DurationVar(&cfg.RunTimeout, "timeout", 0, "bound on one run (default 2m)")
	fs.StringVar(&cfg.JSONPath, "json", "", "write every figure and the run's settings to this file")
	fs.StringVar(&cfg.PlotPath, "plot", "", "write latency CDFs and throughput vs size to this SVG file")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	cfg.Scenarios, cfg.Transports, cfg.Sizes = scenarios, transports, sizes
	cfg.ChildArgs = []string{"bench"}
	if w := fs.Output(); isTerminalWriter(w) {
		cfg.Progress = w // a status line while the suite runs (bench shows it after 2 s)
	}
	rep, err := bench.Run(ctx, cfg, stdout)
	if err != nil {
		return err
	}
	if len(rep.Failures) > 0 {
		return fmt.Errorf("%d of %d runs failed", len(rep.Failures), len(rep.Failures)+len(rep.Results))
	}
	return nil
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
