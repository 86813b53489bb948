package directory

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// mooncakeValue is what Mooncake's addRpcMetaEntry puts: jsoncpp FastWriter output of
// {ip_or_host_name, rpc_port}, keys sorted, newline-terminated.
const mooncakeValue = "{\"ip_or_host_name\":\"10.0.0.7\",\"rpc_port\":12001}\n"

func TestEncodeIsMooncakeBytes(t *testing.T) {
	require.Equal(t, mooncakeValue, string(Encode(Entry{Host: "10.0.0.7", Port: 12001})))
	e, err := Decode("k", Encode(Entry{Host: "decode-7.cluster", Port: 65535}))
	require.NoError(t, err)
	require.Equal(t, Entry{Host: "decode-7.cluster", Port: 65535}, e)
}

func TestDecode(t *testing.T) {
	const key = "mooncake/rpc_meta/decode-7"
	good := []struct {
		val  string
		want string
	}{
		{mooncakeValue, "10.0.0.7:12001"},
		{`{"ip_or_host_name": "node-3", "rpc_port": 17001}`, "node-3:17001"},
		{`{"rpc_port":1,"ip_or_host_name":"::1","extra":[1,2]}`, "[::1]:1"},
	}
	for _, tc := range good {
		e, err := Decode(key, []byte(tc.val))
		require.NoError(t, err, tc.val)
		require.Equal(t, tc.want, e.Addr())
	}
	bad := []struct {
		val, field, why string
	}{
		{`not json`, "value", "not a JSON object"},
		{``, "value", "not a JSON object"},
		{`[1,2]`, "value", "not a JSON object"},
		{`{"ip_or_host_name":"h","rpc_port":12001.5}`, "rpc_port", "not an integer"},
		{`{"ip_or_host_name":"h","rpc_port":12001.0}`, "rpc_port", "not an integer"},
		{`{"ip_or_host_name":"h","rpc_port":0}`, "rpc_port", "out of range"},
		{`{"ip_or_host_name":"h","rpc_port":65536}`, "rpc_port", "out of range"},
		{`{"ip_or_host_name":"h","rpc_port":-1}`, "rpc_port", "out of range"},
		{`{"ip_or_host_name":"h","rpc_port":"12001"}`, "rpc_port", "not a number"},
		{`{"ip_or_host_name":"h"}`, "rpc_port", "missing"},
		{`{"ip_or_host_name":"[","rpc_port":1}`, "ip_or_host_name", `contains '['`},
		{`{"ip_or_host_name":"h]","rpc_port":1}`, "ip_or_host_name", `contains ']'`},
		{`{"ip_or_host_name":"h","rpc_port":null}`, "rpc_port", "missing"},
		{`{"ip_or_host_name":"","rpc_port":1}`, "ip_or_host_name", "empty"},
		{`{"rpc_port":1}`, "ip_or_host_name", "missing"},
		{`{"ip_or_host_name":7,"rpc_port":1}`, "ip_or_host_name", "not a string"},
		{`{"ip_or_host_name":"a b","rpc_port":1}`, "ip_or_host_name", "contains"},
		{`{"ip_or_host_name":"h:1","rpc_port":1}`, "ip_or_host_name", "not an IPv6"},
		{`{"ip_or_host_name":"` + strings.Repeat("h", 300) + `","rpc_port":1}`, "ip_or_host_name", "maximum"},
		{strings.Repeat(" ", MaxValueLen+1), "value", "maximum"},
	}
	for _, tc := range bad {
		_, err := Decode(key, []byte(tc.val))
		require.ErrorIs(t, err, ErrBadValue, tc.val)
		require.Contains(t, err.Error(), key, tc.val)
		require.Contains(t, err.Error(), ": "+tc.field+": ", tc.val)
		require.Contains(t, err.Error(), tc.why, tc.val)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(mooncakeValue))
	f.Add([]byte(`{"ip_or_host_name":"::1","rpc_port":65535}`))
	f.Add([]byte(`{"ip_or_host_name":"h","rpc_port":1e3}`))
	f.Add([]byte(`{"ip_or_host_name":null}`))
	f.Fuzz(func(t *testing.T, val []byte) {
		e, err := Decode("k", val)
		if err != nil {
			if !errors.Is(err, ErrBadValue) || !strings.Contains(err.Error(), "k: ") {
				t.Fatalf("error %v does not wrap ErrBadValue or name the key", err)
			}
			return
		}
		// What decodes re-encodes to Mooncake's form and decodes to the same entry.
		again, err := Decode("k", Encode(e))
		if err != nil || again != e {
			t.Fatalf("%+v: re-decoded %+v, %v", e, again, err)
		}
		if _, err := EntryFromAddr(e.Addr()); err != nil {
			t.Fatalf("%+v: address %q does not parse back: %v", e, e.Addr(), err)
		}
	})
}

