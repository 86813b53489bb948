package http

import (
	"encoding/pem"
	"errors"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/notify/directory"
	"github.com/twosided/twosided/notify/directory/metaserver"
)

const mooncakeValue = "{\"ip_or_host_name\":\"10.0.0.7\",\"rpc_port\":12001}\n"

func cachedIs(d *Directory, name, addr string) func() bool {
	return func() bool { a, err := d.Cached(name); return err == nil && a == addr }
}

// servers are the three servers the backend is tested against.
func servers(t *testing.T) map[string]string {
	_, example := newExample(t, false)
	_, python := newExample(t, true)
	return map[string]string{
		"metadata-server":    newMetaServer(t).Conn(),
		"mooncake-example":   example,
		"duplicate-refusing": python,
	}
}

func TestRegisterResolveMooncakeLayout(t *testing.T) {
	for kind, conn := range servers(t) {
		t.Run(kind, func(t *testing.T) {
			ctx := ctxT(t)
			a := open(t, conn, directory.Config{ClusterID: "prod"}, Options{})
			b := open(t, conn, directory.Config{ClusterID: "prod/"}, Options{})
			require.NoError(t, a.Register(ctx, "decode-7", directory.Entry{Host: "127.0.0.1", Port: 17001}))
			code, val := rawGet(t, conn, "mooncake/prod/rpc_meta/decode-7")
			require.Equal(t, 200, code)
			require.Equal(t, "{\"ip_or_host_name\":\"127.0.0.1\",\"rpc_port\":17001}\n", val)

			addr, err := b.Resolve(ctx, "decode-7")
			require.NoError(t, err)
			require.Equal(t, "127.0.0.1:17001", addr)
			addr, err = b.Cached("decode-7")
			require.NoError(t, err)
			require.Equal(t, "127.0.0.1:17001", addr)

			other := open(t, conn, directory.Config{ClusterID: "staging"}, Options{})
			_, err = other.Resolve(ctx, "decode-7")
			require.ErrorIs(t, err, directory.ErrNotFound)
			require.ErrorContains(t, err, "mooncake/staging/rpc_meta/decode-7")
			require.ErrorContains(t, err, conn)

			// Refreshes (a third of the TTL) leave the value as it was.
			time.Sleep(1500 * time.Millisecond)
			require.True(t, a.Registered("decode-7"))
			_, val = rawGet(t, conn, "mooncake/prod/rpc_meta/decode-7")
			require.Equal(t, "{\"ip_or_host_name\":\"127.0.0.1\",\"rpc_port\":17001}\n", val)

			require.NoError(t, a.Unregister(ctx, "decode-7"))
			code, _ = rawGet(t, conn, "mooncake/prod/rpc_meta/decode-7")
			require.Equal(t, 404, code)
			eventually(t, "deletion seen", func() bool { _, err := b.Cached("decode-7"); return errors.Is(err, directory.ErrNotFound) })
		})
	}
}

// The key is sent percent-encoded as curl_easy_escape does for Mooncake's plugin.
func TestKeyEncodedAsMooncake(t *testing.T) {
	ex, conn := newExample(t, false)
	d := open(t, conn, directory.Config{ClusterID: "c 1"}, Options{})
	_, err := d.Resolve(ctxT(t), "decode-7")
	require.ErrorIs(t, err, directory.ErrNotFound)
	ex.mu.Lock()
	defer ex.mu.Unlock()
	require.Equal(t, "key=mooncake%2Fc%201%2Frpc_meta%2Fdecode-7", ex.queries[0])
	require.Equal(t, "a-b.c_d~e%2F%20%3F%26%3D%25%C3%A9", EscapeKey("a-b.c_d~e/ ?&=%é"))
}

func FuzzEscapeKey(f *testing.F) {
	f.Add("mooncake/rpc_meta/decode-7")
	f.Add("a b+c%2F&key=x")
	f.Fuzz(func(t *testing.T, key string) {
		e := EscapeKey(key)
		v, err := url.ParseQuery("key=" + e)
		if err != nil || v.Get("key") != key {
			t.Fatalf("%q: escaped %q read back as %q (%v)", key, e, v.Get("key"), err)
		}
	})
}

func TestMooncakeWrittenValueResolves(t *testing.T) {
	for kind, conn := range servers(t) {
		t.Run(kind, func(t *testing.T) {
			rawPut(t, conn, "mooncake/rpc_meta/prefill-0", mooncakeValue)
			nd, err := directory.Open(conn, directory.Config{})
			require.NoError(t, err)
			defer nd.Close(ctxT(t))
			addr, err := nd.Resolve(ctxT(t), "prefill-0")
			require.NoError(t, err)
			require.Equal(t, "10.0.0.7:12001", addr)
		})
	}
}

// A server that refuses to put an rpc_meta key again (Mooncake's Python server, Store
// master) still lets a process restarting under its name replace its dead predecessor's
// entry; its refreshes are answered 400 and the registration holds.
func TestTakeOverOnDuplicateRefusingServer(t *testing.T) {
	ex, conn := newExample(t, true)
	ctx := ctxT(t)
	d := open(t, conn, directory.Config{}, Options{})
	key := d.Key("decode-7")
	ex.set(key, []byte(mooncakeValue))
	require.NoError(t, d.Register(ctx, "decode-7", directory.Entry{Host: "127.0.0.1", Port: 5}))
	v, _ := ex.get(key)
	require.Equal(t, string(directory.Encode(directory.Entry{Host: "127.0.0.1", Port: 5})), string(v))
	time.Sleep(2 * time.Second) // refreshes
	require.True(t, d.Registered("decode-7"))
}

