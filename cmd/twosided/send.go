package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/twosided/twosided/notify"
)

func init() {
	register(&command{
		Name:    "send",
		Summary: "Send notifies to a peer and report each result and its latency.",
		Usage:   "--peer host:port|server-name [--metadata etcd://h:2379|redis://h:6379|http://h:8080/metadata] [-n count] [--notify-name name] [--msg text | -s size] [--transport oob|rdma_twosided]",
		Run:     runSend,
	})
}

func runSend(ctx context.Context, fs *flag.FlagSet, args []string, stdout io.Writer) error {
	var ef engineFlags
	ef.define(fs, "127.0.0.1:0")
	peer := fs.String("peer", "", "the receiving engine's host:port, or its server name with --metadata (required)")
	count := fs.Int("count", 1, "notifies to send, one after another")
	fs.IntVar(count, "n", 1, "short for --count (perftest's -n)")
	name := fs.String("notify-name", "twosided", "the notify's name (Notify.Name), as the receiver sees it")
	oldName := deprecatedString{to: name, flag: "--notify-name"}
	fs.Var(&oldName, "name", "deprecated: use --notify-name (serve's --name is the server name)")
	msg := fs.String("msg", "hello", "notify message")
	size := fs.Int("size", 0, "pad or cut the message to this many bytes (default: the message as given)")
	fs.IntVar(size, "s", 0, "short for --size (perftest's -s)")
	timeout := fs.Duration("timeout", 10*time.Second, "bound on each notify")
	quiet := fs.Bool("quiet", false, "print only the summary")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var bad []string
	if *peer == "" {
		bad = append(bad, "--peer: required")
	}
	if *count < 1 {
		bad = append(bad, fmt.Sprintf("--count %d: must be at least 1", *count))
	}
	if *size < 0 {
		bad = append(bad, fmt.Sprintf("--size %d: must not be negative", *size))
	}
	if *timeout <= 0 {
		bad = append(bad, fmt.Sprintf("--timeout %v: must be positive", *timeout))
	}
	if len(bad) > 0 {
		return usageError(fs, bad...)
	}
	if oldName.set {
		fmt.Fprintln(fs.Output(), "twosided send: --name is deprecated, use --notify-name")
	}
	body := []byte(*msg)
	if *size > 0 {
		b := make([]byte, *size)
		for i := range b {
			b[i] = 'x'
		}
		copy(b, body)
		body = b
	}
	e, err := notify.FromEnv(ef.options()...)
	if err != nil {
		return err
	}
	defer closeEngine(e)
	// A server name's address, for the errors: a dead address fails the handshake at once,
	// and the error then names both.
	target := *peer
	rctx, rcancel := context.WithTimeout(ctx, *timeout)
	if addr, err := e.Resolve(rctx, *peer); err == nil && addr != *peer {
		target = fmt.Sprintf("%s (%s)", *peer, addr)
	}
	rcancel()
	var failed int
	var total time.Duration
	prog := newProgress(stdout, fs.Output(), *count, "send", !*quiet)
	defer prog.finish()
	for i := range *count {
		sctx, cancel := context.WithTimeout(ctx, *timeout)
		start := time.Now()
		err := e.SendNotify(sctx, *peer, notify.Notify{Name: *name, Msg: body})
		d := time.Since(start)
		cancel()
		prog.add(1)
		total += d
		if err != nil {
			failed++
			fmt.Fprintf(stdout, "notify %d/%d to %s: error after %v: %v\n", i+1, *count, target, d.Round(time.Microsecond), err)
			if ctx.Err() != nil {
				break
			}
			continue
		}
		if !*quiet {
			fmt.Fprintf(stdout, "notify %d/%d to %s: ok in %.1f µs\n", i+1, *count, *peer, float64(d.Nanoseconds())/1e3)
		}
	}
	prog.finish()
	fmt.Fprintf(stdout, "sent %d, failed %d, transport %s, mean %.1f µs\n", *count-failed, failed, e.Transport(),
		float64(total.Nanoseconds())/1e3/float64(*count))
	if line := pathLine(e.Transport(), e.Stats()); line != "" {
		fmt.Fprintln(stdout, line)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d notifies failed", failed, *count)
	}
	return nil
}

// deprecatedString is a string flag kept as an alias of another (to); set says it was used.
type deprecatedString struct {
	to   *string
	flag string
	set  bool
}

func (d *deprecatedString) String() string {
	if d.to == nil {
		return ""
	}
	return *d.to
}

func (d *deprecatedString) Set(s string) error {
	*d.to, d.set = s, true
	return nil
}

// pathLine says which path the notifies took when it differs from the transport asked
// for: rdma_twosided notifies that went over OOB (the peer serves no ctrl channel, OOB
// fallback after a channel failed, a notify above what a channel carries). It counts what
// left this engine on each path (Stats.Channels.NotifiesSent, Stats.OOB.NotifySent); ""
// when every notify took the transport's own path.
func pathLine(transport string, st notify.Stats) string {
	onChannel, overOOB := st.Channels.NotifiesSent, st.OOB.NotifySent
	if transport != notify.TransportRDMATwoSided || overOOB == 0 {
		return ""
	}
	why := "fallback"
	if st.Limits.Fallbacks > 0 {
		why = fmt.Sprintf("fallback; %d retried after their channel failed", st.Limits.Fallbacks)
	}
	for _, p := range st.Peers {
		if p.State == "oob" {
			why += "; " + p.Peer + " serves no ctrl channel"
			break
		}
	}
	return fmt.Sprintf("transport %s: %d notifies, %d over the ctrl channel, %d over OOB (%s)",
		transport, onChannel+overOOB, onChannel, overOOB, why)
}
