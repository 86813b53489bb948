package etcd

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/twosided/twosided/notify/directory"
	"github.com/twosided/twosided/notify/directory/etcdtest"
)

// ctxT is a test's context for its calls to the directory and to etcd: a hang guard longer
// than the waits a test may make before its last call (eventually's 3 min bound, an etcd
// restart), so that a call made after a long wait on a loaded machine does not find the
// context already expired (a poll that can then never succeed).
func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// callCtx bounds one call made inside an eventually poll: a call that waits for an etcd
// that does not answer returns, and the poll's own bound decides.
func callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, 10*time.Second)
}

// cachedIs reports whether d's cache resolves name to addr.
func cachedIs(d *Directory, name, addr string) func() bool {
	return func() bool { a, err := d.Cached(name); return err == nil && a == addr }
}

func TestRegisterResolveMooncakeLayout(t *testing.T) {
	srv := sharedEtcd(t)
	cli := rawClient(t, srv)
	ctx := ctxT(t)
	a := open(t, srv, directory.Config{ClusterID: "prod"})
	b := open(t, srv, directory.Config{ClusterID: "prod/"})
	require.NoError(t, a.Register(ctx, "decode-7", directory.Entry{Host: "127.0.0.1", Port: 17001}))

	// The key and the value are Mooncake's, byte for byte, under a kept-alive lease.
	resp, err := cli.Get(ctx, "mooncake/prod/rpc_meta/decode-7")
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	require.Equal(t, "{\"ip_or_host_name\":\"127.0.0.1\",\"rpc_port\":17001}\n", string(resp.Kvs[0].Value))
	require.NotZero(t, resp.Kvs[0].Lease)

	addr, err := b.Resolve(ctx, "decode-7")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:17001", addr)
	eventually(t, "cached", cachedIs(b, "decode-7", "127.0.0.1:17001"))

	// Another cluster id does not see it.
	other := open(t, srv, directory.Config{ClusterID: "staging"})
	_, err = other.Resolve(ctx, "decode-7")
	require.ErrorIs(t, err, directory.ErrNotFound)

	// Unregister deletes the entry, and the watch tells the resolver.
	require.NoError(t, a.Unregister(ctx, "decode-7"))
	resp, err = cli.Get(ctx, "mooncake/prod/rpc_meta/decode-7")
	require.NoError(t, err)
	require.Empty(t, resp.Kvs)
	eventually(t, "deletion seen", func() bool { _, err := b.Cached("decode-7"); return errors.Is(err, directory.ErrNotFound) })
	_, err = b.Resolve(ctx, "decode-7")
	require.ErrorIs(t, err, directory.ErrNotFound)
}

// mooncakeValue is what Mooncake's addRpcMetaEntry puts (jsoncpp FastWriter output).
const mooncakeValue = "{\"ip_or_host_name\":\"10.0.0.7\",\"rpc_port\":12001}\n"

// The registration import makes directory.Open serve etcd connection strings; etcd.Open
// opens one directly (for notify.WithDirectory) and refuses any other backend.
func TestOpenRegisteredAndExplicit(t *testing.T) {
	srv := sharedEtcd(t)
	require.NoError(t, directory.CheckConn(srv.Conn()))
	require.NoError(t, directory.CheckConn(srv.Endpoint())) // no "://": etcd, as Mooncake reads it
	d, err := Open(srv.Conn(), directory.Config{ClusterID: t.Name()})
	require.NoError(t, err)
	require.Equal(t, srv.Conn(), d.String())
	var _ directory.Directory = d
	require.NoError(t, d.Close(context.Background()))
	_, err = Open(directory.P2PHandshake, directory.Config{})
	require.ErrorIs(t, err, directory.ErrBadConn)
	_, err = Open(srv.Conn(), directory.Config{TTL: time.Millisecond})
	require.ErrorIs(t, err, directory.ErrBadConn)
	require.ErrorContains(t, err, "ttl")
}

