package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/notify"
	"github.com/twosided/twosided/notify/directory"
	dirhttp "github.com/twosided/twosided/notify/directory/http"
	"github.com/twosided/twosided/notify/directory/redistest"
)

// kvBackend is a metadata service of the tests: its connection string and a plain client
// that reads and writes a key as a Mooncake node does.
type kvBackend struct {
	conn string
	get  func(key string) (string, bool)
	put  func(key, val string)
}

func redisBackend(t *testing.T) kvBackend {
	if _, err := redistest.Binary(); err != nil {
		t.Skipf("SKIPPED: no redis-server, the Redis backend was not tested: %v", err)
	}
	srv, err := redistest.New(t.TempDir(), redistest.Config{})
	require.NoError(t, err)
	t.Cleanup(srv.Close)
	cli := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), Protocol: 2, DisableIdentity: true})
	t.Cleanup(func() { _ = cli.Close() })
	return kvBackend{
		conn: srv.Conn(),
		get: func(key string) (string, bool) {
			v, err := cli.Get(context.Background(), key).Result()
			return v, err == nil
		},
		put: func(key, val string) { require.NoError(t, cli.Set(context.Background(), key, val, 0).Err()) },
	}
}

// startMetadataServer runs `twosided metadata-server` in this process until the test ends.
func startMetadataServer(t *testing.T) string {
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		var errOut bytes.Buffer
		code := run(ctx, []string{"metadata-server", "--listen", "127.0.0.1:0"}, pw, &errOut)
		_ = pw.CloseWithError(io.EOF)
		done <- code
	}()
	t.Cleanup(func() {
		cancel()
		require.Equal(t, 0, <-done)
	})
	sc := bufio.NewScanner(pr)
	require.True(t, sc.Scan(), "metadata-server printed nothing")
	line := sc.Text()
	require.True(t, strings.HasPrefix(line, "metadata server on http://"), line)
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	return strings.Fields(strings.TrimPrefix(line, "metadata server on "))[0]
}

func httpBackend(t *testing.T) kvBackend {
	conn := startMetadataServer(t)
	return kvBackend{
		conn: conn,
		get: func(key string) (string, bool) {
			resp, err := http.Get(conn + "?key=" + dirhttp.EscapeKey(key))
			require.NoError(t, err)
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return string(b), resp.StatusCode == 200
		},
		put: func(key, val string) {
			req, err := http.NewRequest("PUT", conn+"?key="+dirhttp.EscapeKey(key), strings.NewReader(val))
			require.NoError(t, err)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, 200, resp.StatusCode)
		},
	}
}

func backends(t *testing.T) map[string]func(*testing.T) kvBackend {
	return map[string]func(*testing.T) kvBackend{"redis": redisBackend, "http": httpBackend}
}

