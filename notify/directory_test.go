package notify_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/twosided/twosided/notify"
	"github.com/twosided/twosided/notify/directory"
	_ "github.com/twosided/twosided/notify/directory/etcd" // etcd connection strings, for every test and example of the package
	"github.com/twosided/twosided/notify/directory/etcdtest"
)

// dirEtcd starts an embedded etcd for one test and checks, when the test ends, that the
// engines, the directories and the server left no goroutine behind.
func dirEtcd(t *testing.T) *etcdtest.Server {
	t.Helper()
	opts := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opts) })
	srv, err := etcdtest.New(t.TempDir())
	require.NoError(t, err)
	t.Cleanup(srv.Close)
	return srv
}

func dirEngine(t *testing.T, srv *etcdtest.Server, opts ...notify.Option) *notify.Engine {
	t.Helper()
	opts = append([]notify.Option{
		notify.WithListenAddr("127.0.0.1:0"), notify.WithMetadata(srv.Conn()),
		notify.WithMetadataClusterID(t.Name()), notify.WithDirectoryTTL(2 * time.Second),
	}, opts...)
	e, err := notify.New(opts...)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, e.Close(ctx))
	})
	return e
}

func dirCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// recvFrom waits for the next notify on e and checks it.
func recvFrom(t *testing.T, ctx context.Context, e *notify.Engine, want string) {
	t.Helper()
	n, err := e.Recv(ctx)
	require.NoError(t, err)
	require.Equal(t, want, string(n.Msg))
}

func TestDirectoryEnginesFindEachOtherByName(t *testing.T) {
	for _, tr := range []string{notify.TransportOOB, notify.TransportRDMATwoSided} {
		t.Run(tr, func(t *testing.T) {
			srv := dirEtcd(t)
			ctx := dirCtx(t)
			a := dirEngine(t, srv, notify.WithTransport(tr), notify.WithServerName("prefill-0"))
			b := dirEngine(t, srv, notify.WithTransport(tr), notify.WithServerName("decode-0"))
			require.Equal(t, "prefill-0", a.ServerName())

			require.NoError(t, b.SendNotify(ctx, "prefill-0", notify.Notify{Name: "kv", Msg: []byte("by name")}))
			recvFrom(t, ctx, a, "by name")
			require.NoError(t, a.SendNotify(ctx, "decode-0", notify.Notify{Name: "kv", Msg: []byte("back by name")}))
			recvFrom(t, ctx, b, "back by name")
			// host:port still works, and is the same peer.
			require.NoError(t, b.SendNotify(ctx, a.Addr(), notify.Notify{Name: "kv", Msg: []byte("by address")}))
			recvFrom(t, ctx, a, "by address")

			// Unknown names are ErrPeerUnknown.
			err := b.SendNotify(ctx, "nobody", notify.Notify{Name: "kv", Msg: []byte("x")})
			require.ErrorIs(t, err, notify.ErrPeerUnknown)
			require.ErrorIs(t, err, directory.ErrNotFound)

			// SendNotifyAsync never waits: an uncached name fails at once; resolved, it goes.
			c := dirEngine(t, srv, notify.WithTransport(tr))
			err = c.SendNotifyAsync("prefill-0", notify.Notify{Name: "kv", Msg: []byte("async")}, nil)
			require.ErrorIs(t, err, notify.ErrNotResolved)
			addr, err := c.Resolve(ctx, "prefill-0")
			require.NoError(t, err)
			require.Equal(t, a.Addr(), addr)
			done := make(chan error, 1)
			require.NoError(t, c.SendNotifyAsync("prefill-0", notify.Notify{Name: "kv", Msg: []byte("async")}, func(err error) { done <- err }))
			require.NoError(t, <-done)
			recvFrom(t, ctx, a, "async")
		})
	}
}

// TestDirectoryMooncakeEntry: a value put exactly as Mooncake's addRpcMetaEntry writes it
// (no lease) reaches the engine listening there.
func TestDirectoryMooncakeEntry(t *testing.T) {
	srv := dirEtcd(t)
	ctx := dirCtx(t)
	a := dirEngine(t, srv)
	b := dirEngine(t, srv)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, Logger: zap.NewNop()})
	require.NoError(t, err)
	defer cli.Close()
	entry, err := directory.EntryFromAddr(a.Addr())
	require.NoError(t, err)
	val := fmt.Sprintf("{\"ip_or_host_name\":\"%s\",\"rpc_port\":%d}\n", entry.Host, entry.Port)
	_, err = cli.Put(ctx, "mooncake/"+t.Name()+"/rpc_meta/mooncake-node", val)
	require.NoError(t, err)
	require.NoError(t, b.SendNotify(ctx, "mooncake-node", notify.Notify{Name: "kv", Msg: []byte("hi")}))
	recvFrom(t, ctx, a, "hi")

	// A bad value: an error naming the key and the field, the engine keeps serving.
	_, err = cli.Put(ctx, "mooncake/"+t.Name()+"/rpc_meta/broken", `{"ip_or_host_name":"","rpc_port":1}`)
	require.NoError(t, err)
	err = b.SendNotify(ctx, "broken", notify.Notify{Name: "kv", Msg: []byte("x")})
	require.ErrorIs(t, err, notify.ErrPeerUnknown)
	require.ErrorIs(t, err, directory.ErrBadValue)
	require.Contains(t, err.Error(), "rpc_meta/broken")
	require.Contains(t, err.Error(), "ip_or_host_name")
	require.NoError(t, b.SendNotify(ctx, "mooncake-node", notify.Notify{Name: "kv", Msg: []byte("still")}))
	recvFrom(t, ctx, a, "still")
}