func TestMooncakeWrittenValueResolves(t *testing.T) {
	srv := sharedEtcd(t)
	cli := rawClient(t, srv)
	ctx := ctxT(t)
	// Exactly what Mooncake's addRpcMetaEntry puts, without MC_METADATA_CLUSTER_ID.
	_, err := cli.Put(ctx, "mooncake/rpc_meta/prefill-0", mooncakeValue)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = cli.Delete(context.Background(), "mooncake/rpc_meta/prefill-0") })
	nd, err := directory.Open(srv.Conn(), directory.Config{}) // no cluster id, as the Mooncake node
	require.NoError(t, err)
	defer nd.Close(context.Background())
	addr, err := nd.Resolve(ctx, "prefill-0")
	require.NoError(t, err)
	require.Equal(t, "10.0.0.7:12001", addr)
}

func TestUnknownThenRegistered(t *testing.T) {
	srv := sharedEtcd(t)
	ctx := ctxT(t)
	r := open(t, srv, directory.Config{})
	_, err := r.Resolve(ctx, "later")
	require.ErrorIs(t, err, directory.ErrNotFound)
	require.Contains(t, err.Error(), "rpc_meta/later")
	// The absence is cached once the watch is up; a registration replaces it.
	eventually(t, "watch up", func() bool { r.mu.Lock(); defer r.mu.Unlock(); return r.watchFrom > 0 })
	_, err = r.Resolve(ctx, "later")
	require.ErrorIs(t, err, directory.ErrNotFound)
	_, err = r.Cached("later")
	require.ErrorIs(t, err, directory.ErrNotFound)
	w := open(t, srv, directory.Config{})
	require.NoError(t, w.Register(ctx, "later", directory.Entry{Host: "127.0.0.1", Port: 9}))
	eventually(t, "registration seen", cachedIs(r, "later", "127.0.0.1:9"))
}

func TestBadValuesNameKeyAndField(t *testing.T) {
	srv := sharedEtcd(t)
	cli := rawClient(t, srv)
	ctx := ctxT(t)
	d := open(t, srv, directory.Config{})
	prefix := directory.Prefix(t.Name())
	cases := []struct{ name, val, field string }{
		{"notjson", "decode-7 at 10.0.0.7", "value"},
		{"bigport", `{"ip_or_host_name":"10.0.0.7","rpc_port":70000}`, "rpc_port"},
		{"nohost", `{"ip_or_host_name":"","rpc_port":12001}`, "ip_or_host_name"},
	}
	for _, tc := range cases {
		_, err := cli.Put(ctx, prefix+tc.name, tc.val)
		require.NoError(t, err)
		_, err = d.Resolve(ctx, tc.name)
		require.ErrorIs(t, err, directory.ErrBadValue, tc.name)
		require.Contains(t, err.Error(), prefix+tc.name)
		require.Contains(t, err.Error(), tc.field)
	}
	// A cached good name turned bad by a later put reports the bad value, and a fix is seen.
	_, err := cli.Put(ctx, prefix+"flip", mooncakeValue)
	require.NoError(t, err)
	eventually(t, "watch up", func() bool { d.mu.Lock(); defer d.mu.Unlock(); return d.watchFrom > 0 })
	_, err = d.Resolve(ctx, "flip")
	require.NoError(t, err)
	eventually(t, "cached", cachedIs(d, "flip", "10.0.0.7:12001"))
	_, err = cli.Put(ctx, prefix+"flip", `{"ip_or_host_name":"10.0.0.7","rpc_port":"x"}`)
	require.NoError(t, err)
	eventually(t, "bad value seen", func() bool { _, err := d.Cached("flip"); return errors.Is(err, directory.ErrBadValue) })
	_, err = cli.Put(ctx, prefix+"flip", string(directory.Encode(directory.Entry{Host: "10.0.0.8", Port: 1})))
	require.NoError(t, err)
	eventually(t, "fix seen", cachedIs(d, "flip", "10.0.0.8:1"))
}

