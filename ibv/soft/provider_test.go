package soft

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv"
)

func TestEnvConfig(t *testing.T) {
	for _, c := range []struct {
		name, env, val, want string
	}{
		{"devices not a number", EnvDevices, "two", EnvDevices},
		{"devices zero", EnvDevices, "0", EnvDevices},
		{"devices too many", EnvDevices, "65", EnvDevices},
		{"addr garbage", EnvAddr, "localhost", EnvAddr},
		{"addr ipv6", EnvAddr, "[::1]:0", EnvAddr},
		{"addr ports overflow", EnvAddr, "127.0.0.1:65535", EnvAddr},
		{"phantom", EnvPhantom, "maybe", EnvPhantom},
		{"inproc", EnvInProc, "sometimes", EnvInProc},
		{"nic thread", EnvNICThread, "often", EnvNICThread},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(c.env, c.val)
			_, err := Default().GetDeviceList()
			require.ErrorIs(t, err, ErrConfig)
			require.ErrorContains(t, err, c.want)
			_, err = Default().Open("soft0")
			require.ErrorContains(t, err, c.want)
		})
	}
}

func TestDefaultProvider(t *testing.T) {
	t.Setenv(EnvDevices, "3")
	t.Setenv(EnvPhantom, "1")
	p, err := ibv.LookupProvider("soft")
	require.NoError(t, err)
	require.Same(t, Default(), p)
	devs, err := p.GetDeviceList()
	require.NoError(t, err)
	var names []string
	for _, d := range devs {
		names = append(names, d.Name)
	}
	require.Equal(t, []string{"soft0", "soft1", "soft2", PhantomName}, names)
	_, err = p.Open("soft3")
	require.ErrorIs(t, err, ibv.ErrNoDevice)
	_, err = p.Open("soft01")
	require.ErrorIs(t, err, ibv.ErrNoDevice)

	ctx, err := ibv.OpenDevice("soft", "soft2")
	require.NoError(t, err)
	pa, err := ctx.QueryPort(1)
	require.NoError(t, err)
	require.Equal(t, ibv.PortActive, pa.State)
	require.False(t, pa.GID.IsZero(), "an open device has its listener's GID")
	require.Equal(t, "Ethernet", pa.LinkLayer)
	_, err = ctx.QueryPort(2)
	require.ErrorIs(t, err, ibv.ErrInvalid)
	require.NoError(t, ctx.Close())
	require.ErrorIs(t, ctx.Close(), ibv.ErrClosed)
}

func TestFixedPorts(t *testing.T) {
	p := New(WithDevices(2), WithListenAddr("127.0.0.1:0"))
	a, err := p.Open("soft0")
	require.NoError(t, err)
	defer a.Close()
	gid, err := p.DeviceGID("soft0")
	require.NoError(t, err)
	ap, err := addrFromGID(gid)
	require.NoError(t, err)
	require.NotZero(t, ap.Port())
	_, err = New(WithDevices(0)).GetDeviceList()
	require.ErrorContains(t, err, "WithDevices")
}

func TestPhantomDevice(t *testing.T) {
	p := New(WithPhantom(true))
	ctx, err := p.Open(PhantomName)
	require.NoError(t, err)
	defer ctx.Close()
	pa, err := ctx.QueryPort(1)
	require.NoError(t, err)
	require.Equal(t, ibv.PortDown, pa.State)
	_, err = New().Open(PhantomName)
	require.True(t, errors.Is(err, ibv.ErrNoDevice))
}
