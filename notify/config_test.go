package notify

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/reactor/limits"
)

func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestConfigFromEnv(t *testing.T) {
	c := defaultConfig()
	c.fromEnv(envOf(map[string]string{
		"MC_USE_RDMA_TWOSIDED":              "1",
		"MC_RDMA_NOTIFY_OOB_FALLBACK":       "false",
		"MC_RDMA_NOTIFY_RECV_COUNT":         "128",
		"MC_RDMA_NOTIFY_BUFFER_SIZE":        "8192",
		"MC_RDMA_NOTIFY_MAX_PENDING_SENDS":  "16",
		"MC_RDMA_NOTIFY_CONNECT_TIMEOUT_MS": "2500",
		"MC_TE_FILTERS":                     "soft1, mlx5_0",
		"MC_MTU":                            "1024",
		"MC_IB_PORT":                        "2",
		"MC_GID_INDEX":                      "3",
		"MC_HANDSHAKE_CONNECT_TIMEOUT":      "7",
		"MC_HANDSHAKE_MAX_LENGTH":           "2097152",
	}))
	require.NoError(t, c.validate())
	require.Equal(t, TransportRDMATwoSided, c.transport)
	require.False(t, c.oobFallback)
	require.Equal(t, 128, c.recvCount)
	require.Equal(t, 8192, c.bufferSize)
	require.Equal(t, 16, c.maxPendingSends)
	require.Equal(t, 2500*time.Millisecond, c.connectTimeout)
	require.Equal(t, []string{"soft1", "mlx5_0"}, c.filters)
	require.Equal(t, 1024, c.mtu)
	require.Equal(t, 2, c.ibPort)
	require.Equal(t, 3, c.gidIndex)
	require.Equal(t, 7*time.Second, c.handshakeConnectTimeout)
	require.Equal(t, 2<<20, c.handshakeMaxLength)
}

func TestConfigDefaults(t *testing.T) {
	c := defaultConfig()
	c.fromEnv(envOf(nil))
	require.NoError(t, c.validate())
	require.Equal(t, TransportOOB, c.transport)
	require.True(t, c.notifyEnabled)
	require.True(t, c.oobFallback)
	require.Equal(t, 64, c.recvCount)
	require.Equal(t, 4096, c.bufferSize)
	require.Equal(t, 64, c.maxPendingSends)
	require.Equal(t, 10*time.Second, c.connectTimeout)
	require.Equal(t, -1, c.gidIndex)
}

// Every variable out of range is an error naming the variable, never a silent default.
// Where want is set, the whole message: what the variable accepts as a user types it, and
// a value that is not a number never said to be "out of range".
func TestConfigEnvOutOfRange(t *testing.T) {
	cases := []struct{ name, value, want string }{
		{"MC_USE_RDMA_TWOSIDED", "maybe", ""},
		{"MC_RDMA_NOTIFY_ENABLED", "2", ""},
		{"MC_RDMA_NOTIFY_OOB_FALLBACK", "x", ""},
		{"MC_RDMA_NOTIFY_RECV_COUNT", "0", "MC_RDMA_NOTIFY_RECV_COUNT: 0 is out of range (want 1–4096)"},
		{"MC_RDMA_NOTIFY_RECV_COUNT", "4097", ""},
		{"MC_RDMA_NOTIFY_RECV_COUNT", "abc", `MC_RDMA_NOTIFY_RECV_COUNT: "abc" is not an integer (want 1–4096)`},
		{"MC_RDMA_NOTIFY_BUFFER_SIZE", "255", "MC_RDMA_NOTIFY_BUFFER_SIZE: 255 is out of range (want 256–65536 bytes)"},
		{"MC_RDMA_NOTIFY_BUFFER_SIZE", "65537", ""},
		{"MC_RDMA_NOTIFY_MAX_PENDING_SENDS", "0", ""},
		{"MC_RDMA_NOTIFY_MAX_PENDING_SENDS", "4097", ""},
		{"MC_RDMA_NOTIFY_CONNECT_TIMEOUT_MS", "99", "MC_RDMA_NOTIFY_CONNECT_TIMEOUT_MS: 99 is out of range (want 100–600000 ms)"},
		{"MC_RDMA_NOTIFY_CONNECT_TIMEOUT_MS", "600001", ""},
		{"MC_MTU", "300", "MC_MTU: 300 is not one of 256, 512, 1024, 2048, 4096, or port"},
		{"MC_MTU", "9000", "MC_MTU: 9000 is not one of 256, 512, 1024, 2048, 4096, or port"},
		{"MC_MTU", "abc", `MC_MTU: "abc" is not an integer (want 256, 512, 1024, 2048, 4096, or port)`},
		{"MC_IB_PORT", "0", ""},
		{"MC_GID_INDEX", "abc", `MC_GID_INDEX: "abc" is not an integer (want 0–255 or auto)`},
		{"MC_GID_INDEX", "-2", "MC_GID_INDEX: -2 is out of range (want 0–255 or auto)"},
		{"MC_GID_INDEX", "256", "MC_GID_INDEX: 256 is out of range (want 0–255 or auto)"},
		{"MC_HANDSHAKE_PORT", "70000", ""},
		{"MC_HANDSHAKE_CONNECT_TIMEOUT", "0", "MC_HANDSHAKE_CONNECT_TIMEOUT: 0 is out of range (want 1–3599 s)"},
		{"MC_HANDSHAKE_CONNECT_TIMEOUT", "3600", ""},
		{"MC_HANDSHAKE_MAX_LENGTH", "0", ""},
		{"MC_HANDSHAKE_MAX_LENGTH", "134217729", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			c := defaultConfig()
			c.fromEnv(envOf(map[string]string{tc.name: tc.value}))
			err := c.validate()
			require.Error(t, err)
			require.True(t, errors.Is(err, ErrConfig))
			require.Contains(t, err.Error(), tc.name)
			if tc.want != "" {
				require.EqualError(t, err, ErrConfig.Error()+": "+tc.want)
			}
			if _, perr := strconv.Atoi(tc.value); perr != nil {
				require.NotContains(t, err.Error(), "out of range", "a value that is not a number")
			}
		})
	}
}