// TestRestartOnNewPort: a process dies without unregistering; its successor registers the
// same name on a new port; a resolver that cached the old address follows. The time from
// the successor's Register returning to the resolver's cache holding the new address is the
// restart-to-new-address bound (logged).
func TestRestartOnNewPort(t *testing.T) {
	srv := sharedEtcd(t)
	ctx := ctxT(t)
	r := open(t, srv, directory.Config{})
	eventually(t, "watch up", func() bool { r.mu.Lock(); defer r.mu.Unlock(); return r.watchFrom > 0 })
	first, err := directory.Open(srv.Conn(), directory.Config{ClusterID: t.Name(), TTL: 30 * time.Second})
	require.NoError(t, err)
	require.NoError(t, first.Register(ctx, "decode-7", directory.Entry{Host: "127.0.0.1", Port: 1001}))
	addr, err := r.Resolve(ctx, "decode-7")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:1001", addr)
	eventually(t, "cached", cachedIs(r, "decode-7", "127.0.0.1:1001"))
	// The first process "crashes": its keeper stops, its lease (30 s) stays.
	first.(*Directory).cancel()
	first.(*Directory).wg.Wait()
	defer first.(*Directory).cli.Close()

	var worst time.Duration
	for i := range 5 {
		second := open(t, srv, directory.Config{})
		port := 2000 + i
		require.NoError(t, second.Register(ctx, "decode-7", directory.Entry{Host: "127.0.0.1", Port: port}))
		d := eventually(t, "new address", cachedIs(r, "decode-7", fmt.Sprintf("127.0.0.1:%d", port)))
		worst = max(worst, d)
		require.NoError(t, second.Close(ctx))
	}
	t.Logf("restart on a new port: resolver's cache at the new address %v after the put returned (worst of 5)", worst)
}

// TestEtcdDownAndBack: cached names keep resolving while etcd is down, an uncached name
// fails with ErrUnavailable within the caller's deadline, and after etcd returns the
// registration is kept alive again (the entry outlives several TTLs). The cached name "p" is
// held under a lease of a minute, so that it cannot lapse before etcd stops (on a loaded
// machine a late keepalive lets a 1 s lease lapse, and the resolver then rightly forgets the
// name); the keepalive across the outage is "q"'s, under a lease of 1 s.
func TestEtcdDownAndBack(t *testing.T) {
	srv, err := etcdtest.New(t.TempDir())
	require.NoError(t, err)
	t.Cleanup(srv.Close)
	ctx := ctxT(t)
	ttl := time.Second
	long := open(t, srv, directory.Config{TTL: time.Minute})
	wlog := zerolog.New(zerolog.NewTestWriter(t)).With().Timestamp().Logger() // the keeper's account
	w := open(t, srv, directory.Config{TTL: ttl, Logger: &wlog})
	r := open(t, srv, directory.Config{})
	require.NoError(t, long.Register(ctx, "p", directory.Entry{Host: "127.0.0.1", Port: 7}))
	require.NoError(t, w.Register(ctx, "q", directory.Entry{Host: "127.0.0.1", Port: 8}))
	eventually(t, "watch up", func() bool { r.mu.Lock(); defer r.mu.Unlock(); return r.watchFrom > 0 })
	_, err = r.Resolve(ctx, "p")
	require.NoError(t, err)
	eventually(t, "cached", cachedIs(r, "p", "127.0.0.1:7"))

	srv.Stop()
	// Down for longer than the TTL: the writer's keepalives fail meanwhile. (etcd restarted
	// from its data dir restores the lease, so the writer usually keeps it; a lease that was
	// lost is TestLeaseRevokedRegistersAgain's and TestEtcdReturnsEmpty's case.)
	down := time.Now()
	for time.Since(down) < 3*ttl {
		addr, err := r.Resolve(ctx, "p")
		require.NoError(t, err)
		require.Equal(t, "127.0.0.1:7", addr)
		time.Sleep(100 * time.Millisecond)
	}
	sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = r.Resolve(sctx, "uncached")
	cancel()
	require.ErrorIs(t, err, directory.ErrUnavailable)
	require.Contains(t, err.Error(), srv.Endpoint())
	// Once a read failed, uncached names fail at once instead of each waiting.
	eventually(t, "marked down", func() bool { r.mu.Lock(); defer r.mu.Unlock(); return r.down })
	_, err = r.Resolve(ctx, "uncached-2")
	require.ErrorIs(t, err, directory.ErrUnavailable)
	require.Contains(t, err.Error(), "did not answer the last read")

	require.NoError(t, srv.Start())
	back := time.Now()
	cli := rawClient(t, srv)
	key := directory.Prefix(t.Name()) + "q"
	// Registered again under a lease that is kept alive: present with a live lease.
	var lease clientv3.LeaseID
	var last string // what the poll saw last, said if the test fails
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the poll's last answer: %s", last)
		}
	})
	eventually(t, "registered again", func() bool {
		ctx, cancel := callCtx(ctx)
		defer cancel()
		resp, err := cli.Get(ctx, key)
		if err != nil || len(resp.Kvs) == 0 || resp.Kvs[0].Lease == 0 {
			last = fmt.Sprintf("get: %v, %v", err, resp)
			return false
		}
		// etcd reports a lease's remaining TTL in whole seconds, truncated: a 1 s lease
		// granted or renewed just now says 0 (only one restored at etcd's restart, whose
		// expiry is pushed out by an election timeout, says more). A lease etcd finds is
		// live; an expired one is "not found".
		ttlResp, err := cli.TimeToLive(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
		lease = clientv3.LeaseID(resp.Kvs[0].Lease)
		if err != nil {
			last = fmt.Sprintf("lease %x: %v", lease, err)
			return false
		}
		last = fmt.Sprintf("lease %x: ttl %d s of %d", lease, ttlResp.TTL, ttlResp.GrantedTTL)
		return ttlResp.TTL >= 0
	})
	t.Logf("etcd back: entry on a live lease %v later (new lease: %v)", time.Since(back).Round(time.Millisecond), lease != firstLease(w, "q"))
	time.Sleep(3 * ttl)
	// Kept alive: present after three TTLs (on a loaded machine a late keepalive may let
	// the 1 s lease lapse, and the keeper then puts the entry again: present again soon).
	eventually(t, "the entry outlives its TTL once etcd is back", func() bool {
		ctx, cancel := callCtx(ctx)
		defer cancel()
		resp, err := cli.Get(ctx, key)
		return err == nil && len(resp.Kvs) == 1
	})
	addr, err := r.Resolve(ctx, "q")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:8", addr)
}