// serve registered by name in each backend: the stored value is Mooncake's bytes, send
// reaches it by name; a Mooncake-format entry written by another client is resolved and
// sent to; an entry at a dead address fails at once, naming the name and the address.
func TestServeAndSendByNameRedisHTTP(t *testing.T) {
	for kind, mk := range backends(t) {
		t.Run(kind, func(t *testing.T) {
			b := mk(t)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			addr, served := startServe(t, ctx, "--name", "decode-7", "--metadata", b.conn, "--cluster-id", "cmdtest", "--expect", "3")
			entry, err := directory.EntryFromAddr(addr)
			require.NoError(t, err)
			val, ok := b.get("mooncake/cmdtest/rpc_meta/decode-7")
			require.True(t, ok)
			require.Equal(t, "{\"ip_or_host_name\":\""+entry.Host+"\",\"rpc_port\":"+strconv.Itoa(entry.Port)+"}\n", val)

			var out, errOut bytes.Buffer
			code := run(ctx, []string{"send", "--peer", "decode-7", "--metadata", b.conn, "--cluster-id", "cmdtest", "-n", "2"}, &out, &errOut)
			require.Equal(t, 0, code, "send: %s %s", out.String(), errOut.String())

			// A Mooncake node's entry, written as its plugin writes it (no TTL).
			b.put("mooncake/cmdtest/rpc_meta/prefill-0", "{\"ip_or_host_name\":\""+entry.Host+"\",\"rpc_port\":"+strconv.Itoa(entry.Port)+"}\n")
			out.Reset()
			code = run(ctx, []string{"send", "--peer", "prefill-0", "--metadata", b.conn, "--cluster-id", "cmdtest"}, &out, &errOut)
			require.Equal(t, 0, code, "send: %s %s", out.String(), errOut.String())
			r := <-served
			require.Equal(t, 0, r.code, r.stderr)
			require.Contains(t, r.stdout, "registered as decode-7")

			// serve closed: its entry was deleted.
			_, ok = b.get("mooncake/cmdtest/rpc_meta/decode-7")
			require.False(t, ok)

			// A dead address (a crashed Mooncake node's entry stays): the handshake fails at
			// once, not at the timeout, and the error names the name and the address.
			dead := deadAddr(t)
			de, _ := directory.EntryFromAddr(dead)
			b.put("mooncake/cmdtest/rpc_meta/crashed", string(directory.Encode(de)))
			out.Reset()
			code = run(ctx, []string{"send", "--peer", "crashed", "--metadata", b.conn, "--cluster-id", "cmdtest", "--timeout", "50s"}, &out, &errOut)
			require.NotEqual(t, 0, code)
			require.Contains(t, out.String(), "crashed ("+dead+")")
			require.Contains(t, out.String(), "peer unreachable")

			out.Reset()
			code = run(ctx, []string{"send", "--peer", "nobody", "--metadata", b.conn, "--timeout", "5s"}, &out, &errOut)
			require.NotEqual(t, 0, code)
			require.Contains(t, out.String(), "peer unknown")
		})
	}
}

// deadAddr is a loopback host:port nobody listens on.
func deadAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	a := l.Addr().String()
	require.NoError(t, l.Close())
	return a
}

// The engine's errors wrap notify's sentinels as with etcd: a bad connection string
// ErrConfig, an unknown name or a bad value ErrPeerUnknown, a dead address
// ErrPeerUnreachable; each names the backend and the key where the directory answered.
func TestEngineErrorsRedisHTTP(t *testing.T) {
	for _, bad := range []string{"redis://h:99999", "redis://u:p@h:6379", "http://h:8080/m?x=1"} {
		_, err := notify.New(notify.WithMetadata(bad))
		require.ErrorIs(t, err, notify.ErrConfig, bad)
		require.ErrorContains(t, err, "bad metadata connection string", bad)
	}
	for kind, mk := range backends(t) {
		t.Run(kind, func(t *testing.T) {
			b := mk(t)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			e, err := notify.New(notify.WithMetadata(b.conn), notify.WithMetadataClusterID("errs"),
				notify.WithListenAddr("127.0.0.1:0"), notify.WithTransport(notify.TransportOOB), notify.WithoutProcsReserve())
			require.NoError(t, err)
			defer func() { _ = e.Close(ctx) }()
			err = e.SendNotify(ctx, "nobody", notify.Notify{Name: "n"})
			require.ErrorIs(t, err, notify.ErrPeerUnknown)
			require.ErrorContains(t, err, "mooncake/errs/rpc_meta/nobody")
			require.ErrorContains(t, err, b.conn)

			b.put("mooncake/errs/rpc_meta/badjson", "{not json")
			err = e.SendNotify(ctx, "badjson", notify.Notify{Name: "n"})
			require.ErrorIs(t, err, notify.ErrPeerUnknown)
			require.ErrorIs(t, err, directory.ErrBadValue)
			require.ErrorContains(t, err, "mooncake/errs/rpc_meta/badjson")

			dead := deadAddr(t)
			de, _ := directory.EntryFromAddr(dead)
			b.put("mooncake/errs/rpc_meta/crashed", string(directory.Encode(de)))
			err = e.SendNotify(ctx, "crashed", notify.Notify{Name: "n"})
			require.ErrorIs(t, err, notify.ErrPeerUnreachable)
			require.False(t, errors.Is(err, notify.ErrTimeout), "failed at once, not at the deadline: %v", err)
			require.ErrorContains(t, err, dead)
		})
	}
}

