package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	ChildMain() // the receiving side of two-process runs re-executes this test binary
	goleak.VerifyTestMain(m)
}

func tinyConfig(t *testing.T, transports ...string) Config {
	dir := t.TempDir()
	return Config{
		Transports: transports,
		Procs:      1,
		Count:      50,
		Sizes:      []int{64, 4096},
		Peers:      2,
		Window:     4,
		Warmup:     4,
		Duration:   200 * time.Millisecond,
		JSONPath:   filepath.Join(dir, "out.json"),
		PlotPath:   filepath.Join(dir, "out.svg"),
		ChildArgs:  []string{"-test.run=^$"},
		Repeat:     1,
	}
}

func checkOutputs(t *testing.T, cfg Config, rep *Report) {
	t.Helper()
	b, err := os.ReadFile(cfg.JSONPath)
	require.NoError(t, err)
	require.NotEmpty(t, b)
	var back Report
	require.NoError(t, json.Unmarshal(b, &back))
	require.Len(t, back.Results, len(rep.Results))
	require.NotEmpty(t, back.Settings.GoVersion)
	require.NotEmpty(t, back.Settings.Commit)

	svg, err := os.ReadFile(cfg.PlotPath)
	require.NoError(t, err)
	require.NotEmpty(t, svg)
	dec := xml.NewDecoder(bytes.NewReader(svg))
	var root string
	for {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		if se, ok := tok.(xml.StartElement); ok && root == "" {
			root = se.Name.Local
		}
	}
	require.Equal(t, "svg", root)
	// The whole document must parse, not only its start.
	require.NoError(t, xml.Unmarshal(svg, new(struct {
		XMLName xml.Name `xml:"svg"`
	})))
}

func TestTinySuiteOneProcess(t *testing.T) {
	cfg := tinyConfig(t)
	var out bytes.Buffer
	rep, err := Run(context.Background(), cfg, &out)
	require.NoError(t, err)
	t.Log("\n" + out.String())
	require.Empty(t, rep.Failures)
	// Burst sweeps two sizes; floor-stream runs in burst only.
	require.Len(t, rep.Results, (len(Transports)-1)*(len(Scenarios)+1)+2)
	for _, r := range rep.Results {
		require.Zero(t, r.Errors, "%s %s: %s", r.Scenario, r.Transport, r.FirstError)
		require.Empty(t, r.FirstError)
		if !isFloor(r.Transport) && r.Scenario != ScenarioIdle {
			require.Positive(t, r.Wakeups, "%s %s", r.Scenario, r.Transport)
			require.Positive(t, r.VsFloor, "%s %s", r.Scenario, r.Transport)
		}
		switch r.Scenario {
		case ScenarioLatency:
			require.NotNil(t, r.OneWay)
			upTo(t, 50, int64(r.OneWay.Count), r)
			require.Equal(t, "one clock", r.OneWayMethod)
		case ScenarioConnect:
			require.NotNil(t, r.Connect)
			require.EqualValues(t, 2, r.Connect.Count)
		case ScenarioIdle:
		case ScenarioBidi:
			upTo(t, 100, int64(r.Notifies), r)
		default:
			upTo(t, 50, int64(r.Notifies), r)
		}
	}
	checkOutputs(t, cfg, rep)
}

func TestTwoProcesses(t *testing.T) {
	cfg := tinyConfig(t, TransportRDMA, TransportOOBClassic, FloorBlock)
	cfg.Procs = 2
	cfg.Sizes = []int{64}
	cfg.Scenarios = []string{ScenarioLatency, ScenarioBidi}
	var out bytes.Buffer
	rep, err := Run(context.Background(), cfg, &out)
	require.NoError(t, err)
	t.Log("\n" + out.String())
	require.Empty(t, rep.Failures)
	for _, r := range rep.Results {
		require.Zero(t, r.Errors, "%s %s: %s", r.Scenario, r.Transport, r.FirstError)
		require.Positive(t, r.CPUChildUS, "%s %s", r.Scenario, r.Transport)
		if r.Scenario == ScenarioLatency {
			require.Contains(t, r.OneWayMethod, "rtt/2")
			upTo(t, 50, int64(r.OneWay.Count), r)
		}
	}
}