// TestDirectoryPeerRestartsOnNewPort: the peer closes and a new engine takes its name on
// another port; the sender reaches the new one by the same name.
func TestDirectoryPeerRestartsOnNewPort(t *testing.T) {
	srv := dirEtcd(t)
	ctx := dirCtx(t)
	b := dirEngine(t, srv)
	a, err := notify.New(notify.WithListenAddr("127.0.0.1:0"), notify.WithMetadata(srv.Conn()),
		notify.WithMetadataClusterID(t.Name()), notify.WithServerName("p"))
	require.NoError(t, err)
	require.NoError(t, b.SendNotify(ctx, "p", notify.Notify{Name: "kv", Msg: []byte("1")}))
	recvFrom(t, ctx, a, "1")
	old := a.Addr()
	require.NoError(t, a.Close(ctx))

	a2 := dirEngine(t, srv, notify.WithServerName("p"))
	require.NotEqual(t, old, a2.Addr())
	start := time.Now()
	for {
		addr, err := b.Resolve(ctx, "p")
		require.NoError(t, ctx.Err())
		if err == nil && addr == a2.Addr() {
			break
		}
		time.Sleep(time.Millisecond)
	}
	// Measured from New's return, when the new engine's registration is already done (the
	// watch has often delivered it by then): the bound from the put is TestRestartOnNewPort's.
	t.Logf("new address resolved %v after the new engine's New returned", time.Since(start).Round(time.Microsecond))
	require.NoError(t, b.SendNotify(ctx, "p", notify.Notify{Name: "kv", Msg: []byte("2")}))
	recvFrom(t, ctx, a2, "2")
}

// TestDirectoryEtcdDown: with etcd down, cached names keep working and an uncached name
// fails with ErrDirectoryUnavailable within the send's deadline. "a" is registered under a
// lease of a minute: one of 2 s can lapse before etcd stops when a loaded machine delays its
// keepalive, and b then rightly forgets the name.
func TestDirectoryEtcdDown(t *testing.T) {
	srv := dirEtcd(t)
	ctx := dirCtx(t)
	a := dirEngine(t, srv, notify.WithServerName("a"), notify.WithDirectoryTTL(time.Minute))
	b := dirEngine(t, srv)
	require.NoError(t, b.SendNotify(ctx, "a", notify.Notify{Name: "kv", Msg: []byte("up")}))
	recvFrom(t, ctx, a, "up")
	// Resolved once the watch covers the read (the cache keeps only such reads).
	for {
		_, err := b.Resolve(ctx, "a")
		require.NoError(t, err)
		if err := b.SendNotifyAsync("a", notify.Notify{Name: "kv", Msg: []byte("cached")}, nil); err == nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	recvFrom(t, ctx, a, "cached")

	srv.Stop()
	require.NoError(t, b.SendNotify(ctx, "a", notify.Notify{Name: "kv", Msg: []byte("etcd down")}))
	recvFrom(t, ctx, a, "etcd down")
	sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err := b.SendNotify(sctx, "uncached", notify.Notify{Name: "kv", Msg: []byte("x")})
	cancel()
	require.ErrorIs(t, err, notify.ErrDirectoryUnavailable)
	require.False(t, errors.Is(err, notify.ErrPeerUnknown))
	require.NoError(t, srv.Start())
}

func TestDirectoryConfig(t *testing.T) {
	_, err := notify.New(notify.WithServerName("x"))
	require.ErrorIs(t, err, notify.ErrConfig)
	require.Contains(t, err.Error(), "server_name")
	_, err = notify.New(notify.WithMetadata("redis://h:6379"))
	require.ErrorIs(t, err, notify.ErrConfig)
	require.Contains(t, err.Error(), "metadata")
	t.Setenv("MC_METADATA_SERVER", "http://h:8080/metadata")
	_, err = notify.FromEnv()
	require.ErrorIs(t, err, notify.ErrConfig)
	require.Contains(t, err.Error(), "MC_METADATA_SERVER")

	// P2P: names are host:port.
	t.Setenv("MC_METADATA_SERVER", directory.P2PHandshake)
	e, err := notify.FromEnv(notify.WithListenAddr("127.0.0.1:0"))
	require.NoError(t, err)
	defer e.Close(context.Background())
	err = e.SendNotify(context.Background(), "decode-7", notify.Notify{Name: "kv", Msg: []byte("x")})
	require.ErrorIs(t, err, notify.ErrPeerUnknown)
	_, err = notify.FromEnv(notify.WithListenAddr("127.0.0.1:0"), notify.WithServerName("decode-7"))
	require.ErrorIs(t, err, notify.ErrConfig)
}

// TestDirectoryUnreachableAtStart: a server name cannot be registered without etcd: New
// says so (within the directory's timeout) and leaves nothing running.
func TestDirectoryUnreachableAtStart(t *testing.T) {
	srv := dirEtcd(t)
	srv.Stop()
	_, err := notify.New(notify.WithListenAddr("127.0.0.1:0"), notify.WithMetadata(srv.Conn()), notify.WithServerName("x"))
	require.ErrorIs(t, err, notify.ErrDirectoryUnavailable)
	require.Contains(t, err.Error(), srv.Endpoint())
	// Without a name the engine starts; sends by address work (after a bounded lookup),
	// by name fail clearly.
	e := dirEngine(t, srv)
	peer := dirEngine(t, srv)
	ctx := dirCtx(t)
	require.NoError(t, e.SendNotify(ctx, peer.Addr(), notify.Notify{Name: "kv", Msg: []byte("addr")}))
	recvFrom(t, ctx, peer, "addr")
	sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, e.SendNotify(sctx, "x", notify.Notify{Name: "kv", Msg: []byte("name")}), notify.ErrDirectoryUnavailable)
}

