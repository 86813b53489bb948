package bench

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSeqRoundTrip(t *testing.T) {
	tests := []struct {
		seq  uint64
		size int
	}{
		{0, 16}, {1, 16}, {0xdeadbeef, 64}, {1<<64 - 1, 16}, {12345, 4096},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.seq), func(t *testing.T) {
			b := newMsg(tt.size)
			require.Len(t, b, tt.size)
			putSeq(b, tt.seq)
			got, ok := parseSeq(b)
			require.True(t, ok)
			require.Equal(t, tt.seq, got)
		})
	}
}

func TestParseSeqRejects(t *testing.T) {
	tests := []struct {
		name string
		in   string
	}{
		{"empty", ""},
		{"short", "000000000000001"},
		{"upper case", "000000000000000A"},
		{"not hex", "00000000000000g0"},
		{"space", " 000000000000000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, ok := parseSeq([]byte(tt.in))
			require.False(t, ok)
		})
	}
}

func FuzzParseSeq(f *testing.F) {
	f.Add([]byte("00000000000000ffxxxx"))
	f.Add([]byte("zz"))
	f.Fuzz(func(t *testing.T, b []byte) {
		seq, ok := parseSeq(b)
		if !ok {
			return
		}
		out := make([]byte, seqLen)
		putSeq(out, seq)
		require.Equal(t, string(b[:seqLen]), string(out))
	})
}

func TestConfigRejectsBadFields(t *testing.T) {
	tests := []struct {
		name  string
		cfg   Config
		field string
	}{
		{"scenario", Config{Scenarios: []string{"nope"}}, "scenario"},
		{"transport", Config{Transports: []string{"udp"}}, "transport"},
		{"procs", Config{Procs: 3}, "procs"},
		{"size", Config{Sizes: []int{0}}, "size"},
		{"size too large", Config{Sizes: []int{maxSize + 1}}, "size"},
		{"peers", Config{Peers: -1}, "peers"},
		{"busy poll", Config{BusyPoll: 2 * time.Second}, "busy-poll"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			cfg.Procs = max(cfg.Procs, 1)
			err := cfg.normalize()
			require.ErrorIs(t, err, ErrConfig)
			require.Contains(t, err.Error(), tt.field+":")
		})
	}
}

func TestSpecsDefaultSuite(t *testing.T) {
	cfg := Config{Procs: 1}
	require.NoError(t, cfg.normalize())
	specs := cfg.specs()
	// Every scenario over every transport, burst once per default size; floor-stream only
	// in burst.
	require.Len(t, specs, (len(Transports)-1)*(len(Scenarios)-1+len(DefaultSizes))+len(DefaultSizes))
	for _, s := range specs {
		switch {
		case isPipelined(s.Scenario):
			// Without a count a pipelined run is timed: a steady state of BurstTime.
			require.True(t, s.Timed, "%s %s", s.Scenario, s.Transport)
			require.Equal(t, time.Second, s.Duration)
			if s.Transport == TransportOOBClassic {
				require.Equal(t, classicCeiling, s.Count)
			}
		default:
			require.False(t, s.Timed, s.Scenario)
		}
	}
	// With a count, burst sends it (at most 16 MiB per run by default is the untimed rule).
	cfg = Config{Procs: 1, Count: 100}
	require.NoError(t, cfg.normalize())
	for _, s := range cfg.specs() {
		require.False(t, s.Timed)
		require.Equal(t, 100, s.Count)
	}
}

func TestHistSummary(t *testing.T) {
	h := NewHist()
	for i := 1; i <= 1000; i++ {
		h.Record(int64(i) * 1000) // 1..1000 µs
	}
	s := h.Summary(1)
	require.EqualValues(t, 1000, s.Count)
	require.InDelta(t, 500, s.P50, 1)
	require.InDelta(t, 990, s.P99, 1)
	require.InDelta(t, 1000, s.Max, 1)
	half := h.Summary(2)
	require.InDelta(t, 250, half.P50, 1)
	require.NotEmpty(t, s.CDF)
	require.InDelta(t, 1, s.CDF[len(s.CDF)-1].Quantile, 1e-9)
	require.Nil(t, NewHist().Summary(1))
}

// TestFloorSendAllocatesNothing: one floor notify, both sides (client send, receiver
// delivery into a timed sink), allocates nothing once the connection is up.
func TestFloorSendAllocatesNothing(t *testing.T) {
	for _, spin := range []bool{false, true} {
		t.Run(fmt.Sprintf("spin=%v", spin), func(t *testing.T) {
			s := newSink()
			t0 := make([]atomic.Int64, 4)
			s.timed(t0, 0)
			n, err := newFloorNode(spin, spin, false, "", s)
			require.NoError(t, err)
			defer n.close(context.Background())
			c, err := n.newClient([]string{n.addr()})
			require.NoError(t, err)
			defer c.close()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			msg := newMsg(64)
			ctx := context.Background()
			require.NoError(t, c.send(ctx, 0, msg))
			// Not testing.AllocsPerRun: it sets GOMAXPROCS to 1, and two spinning threads on
			// one P hand over only at preemption.
			allocs := mallocs(func() {
				for range 200 {
					putSeq(msg, 1)
					t0[1].Store(nanotime())
					if err := c.send(ctx, 0, msg); err != nil {
						panic(err)
					}
				}
			})
			require.NoError(t, s.wait(ctx, 201))
			require.EqualValues(t, 201, s.latency().Count())
			t.Logf("%d allocations for 200 notifies", allocs)
			if !raceEnabled {
				require.Less(t, allocs, uint64(20), "%d allocations for 200 notifies", allocs)
			}
		})
	}
}

func TestPumpAllocatesNothingPerMessage(t *testing.T) {
	s := newSink()
	n, err := newFloorNode(false, false, false, "", s)
	require.NoError(t, err)
	defer n.close(context.Background())
	var workers []client
	for range 2 {
		c, err := n.newClient([]string{n.addr()})
		require.NoError(t, err)
		workers = append(workers, c)
	}
	defer closeClients(workers)
	ctx := context.Background()
	_, err = warmUp(ctx, workers, 1, 0, 64)
	require.NoError(t, err)
	few := mallocs(func() { runPump(ctx, workers, 1, 10, 64, 0) })
	many := mallocs(func() { runPump(ctx, workers, 1, 1010, 64, 0) })
	require.NoError(t, s.wait(ctx, 2+10+1010))
	if raceEnabled {
		t.Skip("allocation counts are checked without -race")
	}
	// The per-run setup (goroutines, histograms) is the same; 1000 more messages must not
	// add an allocation each.
	require.Less(t, many, few+100, "pump: %d allocations for 10 messages, %d for 1010", few, many)
}

// mallocs counts the heap allocations of the whole process while f runs (the receiving
// threads included).
func mallocs(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.Mallocs - before.Mallocs
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestProgressLine(t *testing.T) {
	var w lockedBuffer
	p := startProgress(&w, 3, 0)
	p.set(1, runSpec{Scenario: ScenarioBurst, Transport: TransportOOB, Size: 4096})
	require.Eventually(t, func() bool { return strings.Contains(w.String(), "bench [2/3] burst oob 4 KiB") },
		5*time.Second, 10*time.Millisecond)
	p.stop()
	require.True(t, strings.HasSuffix(w.String(), "\r\033[K"), "the line is cleared at the end")

	quiet := startProgress(&w, 1, time.Hour)
	before := w.String()
	quiet.stop()
	require.Equal(t, before, w.String(), "nothing before the threshold")
	newProgress(nil, 1).stop() // no writer: no goroutine, stop returns
}
