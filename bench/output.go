package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// writeTable prints one table per scenario.
func writeTable(w io.Writer, rep *Report) {
	s := rep.Settings
	procs := "2 processes (the receivers run in a child process)"
	other := "the child"
	if s.Procs == 1 {
		procs = "1 process"
	}
	if sv := s.Server; sv != nil {
		procs = fmt.Sprintf("2 hosts: client %s, server %s (%s/%s, %d CPUs, provider %s, commit %s)",
			s.Client, sv.Addr, sv.GOOS, sv.GOARCH, sv.NumCPU, sv.Provider, shortCommit(sv.Commit))
		other = "the server"
	}
	short := shortCommit(s.Commit)
	fmt.Fprintf(w, "twosided bench: %s, provider %s, %s, %d CPUs, commit %s, %.1f s\n",
		procs, s.Provider, s.GoVersion, s.NumCPU, short, rep.ElapsedS)
	if note := s.CPUCheck.note(); note != "" {
		fmt.Fprintln(w, note)
	}
	if s.BusyPollUS > 0 {
		fmt.Fprintf(w, "busy poll %.0f µs; ", s.BusyPollUS)
	}
	if !s.Keepalive {
		fmt.Fprintf(w, "keepalive off; ")
	}
	fmt.Fprintf(w, "×floor: the key figure against %s (latency: p50 ratio; throughput: floor ops/s over ops/s; burst: against %s when it ran; rdma_twosided: against %s when it ran)\n", s.Floor, FloorStream, FloorVerbs)
	fmt.Fprintf(w, "cpu µs/n: CPU time per notify, this process + %s; wake/n: reactor epoll wake-ups per notify\n", other)
	if s.Server != nil {
		fmt.Fprintf(w, "across hosts only round trips are timed: one-way is half a round trip, and the two hosts' clocks are never compared\n")
	}
	if s.Repeat > 1 {
		fmt.Fprintf(w, "pipelined rows: the median of %d runs; spread: ± half their ops/s range, of the median", s.Repeat)
		if s.Count == 0 {
			fmt.Fprintf(w, "; each run sends for %.1f s", s.BurstTimeS)
		}
		fmt.Fprintln(w)
	}
	for _, sc := range Scenarios {
		var rows []*Result
		for _, r := range rep.Results {
			if r.Scenario == sc {
				rows = append(rows, r)
			}
		}
		if len(rows) == 0 {
			continue
		}
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		switch sc {
		case ScenarioLatency:
			r0 := rows[0]
			method := ""
			for _, r := range rows {
				if r.OneWayMethod != "" && !strings.Contains(method, r.OneWayMethod) {
					method += "; " + r.Transport + ": " + r.OneWayMethod
				}
			}
			fmt.Fprintf(w, "latency: sequential, %d B, %d notifies each; one-way µs%s\n", r0.Size, r0.Notifies, method)
			fmt.Fprintln(tw, "transport\tp50\tp90\tp99\tp99.9\tmax\tcall p50\tcall p99\tcpu µs/n\twake/n\t×floor\terrors\t")
			for _, r := range rows {
				ow := r.OneWay
				if ow == nil {
					ow = &Summary{}
				}
				c := r.Call
				if c == nil {
					c = &Summary{}
				}
				fmt.Fprintf(tw, "%s\t%.1f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t\n", r.Transport,
					ow.P50, usCell(r, ow.P90), usCell(r, ow.P99), usCell(r, ow.P999), usCell(r, ow.Max), usCell(r, c.P50), usCell(r, c.P99), cpuCell(r), wakeCell(r), ratioCell(r), r.Errors)
			}
		case ScenarioIdle:
			r0 := rows[0]
			fmt.Fprintf(w, "idle: %d peers connected, no traffic, %.1f s\n", r0.Peers, r0.ElapsedS)
			fmt.Fprintf(tw, "transport\twake-ups/s\tcpu %% self\tcpu %% %s\terrors\t\n", strings.TrimPrefix(other, "the "))
			for _, r := range rows {
				self, child := 0.0, 0.0
				if r.ElapsedS > 0 {
					self, child = r.CPUSelfUS/1e4/r.ElapsedS, r.CPUChildUS/1e4/r.ElapsedS
				}
				fmt.Fprintf(tw, "%s\t%.1f\t%.2f\t%.2f\t%d\t\n", r.Transport, r.WakeupsPerSec, self, child, r.Errors)
			}
		case ScenarioConnect:
			r0 := rows[0]
			fmt.Fprintf(w, "connect: first notify to each of %d cold peers, one after another; µs per channel\n", r0.Peers)
			fmt.Fprintln(tw, "transport\tp50\tp99\tmax\tcpu µs/n\t×floor\terrors\t")
			for _, r := range rows {
				c := r.Connect
				if c == nil {
					c = &Summary{}
				}
				fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%s\t%s\t%d\t\n", r.Transport, c.P50, c.P99, c.Max, cpuCell(r), ratioCell(r), r.Errors)
			}
		default:
			r0 := rows[0]
			what := map[string]string{
				ScenarioBurst:  "burst: pipelined one-way, one sender, one receiver",
				ScenarioBidi:   "bidi: pipelined both ways at once (figures count both directions)",
				ScenarioFanin:  fmt.Sprintf("fanin: %d senders, one receiver", r0.Peers),
				ScenarioFanout: fmt.Sprintf("fanout: one sender, %d receivers", r0.Peers),
			}[sc]
			fmt.Fprintf(w, "%s; %d in flight per sender; call µs\n", what, r0.Window)
			fmt.Fprintln(tw, "transport\tsize\tnotifies\tops/s\tspread\tMB/s\tcall p50\tcall p99\tcall p99.9\tcpu µs/n\twake/n\t×floor\terrors\t")
			for _, r := range rows {
				c := r.Call
				if c == nil {
					c = &Summary{}
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%s\t%.2f\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t\n", r.Transport, sizeCell(r.Size),
					r.Notifies, r.OpsPerSec, spreadCell(r), r.MBPerSec, usCell(r, c.P50), usCell(r, c.P99), usCell(r, c.P999), cpuCell(r), wakeCell(r), ratioCell(r), r.Errors)
			}
		}
		_ = tw.Flush()
		for _, r := range rows {
			if r.FirstError != "" {
				fmt.Fprintf(w, "  %s: first error: %s\n", r.Transport, r.FirstError)
			}
		}
		writeBreakdowns(w, rows)
	}
	writeAnchors(w, rep.Anchors, s.Server != nil)
	for _, f := range rep.Failures {
		fmt.Fprintf(w, "\nFAILED %s %s (%s): %s\n", f.Scenario, f.Transport, sizeCell(f.Size), f.Error)
	}
}