// TestDirectoryAsyncFromHandler: a handler on the reactor thread answers by server name from
// the cache, and gets ErrNotResolved at once for a name it has not resolved.
func TestDirectoryAsyncFromHandler(t *testing.T) {
	srv := dirEtcd(t)
	ctx := dirCtx(t)
	a := dirEngine(t, srv, notify.WithServerName("a"))
	dirEngine(t, srv, notify.WithServerName("b"))
	var echo *notify.Engine
	errs := make(chan error, 4)
	echo = dirEngine(t, srv, notify.WithHandler(func(n notify.Notify) {
		errs <- echo.SendNotifyAsync("b", notify.Notify{Name: "kv", Msg: []byte("to b")}, nil)
		errs <- echo.SendNotifyAsync("a", notify.Notify{Name: "kv", Msg: append([]byte("echo "), n.Msg...)}, nil)
	}))
	_, err := echo.Resolve(ctx, "a")
	require.NoError(t, err)
	require.NoError(t, a.SendNotify(ctx, echo.Addr(), notify.Notify{Name: "kv", Msg: []byte("ping")}))
	require.ErrorIs(t, <-errs, notify.ErrNotResolved)
	require.NoError(t, <-errs)
	recvFrom(t, ctx, a, "echo ping")
}

// TestDirectoryCloseRemovesName: an engine's Close removes its name from etcd at once (not
// at its lease's expiry): the key is gone when Close returns, and a new sender's lookup is
// ErrPeerUnknown.
func TestDirectoryCloseRemovesName(t *testing.T) {
	srv := dirEtcd(t)
	ctx := dirCtx(t)
	a, err := notify.New(notify.WithListenAddr("127.0.0.1:0"), notify.WithMetadata(srv.Conn()),
		notify.WithMetadataClusterID(t.Name()), notify.WithDirectoryTTL(time.Hour), notify.WithServerName("leaving"))
	require.NoError(t, err)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, Logger: zap.NewNop()})
	require.NoError(t, err)
	defer cli.Close()
	key := "mooncake/" + t.Name() + "/rpc_meta/leaving"
	resp, err := cli.Get(ctx, key)
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "registered while serving")
	require.NoError(t, a.Close(ctx))
	resp, err = cli.Get(ctx, key)
	require.NoError(t, err)
	require.Empty(t, resp.Kvs, "the name outlived Close (its lease is an hour)")
	b := dirEngine(t, srv)
	err = b.SendNotify(ctx, "leaving", notify.Notify{Name: "kv", Msg: []byte("x")})
	require.ErrorIs(t, err, notify.ErrPeerUnknown)
}

// A send whose context was cancelled while a name waited on the directory says
// "canceled", and the directory is not taken for down: the next send resolves at once.
func TestDirectoryCanceled(t *testing.T) {
	srv := dirEtcd(t)
	ctx := dirCtx(t)
	a := dirEngine(t, srv, notify.WithServerName("a"))
	b := dirEngine(t, srv)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	err := b.SendNotify(cctx, "a", notify.Notify{Name: "kv", Msg: []byte("x")})
	require.ErrorIs(t, err, notify.ErrTimeout)
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, notify.ErrDirectoryUnavailable)
	require.ErrorContains(t, err, "notify: canceled: send to a (directory)")
	require.NoError(t, b.SendNotify(ctx, "a", notify.Notify{Name: "kv", Msg: []byte("after")}))
	recvFrom(t, ctx, a, "after")
}
