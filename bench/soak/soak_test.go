package soak

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/twosided/twosided/notify"
)

// agentEnv makes the test binary run as a soak agent with the spec it holds.
const agentEnv = "TWOSIDED_SOAK_AGENT_SPEC"

func TestMain(m *testing.M) {
	if raw, ok := os.LookupEnv(agentEnv); ok {
		spec, err := ParseAgentSpec(raw)
		if err == nil {
			err = RunAgent(context.Background(), spec, os.Stdin, os.Stdout)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "soak agent:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// testSeed draws, among the first incarnations, a handler that answers every notify it
// takes (a0e0.1) and one that answers none (a1e0.1); TestSoakAnswers holds it to that.
const testSeed = 3

// testConfig is a short soak: a few seconds, small messages (under -race a 1 MiB OOB
// notify takes seconds on a loaded machine), the two engines of two agents, each peer sent
// to by both its names.
func testConfig(t *testing.T, d time.Duration, faults []string) Config {
	return Config{
		Duration: d, Seed: testSeed, Faults: faults, Procs: 2,
		Transports: []string{notify.TransportRDMATwoSided, notify.TransportOOB}, Provider: "soft",
		FaultEvery: 700 * time.Millisecond,
		Mix:        Mix{MaxSize: 64 << 10, MaxWindow: 16},
		// Enough work for the plants to act and be seen, however slow the machine.
		MinDelivered: 400,
		Command: func(args []string) *exec.Cmd {
			require.Len(t, args, 2)
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), agentEnv+"="+args[1])
			return cmd
		},
		Log: testLog{t},
		// Resources judged in a short run too: a baseline after 1 s, samples every 300 ms.
		SampleEvery: 300 * time.Millisecond, ResWarmup: time.Second,
		DeviceCtlDir: t.TempDir(), // device faults: on softverbs only (TestSoakVerbs)
		// A pair whose sender waited for the credit of a receiver killed then is held to the
		// general recovery bound here, not the CLI's tighter one: under -race on a loaded
		// machine a healthy engine's probe, handshake and retry take seconds each.
		StallBound: DefaultRecoveryBound,
	}
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) { l.t.Log(string(p)); return len(p), nil }

// runSoak runs cfg under a hang guard (generous: the run's own guards end it far sooner).
func runSoak(t *testing.T, cfg Config) (Result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	type out struct {
		r   Result
		err error
	}
	done := make(chan out, 1)
	go func() { r, err := Run(ctx, cfg); done <- out{r, err} }()
	o := <-done
	t.Logf("%s: ops %d, calls %d, acked %d, checked %d, answers %+v, faults %v, allowances %v, violations %v",
		o.r.Verdict, o.r.Ops, o.r.Calls, o.r.Acked, o.r.NotifiesChecked, o.r.Answers, o.r.Faults, o.r.Allowances, o.r.Violations)
	return o.r, o.err
}

// ciFaults are the faults of the short soaks in make test: all of them (device faults act
// on softverbs only, TestSoakVerbs).
var ciFaults = AllFaults

func TestSoakClean(t *testing.T) {
	r, err := runSoak(t, testConfig(t, 4*time.Second, ciFaults))
	for _, v := range r.Details {
		t.Logf("%s at step %d, %s: %s\nhistory:\n%s\nschedule:\n%s", v.Kind, v.Step, v.Stream, v.Detail,
			strings.Join(v.History, "\n"), strings.Join(v.Schedule, "\n"))
	}
	require.NoError(t, err)
	require.Equal(t, "PASS", r.Verdict)
	require.Empty(t, r.Violations)
	require.Positive(t, r.NotifiesChecked, "nothing was checked")
	require.Positive(t, r.Ops)
}

// TestSoakAnswers: where an engine's consumer is a handler that answers (the seed's
// a0e0.1, every notify it takes), the run's summary shows answers made, acknowledged and
// delivered, and the contract holds for them. No faults: that incarnation lives the whole
// run, and takes notifies from its first operations on.
func TestSoakAnswers(t *testing.T) {
	cfg := testConfig(t, 2*time.Second, nil)
	require.True(t, Answering(cfg.Seed, "a0e0", 1), "the seed draws no answering handler: pick another")
	require.Equal(t, 1, NewAnswerGen(cfg.Seed, "a0e0.1").Every())
	require.Equal(t, ConsumeHandler, Consumer(cfg.Seed, "a1e0", 1))
	require.False(t, Answering(cfg.Seed, "a1e0", 1), "a handler that does not answer is in the mix too")
	r, err := runSoak(t, cfg)
	for _, v := range r.Details {
		t.Logf("%s at step %d, %s: %s\nhistory:\n%s", v.Kind, v.Step, v.Stream, v.Detail, strings.Join(v.History, "\n"))
	}
	require.NoError(t, err)
	require.Equal(t, "PASS", r.Verdict)
	require.Equal(t, 1, r.Answers.Engines)
	require.Positive(t, r.Answers.Calls, "no answer was made")
	require.Positive(t, r.Answers.Acked)
	require.Positive(t, r.Answers.Delivered)
	require.Positive(t, r.Answers.Checked)
	require.LessOrEqual(t, r.Answers.Checked, r.NotifiesChecked)
	var report strings.Builder
	r.Report(&report, "")
	require.Contains(t, report.String(), fmt.Sprintf("answers from handlers: 1 answering engines; calls %d", r.Answers.Calls))
}

func TestSoakPlants(t *testing.T) {
	for plant, kind := range map[string]string{PlantLose: VLost, PlantDup: VDuplicate, PlantReorder: VReorder, PlantLeak: VLeak} {
		t.Run(plant, func(t *testing.T) {
			cfg := testConfig(t, 2*time.Second, nil)
			cfg.Plant = plant
			r, err := runSoak(t, cfg)
			for _, v := range r.Details {
				if v.Kind != kind {
					t.Logf("%s at step %d, %s: %s\nhistory:\n%s\nschedule:\n%s", v.Kind, v.Step, v.Stream, v.Detail,
						strings.Join(v.History, "\n"), strings.Join(v.Schedule, "\n"))
				}
			}
			require.ErrorIs(t, err, ErrViolation)
			require.Equal(t, "FAIL", r.Verdict)
			require.Positive(t, r.Violations[kind], "the planted %s was not reported: %v", plant, r.Violations)
			require.Len(t, r.Violations, 1, "only the planted kind: %v", r.Violations)
		})
	}
}

// TestSoakRecoveryBound: a bound no engine can meet is reported, for every pair of new
// engines, as slow_recovery: the judgement can fail.
func TestSoakRecoveryBound(t *testing.T) {
	cfg := testConfig(t, 2*time.Second, nil)
	cfg.RecoveryBound = time.Nanosecond
	r, err := runSoak(t, cfg)
	require.ErrorIs(t, err, ErrViolation)
	require.Positive(t, r.Violations[VSlowRecovery], "%v", r.Violations)
	require.Len(t, r.Violations, 1, "only slow_recovery: %v", r.Violations)
}

// TestSoakRemoteAgent: one local agent and one of an agent host (here in this process, on
// another loopback address), with kill and stop faults, which the host carries out on its
// child: the contract holds, and the remote agent's engines took part.
func TestSoakRemoteAgent(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	h := &AgentHost{Advertise: "127.0.0.1", Log: testLog{t}, Command: func(args []string) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), agentEnv+"="+args[1])
		return cmd
	}}
	go func() { served <- h.Serve(ctx, l) }()
	defer func() { cancel(); require.NoError(t, <-served) }()

	cfg := testConfig(t, 3*time.Second, []string{FaultStop, FaultPause})
	cfg.Procs = 1
	cfg.Remote = []string{l.Addr().String()}
	r, err := runSoak(t, cfg)
	require.NoError(t, err)
	require.Equal(t, "PASS", r.Verdict)
	require.Equal(t, 2, r.Procs)
	require.Positive(t, r.NotifiesChecked)
}