// doctor --peer <name> resolves the name through --metadata; an unknown name is an error
// naming it and the key.
func TestDoctorPeerByName(t *testing.T) {
	b := httpBackend(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	peer, err := notify.New(notify.WithTransport(notify.TransportRDMATwoSided), notify.WithProvider("soft"),
		notify.WithDeviceFilters("soft1"), notify.WithListenAddr("127.0.0.1:0"), notify.WithoutProcsReserve(),
		notify.WithMetadata(b.conn), notify.WithServerName("decode-9"))
	require.NoError(t, err)
	defer func() { _ = peer.Close(ctx) }()
	code, rep, out := runDoctorJSON(t, "--allow-soft", "--device", "soft0", "--peer", "decode-9", "--metadata", b.conn)
	require.Equal(t, 0, code, out)
	require.True(t, rep.Peer.OK, out)
	require.Contains(t, rep.Peer.Detail, "decode-9 ("+peer.Addr()+")")

	var o, e bytes.Buffer
	code = run(ctx, []string{"doctor", "--allow-soft", "--device", "soft0", "--peer", "nobody", "--metadata", b.conn}, &o, &e)
	require.NotEqual(t, 0, code)
	require.Contains(t, o.String()+e.String(), "mooncake/rpc_meta/nobody")
	require.Contains(t, o.String()+e.String(), "peer unknown")
}

// metadata-server over https: an engine registers through MC_METADATA_SERVER=https://… with
// the authority in TWOSIDED_METADATA_CA_FILE, and a second resolves it.
func TestMetadataServerTLS(t *testing.T) {
	dir := t.TempDir()
	cert, key, err := redistest.SelfSigned(dir)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		var errOut bytes.Buffer
		code := run(ctx, []string{"metadata-server", "--listen", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", key}, pw, &errOut)
		_ = pw.CloseWithError(io.EOF)
		done <- code
	}()
	sc := bufio.NewScanner(pr)
	require.True(t, sc.Scan())
	line := sc.Text()
	require.True(t, strings.HasPrefix(line, "metadata server on https://"), line)
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	conn := strings.Fields(strings.TrimPrefix(line, "metadata server on "))[0]
	t.Setenv("TWOSIDED_METADATA_CA_FILE", cert)
	e, err := notify.FromEnv(notify.WithMetadata(conn), notify.WithServerName("tls-0"), notify.WithListenAddr("127.0.0.1:0"),
		notify.WithTransport(notify.TransportOOB), notify.WithoutProcsReserve())
	require.NoError(t, err)
	r, err := notify.FromEnv(notify.WithMetadata(conn), notify.WithListenAddr("127.0.0.1:0"),
		notify.WithTransport(notify.TransportOOB), notify.WithoutProcsReserve())
	require.NoError(t, err)
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	defer scancel()
	addr, err := r.Resolve(sctx, "tls-0")
	require.NoError(t, err)
	require.Equal(t, e.Addr(), addr)
	require.NoError(t, r.SendNotify(sctx, "tls-0", notify.Notify{Name: "n", Msg: []byte("x")}))
	require.NoError(t, e.Close(sctx))
	require.NoError(t, r.Close(sctx))
	cancel()
	require.Equal(t, 0, <-done)
}

func TestMetadataServerBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"metadata-server", "--tls-cert", "x"},
		{"metadata-server", "--max-keys", "0"},
		{"metadata-server", "--path", "metadata"},
	} {
		var out, errOut bytes.Buffer
		require.Equal(t, 2, run(context.Background(), args, &out, &errOut), args)
		require.Contains(t, errOut.String(), "Run 'twosided metadata-server --help' for usage.")
	}
}