func TestPrefix(t *testing.T) {
	require.Equal(t, "mooncake/rpc_meta/", Prefix(""))
	require.Equal(t, "mooncake/prod/rpc_meta/", Prefix("prod"))
	require.Equal(t, "mooncake/prod/rpc_meta/", Prefix("prod/"))
}

func TestParseConn(t *testing.T) {
	good := []struct {
		in   string
		want Conn
	}{
		{"P2PHANDSHAKE", Conn{Backend: BackendP2P}},
		{"etcd://h1:2379", Conn{Backend: BackendEtcd, Endpoints: []string{"h1:2379"}}},
		{"etcd://h1:2379,h2:2379", Conn{Backend: BackendEtcd, Endpoints: []string{"h1:2379", "h2:2379"}}},
		{"etcd://h1:2379;h2:2379;", Conn{Backend: BackendEtcd, Endpoints: []string{"h1:2379", "h2:2379"}}},
		{"127.0.0.1:2379", Conn{Backend: BackendEtcd, Endpoints: []string{"127.0.0.1:2379"}}}, // Mooncake's default backend
		{"redis://h:6379", Conn{Backend: BackendRedis, Endpoints: []string{"h:6379"}}},
		{"redis://10.0.0.1", Conn{Backend: BackendRedis, Endpoints: []string{"10.0.0.1:6379"}}},
		{"rediss://h:6380/", Conn{Backend: BackendRedis, Endpoints: []string{"h:6380"}, TLS: true}},
		{"redis://[::1]:7000", Conn{Backend: BackendRedis, Endpoints: []string{"[::1]:7000"}}},
		{"http://h:8080/metadata", Conn{Backend: BackendHTTP, Endpoints: []string{"h:8080"}, URL: "http://h:8080/metadata"}},
		{"http://h", Conn{Backend: BackendHTTP, Endpoints: []string{"h:80"}, URL: "http://h"}},
		{"https://h/m", Conn{Backend: BackendHTTP, Endpoints: []string{"h:443"}, TLS: true, URL: "https://h/m"}},
	}
	for _, tc := range good {
		c, err := ParseConn(tc.in)
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, c, tc.in)
	}
	for _, in := range []string{"", "etcd://", "etcd://h1", "etcd://h1:0", "etcd://:2379", "p2phandshake",
		"redis://", "redis://u:p@h:6379", "redis://h:6379/0", "redis://h:99999", "redis://h:6379?x=1", "redis://h1,h2",
		"http://", "http://h:8080/m?x=1", "http://u@h/m", "http://h:0/m", "http://h/m#f", "ftp://h:21", "mongodb://h"} {
		_, err := ParseConn(in)
		require.ErrorIs(t, err, ErrBadConn, in)
	}
}

func TestCheckName(t *testing.T) {
	require.NoError(t, CheckName("decode-7"))
	require.NoError(t, CheckName("10.0.0.7:17777"))
	for _, n := range []string{"", "a/b", "a\nb", strings.Repeat("n", MaxNameLen+1), "\xff"} {
		require.ErrorIs(t, CheckName(n), ErrBadName, "%q", n)
	}
}