func TestNameTakenIsNotTakenBack(t *testing.T) {
	ex, conn := newExample(t, false)
	ctx := ctxT(t)
	d := open(t, conn, directory.Config{TTL: time.Second}, Options{})
	require.NoError(t, d.Register(ctx, "n", directory.Entry{Host: "127.0.0.1", Port: 1}))
	ex.set(d.Key("n"), []byte(mooncakeValue))
	eventually(t, "keeper stopped", func() bool { return !d.Registered("n") })
	require.NoError(t, d.Unregister(ctx, "n"))
	v, ok := ex.get(d.Key("n"))
	require.True(t, ok)
	require.Equal(t, mooncakeValue, string(v))
}

func TestBadValuesAndWrongPath(t *testing.T) {
	_, conn := newExample(t, false)
	ctx := ctxT(t)
	d := open(t, conn, directory.Config{}, Options{})
	prefix := directory.Prefix(t.Name())
	for _, tc := range []struct{ name, val, field string }{
		{"notjson", "decode-7 at 10.0.0.7", "value"},
		{"bigport", `{"ip_or_host_name":"10.0.0.7","rpc_port":70000}`, "rpc_port"},
	} {
		rawPut(t, conn, prefix+tc.name, tc.val)
		_, err := d.Resolve(ctx, tc.name)
		require.ErrorIs(t, err, directory.ErrBadValue)
		require.ErrorContains(t, err, prefix+tc.name)
		require.ErrorContains(t, err, tc.field)
		require.ErrorContains(t, err, conn)
	}
	wrong := open(t, conn[:len(conn)-len("/metadata")]+"/meta", directory.Config{}, Options{})
	_, err := wrong.Resolve(ctx, "x")
	require.ErrorIs(t, err, directory.ErrUnavailable)
	require.ErrorContains(t, err, "404 page not found")
	require.ErrorContains(t, err, "path")
	err = wrong.Register(ctx, "x", directory.Entry{Host: "127.0.0.1", Port: 1})
	require.ErrorIs(t, err, directory.ErrUnavailable)
	require.ErrorContains(t, err, "PUT")
}

// TestEntryGoneAfterKill9OnMetadataServer: on twosided metadata-server the entry of a
// process killed with -9 goes within its TTL; on a Mooncake server it stays, and a
// resolver finds the dead address (the engine's handshake then fails at once: see the
// engine test in cmd/twosided).
func TestEntryAfterKill9(t *testing.T) {
	ms := newMetaServer(t)
	_, example := newExample(t, false)
	for _, conn := range []string{ms.Conn(), example} {
		cmd := startHelper(t, conn)
		key := directory.Prefix(t.Name()) + "victim"
		code, _ := rawGet(t, conn, key)
		require.Equal(t, 200, code)
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		_ = cmd.Wait()
		if conn == ms.Conn() {
			eventually(t, "entry expired", func() bool { code, _ := rawGet(t, conn, key); return code == 404 })
			continue
		}
		r := open(t, conn, directory.Config{}, Options{})
		addr, err := r.Resolve(ctxT(t), "victim")
		require.NoError(t, err)
		require.Equal(t, "127.0.0.1:4242", addr)
	}
}

// TestServerDownAndBack: cached names keep resolving while the server is down; an uncached
// name fails with ErrUnavailable naming the server and the key; the server restarted
// empty gets the registration back.
func TestServerDownAndBack(t *testing.T) {
	ms := newMetaServer(t)
	conn := ms.Conn()
	ctx := ctxT(t)
	w := open(t, conn, directory.Config{TTL: time.Second}, Options{})
	// The resolver keeps an address found absent for a refresh period of its own TTL (20 s)
	// and a poll: longer than the writer needs to put its registration back.
	r := open(t, conn, directory.Config{Timeout: 2 * time.Second, TTL: time.Minute}, Options{})
	require.NoError(t, w.Register(ctx, "p", directory.Entry{Host: "127.0.0.1", Port: 7}))
	addr, err := r.Resolve(ctx, "p")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:7", addr)

	ms.Stop()
	for range 20 {
		addr, err = r.Resolve(ctx, "p")
		require.NoError(t, err)
		require.Equal(t, "127.0.0.1:7", addr)
		time.Sleep(10 * time.Millisecond)
	}
	_, err = r.Resolve(ctx, "q")
	require.ErrorIs(t, err, directory.ErrUnavailable)
	require.ErrorContains(t, err, conn)
	require.ErrorContains(t, err, "rpc_meta/q")
	require.ErrorContains(t, err, "connection refused")

	ms.Start()
	eventually(t, "registration back", func() bool {
		code, v := rawGet(t, conn, w.Key("p"))
		return code == 200 && v == string(directory.Encode(directory.Entry{Host: "127.0.0.1", Port: 7}))
	})
	addr, err = r.Cached("p")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:7", addr)
	eventually(t, "uncached resolves again", func() bool { _, err := r.Resolve(ctx, "q"); return errors.Is(err, directory.ErrNotFound) })
}

func TestHTTPS(t *testing.T) {
	h, err := metaserver.New("", metaserver.Limits{}, nil)
	require.NoError(t, err)
	srv := httptest.NewTLSServer(h)
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600))
	conn := srv.URL + "/metadata"
	require.Contains(t, conn, "https://")
	ctx := ctxT(t)
	d := open(t, conn, directory.Config{}, Options{CAFile: ca})
	require.NoError(t, d.Register(ctx, "n", directory.Entry{Host: "127.0.0.1", Port: 9}))
	r := open(t, conn, directory.Config{}, Options{CAFile: ca})
	addr, err := r.Resolve(ctx, "n")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:9", addr)
	untrusted := open(t, conn, directory.Config{}, Options{})
	_, err = untrusted.Resolve(ctx, "n")
	require.ErrorIs(t, err, directory.ErrUnavailable)
	require.ErrorContains(t, err, "certificate")
}
