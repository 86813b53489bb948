//go:build rdma

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv"
)

// envDoctorChild names the file where TestDoctorVerbsFaults' child process writes its
// doctor run (softverbs reads its fault variables once, when the library is first used,
// so each fault runs in a child process of its own).
const envDoctorChild = "TWOSIDED_TEST_DOCTOR_OUT"

// verbsDevice is the first device libibverbs lists; the test is skipped without one (run
// with LD_LIBRARY_PATH=$PWD/build/softverbs, after make softverbs, to use softverbs).
func verbsDevice(t *testing.T) ibv.DeviceInfo {
	t.Helper()
	p, err := ibv.LookupProvider(verbsProvider)
	require.NoError(t, err)
	devs, err := p.GetDeviceList()
	if err != nil || len(devs) == 0 {
		t.Skipf("libibverbs lists no device (%v): make softverbs and set LD_LIBRARY_PATH=$PWD/build/softverbs", err)
	}
	return devs[0]
}

// Through libibverbs: the NIC path works: exit status 0, the verdict names the device, the
// port and the GID in use; loopback and echo pass over the ctrl channel.
func TestDoctorVerbs(t *testing.T) {
	dev := verbsDevice(t)
	if _, ok := dev.ActivePort(); !ok {
		t.Skipf("%s has no active port", dev.Name)
	}
	code, rep, out := runDoctorJSON(t, "--provider", verbsProvider)
	require.Equal(t, 0, code, out)
	require.True(t, rep.OK, out)
	require.True(t, strings.HasPrefix(rep.Verdict, "OK: rdma_twosided works on "+dev.Name+" port 1 (GID "), rep.Verdict)
	d := findDevice(t, rep, dev.Name)
	require.True(t, d.OK, out)
	require.NotNil(t, d.Ports[0].Loopback)
	require.True(t, d.Ports[0].Loopback.OK, out)
	require.NotNil(t, d.Echo)
	require.Equal(t, "channel", d.Echo.Path, out)
	if strings.HasPrefix(dev.Name, "softverbs") {
		require.Contains(t, rep.Verdict, "(GID 3, RoCE v2, ::ffff:127.0.0.1)")
	}
}

// Faults injected in softverbs, each in a child process: each gives its own verdict and
// exit status 1.
func TestDoctorVerbsFaults(t *testing.T) {
	if os.Getenv(envDoctorChild) != "" {
		t.Skip("the child runs TestDoctorVerbsChild")
	}
	dev := verbsDevice(t)
	if !strings.HasPrefix(dev.Name, "softverbs") {
		t.Skip("needs softverbs (its fault variables)")
	}
	for _, tc := range []struct {
		name    string
		env     []string
		args    []string
		verdict string
		hint    string
		ok      bool // works, with a warning
	}{
		{"port down", []string{"SOFTVERBS_PORT=down"}, nil,
			"FAIL: " + dev.Name + " port 1 is PORT_DOWN", "bring the link up", false},
		{"RTR refused", []string{"SOFTVERBS_RTR_FAIL=EINVAL"}, nil,
			"FAIL: " + dev.Name + " port 1: loopback: qp ", "set MC_GID_INDEX to another entry", false},
		{"RTR hangs past --timeout", []string{"SOFTVERBS_RTR_DELAY_MS=60000"}, []string{"--timeout", "1s"},
			"FAIL: " + dev.Name + " port 1: loopback: verbs calls: no answer within 1s (--timeout)", "a verb did not return within --timeout", false},
		{"MC_GID_INDEX on an empty entry", []string{"MC_GID_INDEX=9"}, nil,
			"FAIL: " + dev.Name + " port 1 has no source GID: ibv: gid index 9 on port 1: empty", "unset MC_GID_INDEX (auto picks index 3, RoCE v2, ::ffff:127.0.0.1)", false},
		{"no RoCE v2 in the GID table", []string{"SOFTVERBS_ROCE=v1"}, nil,
			"OK: rdma_twosided works on " + dev.Name + " port 1 (GID 2, RoCE v1, ::ffff:127.0.0.1); RoCE v1 only", "it is not routed beyond the L2 segment", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outFile := filepath.Join(t.TempDir(), "doctor.json")
			cmd := exec.Command(os.Args[0], "-test.run=^TestDoctorVerbsChild$", "-test.count=1", "-test.v")
			cmd.Env = append(append(os.Environ(), tc.env...), envDoctorChild+"="+outFile,
				"TWOSIDED_TEST_DOCTOR_ARGS="+strings.Join(tc.args, " "))
			b, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s", b)
			require.Contains(t, string(b), "--- PASS: TestDoctorVerbsChild", "%s", b)
			raw, err := os.ReadFile(outFile)
			require.NoError(t, err)
			code, rest, _ := strings.Cut(string(raw), "\n")
			var rep doctorReport
			require.NoError(t, json.Unmarshal([]byte(rest), &rep), "%s", raw)
			if tc.ok {
				require.Equal(t, "0", code, "%s", raw)
				require.True(t, rep.OK)
			} else {
				require.Equal(t, "1", code, "%s", raw)
				require.False(t, rep.OK)
			}
			require.True(t, strings.HasPrefix(rep.Verdict, tc.verdict), "verdict: %s", rep.Verdict)
			require.Contains(t, strings.Join(rep.Hints, "\n"), tc.hint)
		})
	}
}

// TestDoctorVerbsChild is TestDoctorVerbsFaults' child: it runs doctor on the verbs
// provider and writes the exit status and the JSON report to the file named by
// envDoctorChild.
func TestDoctorVerbsChild(t *testing.T) {
	outFile := os.Getenv(envDoctorChild)
	if outFile == "" {
		t.Skip("run by TestDoctorVerbsFaults")
	}
	args := []string{"doctor", "--json", "--provider", verbsProvider}
	args = append(args, strings.Fields(os.Getenv("TWOSIDED_TEST_DOCTOR_ARGS"))...)
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, &out, &errOut)
	require.NoError(t, os.WriteFile(outFile, []byte(strconv.Itoa(code)+"\n"+out.String()), 0o600))
}