func TestP2P(t *testing.T) {
	d, err := Open(P2PHandshake, Config{})
	require.NoError(t, err)
	addr, err := d.Resolve(context.Background(), "10.0.0.7:12001")
	require.NoError(t, err)
	require.Equal(t, "10.0.0.7:12001", addr)
	_, err = d.Cached("decode-7")
	require.ErrorIs(t, err, ErrNotFound)
	_, err = d.Resolve(context.Background(), "h:99999")
	require.ErrorIs(t, err, ErrNotFound)
	require.NoError(t, d.Register(context.Background(), "x", Entry{Host: "h", Port: 1}))
	require.NoError(t, d.Close(context.Background()))
}

// Without its backend linked in (this test binary imports no backend), a connection string
// parses but does not open, and the error names the import.
func TestBackendNotLinked(t *testing.T) {
	for conn, pkg := range map[string]string{"etcd://127.0.0.1:2379": "etcd", "127.0.0.1:2379": "etcd",
		"redis://127.0.0.1:6379": "redis", "rediss://h": "redis", "http://h:8080/metadata": "http", "https://h/m": "http"} {
		_, err := ParseConn(conn)
		require.NoError(t, err)
		for _, err := range []error{CheckConn(conn), func() error { _, err := Open(conn, Config{}); return err }()} {
			require.ErrorIs(t, err, ErrBadConn)
			require.ErrorContains(t, err, `import _ "github.com/twosided/twosided/notify/directory/`+pkg+`"`)
		}
	}
	require.NoError(t, CheckConn(P2PHandshake))
	d, err := Open(P2PHandshake, Config{})
	require.NoError(t, err)
	require.Equal(t, P2P{}, d)
}

func TestRegisterBackend(t *testing.T) {
	const name = "test-backend"
	opened := 0
	RegisterBackend(name, func(c Conn, cfg Config) (Directory, error) {
		opened++
		require.Equal(t, DefaultTTL, cfg.TTL) // defaults filled before the backend sees cfg
		return P2P{}, nil
	})
	t.Cleanup(func() { backends.Lock(); delete(backends.m, name); backends.Unlock() })
	open, err := backend("x", name)
	require.NoError(t, err)
	_, err = open(Conn{Backend: name}, func() Config { c, _ := Config{}.WithDefaults(); return c }())
	require.NoError(t, err)
	require.Equal(t, 1, opened)
	require.Panics(t, func() { RegisterBackend(name, func(Conn, Config) (Directory, error) { return nil, nil }) })
	require.Panics(t, func() { RegisterBackend("nil-opener", nil) })
}

// FuzzParseConn: any string parses or fails with ErrBadConn, never panics, and what parses
// names a backend with its endpoints.
func FuzzParseConn(f *testing.F) {
	for _, s := range []string{"P2PHANDSHAKE", "etcd://h1:2379,h2:2379", "h:2379", "redis://h:6379", "rediss://h",
		"http://h:8080/metadata", "https://[::1]:1/x", "http://h/m?key=", "redis://[::1]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseConn(s)
		if err != nil {
			if !errors.Is(err, ErrBadConn) {
				t.Fatalf("%q: %v does not wrap ErrBadConn", s, err)
			}
			return
		}
		switch c.Backend {
		case BackendP2P:
		case BackendEtcd, BackendRedis, BackendHTTP:
			if len(c.Endpoints) == 0 {
				t.Fatalf("%q: no endpoint", s)
			}
			for _, ep := range c.Endpoints {
				if _, _, err := net.SplitHostPort(ep); err != nil {
					t.Fatalf("%q: endpoint %q: %v", s, ep, err)
				}
			}
			if c.Backend == BackendHTTP && c.URL == "" {
				t.Fatalf("%q: no URL", s)
			}
		default:
			t.Fatalf("%q: backend %q", s, c.Backend)
		}
	})
}
