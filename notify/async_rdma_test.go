//go:build rdma

package notify

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Through libibverbs: softverbs' port going down raises IBV_EVENT_PORT_ERR on every
// context; the engine's channels fail at once (keepalive off: nothing else would notice),
// notifies go over OOB, and after IBV_EVENT_PORT_ACTIVE a channel is made again.
func TestAsyncPortErrVerbs(t *testing.T) {
	ctl, _, child := softverbsChild(t, "TestAsyncPortErrVerbs", "port=up\n", "its control file takes the port down")
	if !child {
		return
	}
	send, recv, ctx := verbsPairUp(t)

	require.NoError(t, os.WriteFile(ctl, []byte("port=down\n"), 0o600))
	require.Eventually(t, func() bool {
		ev := send.DeviceEvents()
		return ev.PortErr == 1 && ev.ChannelsFailed == 1 && send.Stats().ChannelsUp == 0
	}, bounded, 10*time.Millisecond, "PORT_ERR must fail the channel: %+v", send.DeviceEvents())
	sendRecv(t, ctx, send, recv, "oob")
	require.Zero(t, send.Stats().ChannelsUp)

	require.NoError(t, os.WriteFile(ctl, []byte("port=up\n"), 0o600))
	require.Eventually(t, func() bool { return send.DeviceEvents().PortActive == 1 }, bounded, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		sendRecv(t, ctx, send, recv, "again")
		return send.Stats().ChannelsUp == 1
	}, bounded, 100*time.Millisecond, "a channel is made again once the port is active")
}

// optNames are the device names of WithDeviceFilters among opts.
func optNames(opts []Option) []string {
	var c config
	for _, o := range opts {
		o(&c)
	}
	return c.filters
}

// Through libibverbs: softverbs' device turning fatal raises IBV_EVENT_DEVICE_FATAL and
// refuses to open while it lasts; the engine fails its channels, serves notifies over OOB,
// keeps trying to open the device (the tries fail while it is fatal), and once the device
// is back opens it again and makes channels on it.
func TestAsyncDeviceFatalVerbs(t *testing.T) {
	ctl, _, child := softverbsChild(t, "TestAsyncDeviceFatalVerbs", "fatal=0\n", "its control file makes the device fatal")
	if !child {
		return
	}
	send, recv, ctx := verbsPairUp(t)

	require.NoError(t, os.WriteFile(ctl, []byte("fatal=1\n"), 0o600))
	require.Eventually(t, func() bool {
		ev := send.DeviceEvents()
		return ev.DeviceFatal == 1 && ev.ChannelsFailed == 1 && send.Stats().ChannelsUp == 0
	}, bounded, 10*time.Millisecond, "DEVICE_FATAL must fail the channel: %+v", send.DeviceEvents())
	sendRecv(t, ctx, send, recv, "oob")
	require.Eventually(t, func() bool { return send.DeviceEvents().ReopenFailed > 0 }, bounded, 10*time.Millisecond,
		"tries to open the fatal device again: %+v", send.DeviceEvents())
	require.Zero(t, send.DeviceEvents().Reopened, "opened while fatal")

	require.NoError(t, os.WriteFile(ctl, []byte("fatal=0\n"), 0o600))
	require.Eventually(t, func() bool { return send.DeviceEvents().Reopened == 1 }, bounded, 10*time.Millisecond,
		"%+v", send.DeviceEvents())
	require.Eventually(t, func() bool {
		sendRecv(t, ctx, send, recv, "again")
		return send.Stats().ChannelsUp == 1
	}, bounded, 100*time.Millisecond, "a channel is made again on the reopened device")
	t.Logf("device events: %+v", send.DeviceEvents())
}

// softverbsChild runs test name again in a child process with softverbs' control file set
// (softverbs reads SOFTVERBS_CTL once, when the library is first used), the file holding
// initial. In the parent it runs the child, requires its PASS and returns its output with
// child false; in the child it returns the control file's path with child true. It skips
// without softverbs; why says what the control file is for.
func softverbsChild(t *testing.T, name, initial, why string) (ctl string, out []byte, child bool) {
	t.Helper()
	const env = "TWOSIDED_TEST_SOFTVERBS_CTL"
	if ctl := os.Getenv(env); ctl != "" {
		return ctl, nil, true
	}
	if !strings.Contains(strings.Join(optNames(verbsOpts(t)), ","), "softverbs") {
		t.Skip("needs softverbs (" + why + ")")
	}
	ctl = filepath.Join(t.TempDir(), "ctl")
	require.NoError(t, os.WriteFile(ctl, []byte(initial), 0o600))
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "SOFTVERBS_CTL="+ctl, env+"="+ctl)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "--- PASS: "+name)
	return "", out, false
}

// verbsPairUp is two engines on the verbs device, OOB fallback on, keepalive off (so that
// nothing but an async event notices the port), with their channel up.
func verbsPairUp(t *testing.T) (send, recv *Engine, ctx context.Context) {
	t.Helper()
	opts := append(verbsOpts(t), WithOOBFallback(true), WithKeepalive(0))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	var err error
	recv, err = New(opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = recv.Close(ctx) })
	send, err = New(opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = send.Close(ctx) })
	sendRecv(t, ctx, send, recv, "up")
	require.Equal(t, 1, send.Stats().ChannelsUp)
	return send, recv, ctx
}
