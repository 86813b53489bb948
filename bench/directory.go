package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twosided/twosided/notify"
	"github.com/twosided/twosided/notify/directory"
	_ "github.com/twosided/twosided/notify/directory/etcd"  // etcd connection strings (--metadata)
	_ "github.com/twosided/twosided/notify/directory/http"  // http:// metadata servers
	_ "github.com/twosided/twosided/notify/directory/redis" // redis://
)

// The directory scenario: Senders engines, each in its own process and registered in the
// metadata service under its own name, send to one receiving engine in this process,
// registered as DirectorySink. Each sender sends Count notifies one after another
// (SendNotify), all senders at once (fan-in), first to the sink's host:port, then to its
// server name; the receiver's delivery rate and the senders' mean call time are reported
// side by side. Beside them: the cost of a resolve from the directory's cache and from etcd
// (uncached: one etcd read), measured in this process on the senders' names.

// DirectorySink is the receiver's server name.
const DirectorySink = "fanin-sink"

const dirChildEnv = "TWOSIDED_BENCH_DIRECTORY_CHILD"

// DirectoryConfig is one run of the directory scenario. Zero fields take defaults.
type DirectoryConfig struct {
	Metadata   string // etcd://host:port, redis://host:port or http://host:port/path; required
	ClusterID  string // default "twosided-bench"
	Transport  string // default rdma_twosided
	Senders    int    // default 16
	Count      int    // notifies per sender per mode; default 2000
	Size       int    // message bytes; default 64
	Resolves   int    // cached resolves timed; default 100000
	Executable string // the binary re-executed as a sender (default: this one)
	ChildArgs  []string
}

// DirectoryMode is one fan-in pass.
type DirectoryMode struct {
	Peer     string  `json:"peer"` // "host:port" or "name"
	Notifies int     `json:"notifies"`
	Seconds  float64 `json:"seconds"`  // first send to last delivery
	Rate     float64 `json:"rate"`     // delivered notifies/s
	CallUS   float64 `json:"call_us"`  // senders' mean SendNotify time
	FirstUS  float64 `json:"first_us"` // senders' mean time of their first send of the pass
}

// DirectoryReport is the directory scenario's figures.
type DirectoryReport struct {
	Backend           string          `json:"backend"` // etcd, redis or http
	Senders           int             `json:"senders"`
	Transport         string          `json:"transport"`
	Modes             []DirectoryMode `json:"modes"`
	ResolveCachedNS   float64         `json:"resolve_cached_ns"`
	ResolveUncachedNS float64         `json:"resolve_uncached_ns"`
	ResolveAddressNS  float64         `json:"resolve_address_ns"` // a host:port through an engine without a directory
}

// dirChildSpec is what a sender process is told through its environment.
type dirChildSpec struct {
	Metadata, ClusterID, Name, Transport string
	Size                                 int
}

func (c *DirectoryConfig) normalize() error {
	if c.Metadata == "" {
		return fmt.Errorf("%w: metadata: required (etcd://host:port, redis://host:port or http://host:port/path)", ErrConfig)
	}
	if conn, err := directory.ParseConn(c.Metadata); err != nil || conn.Backend == directory.BackendP2P {
		return fmt.Errorf("%w: metadata: %q: want etcd://host:port, redis://host:port or http://host:port/path", ErrConfig, c.Metadata)
	}
	def := func(v *int, d, lo, hi int, field string) error {
		if *v == 0 {
			*v = d
		}
		if *v < lo || *v > hi {
			return fmt.Errorf("%w: %s: %d out of range %d..%d", ErrConfig, field, *v, lo, hi)
		}
		return nil
	}
	if c.ClusterID == "" {
		c.ClusterID = "twosided-bench"
	}
	if c.Transport == "" {
		c.Transport = notify.TransportRDMATwoSided
	}
	if c.Executable == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("%w: executable: %v", ErrConfig, err)
		}
		c.Executable = exe
	}
	return errors.Join(def(&c.Senders, 16, 1, 256, "senders"), def(&c.Count, 2000, 1, 1<<24, "count"),
		def(&c.Size, defaultSize, 1, maxSize, "size"), def(&c.Resolves, 100000, 1, 1<<30, "resolves"))
}

// dirSender is one sender process.
type dirSender struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

func (s *dirSender) read(ctx context.Context) (string, error) {
	select {
	case l, ok := <-s.lines:
		if !ok {
			return "", fmt.Errorf("%w: %s exited", errChild, s.name)
		}
		if strings.HasPrefix(l, "ERR ") {
			return "", fmt.Errorf("%w: %s: %s", errChild, s.name, l[4:])
		}
		return l, nil
	case <-ctx.Done():
		return "", fmt.Errorf("%w: %s: %v", errChild, s.name, ctx.Err())
	}
}

