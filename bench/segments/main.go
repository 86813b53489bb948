// Command segments prints where a notify's time goes from the stamps of a bench run built
// with -tags tracepoints (bench.TracepointsEnv): for each process, every pair of points
// that follow each other on its threads (two threads' stamps interleave, so a pair may
// span two threads), how often it occurred and the median and p90 of the time between
// them; then, across the two processes, each OOB write's or ctrl channel post's start to
// the other process's next wake-up (the wire and the wake-up).
//
//	go build -tags tracepoints -o /tmp/twosided-tp ./cmd/twosided
//	mkdir /tmp/tp && TWOSIDED_TRACEPOINTS=/tmp/tp /tmp/twosided-tp bench --scenario latency \
//	    --transport oob -s 64 -n 40000 --keepalive-off
//	go run ./bench/segments /tmp/tp
package main

import (
	"bufio"
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/twosided/twosided/internal/tracepoint"
)

type stamp struct {
	t   int64
	p   tracepoint.Point
	arg int64
}

func main() {
	share := flag.Float64("min", 0.2, "leave out pairs seen fewer times than this share of the most frequent pair")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: segments [--min share] DIR   (DIR holds parent.PID and child.PID from a tracepoints build)")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(os.Stdout, flag.Arg(0), *share); err != nil {
		fmt.Fprintln(os.Stderr, "segments:", err)
		os.Exit(1)
	}
}

func run(w io.Writer, dir string, share float64) error {
	procs := map[string][]stamp{}
	for _, role := range []string{"parent", "child"} {
		files, _ := filepath.Glob(filepath.Join(dir, role+".*"))
		if len(files) != 1 {
			return fmt.Errorf("%s: want one %s.PID file, found %d", dir, role, len(files))
		}
		st, err := load(files[0])
		if err != nil {
			return err
		}
		procs[role] = st
	}
	for _, role := range []string{"parent", "child"} {
		fmt.Fprintf(w, "%s (%d stamps): pair, count, p50 µs, p90 µs\n", role, len(procs[role]))
		printPairs(w, procs[role], share)
	}
	fmt.Fprintln(w, "across: a write's (OOB) or a post's (ctrl channel) start in one process to the other's next wake-up (µs)")
	printAcross(w, "parent sends → child woke", procs["parent"], procs["child"])
	printAcross(w, "child sends → parent woke", procs["child"], procs["parent"])
	return nil
}

func load(path string) ([]stamp, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []stamp
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		fs := strings.Fields(sc.Text())
		if len(fs) != 3 {
			return nil, fmt.Errorf("%s:%d: want 3 fields, got %d", path, line, len(fs))
		}
		t, err1 := strconv.ParseInt(fs[0], 10, 64)
		p, err2 := strconv.ParseUint(fs[1], 10, 8)
		a, err3 := strconv.ParseInt(fs[2], 10, 64)
		if err := errors.Join(err1, err2, err3); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		out = append(out, stamp{t, tracepoint.Point(p), a})
	}
	return out, sc.Err()
}

type pair struct{ a, b tracepoint.Point }

func printPairs(w io.Writer, st []stamp, share float64) {
	d := map[pair][]int64{}
	for i := 1; i < len(st); i++ {
		k := pair{st[i-1].p, st[i].p}
		d[k] = append(d[k], st[i].t-st[i-1].t)
	}
	most := 0
	for _, v := range d {
		most = max(most, len(v))
	}
	keys := make([]pair, 0, len(d))
	for k, v := range d {
		if float64(len(v)) >= share*float64(most) {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(x, y pair) int {
		return cmp.Or(cmp.Compare(len(d[y]), len(d[x])), cmp.Compare(x.a, y.a), cmp.Compare(x.b, y.b))
	})
	for _, k := range keys {
		v := d[k]
		slices.Sort(v)
		fmt.Fprintf(w, "  %-13s → %-13s %7d %8.2f %8.2f\n", k.a, k.b, len(v), us(v[len(v)/2]), us(v[len(v)*9/10]))
	}
}

func printAcross(w io.Writer, what string, from, to []stamp) {
	var wakes []int64
	for _, s := range to {
		if s.p == tracepoint.LoopWoke || s.p == tracepoint.CallerWoke {
			wakes = append(wakes, s.t)
		}
	}
	slices.Sort(wakes)
	var v []int64
	for _, s := range from {
		if s.p != tracepoint.WriteStart && s.p != tracepoint.PostSendStart {
			continue
		}
		if i, _ := slices.BinarySearch(wakes, s.t); i < len(wakes) && wakes[i]-s.t < 1e6 {
			v = append(v, wakes[i]-s.t)
		}
	}
	if len(v) == 0 {
		fmt.Fprintf(w, "  %s: none\n", what)
		return
	}
	slices.Sort(v)
	fmt.Fprintf(w, "  %-28s %7d %8.2f %8.2f\n", what, len(v), us(v[len(v)/2]), us(v[len(v)*9/10]))
}

func us(ns int64) float64 { return float64(ns) / 1e3 }