// TestEtcdReturnsEmpty: etcd comes back without its data (rebuilt); the registration is
// put again and a resolver reaches it.
func TestEtcdReturnsEmpty(t *testing.T) {
	srv, err := etcdtest.New(t.TempDir())
	require.NoError(t, err)
	t.Cleanup(srv.Close)
	ctx := ctxT(t)
	w := open(t, srv, directory.Config{TTL: time.Second})
	require.NoError(t, w.Register(ctx, "p", directory.Entry{Host: "127.0.0.1", Port: 7}))
	require.NoError(t, srv.Wipe())
	require.NoError(t, srv.Start())
	back := time.Now()
	cli := rawClient(t, srv)
	eventually(t, "registered again", func() bool {
		ctx, cancel := callCtx(ctx)
		defer cancel()
		resp, err := cli.Get(ctx, directory.Prefix(t.Name())+"p")
		return err == nil && len(resp.Kvs) == 1
	})
	t.Logf("etcd back empty: registered again %v later", time.Since(back).Round(time.Millisecond))
	r := open(t, srv, directory.Config{})
	addr, err := r.Resolve(ctx, "p")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:7", addr)
}

func cacheLen(d *Directory) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.cache)
}

// firstLease is the lease the registration of name held when it was made. (The keeper
// replaces it; the test wants to see that.)
func firstLease(d *Directory, name string) clientv3.LeaseID {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.regs[name].firstLease
}

func TestLeaseRevokedRegistersAgain(t *testing.T) {
	srv := sharedEtcd(t)
	cli := rawClient(t, srv)
	ctx := ctxT(t)
	w := open(t, srv, directory.Config{})
	require.NoError(t, w.Register(ctx, "p", directory.Entry{Host: "127.0.0.1", Port: 7}))
	key := directory.Prefix(t.Name()) + "p"
	resp, err := cli.Get(ctx, key)
	require.NoError(t, err)
	_, err = cli.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
	require.NoError(t, err)
	eventually(t, "registered again", func() bool {
		ctx, cancel := callCtx(ctx)
		defer cancel()
		resp, err := cli.Get(ctx, key)
		return err == nil && len(resp.Kvs) == 1
	})
}