func (s *dirSender) stop() {
	_ = s.stdin.Close()
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
}

func startDirSender(cfg *DirectoryConfig, name string) (*dirSender, error) {
	raw, _ := json.Marshal(dirChildSpec{Metadata: cfg.Metadata, ClusterID: cfg.ClusterID, Name: name, Transport: cfg.Transport, Size: cfg.Size})
	cmd := exec.Command(cfg.Executable, cfg.ChildArgs...)
	cmd.Env = append(os.Environ(), dirChildEnv+"="+string(raw))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%w: start %s: %w", errChild, cfg.Executable, err)
	}
	s := &dirSender{name: name, cmd: cmd, stdin: stdin, lines: make(chan string, 4)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			s.lines <- sc.Text()
		}
		close(s.lines)
	}()
	return s, nil
}

// RunDirectory runs the directory scenario and prints its table to out.
func RunDirectory(ctx context.Context, cfg DirectoryConfig, out io.Writer) (*DirectoryReport, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	var delivered atomic.Int64
	sink, err := notify.New(notify.WithListenAddr("127.0.0.1:0"), notify.WithTransport(cfg.Transport),
		notify.WithMetadata(cfg.Metadata), notify.WithMetadataClusterID(cfg.ClusterID), notify.WithServerName(DirectorySink),
		notify.WithHandler(func(notify.Notify) { delivered.Add(1) }))
	if err != nil {
		return nil, err
	}
	defer closeQuietly(sink)
	var senders []*dirSender
	defer func() {
		for _, s := range senders {
			s.stop()
		}
	}()
	for i := range cfg.Senders {
		s, err := startDirSender(&cfg, fmt.Sprintf("fanin-sender-%02d", i))
		if err != nil {
			return nil, err
		}
		senders = append(senders, s)
	}
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for _, s := range senders {
		if _, err := s.read(sctx); err != nil { // READY
			return nil, err
		}
	}
	conn, _ := directory.ParseConn(cfg.Metadata) // normalize checked it
	rep := &DirectoryReport{Backend: conn.Backend, Senders: cfg.Senders, Transport: cfg.Transport}
	// Warm-up by address: channels exist before the measured passes.
	if _, err := dirPass(ctx, senders, sink.Addr(), 32, &delivered); err != nil {
		return nil, err
	}
	for _, peer := range []string{sink.Addr(), DirectorySink} {
		m, err := dirPass(ctx, senders, peer, cfg.Count, &delivered)
		if err != nil {
			return nil, err
		}
		m.Peer = "host:port"
		if peer == DirectorySink {
			m.Peer = "name"
		}
		rep.Modes = append(rep.Modes, m)
	}
	if err := resolveCosts(ctx, &cfg, senders, rep); err != nil {
		return nil, err
	}
	printDirectory(out, rep)
	return rep, nil
}

// dirPass has every sender send count notifies to peer and waits for all of them.
func dirPass(ctx context.Context, senders []*dirSender, peer string, count int, delivered *atomic.Int64) (DirectoryMode, error) {
	pctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	target := delivered.Load() + int64(count*len(senders))
	start := time.Now()
	for _, s := range senders {
		if _, err := fmt.Fprintf(s.stdin, "RUN %s %d\n", peer, count); err != nil {
			return DirectoryMode{}, fmt.Errorf("%w: %s: %v", errChild, s.name, err)
		}
	}
	var callNS, firstNS float64
	for _, s := range senders {
		line, err := s.read(pctx) // DONE <total ns> <first ns>
		if err != nil {
			return DirectoryMode{}, err
		}
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "DONE" {
			return DirectoryMode{}, fmt.Errorf("%w: %s: %q", errChild, s.name, line)
		}
		total, _ := strconv.ParseFloat(f[1], 64)
		first, _ := strconv.ParseFloat(f[2], 64)
		callNS += total / float64(count)
		firstNS += first
	}
	for delivered.Load() < target {
		if pctx.Err() != nil {
			return DirectoryMode{}, fmt.Errorf("bench: directory: %d of %d notifies delivered", delivered.Load()-target+int64(count*len(senders)), count*len(senders))
		}
		time.Sleep(100 * time.Microsecond)
	}
	el := time.Since(start)
	n := count * len(senders)
	return DirectoryMode{Notifies: n, Seconds: el.Seconds(), Rate: float64(n) / el.Seconds(),
		CallUS: callNS / float64(len(senders)) / 1e3, FirstUS: firstNS / float64(len(senders)) / 1e3}, nil
}