func TestConfigOptions(t *testing.T) {
	t.Run("both transports", func(t *testing.T) {
		c := defaultConfig()
		WithTransport("oob")(&c)
		WithTransport("rdma_twosided")(&c)
		err := c.validate()
		require.ErrorIs(t, err, ErrConfig)
		require.Contains(t, err.Error(), "exactly one transport")
	})
	t.Run("both in one", func(t *testing.T) {
		c := defaultConfig()
		WithTransport("oob,rdma_twosided")(&c)
		require.ErrorContains(t, c.validate(), "exactly one transport")
	})
	t.Run("unknown transport", func(t *testing.T) {
		c := defaultConfig()
		WithTransport("tcp")(&c)
		require.ErrorContains(t, c.validate(), `transport: "tcp"`)
	})
	t.Run("option overrides env", func(t *testing.T) {
		c := defaultConfig()
		c.fromEnv(envOf(map[string]string{"MC_USE_RDMA_TWOSIDED": "1", "MC_RDMA_NOTIFY_RECV_COUNT": "8"}))
		WithTransport("oob")(&c)
		WithRecvCount(32)(&c)
		require.NoError(t, c.validate())
		require.Equal(t, TransportOOB, c.transport)
		require.Equal(t, 32, c.recvCount)
	})
	t.Run("option out of range", func(t *testing.T) {
		c := defaultConfig()
		WithBufferSize(100)(&c)
		require.ErrorContains(t, c.validate(), "buffer_size: 100 B out of range 256 B..65536 B")
	})
}

// Each variable's range equals its option's: the values at and one step past every bound
// of the table are accepted from the environment exactly when the same value given as an
// option (or, for a variable without an option, as the config field) is. MTU 256 used to
// be accepted as an option and refused from MC_MTU.
func TestConfigEnvRangeIsOptionRange(t *testing.T) {
	dur := func(f func(time.Duration) Option) func(int64) Option {
		return func(v int64) Option { return f(time.Duration(v)) }
	}
	num := func(f func(int) Option) func(int64) Option {
		return func(v int64) Option { return f(int(v)) }
	}
	field := func(set func(*config, int64)) func(int64) Option {
		return func(v int64) Option { return func(c *config) { set(c, v) } }
	}
	options := map[*limits.Limit]func(int64) Option{
		&limits.RecvCount:               num(WithRecvCount),
		&limits.BufferSize:              num(WithBufferSize),
		&limits.MaxPendingSends:         num(WithMaxPendingSends),
		&limits.ConnectTimeout:          dur(WithConnectTimeout),
		&limits.MTU:                     num(WithMTU),
		&limits.IBPort:                  field(func(c *config, v int64) { c.ibPort = int(v) }),
		&limits.GIDIndex:                field(func(c *config, v int64) { c.gidIndex = int(v) }),
		&limits.TrafficClass:            num(WithTrafficClass),
		&limits.ServiceLevel:            num(WithServiceLevel),
		&limits.PKeyIndex:               num(WithPKeyIndex),
		&limits.MaxInline:               num(WithMaxInline),
		&limits.RetryCount:              num(WithRetryCount),
		&limits.AckTimeout:              num(WithAckTimeout),
		&limits.ForkSafe:                field(func(c *config, v int64) { c.forkSafe = int(v) }),
		&limits.HandshakePort:           nil, // a port, checked by the listener's address
		&limits.HandshakeConnectTimeout: field(func(c *config, v int64) { c.handshakeConnectTimeout = time.Duration(v) }),
		&limits.HandshakeMaxLength:      field(func(c *config, v int64) { c.handshakeMaxLength = int(v) }),
	}
	for _, l := range limits.All() {
		if l.Env == "" {
			continue
		}
		opt, ok := options[l]
		require.True(t, ok, "%s: add it to this test", l.Env)
		step := int64(1)
		if l.Unit == limits.Duration {
			step = int64(l.EnvUnit)
		}
		lo, hi := (l.Min+step-1)/step, l.Max/step
		vals := []int64{lo - 1, lo, hi, hi + 1}
		for _, sp := range l.Special {
			vals = append(vals, sp.Value/step)
		}
		for _, n := range vals {
			c := defaultConfig()
			c.fromEnv(envOf(map[string]string{l.Env: strconv.FormatInt(n, 10)}))
			envErr := c.validate()
			if opt == nil {
				require.Equal(t, l.Allowed(n*step), envErr == nil, "%s=%d: %v", l.Env, n, envErr)
				continue
			}
			c = defaultConfig()
			opt(n * step)(&c)
			optErr := c.validate()
			require.Equal(t, optErr == nil, envErr == nil, "%s=%d: env %v, option %v", l.Env, n, envErr, optErr)
			if envErr != nil {
				require.ErrorIs(t, envErr, ErrConfig)
				require.ErrorIs(t, optErr, ErrConfig)
				require.Contains(t, envErr.Error(), l.Env)
				require.Contains(t, envErr.Error(), l.EnvRange(), "the variable's values, as typed")
				require.Contains(t, optErr.Error(), l.Range())
			}
		}
	}
	c := defaultConfig()
	c.fromEnv(envOf(map[string]string{"MC_MTU": "256"}))
	require.NoError(t, c.validate())
	require.Equal(t, 256, c.mtu)
}