// TestNameTakenIsNotStolenBack: after losing its lease, a process does not take its name
// back from a process that registered it since.
func TestNameTakenIsNotStolenBack(t *testing.T) {
	srv := sharedEtcd(t)
	cli := rawClient(t, srv)
	ctx := ctxT(t)
	a := open(t, srv, directory.Config{})
	b := open(t, srv, directory.Config{})
	require.NoError(t, a.Register(ctx, "p", directory.Entry{Host: "127.0.0.1", Port: 1}))
	lease := firstLease(a, "p")
	require.NoError(t, b.Register(ctx, "p", directory.Entry{Host: "127.0.0.1", Port: 2}))
	_, err := cli.Revoke(ctx, lease)
	require.NoError(t, err)
	a.mu.Lock()
	done := a.regs["p"].done
	a.mu.Unlock()
	select {
	case <-done: // a's keeper gave the name up
	case <-ctx.Done():
		t.Fatal("a's keeper still runs")
	}
	resp, err := cli.Get(ctx, directory.Prefix(t.Name())+"p")
	require.NoError(t, err)
	require.Equal(t, string(directory.Encode(directory.Entry{Host: "127.0.0.1", Port: 2})), string(resp.Kvs[0].Value))
}

// TestLeaseExpiresAfterKill9: a registered process killed with SIGKILL leaves an entry
// that disappears within its TTL (2 s); the resolver sees the name go.
func TestLeaseExpiresAfterKill9(t *testing.T) {
	srv := sharedEtcd(t)
	ctx := ctxT(t)
	r := open(t, srv, directory.Config{})
	eventually(t, "watch up", func() bool { r.mu.Lock(); defer r.mu.Unlock(); return r.watchFrom > 0 })
	cmd := startHelper(t, srv)
	addr, err := r.Resolve(ctx, "victim")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:4242", addr)
	eventually(t, "cached", cachedIs(r, "victim", "127.0.0.1:4242"))
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	killed := time.Now()
	_ = cmd.Wait()
	eventually(t, "entry gone", func() bool { _, err := r.Cached("victim"); return errors.Is(err, directory.ErrNotFound) })
	t.Logf("kill -9: entry gone %v after the kill (TTL 2 s)", time.Since(killed).Round(time.Millisecond))
	_, err = r.Resolve(ctx, "victim")
	require.ErrorIs(t, err, directory.ErrNotFound)
}

func TestThousandNames(t *testing.T) {
	srv := sharedEtcd(t)
	// 1 000 registrations and resolutions, each a round trip to an etcd under -race: a
	// hang guard that a loaded machine does not reach (30 s did not).
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	w := open(t, srv, directory.Config{TTL: 10 * time.Second})
	r := open(t, srv, directory.Config{})
	const n = 1000
	for i := range n {
		require.NoError(t, w.Register(ctx, fmt.Sprintf("node-%04d", i), directory.Entry{Host: "127.0.0.1", Port: 10000 + i}))
	}
	eventually(t, "watch up", func() bool { r.mu.Lock(); defer r.mu.Unlock(); return r.watchFrom > 0 })
	for i := range n {
		addr, err := r.Resolve(ctx, fmt.Sprintf("node-%04d", i))
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("127.0.0.1:%d", 10000+i), addr)
	}
	require.Equal(t, n, cacheLen(r))
	require.NoError(t, w.Close(ctx))
	eventually(t, "all gone", func() bool {
		for i := range n {
			if _, err := r.Cached(fmt.Sprintf("node-%04d", i)); !errors.Is(err, directory.ErrNotFound) {
				return false
			}
		}
		return true
	})
}

func TestCacheIsBounded(t *testing.T) {
	srv := sharedEtcd(t)
	cli := rawClient(t, srv)
	ctx := ctxT(t)
	r := open(t, srv, directory.Config{MaxCache: 10})
	eventually(t, "watch up", func() bool { r.mu.Lock(); defer r.mu.Unlock(); return r.watchFrom > 0 })
	for i := range 50 {
		_, err := cli.Put(ctx, directory.Prefix(t.Name())+fmt.Sprint(i), string(directory.Encode(directory.Entry{Host: "h", Port: i + 1})))
		require.NoError(t, err)
	}
	for i := range 50 {
		addr, err := r.Resolve(ctx, fmt.Sprint(i))
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("h:%d", i+1), addr)
		_, _ = r.Resolve(ctx, fmt.Sprintf("absent-%d", i))
	}
	require.LessOrEqual(t, cacheLen(r), 10)
}