// resolveCosts times resolves in this process: uncached (the first resolve of each sender's
// name reads the service, after one warm-up read that starts etcd's watch), cached (one name,
// again and again), and a host:port through an engine without a directory.
func resolveCosts(ctx context.Context, cfg *DirectoryConfig, senders []*dirSender, rep *DirectoryReport) error {
	open := func() (directory.Directory, error) {
		return directory.Open(cfg.Metadata, directory.Config{ClusterID: cfg.ClusterID})
	}
	d, err := open()
	if err != nil {
		return err
	}
	defer d.Close(context.Background())
	if _, err := d.Resolve(ctx, DirectorySink); err != nil { // the watch is up from here
		return err
	}
	var uncached time.Duration
	for _, s := range senders {
		t0 := time.Now()
		if _, err := d.Resolve(ctx, s.name); err != nil {
			return err
		}
		uncached += time.Since(t0)
	}
	rep.ResolveUncachedNS = float64(uncached.Nanoseconds()) / float64(len(senders))
	name := senders[0].name
	t0 := time.Now()
	for range cfg.Resolves {
		if _, err := d.Resolve(ctx, name); err != nil {
			return err
		}
	}
	rep.ResolveCachedNS = float64(time.Since(t0).Nanoseconds()) / float64(cfg.Resolves)
	plain, err := notify.New(notify.WithListenAddr("127.0.0.1:0"))
	if err != nil {
		return err
	}
	defer closeQuietly(plain)
	t0 = time.Now()
	for range cfg.Resolves {
		if _, err := plain.Resolve(ctx, "127.0.0.1:12001"); err != nil {
			return err
		}
	}
	rep.ResolveAddressNS = float64(time.Since(t0).Nanoseconds()) / float64(cfg.Resolves)
	return nil
}

func printDirectory(out io.Writer, rep *DirectoryReport) {
	fmt.Fprintf(out, "directory fan-in: %d sender processes registered in %s -> 1 receiver, transport %s\n", rep.Senders, rep.Backend, rep.Transport)
	fmt.Fprintf(out, "%-10s %10s %10s %12s %12s %14s\n", "peer", "notifies", "seconds", "notifies/s", "call µs", "first call µs")
	for _, m := range rep.Modes {
		fmt.Fprintf(out, "%-10s %10d %10.3f %12.0f %12.1f %14.1f\n", m.Peer, m.Notifies, m.Seconds, m.Rate, m.CallUS, m.FirstUS)
	}
	fmt.Fprintf(out, "resolve: cached %.0f ns, uncached (one %s read) %.0f ns, host:port without a directory %.0f ns\n",
		rep.ResolveCachedNS, rep.Backend, rep.ResolveUncachedNS, rep.ResolveAddressNS)
}

func closeQuietly(e *notify.Engine) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = e.Close(ctx)
}

// directoryChild runs a sender process of the directory scenario when this process was
// started as one: false otherwise.
func directoryChild() (int, bool) {
	raw, ok := os.LookupEnv(dirChildEnv)
	if !ok {
		return 0, false
	}
	return runDirectoryChild(raw, os.Stdin, os.Stdout), true
}

// runDirectoryChild: READY, then per "RUN <peer> <count>" line count SendNotify calls and
// "DONE <total ns> <first call ns>"; stdin's end closes the engine.
func runDirectoryChild(raw string, in io.Reader, out io.Writer) int {
	var spec dirChildSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintf(out, "ERR %s: %v\n", dirChildEnv, err)
		return 1
	}
	e, err := notify.New(notify.WithListenAddr("127.0.0.1:0"), notify.WithTransport(spec.Transport),
		notify.WithMetadata(spec.Metadata), notify.WithMetadataClusterID(spec.ClusterID), notify.WithServerName(spec.Name))
	if err != nil {
		fmt.Fprintf(out, "ERR %v\n", err)
		return 1
	}
	defer closeQuietly(e)
	fmt.Fprintf(out, "READY %s\n", e.Addr())
	msg := make([]byte, spec.Size)
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		var peer string
		var count int
		if _, err := fmt.Sscanf(sc.Text(), "RUN %s %d", &peer, &count); err != nil {
			fmt.Fprintf(out, "ERR %q: %v\n", sc.Text(), err)
			return 1
		}
		n := notify.Notify{Name: "fanin", Msg: msg}
		var first time.Duration
		t0 := time.Now()
		for i := range count {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			s := time.Now()
			err := e.SendNotify(ctx, peer, n)
			cancel()
			if err != nil {
				fmt.Fprintf(out, "ERR send %d to %s: %v\n", i, peer, err)
				return 1
			}
			if i == 0 {
				first = time.Since(s)
			}
		}
		fmt.Fprintf(out, "DONE %d %d\n", time.Since(t0).Nanoseconds(), first.Nanoseconds())
	}
	return 0
}
