package metrics

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv/soft"
	"github.com/twosided/twosided/notify"
)

// The device's async events are exported: a PORT_ERR on the engine's soft device shows in
// twosided_device_events_total{event="port_err"} and twosided_device_port_down.
func TestDeviceEventMetrics(t *testing.T) {
	t.Setenv(soft.EnvDevices, "6")
	e := newEngine(t, notify.TransportRDMATwoSided, notify.WithDeviceFilters("soft5"))
	c := New(e)
	m := scrape(t, c)
	for _, ev := range deviceEvents {
		v, ok := m[`twosided_device_events_total{event="`+ev+`"}`]
		require.True(t, ok, ev)
		require.Zero(t, v)
	}
	require.NoError(t, soft.Default().SetPortState("soft5", false))
	defer func() { require.NoError(t, soft.Default().SetPortState("soft5", true)) }()
	require.Eventually(t, func() bool {
		m = scrape(t, c)
		return m[`twosided_device_events_total{event="port_err"}`] == 1 && m["twosided_device_port_down"] == 1
	}, 30*time.Second, 5*time.Millisecond)
}
