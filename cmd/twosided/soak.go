package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/twosided/twosided/bench/soak"
	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/notify"
)

func init() {
	register(&command{
		Name: "soak",
		Summary: "check the delivery contract end to end under faults: agent processes of this binary\n" +
			"send to each other with a seeded mix of calls while they are killed, stopped and\n" +
			"reopened; every acknowledged notify must arrive once, in order. Exit 1 on a violation.",
		Usage: "[--duration 1m] [--seed n] [--remote ip:port,... --bind ip] [--faults all|none|kill,stop,reopen,pause,slow,device,cut,hostile] [--procs 3]\n" +
			"       [--provider soft|verbs] [--transports rdma_twosided,oob] [--json file] [--plant lose|dup|reorder|leak]\n" +
			"       [--recovery-bound 20s] [--stall-bound 12s]\n" +
			"       twosided soak --agent-host --listen ip:port    (on each other host of a run)",
		Run: runSoak,
	})
}

func runSoak(ctx context.Context, fs *flag.FlagSet, args []string, stdout io.Writer) error {
	var (
		agent      = fs.Bool("agent", false, "run as an agent of a soak (the parent starts these)")
		agentHost  = fs.Bool("agent-host", false, "serve a soak run from another host: start its agents here on its word (with --listen)")
		listen     = fs.String("listen", "", "with --agent-host: the ip:port to serve on; its IP is where this host's engines listen")
		remote     = fs.String("remote", "", "agent hosts (ip:port of `twosided soak --agent-host`), comma list, one agent each, beside --procs local ones")
		bind       = fs.String("bind", "127.0.0.1", "the IP local engines listen on (with --remote: one the agent hosts reach)")
		spec       = fs.String("spec", "", "an agent's engines, as JSON (with --agent)")
		duration   = fs.Duration("duration", time.Minute, "how long to run")
		seed       = fs.Uint64("seed", 0, "the schedule's seed (0: a random one, printed)")
		faults     = fs.String("faults", "all", "faults to inject: all, none, or a list of "+strings.Join(soak.AllFaults, ","))
		procs      = fs.Int("procs", 3, "agent processes")
		provider   = fs.String("provider", "soft", "ibv provider of the rdma_twosided engines: soft, or verbs (built with -tags rdma)")
		transports = fs.String("transports", notify.TransportRDMATwoSided+","+notify.TransportOOB, "one engine per transport in each agent")
		jsonPath   = fs.String("json", "", "write the figures and the verdict to this file as JSON")
		plant      = fs.String("plant", "", "lose, dup or reorder one delivery, or leak goroutines, on purpose in an agent (the soak must fail)")
		every      = fs.Duration("fault-every", 3*time.Second, "mean time between faults")
		bound      = fs.Duration("recovery-bound", soak.DefaultRecoveryBound, "a new engine must have a notify acknowledged each way with every live engine within this of its start")
		stallBound = fs.Duration("stall-bound", soak.DefaultStallBound, "the recovery bound of a sender whose sends waited for the credit of a receiver killed then: its restarted receiver must acknowledge a notify of it within this of its start")
		maxSize    = fs.Int("max-size", 1<<20-128, "the largest message (the engines' limit is 1 MiB, name included)")
		window     = fs.Int("window", 32, "the largest SendNotifyAsync window")
		oneName    = fs.Bool("one-name", false, "send to each peer by host:port only (default: host:port and localhost:port, two names of one peer)")
		progress   = fs.Duration("progress", 5*time.Second, "print a progress line this often on stderr (0: never)")
		verbose    = fs.Bool("v", false, "print the agents' stderr and log lines")
	)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *agentHost {
		host, _, err := net.SplitHostPort(*listen)
		if ip := net.ParseIP(host); err != nil || ip == nil || ip.IsUnspecified() {
			return usageError(fs, fmt.Sprintf("--listen: want ip:port with the IP peers reach this host's engines at, got %q", *listen))
		}
		return runAgentHost(ctx, *listen)
	}
	if *agent {
		sp, err := soak.ParseAgentSpec(*spec)
		if err != nil {
			return usageError(fs, err.Error())
		}
		return soak.RunAgent(ctx, sp, os.Stdin, stdout)
	}
	kinds, err := soak.ParseFaults(*faults)
	if err != nil {
		return usageError(fs, err.Error())
	}
	switch {
	case *procs < 0 || *procs > 64:
		return usageError(fs, "--procs: want 0..64")
	case *duration <= 0:
		return usageError(fs, "--duration: want more than 0")
	case *maxSize < 0 || *maxSize > 1<<20-128:
		return usageError(fs, "--max-size: want 0..1048448")
	case *window < 1 || *window > 256:
		return usageError(fs, "--window: want 1..256")
	case *plant != "" && *plant != soak.PlantLose && *plant != soak.PlantDup && *plant != soak.PlantReorder && *plant != soak.PlantLeak:
		return usageError(fs, "--plant: want lose, dup, reorder or leak")
	}
	var trs []string
	for _, t := range strings.Split(*transports, ",") {
		if t != notify.TransportRDMATwoSided && t != notify.TransportOOB {
			return usageError(fs, fmt.Sprintf("--transports: %q is not rdma_twosided or oob", t))
		}
		trs = append(trs, t)
	}
	if err := checkProvider(*provider); err != nil {
		return err
	}
	if *seed == 0 {
		var b [8]byte
		_, _ = rand.Read(b[:])
		*seed = binary.LittleEndian.Uint64(b[:]) >> 1
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	var hosts []string
	if *remote != "" {
		for _, h := range strings.Split(*remote, ",") {
			if _, _, err := net.SplitHostPort(h); err != nil {
				return usageError(fs, fmt.Sprintf("--remote: %q is not ip:port", h))
			}
			hosts = append(hosts, h)
		}
	}
	if *procs+len(hosts) < 1 {
		return usageError(fs, "--procs 0 needs --remote")
	}
	if net.ParseIP(*bind) == nil {
		return usageError(fs, fmt.Sprintf("--bind: %q is not an IP", *bind))
	}
	cfg := soak.Config{
		Remote: hosts, BindIP: *bind,
		Duration: *duration, Seed: *seed, Faults: kinds, Procs: *procs, Transports: trs, Provider: *provider,
		Plant: *plant, FaultEvery: *every, RecoveryBound: *bound, StallBound: *stallBound, Mix: soak.Mix{MaxSize: *maxSize, MaxWindow: *window, OneName: *oneName},
		Command: func(args []string) *exec.Cmd {
			return exec.Command(exe, append([]string{"soak", "--agent"}, args...)...)
		},
		Progress: os.Stderr, ProgressEvery: *progress,
	}
	if *verbose {
		cfg.Log = os.Stderr
	}
	if *provider == "verbs" { // softverbs' control files, for device faults
		dir, err := os.MkdirTemp("", "twosided-soak-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		cfg.DeviceCtlDir = dir
	}
	fmt.Fprintf(os.Stderr, "soak: seed %d, %v, %d procs, %s on %s, faults %s\n", *seed, *duration, *procs, *transports, *provider, strings.Join(kinds, ","))
	res, err := soak.Run(ctx, cfg)
	replay := fmt.Sprintf("twosided soak --seed %d --duration %v --procs %d --faults %s --provider %s --transports %s",
		*seed, *duration, *procs, strings.Join(append(kinds, "none")[:max(len(kinds), 1)], ","), *provider, *transports)
	if *oneName {
		replay += " --one-name"
	}
	if *plant != "" {
		replay += " --plant " + *plant
	}
	res.Report(stdout, replay)
	if *jsonPath != "" {
		if werr := res.WriteJSON(*jsonPath); werr != nil {
			return werr
		}
	}
	if errors.Is(err, soak.ErrViolation) {
		return fmt.Errorf("%w; seed %s", err, strconv.FormatUint(*seed, 10))
	}
	return err
}

// runAgentHost serves remote agents on listen until ctx ends (the process is stopped).
func runAgentHost(ctx context.Context, listen string) error {
	host, _, _ := net.SplitHostPort(listen)
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	fmt.Fprintf(os.Stderr, "soak agent host on %s: run `twosided soak --remote %s --bind <this side's IP>` on the parent host\n", l.Addr(), l.Addr())
	h := &soak.AgentHost{Advertise: host, Log: os.Stderr, Command: func(args []string) *exec.Cmd {
		return exec.Command(exe, append([]string{"soak", "--agent"}, args...)...)
	}}
	return h.Serve(ctx, l)
}

// checkProvider says why provider cannot run the rdma_twosided engines, before agents start.
func checkProvider(name string) error {
	p, err := ibv.LookupProvider(name)
	if err != nil {
		if name == "verbs" {
			return fmt.Errorf("--provider verbs: %w (build with -tags rdma)", err)
		}
		return fmt.Errorf("--provider: %w", err)
	}
	if _, err := p.GetDeviceList(); err != nil {
		return fmt.Errorf("--provider %s: %w", name, err)
	}
	return nil
}
