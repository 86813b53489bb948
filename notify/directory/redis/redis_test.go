package redis

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/notify/directory"
	"github.com/twosided/twosided/notify/directory/redistest"
)

// mooncakeValue is what Mooncake's addRpcMetaEntry SETs (jsoncpp FastWriter output).
const mooncakeValue = "{\"ip_or_host_name\":\"10.0.0.7\",\"rpc_port\":12001}\n"

func cachedIs(d *Directory, name, addr string) func() bool {
	return func() bool { a, err := d.Cached(name); return err == nil && a == addr }
}

func TestRegisterResolveMooncakeLayout(t *testing.T) {
	srv := sharedRedis(t)
	cli := rawClient(t, srv, 0)
	ctx := ctxT(t)
	a := open(t, srv, directory.Config{ClusterID: "prod", TTL: 5 * time.Second}, Options{})
	b := open(t, srv, directory.Config{ClusterID: "prod/"}, Options{})
	require.NoError(t, a.Register(ctx, "decode-7", directory.Entry{Host: "127.0.0.1", Port: 17001}))

	// The key and the value are Mooncake's, byte for byte, under a TTL.
	val, err := cli.Get(ctx, "mooncake/prod/rpc_meta/decode-7").Result()
	require.NoError(t, err)
	require.Equal(t, "{\"ip_or_host_name\":\"127.0.0.1\",\"rpc_port\":17001}\n", val)
	ttl, err := cli.PTTL(ctx, "mooncake/prod/rpc_meta/decode-7").Result()
	require.NoError(t, err)
	require.Greater(t, ttl, time.Duration(0))
	require.LessOrEqual(t, ttl, 5*time.Second)

	addr, err := b.Resolve(ctx, "decode-7")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:17001", addr)
	addr, err = b.Cached("decode-7")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:17001", addr)

	other := open(t, srv, directory.Config{ClusterID: "staging"}, Options{})
	_, err = other.Resolve(ctx, "decode-7")
	require.ErrorIs(t, err, directory.ErrNotFound)
	require.ErrorContains(t, err, "mooncake/staging/rpc_meta/decode-7")
	require.ErrorContains(t, err, srv.Conn())

	// Unregister deletes the entry; the poll tells the resolver.
	require.NoError(t, a.Unregister(ctx, "decode-7"))
	require.Zero(t, cli.Exists(ctx, "mooncake/prod/rpc_meta/decode-7").Val())
	eventually(t, "deletion seen", func() bool { _, err := b.Cached("decode-7"); return errors.Is(err, directory.ErrNotFound) })
}

func TestOpenRegisteredAndExplicit(t *testing.T) {
	require.NoError(t, directory.CheckConn("redis://127.0.0.1:6379"))
	require.NoError(t, directory.CheckConn("rediss://127.0.0.1"))
	d, err := directory.Open("redis://127.0.0.1:1", directory.Config{})
	require.NoError(t, err) // does not wait for Redis
	require.Equal(t, "redis://127.0.0.1:1", d.String())
	require.NoError(t, d.Close(ctxT(t)))
	_, err = Open("etcd://127.0.0.1:2379", directory.Config{}, Options{})
	require.ErrorIs(t, err, directory.ErrBadConn)
	_, err = Open("redis://127.0.0.1:1", directory.Config{Poll: time.Nanosecond}, Options{})
	require.ErrorIs(t, err, directory.ErrBadConn)
	require.ErrorContains(t, err, "poll")
}

func TestOptionsFromEnv(t *testing.T) {
	env := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	o, err := OptionsFromEnv(env(map[string]string{UsernameEnv: "u", PasswordEnv: "p", DBIndexEnv: "3"}))
	require.NoError(t, err)
	require.Equal(t, Options{Username: "u", Password: "p", DB: 3}, o)
	for _, bad := range []string{"x", "-1", "256"} {
		_, err := OptionsFromEnv(env(map[string]string{DBIndexEnv: bad}))
		require.ErrorIs(t, err, directory.ErrBadConn, bad)
		require.ErrorContains(t, err, DBIndexEnv)
	}
}

