package notify

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ctrlchannel"
	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/ibv/soft"
)

// chanQPs reads the QP attributes of every ctrl channel of e, on its loop.
func chanQPs(t *testing.T, e *Engine) (attrs []ibv.QPAttr, caps []ibv.QPCap, inline []int) {
	t.Helper()
	done := make(chan error, 1)
	require.NoError(t, e.loop.Submit(func() {
		for _, ch := range e.chans {
			a, c, in, err := ch.QPAttr()
			if err != nil {
				done <- err
				return
			}
			attrs, caps, inline = append(attrs, a), append(caps, c), append(inline, in)
		}
		done <- nil
	}))
	require.NoError(t, <-done)
	return attrs, caps, inline
}

// Mooncake's QP knobs reach the ctrl channels' QPs: traffic class and SL in the address
// vector, the ACK timeout and retry count at RTS, max inline data at creation; a P_Key
// index the port lacks is refused at INIT (soft ports have one entry), by name.
func TestQPKnobs(t *testing.T) {
	t.Setenv(soft.EnvDevices, "6") // gidPair's soft4 and soft5
	opts := []Option{WithProvider("soft"), WithTransport(TransportRDMATwoSided), WithOOBFallback(false),
		WithTrafficClass(106), WithServiceLevel(3), WithAckTimeout(12), WithRetryCount(5), WithMaxInline(128)}
	send, recv, err := gidPair(t, opts)
	require.NoError(t, err)
	for _, e := range []*Engine{send, recv} {
		attrs, caps, inline := chanQPs(t, e)
		require.Len(t, attrs, 1)
		a := attrs[0]
		require.Equal(t, uint8(106), a.AHAttr.TrafficClass)
		require.Equal(t, uint8(3), a.AHAttr.SL)
		require.Equal(t, uint8(12), a.Timeout)
		require.Equal(t, uint8(5), a.RetryCnt)
		require.Equal(t, uint32(128), caps[0].MaxInlineData)
		require.Equal(t, 128, inline[0])
	}

	// Defaults: Mooncake's (timeout 14, retry 7, TC and SL 0, 64 bytes inline); 0 inline: none.
	send, _, err = gidPair(t, []Option{WithProvider("soft"), WithTransport(TransportRDMATwoSided), WithOOBFallback(false), WithMaxInline(0)})
	require.NoError(t, err)
	attrs, caps, inline := chanQPs(t, send)
	require.Equal(t, uint8(14), attrs[0].Timeout)
	require.Equal(t, uint8(7), attrs[0].RetryCnt)
	require.Zero(t, attrs[0].AHAttr.TrafficClass)
	require.Zero(t, caps[0].MaxInlineData)
	require.Zero(t, inline[0])

	_, _, err = gidPair(t, []Option{WithProvider("soft"), WithTransport(TransportRDMATwoSided), WithOOBFallback(false), WithPKeyIndex(1)})
	require.Error(t, err)
	require.ErrorContains(t, err, "PKeyIndex")
}

// The knobs come from the environment with Mooncake's names, checked against one table.
func TestQPKnobsEnv(t *testing.T) {
	c := defaultConfig()
	c.fromEnv(envOf(map[string]string{"MC_IB_TC": "96", "MC_IB_SL": "15", "MC_PKEY_INDEX": "2",
		"MC_MAX_INLINE": "0", "MC_IB_RETRY_CNT": "3", "MC_IB_TIMEOUT": "17"}))
	require.NoError(t, c.validate())
	require.Equal(t, qpKnobs{trafficClass: 96, serviceLevel: 15, pkeyIndex: 2, maxInline: 0, retryCount: 3, ackTimeout: 17}, c.qp)
	for k, v := range map[string]string{"MC_IB_TC": "256", "MC_IB_SL": "16", "MC_PKEY_INDEX": "65536",
		"MC_MAX_INLINE": "-1", "MC_IB_RETRY_CNT": "8", "MC_IB_TIMEOUT": "0"} {
		c := defaultConfig()
		c.fromEnv(envOf(map[string]string{k: v}))
		err := c.validate()
		require.ErrorIs(t, err, ErrConfig, "%s=%s", k, v)
		require.ErrorContains(t, err, k)
	}
	pd := &channelPD{qp: defaultConfig().qp}
	var cfg ctrlchannel.Config
	pd.ChannelDefaults(&cfg)
	require.Equal(t, ctrlchannel.Config{PKeyIndex: 0, MaxInline: 64, RetryCnt: 7, Timeout: 14}, cfg)
}