// TestNoEcho: with NoEcho a two-process latency round trip of the engines is a notify and its
// ACK, measured as the floors' is (rtt/2 of the call); by default it is a notify and the
// receiver's echo, and floor-echo's the same four frames over raw sockets (with no engine
// breakdown).
func TestNoEcho(t *testing.T) {
	for _, noEcho := range []bool{false, true} {
		cfg := tinyConfig(t, TransportOOB, TransportRDMA, FloorEcho)
		cfg.Procs = 2
		cfg.Sizes = []int{64}
		cfg.Scenarios = []string{ScenarioLatency}
		cfg.NoEcho = noEcho
		var out bytes.Buffer
		rep, err := Run(context.Background(), cfg, &out)
		require.NoError(t, err)
		require.Empty(t, rep.Failures)
		require.Equal(t, noEcho, rep.Settings.NoEcho)
		require.Len(t, rep.Results, 3)
		for _, r := range rep.Results {
			require.Zero(t, r.Errors, "%s: %s", r.Transport, r.FirstError)
			upTo(t, 50, int64(r.OneWay.Count), r)
			if r.Transport == FloorEcho {
				require.Nil(t, r.Breakdown)
			}
			if noEcho {
				require.Equal(t, "rtt/2 (ack)", r.OneWayMethod, r.Transport)
				require.Nil(t, r.Breakdown, r.Transport)
			} else {
				require.Equal(t, "rtt/2 (echo notify)", r.OneWayMethod, r.Transport)
			}
		}
	}
}

// TestFloorEpoll: floor-epoll runs the latency scenario only (in one process and in two),
// every message delivered and acknowledged, and the engines' key figure stays against
// floor-block.
func TestFloorEpoll(t *testing.T) { testWaitFloor(t, FloorEpoll) }

// TestFloorLoop: floor-loop, the same on the engines' reactor.
func TestFloorLoop(t *testing.T) { testWaitFloor(t, FloorLoop) }

// TestFloorNode: floor-node, the same as the engine's OOB frames through an oob.Node.
func TestFloorNode(t *testing.T) { testWaitFloor(t, FloorNode) }

// TestFloorURing: floor-uring, the same through io_uring (where the kernel has it).
func TestFloorURing(t *testing.T) {
	if err := probeURing(); err != nil {
		t.Skipf("no io_uring here: %v", err)
	}
	testWaitFloor(t, FloorURing)
}

// TestFloorEcho: floor-echo runs the latency scenario only (its echo: TestNoEcho).
func TestFloorEcho(t *testing.T) { testWaitFloor(t, FloorEcho) }

// TestFloorVerbsEchoOnSoft: on the soft provider floor-verbs-echo's echo is refused with a
// reason (its manual progress would hold every packet for the backstop); in one process,
// where there is no echo, it runs floor-verbs's exchange. On a libibverbs device:
// TestFloorVerbsEcho (-tags rdma).
func TestFloorVerbsEchoOnSoft(t *testing.T) {
	cfg := tinyConfig(t, FloorVerbsEcho)
	cfg.Procs = 2
	cfg.Provider = "soft"
	cfg.Sizes = []int{64}
	cfg.Scenarios = []string{ScenarioLatency}
	var out bytes.Buffer
	rep, err := Run(context.Background(), cfg, &out)
	require.NoError(t, err)
	require.Len(t, rep.Failures, 1)
	require.Contains(t, rep.Failures[0].Error, "floor-verbs-echo: the soft provider makes progress only for a thread that waits on the device's first channel")
	require.Contains(t, rep.Failures[0].Error, "--provider verbs")

	cfg.Procs = 1
	rep, err = Run(context.Background(), cfg, &out)
	require.NoError(t, err)
	require.Empty(t, rep.Failures)
	require.Len(t, rep.Results, 1)
	r := rep.Results[0]
	require.Zero(t, r.Errors, r.FirstError)
	require.Equal(t, "one clock", r.OneWayMethod, "one process: each message timed to its delivery")
	upTo(t, 50, int64(r.OneWay.Count), r)
}