func TestMooncakeWrittenValueResolves(t *testing.T) {
	srv := sharedRedis(t)
	cli := rawClient(t, srv, 0)
	ctx := ctxT(t)
	// Exactly what Mooncake's Redis plugin does: SET without expiry, no cluster id.
	require.NoError(t, cli.Set(ctx, "mooncake/rpc_meta/prefill-0", mooncakeValue, 0).Err())
	t.Cleanup(func() { cli.Del(ctxT(t), "mooncake/rpc_meta/prefill-0") })
	nd, err := directory.Open(srv.Conn(), directory.Config{})
	require.NoError(t, err)
	defer nd.Close(ctx)
	addr, err := nd.Resolve(ctx, "prefill-0")
	require.NoError(t, err)
	require.Equal(t, "10.0.0.7:12001", addr)
}

func TestBadValuesNameKeyAndField(t *testing.T) {
	srv := sharedRedis(t)
	cli := rawClient(t, srv, 0)
	ctx := ctxT(t)
	d := open(t, srv, directory.Config{}, Options{})
	prefix := directory.Prefix(t.Name())
	cases := []struct{ name, val, field string }{
		{"notjson", "decode-7 at 10.0.0.7", "value"},
		{"bigport", `{"ip_or_host_name":"10.0.0.7","rpc_port":70000}`, "rpc_port"},
		{"nohost", `{"ip_or_host_name":"","rpc_port":12001}`, "ip_or_host_name"},
	}
	for _, tc := range cases {
		require.NoError(t, cli.Set(ctx, prefix+tc.name, tc.val, 0).Err())
		_, err := d.Resolve(ctx, tc.name)
		require.ErrorIs(t, err, directory.ErrBadValue, tc.name)
		require.ErrorContains(t, err, prefix+tc.name)
		require.ErrorContains(t, err, tc.field)
		require.ErrorContains(t, err, "redis://")
	}
	// A cached name turned bad is reported, and a fix is seen (the poll).
	require.NoError(t, cli.Set(ctx, prefix+"flip", mooncakeValue, 0).Err())
	_, err := d.Resolve(ctx, "flip")
	require.NoError(t, err)
	require.NoError(t, cli.Set(ctx, prefix+"flip", `{"ip_or_host_name":"10.0.0.7","rpc_port":"x"}`, 0).Err())
	eventually(t, "bad value seen", func() bool { _, err := d.Cached("flip"); return errors.Is(err, directory.ErrBadValue) })
	require.NoError(t, cli.Set(ctx, prefix+"flip", directory.Encode(directory.Entry{Host: "10.0.0.8", Port: 1}), 0).Err())
	eventually(t, "fix seen", cachedIs(d, "flip", "10.0.0.8:1"))
}

// TestRestartOnNewPort: a process stops without unregistering; its successor registers the
// name on a new port; a resolver that cached the old address follows through the poll.
func TestRestartOnNewPort(t *testing.T) {
	srv := sharedRedis(t)
	ctx := ctxT(t)
	r := open(t, srv, directory.Config{}, Options{})
	first := open(t, srv, directory.Config{TTL: 30 * time.Second}, Options{})
	require.NoError(t, first.Register(ctx, "decode-7", directory.Entry{Host: "127.0.0.1", Port: 1001}))
	addr, err := r.Resolve(ctx, "decode-7")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:1001", addr)
	for i := range 3 {
		second := open(t, srv, directory.Config{}, Options{})
		port := 2000 + i
		require.NoError(t, second.Register(ctx, "decode-7", directory.Entry{Host: "127.0.0.1", Port: port}))
		eventually(t, "new address", cachedIs(r, "decode-7", fmt.Sprintf("127.0.0.1:%d", port)))
		_, _ = r.Cached("decode-7") // in use: the poll keeps reading it
		require.NoError(t, second.Close(ctx))
	}
	// The first process's keeper does not take the name back from its successors: the
	// last one deleted its own entry, the first's refresh puts its value back only where
	// the key is absent or still its own.
}

