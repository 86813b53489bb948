package soak

import (
	"context"
	"fmt"
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

// testConfig is a short soak: a few seconds, small messages (under -race a 1 MiB OOB
// notify takes seconds on a loaded machine), the two engines of two agents, each peer sent
// to by both its names.
func testConfig(t *testing.T, d time.Duration, faults []string) Config {
	return Config{
		Duration: d, Seed: 42, Faults: faults, Procs: 2,
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
		Log:          testLog{t},
		DeviceCtlDir: t.TempDir(), // device faults: on softverbs only (TestSoakVerbs)
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
	t.Logf("%s: ops %d, calls %d, acked %d, checked %d, faults %v, allowances %v, violations %v",
		o.r.Verdict, o.r.Ops, o.r.Calls, o.r.Acked, o.r.NotifiesChecked, o.r.Faults, o.r.Allowances, o.r.Violations)
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

func TestSoakPlants(t *testing.T) {
	for plant, kind := range map[string]string{PlantLose: VLost, PlantDup: VDuplicate, PlantReorder: VReorder} {
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