func testWaitFloor(t *testing.T, floor string) {
	for _, procs := range []int{1, 2} {
		cfg := tinyConfig(t, TransportOOB, FloorBlock, floor)
		cfg.Procs = procs
		cfg.Sizes = []int{64}
		cfg.Scenarios = []string{ScenarioLatency, ScenarioBurst}
		var out bytes.Buffer
		rep, err := Run(context.Background(), cfg, &out)
		require.NoError(t, err)
		require.Empty(t, rep.Failures)
		var fl, oob *Result
		for _, r := range rep.Results {
			require.Zero(t, r.Errors, "%s %s: %s", r.Scenario, r.Transport, r.FirstError)
			switch {
			case r.Transport == floor:
				require.Equal(t, ScenarioLatency, r.Scenario, "%s is a ping-pong", floor)
				fl = r
			case r.Transport == TransportOOB && r.Scenario == ScenarioLatency:
				oob = r
			}
		}
		require.NotNil(t, fl, "procs %d", procs)
		upTo(t, 50, int64(fl.OneWay.Count), fl)
		require.NotNil(t, oob)
		require.Contains(t, oob.VsFloorOf, FloorBlock)
	}
}

func upTo(t *testing.T, want, got int64, r *Result) {
	t.Helper()
	require.Positive(t, got, "%s %s", r.Scenario, r.Transport)
	require.LessOrEqual(t, got, want, "%s %s", r.Scenario, r.Transport)
}

func TestPlotWithoutData(t *testing.T) {
	// No latency and no burst results: both panels are empty and the SVG still well-formed.
	path := filepath.Join(t.TempDir(), "empty.svg")
	require.NoError(t, writePlot(path, &Report{Results: []*Result{{Scenario: ScenarioIdle, Transport: FloorBlock}}}))
	svg, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, xml.Unmarshal(svg, new(struct {
		XMLName xml.Name `xml:"svg"`
	})))
}

// TestVerbsFloors: the verbs floors run on the device an engine takes (here the soft
// provider; over a libibverbs with --provider verbs), in two processes, and rdma_twosided's
// key figure is taken against them.
func TestVerbsFloors(t *testing.T) {
	cfg := tinyConfig(t, TransportRDMA, FloorVerbs, FloorVerbsSpin)
	cfg.Procs = 2
	cfg.Provider = "soft"
	cfg.Sizes = []int{64}
	cfg.Scenarios = []string{ScenarioLatency, ScenarioBurst, ScenarioIdle}
	var out bytes.Buffer
	rep, err := Run(context.Background(), cfg, &out)
	require.NoError(t, err)
	t.Log("\n" + out.String())
	require.Empty(t, rep.Failures)
	require.Len(t, rep.Results, 2*3+1, "the verbs floors run latency and burst only")
	require.Equal(t, "soft:soft0", rep.Settings.Provider)
	for _, r := range rep.Results {
		require.Zero(t, r.Errors, "%s %s: %s", r.Scenario, r.Transport, r.FirstError)
		if r.Scenario == ScenarioIdle {
			continue
		}
		upTo(t, 50, r.Notifies, r)
		if r.Transport == TransportRDMA {
			require.Positive(t, r.VsFloor, r.Scenario)
			require.Contains(t, r.VsFloorOf, FloorVerbs, r.Scenario)
		}
	}
}

func TestProviderChecked(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.Provider = "nosuch"
	err := cfg.normalize()
	require.ErrorIs(t, err, ErrConfig)
	require.Contains(t, err.Error(), `provider: "nosuch": not built into this binary`)
}