// TestNameTakenIsNotTakenBack: a keeper that finds another value at its key stops.
func TestNameTakenIsNotTakenBack(t *testing.T) {
	srv := sharedRedis(t)
	cli := rawClient(t, srv, 0)
	ctx := ctxT(t)
	d := open(t, srv, directory.Config{TTL: time.Second}, Options{})
	require.NoError(t, d.Register(ctx, "n", directory.Entry{Host: "127.0.0.1", Port: 1}))
	key := d.Key("n")
	require.NoError(t, cli.Set(ctx, key, mooncakeValue, 0).Err())
	eventually(t, "keeper stopped", func() bool { return !d.Registered("n") })
	require.Equal(t, mooncakeValue, cli.Get(ctx, key).Val())
	// Unregister leaves the other process's value.
	require.NoError(t, d.Unregister(ctx, "n"))
	require.Equal(t, mooncakeValue, cli.Get(ctx, key).Val())
}

// TestEntryGoneAfterKill9: the key of a process killed with -9 expires within its TTL
// (Mooncake's own entries, without one, would stay).
func TestEntryGoneAfterKill9(t *testing.T) {
	srv := sharedRedis(t)
	cli := rawClient(t, srv, 0)
	ctx := ctxT(t)
	cmd := startHelper(t, srv)
	key := directory.Prefix(t.Name()) + "victim"
	require.Equal(t, "{\"ip_or_host_name\":\"127.0.0.1\",\"rpc_port\":4242}\n", cli.Get(ctx, key).Val())
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	// Nothing refreshes it now: its remaining TTL is at most the 2 s it was set with.
	ttl := cli.PTTL(ctx, key).Val()
	require.LessOrEqual(t, ttl, 2*time.Second)
	eventually(t, "entry expired", func() bool { return cli.Exists(ctx, key).Val() == 0 })
	r := open(t, srv, directory.Config{}, Options{})
	_, err := r.Resolve(ctx, "victim")
	require.ErrorIs(t, err, directory.ErrNotFound)
}

// TestRedisDownAndBack: cached names keep resolving while Redis is down; an uncached name
// fails with ErrUnavailable naming the backend and the key; after Redis returns (empty,
// as a rebuilt one), the registration comes back.
func TestRedisDownAndBack(t *testing.T) {
	srv := newServer(t, redistest.Config{})
	cli := rawClient(t, srv, 0)
	ctx := ctxT(t)
	w := open(t, srv, directory.Config{TTL: time.Second}, Options{})
	// The resolver keeps an address found absent for a refresh period of its own TTL (20 s)
	// and a poll: longer than the writer needs to put its registration back.
	r := open(t, srv, directory.Config{Timeout: 2 * time.Second, TTL: time.Minute}, Options{})
	require.NoError(t, w.Register(ctx, "p", directory.Entry{Host: "127.0.0.1", Port: 7}))
	addr, err := r.Resolve(ctx, "p")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:7", addr)

	srv.Stop()
	for range 20 { // across several poll rounds
		addr, err = r.Resolve(ctx, "p")
		require.NoError(t, err)
		require.Equal(t, "127.0.0.1:7", addr)
		time.Sleep(10 * time.Millisecond)
	}
	_, err = r.Resolve(ctx, "q")
	require.ErrorIs(t, err, directory.ErrUnavailable)
	require.ErrorContains(t, err, "q")
	require.ErrorContains(t, err, "redis://"+srv.Addr())

	require.NoError(t, srv.Start())
	key := w.Key("p")
	eventually(t, "registration back", func() bool {
		return cli.Get(ctx, key).Val() == string(directory.Encode(directory.Entry{Host: "127.0.0.1", Port: 7}))
	})
	require.Greater(t, cli.PTTL(ctx, key).Val(), time.Duration(0))
	addr, err = r.Cached("p")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:7", addr)
	eventually(t, "uncached resolves again", func() bool {
		_, err := r.Resolve(ctx, "q")
		return errors.Is(err, directory.ErrNotFound)
	})
}

