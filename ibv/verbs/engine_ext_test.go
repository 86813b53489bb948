//go:build rdma

package verbs_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/ibv"
	"github.com/twosided/twosided/ibv/verbs"
	"github.com/twosided/twosided/notify"
)

// TestEngineWithoutLibraryChild runs in TestWithoutLibrary's child, where libibverbs cannot
// be loaded: an rdma_twosided engine takes the soft provider and carries a notify; one that
// asks for the verbs provider fails, naming the library and why.
func TestEngineWithoutLibraryChild(t *testing.T) {
	if os.Getenv("TWOSIDED_TEST_VERBS_LIB_CHILD") != "missing" {
		t.Skip("run by TestWithoutLibrary")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	newEngine := func(opts ...notify.Option) (*notify.Engine, error) {
		return notify.New(append([]notify.Option{notify.WithTransport(notify.TransportRDMATwoSided),
			notify.WithListenAddr("127.0.0.1:0"), notify.WithoutProcsReserve()}, opts...)...)
	}
	a, err := newEngine()
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close(ctx)) }()
	b, err := newEngine()
	require.NoError(t, err)
	defer func() { require.NoError(t, b.Close(ctx)) }()
	require.True(t, strings.HasPrefix(a.Stats().Device, "soft"), "device %q", a.Stats().Device)

	require.NoError(t, a.SendNotify(ctx, b.Addr(), notify.Notify{Name: "k", Msg: []byte("v")}))
	n, err := b.Recv(ctx)
	require.NoError(t, err)
	require.Equal(t, "k", n.Name)
	require.Equal(t, "v", string(n.Msg))

	_, err = newEngine(notify.WithProvider("verbs"))
	require.ErrorIs(t, err, ibv.ErrNoDevice)
	require.ErrorIs(t, err, verbs.ErrLibrary)
	require.Contains(t, err.Error(), `verbs: no RDMA device: libibverbs not loaded: dlopen "/nonexistent/libibverbs.so.1" (TWOSIDED_LIBIBVERBS): `)
}