func TestUnreachableDirectory(t *testing.T) {
	// A port nothing listens on.
	srv, err := etcdtest.New(t.TempDir())
	require.NoError(t, err)
	srv.Close()
	d, err := directory.Open(srv.Conn(), directory.Config{Timeout: 200 * time.Millisecond})
	require.NoError(t, err, "opening does not wait for etcd")
	defer d.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = d.Resolve(ctx, "decode-7")
	require.ErrorIs(t, err, directory.ErrUnavailable)
	require.Contains(t, err.Error(), srv.Endpoint())
	err = d.Register(context.Background(), "me", directory.Entry{Host: "127.0.0.1", Port: 1})
	require.ErrorIs(t, err, directory.ErrUnavailable)
	_, err = d.Cached("decode-7")
	require.ErrorIs(t, err, directory.ErrNotCached)
}

// BenchmarkResolve: a cached resolve (map lookup under a mutex) and an uncached one (one
// etcd read from the embedded server, singleflighted, then cached).
//
//	go test -run '^$' -bench Resolve -benchmem ./notify/directory/
func BenchmarkResolve(b *testing.B) {
	dir := b.TempDir()
	srv, err := etcdtest.New(dir)
	require.NoError(b, err)
	defer srv.Close()
	w, err := directory.Open(srv.Conn(), directory.Config{})
	require.NoError(b, err)
	defer w.Close(context.Background())
	ctx := context.Background()
	require.NoError(b, w.Register(ctx, "decode-7", directory.Entry{Host: "127.0.0.1", Port: 17001}))
	rd, err := directory.Open(srv.Conn(), directory.Config{})
	require.NoError(b, err)
	defer rd.Close(context.Background())
	r := rd.(*Directory)
	_, err = r.Resolve(ctx, "decode-7")
	require.NoError(b, err)
	b.Run("cached", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := r.Resolve(ctx, "decode-7"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("uncached", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			r.mu.Lock()
			clear(r.cache)
			r.mu.Unlock()
			if _, err := r.Resolve(ctx, "decode-7"); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestRegisterRacesUnregister: an Unregister (or Close) that comes while Register is still
// publishing neither panics nor hangs, and leaves the name unregistered once both return.
func TestRegisterRacesUnregister(t *testing.T) {
	srv := sharedEtcd(t)
	cli := rawClient(t, srv)
	ctx := ctxT(t)
	d := open(t, srv, directory.Config{})
	key := directory.Prefix(t.Name()) + "p"
	for i := 0; i < 20; i++ {
		regErr := make(chan error, 1)
		go func() { regErr <- d.Register(ctx, "p", directory.Entry{Host: "127.0.0.1", Port: 7}) }()
		var unErr error
		for { // until the Register is seen (it may still be publishing)
			if unErr = d.Unregister(ctx, "p"); !errors.Is(unErr, directory.ErrNotFound) {
				break
			}
			runtime.Gosched()
		}
		require.NoError(t, unErr, "round %d", i)
		require.NoError(t, <-regErr, "round %d", i)
		resp, err := cli.Get(ctx, key)
		require.NoError(t, err)
		require.Empty(t, resp.Kvs, "round %d: the name outlived its Unregister", i)
	}
	// Close racing with a Register in flight.
	d2 := open(t, srv, directory.Config{})
	regErr := make(chan error, 1)
	go func() { regErr <- d2.Register(ctx, "q", directory.Entry{Host: "127.0.0.1", Port: 8}) }()
	for {
		d2.mu.Lock()
		seen := d2.regs["q"] != nil
		d2.mu.Unlock()
		if seen {
			break
		}
		runtime.Gosched()
	}
	require.NoError(t, d2.Close(ctx))
	require.NoError(t, <-regErr)
	resp, err := cli.Get(ctx, directory.Prefix(t.Name())+"q")
	require.NoError(t, err)
	require.Empty(t, resp.Kvs, "the name outlived Close")
}

// A caller that cancels its resolve says nothing of etcd: the directory is not marked
// down, and the next resolve reads etcd.
func TestResolveCanceledIsNotDown(t *testing.T) {
	srv := sharedEtcd(t)
	d := open(t, srv, directory.Config{})
	w := open(t, srv, directory.Config{})
	ctx := ctxT(t)
	require.NoError(t, w.Register(ctx, "p", directory.Entry{Host: "127.0.0.1", Port: 7}))
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err := d.Resolve(cctx, "q")
	require.Error(t, err)
	addr, err := d.Resolve(ctx, "p") // not cached: read from etcd, unless taken for down
	require.NoError(t, err, "a cancelled resolve marked the directory down")
	require.Equal(t, "127.0.0.1:7", addr)
}