// TestAgentHostRefuses: a wrong version, an unknown request and a bad spec get a clear
// refusal; a parent that is no agent host is reported as such.
func TestAgentHostRefuses(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	h := &AgentHost{Advertise: "127.0.0.1", Command: func([]string) *exec.Cmd { return exec.Command("false") }}
	go func() { served <- h.Serve(ctx, l) }()
	defer func() { cancel(); require.NoError(t, <-served) }()
	ask := func(line string) string {
		c, err := net.Dial("tcp", l.Addr().String())
		require.NoError(t, err)
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(30 * time.Second)) // a hang guard
		_, err = c.Write([]byte(line + "\n"))
		require.NoError(t, err)
		b, _ := io.ReadAll(c)
		return string(b)
	}
	require.Contains(t, ask("!ports 9 2"), "!error version")
	require.Contains(t, ask("!explode 1 x"), "!error unknown request")
	require.Contains(t, ask("!ports 1 0"), "!error ports")
	require.Contains(t, ask("!spawn 1 {}"), "!error --spec")
	addrs := ask("!ports 1 3")
	require.True(t, strings.HasPrefix(addrs, "!addrs 127.0.0.1:"), addrs)
	require.Len(t, strings.Split(strings.TrimSpace(strings.TrimPrefix(addrs, "!addrs ")), ","), 3)

	_, err = hostPorts(l.Addr().String(), 65)
	require.ErrorIs(t, err, ErrRemote)
	require.ErrorContains(t, err, "refused")
	silent, err := net.Listen("tcp", "127.0.0.1:0") // accepts, says nothing
	require.NoError(t, err)
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	_, err = hostPorts(silent.Addr().String(), 2)
	require.ErrorIs(t, err, ErrRemote)
	require.ErrorContains(t, err, "--agent-host")
}