func TestRegisterWhileDownFails(t *testing.T) {
	srv := newServer(t, redistest.Config{})
	srv.Stop()
	d := open(t, srv, directory.Config{Timeout: time.Second}, Options{})
	err := d.Register(ctxT(t), "n", directory.Entry{Host: "127.0.0.1", Port: 1})
	require.ErrorIs(t, err, directory.ErrUnavailable)
	require.ErrorContains(t, err, "redis://"+srv.Addr())
	require.ErrorContains(t, err, d.Key("n"))
	require.ErrorContains(t, err, "connect")
}

func TestAuthAndDatabase(t *testing.T) {
	srv := newServer(t, redistest.Config{Password: "s3cret", User: "mc", UserPassword: "pw"})
	ctx := ctxT(t)
	bad := open(t, srv, directory.Config{}, Options{Password: "wrong"})
	err := bad.Register(ctx, "n", directory.Entry{Host: "127.0.0.1", Port: 1})
	require.ErrorIs(t, err, directory.ErrUnavailable)
	require.ErrorContains(t, err, "authentication failed")
	require.ErrorContains(t, err, bad.Key("n"))

	// An ACL user, and database 3 as MC_REDIS_DB_INDEX selects it.
	good := open(t, srv, directory.Config{}, Options{Username: "mc", Password: "pw", DB: 3})
	require.NoError(t, good.Register(ctx, "n", directory.Entry{Host: "127.0.0.1", Port: 1}))
	cli := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), Username: "mc", Password: "pw", DB: 3, Protocol: 2, DisableIdentity: true})
	defer cli.Close()
	require.Equal(t, string(directory.Encode(directory.Entry{Host: "127.0.0.1", Port: 1})), cli.Get(ctx, good.Key("n")).Val())
	cli0 := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), Password: "s3cret", Protocol: 2, DisableIdentity: true})
	defer cli0.Close()
	require.Zero(t, cli0.Exists(ctx, good.Key("n")).Val(), "not in database 0")

	_, err = open(t, srv, directory.Config{}, Options{Password: "s3cret", DB: 200}).Resolve(ctx, "x")
	require.ErrorIs(t, err, directory.ErrUnavailable)
	require.ErrorContains(t, err, DBIndexEnv)
}

func TestTLS(t *testing.T) {
	if _, err := redistest.Binary(); err != nil {
		t.Skipf("SKIPPED: no redis-server: %v", err)
	}
	dir := t.TempDir()
	cert, key, err := redistest.SelfSigned(dir)
	require.NoError(t, err)
	srv, err := redistest.New(dir, redistest.Config{TLSCert: cert, TLSKey: key})
	if err != nil {
		t.Skipf("SKIPPED: this redis-server does not serve TLS (built without it?): %v", err)
	}
	t.Cleanup(srv.Close)
	require.Equal(t, "rediss://"+srv.Addr(), srv.Conn())
	ctx := ctxT(t)
	d := open(t, srv, directory.Config{}, Options{CAFile: cert})
	require.NoError(t, d.Register(ctx, "n", directory.Entry{Host: "127.0.0.1", Port: 9}))
	r := open(t, srv, directory.Config{}, Options{CAFile: cert})
	addr, err := r.Resolve(ctx, "n")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:9", addr)
	// Without the authority the certificate is refused.
	untrusted := open(t, srv, directory.Config{Timeout: 20 * time.Second}, Options{})
	_, err = untrusted.Resolve(ctx, "n")
	require.ErrorIs(t, err, directory.ErrUnavailable)
	require.ErrorContains(t, err, "certificate")
}