// writeAnchors says how the anchors' rows were made, or why there are none.
func writeAnchors(w io.Writer, as []*Anchor, remote bool) {
	if len(as) == 0 {
		return
	}
	where := "on this host's loopback"
	if remote {
		where = "between this host and the server (its ucx_perftest server started by the bench server)"
	}
	fmt.Fprintf(w, "\nanchors (%s rows): UCX's ucx_perftest over UCX's tcp transport %s, both sides busy polling; ucp_am_lat's p50 and mean are half the round trip\n", TransportUCX, where)
	seen := map[string]bool{}
	for _, a := range as {
		switch {
		case a.Skipped != "":
			fmt.Fprintf(w, "  skipped: %s\n", a.Skipped)
		case a.Error != "":
			fmt.Fprintf(w, "  FAILED %s %s: %s\n", a.Test, sizeCell(a.Size), a.Error)
		case !seen[a.Command]:
			seen[a.Command] = true
			fmt.Fprintf(w, "  %s\n", a.Command)
		}
	}
}

func shortCommit(c string) string {
	if len(c) > 12 {
		return c[:12]
	}
	return c
}

// spreadCell is a pipelined row's spread over its repeats.
func spreadCell(r *Result) string {
	if len(r.OpsRepeats) < 2 {
		return "-"
	}
	return fmt.Sprintf("±%.0f%%", 50*r.Spread())
}

// usCell is a figure the row has: an anchor's table reports fewer.
func usCell(r *Result, v float64) string {
	if r.Transport == TransportUCX && v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", v)
}

func sizeCell(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

func cpuCell(r *Result) string {
	if r.Notifies == 0 || r.Transport == TransportUCX {
		return "-"
	}
	if r.Procs == 1 {
		return fmt.Sprintf("%.1f", r.CPUPerNotifyUS)
	}
	return fmt.Sprintf("%.1f+%.1f", r.CPUSelfPerNotifyUS, r.CPUChildPerNotifyUS)
}

func wakeCell(r *Result) string {
	if isFloor(r.Transport) || r.Transport == TransportUCX || r.Notifies == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", r.WakeupsPerNotify)
}

func ratioCell(r *Result) string {
	if r.VsFloor == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f×", r.VsFloor)
}

func writeJSON(path string, rep *Report) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("bench: json: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("bench: json: %w", err)
	}
	return nil
}

// progress keeps one status line on a terminal, from two seconds into the suite on.
type progress struct {
	w     io.Writer
	total int
	start int64
	after time.Duration // quiet until the suite has run this long

	mu    sync.Mutex
	i     int
	label string
	shown bool

	quit chan struct{}
	done chan struct{}
	once sync.Once
}

func newProgress(w io.Writer, total int) *progress { return startProgress(w, total, 2*time.Second) }

func startProgress(w io.Writer, total int, after time.Duration) *progress {
	p := &progress{w: w, total: total, start: nanotime(), after: after, quit: make(chan struct{}), done: make(chan struct{})}
	if w == nil {
		close(p.done)
		return p
	}
	go p.loop()
	return p
}

func (p *progress) set(i int, s runSpec) {
	p.mu.Lock()
	p.i, p.label = i, fmt.Sprintf("%s %s %s", s.Scenario, s.Transport, sizeCell(max(s.Size, minSize)))
	p.mu.Unlock()
}

func (p *progress) loop() {
	defer close(p.done)
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.quit:
			p.mu.Lock()
			if p.shown {
				fmt.Fprint(p.w, "\r\033[K")
			}
			p.mu.Unlock()
			return
		case <-t.C:
			el := time.Duration(nanotime() - p.start)
			if el < p.after {
				continue
			}
			p.mu.Lock()
			fmt.Fprintf(p.w, "\r\033[Kbench [%d/%d] %s  %.1fs", p.i+1, p.total, p.label, el.Seconds())
			p.shown = true
			p.mu.Unlock()
		}
	}
}

func (p *progress) stop() {
	p.once.Do(func() {
		close(p.quit)
		<-p.done
	})
}

// writeBreakdowns prints where the time of a notify goes, for the runs that measured it.
func writeBreakdowns(w io.Writer, rows []*Result) {
	for _, r := range rows {
		b := r.Breakdown
		if b == nil {
			continue
		}
		fmt.Fprintf(w, "\n%s: where a notify's time goes (CLOCK_MONOTONIC stamps in both processes; µs)\n", r.Transport)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "hop\tp50\tp90\twhat it holds")
		for _, h := range b.Hops {
			fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%s\n", h.Name, h.P50, h.P90, h.What)
		}
		fmt.Fprintf(tw, "reactor wake-ups per notify\tsender %.2f\treceiver %.2f\t\n", b.SenderWakeupsPerN, b.ReceiverWakeupsPerN)
		tw.Flush()
	}
}
