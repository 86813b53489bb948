package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/twosided/twosided/notify"
)

func init() {
	register(&command{
		Name:    "serve",
		Summary: "Run a notify engine, show its address and print the notifies it receives (or count them).",
		Usage:   "[--listen host:port] [--name N --metadata etcd://h:2379|redis://h:6379|http://h:8080/metadata] [--transport oob|rdma_twosided] [--count-only] [--expect n] [--duration d] [--full] [--metrics host:port] [--stats interval]",
		Run:     runServe,
	})
}

// engineFlags are the engine settings serve and send share. The MC_* environment applies
// first (notify.FromEnv); a flag given on the command line overrides it.
type engineFlags struct {
	listen    string
	transport string
	busyPoll  time.Duration
	recvCount int
	dir       dirFlags // directory.go
	fs        *flag.FlagSet
}

func (f *engineFlags) define(fs *flag.FlagSet, listen string) {
	f.fs = fs
	fs.StringVar(&f.listen, "listen", listen, "OOB listen address; its host:port is this engine's peer name")
	fs.StringVar(&f.transport, "transport", "", "oob or rdma_twosided (default from MC_USE_RDMA_TWOSIDED, else oob)")
	fs.DurationVar(&f.busyPoll, "busy-poll", 0, "reactor busy-poll budget, e.g. 50us (default 0: never spin)")
	fs.IntVar(&f.recvCount, "recv-count", 0, "RECV ring depth per channel (default MC_RDMA_NOTIFY_RECV_COUNT, else 64)")
	f.dir.define(fs)
}

func (f *engineFlags) options() []notify.Option {
	opts := []notify.Option{notify.WithListenAddr(f.listen)}
	if f.transport != "" {
		opts = append(opts, notify.WithTransport(f.transport))
	}
	if f.busyPoll > 0 {
		opts = append(opts, notify.WithBusyPoll(f.busyPoll))
	}
	if f.recvCount > 0 {
		opts = append(opts, notify.WithRecvCount(f.recvCount))
	}
	return append(opts, f.dir.options()...)
}

func closeEngine(e *notify.Engine) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return e.Close(ctx)
}

func runServe(ctx context.Context, fs *flag.FlagSet, args []string, stdout io.Writer) error {
	var ef engineFlags
	ef.define(fs, "127.0.0.1:12001")
	ef.dir.defineName(fs)
	countOnly := fs.Bool("count-only", false, "count notifies (a line per second while they arrive) instead of printing each")
	expect := fs.Int("expect", 0, "exit after this many notifies (default 0: run until interrupted)")
	duration := fs.Duration("duration", 0, "exit after this long (default 0: run until interrupted)")
	full := fs.Bool("full", false, fmt.Sprintf("print each message whole (default: at most %d bytes, then how many more)", maxShown))
	var of observeFlags
	of.define(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *expect < 0 {
		return usageError(fs, fmt.Sprintf("--expect %d: must not be negative", *expect))
	}
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var count atomic.Int64
	opts := ef.options()
	if *countOnly {
		opts = append(opts, notify.WithHandler(func(notify.Notify) {
			if n := count.Add(1); *expect > 0 && n >= int64(*expect) {
				cancel()
			}
		}))
	}
	// Every listener is bound before anything says "serving": --metrics first, then the
	// engine's OOB listener (and its registration).
	closeMetrics, err := of.listen()
	defer closeMetrics()
	if err != nil {
		return err
	}
	e, err := notify.FromEnv(opts...)
	if err != nil {
		return err
	}
	defer closeEngine(e)
	stopObserve, metricsURL := of.start(e, fs.Output())
	defer stopObserve()
	fmt.Fprintf(stdout, "serving on %s (transport %s)\n", e.Addr(), e.Transport())
	if e.ServerName() != "" {
		fmt.Fprintf(stdout, "registered as %s\n", e.ServerName())
	}
	if metricsURL != "" {
		fmt.Fprintf(stdout, "metrics on %s\n", metricsURL)
	}
	if *countOnly {
		return countLoop(ctx, stdout, &count)
	}
	for *expect == 0 || count.Load() < int64(*expect) {
		n, err := e.Recv(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			return err
		}
		count.Add(1)
		fmt.Fprintf(stdout, "%s\t%s\t%s\n", n.Peer, n.Name, shown(n.Msg, *full))
	}
	fmt.Fprintf(stdout, "received %d notifies\n", count.Load())
	return nil
}

// maxShown bounds the bytes of a message serve prints without --full.
const maxShown = 256

// shown is msg quoted, cut to maxShown bytes unless full, saying how much was left out.
func shown(msg []byte, full bool) string {
	if full || len(msg) <= maxShown {
		return strconv.Quote(string(msg))
	}
	return fmt.Sprintf("%s… (%d bytes, %d not shown; --full prints them)", strconv.Quote(string(msg[:maxShown])), len(msg), len(msg)-maxShown)
}

// countLoop prints the count once a second while it changes, and the total at the end.
func countLoop(ctx context.Context, stdout io.Writer, count *atomic.Int64) error {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var last int64
	for {
		select {
		case <-t.C:
			if n := count.Load(); n != last {
				fmt.Fprintf(stdout, "received %d (%d/s)\n", n, n-last)
				last = n
			}
		case <-ctx.Done():
			fmt.Fprintf(stdout, "received %d notifies\n", count.Load())
			if errors.Is(ctx.Err(), context.Canceled) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil
			}
			return ctx.Err()
		}
	}
}
