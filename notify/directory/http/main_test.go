package http

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	nethttp "net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/twosided/twosided/notify/directory"
	"github.com/twosided/twosided/notify/directory/metaserver"
)

const (
	helperEnv     = "TWOSIDED_HTTP_TEST_HELPER"
	helperConnEnv = "TWOSIDED_HTTP_TEST_CONN"
	helperCIDEnv  = "TWOSIDED_HTTP_TEST_CLUSTER"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "register" {
		os.Exit(runRegisterHelper())
	}
	code := m.Run()
	if code == 0 {
		// A closed transport's connections end their goroutines shortly after.
		err := goleak.Find()
		for i := 0; err != nil && i < 5; i++ {
			time.Sleep(time.Second)
			err = goleak.Find()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// metaServer is `twosided metadata-server`'s server on a loopback port; Stop and Start keep
// its address, and a Start serves an empty store, as a restarted server does.
type metaServer struct {
	t      *testing.T
	addr   string
	cancel context.CancelFunc
	done   chan error
}

func newMetaServer(t *testing.T) *metaServer {
	m := &metaServer{t: t, addr: "127.0.0.1:0"}
	m.Start()
	t.Cleanup(m.Stop)
	return m
}

func (m *metaServer) Start() {
	ln, err := net.Listen("tcp", m.addr)
	for i := 0; err != nil && i < 100; i++ { // the old socket may linger a moment
		time.Sleep(50 * time.Millisecond)
		ln, err = net.Listen("tcp", m.addr)
	}
	require.NoError(m.t, err)
	m.addr = ln.Addr().String()
	srv, err := metaserver.New("", metaserver.Limits{}, nil)
	require.NoError(m.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel, m.done = cancel, make(chan error, 1)
	go func() { m.done <- srv.Serve(ctx, ln) }()
}

func (m *metaServer) Stop() {
	if m.cancel == nil {
		return
	}
	m.cancel()
	require.NoError(m.t, <-m.done)
	m.cancel = nil
}

func (m *metaServer) Conn() string { return "http://" + m.addr + "/metadata" }

// mooncakeExample is a server written to the behaviour of Mooncake's Go example
// http-metadata-server: PUT replaces, DELETE answers 200 whether or not the key was there,
// GET answers 404 "metadata not found", and any other path is the router's 404 page.
// dupRefused: PUT of an rpc_meta key already held answers 400 and a DELETE of an absent
// key 404, as Mooncake's Python server and Store master do. It records the raw queries.
type mooncakeExample struct {
	mu         sync.Mutex
	m          map[string][]byte
	queries    []string
	dupRefused bool
}

func (s *mooncakeExample) ServeHTTP(w nethttp.ResponseWriter, r *nethttp.Request) {
	if r.URL.Path != "/metadata" {
		w.WriteHeader(404)
		_, _ = io.WriteString(w, "404 page not found")
		return
	}
	key := r.URL.Query().Get("key")
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queries = append(s.queries, r.URL.RawQuery)
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	switch r.Method {
	case "GET":
		v, ok := s.m[key]
		if !ok {
			w.WriteHeader(404)
			_, _ = io.WriteString(w, "metadata not found")
			return
		}
		_, _ = w.Write(v)
	case "PUT":
		b, _ := io.ReadAll(r.Body)
		if _, held := s.m[key]; held && s.dupRefused && strings.Contains(key, "rpc_meta") {
			w.WriteHeader(400)
			_, _ = io.WriteString(w, "Duplicate rpc_meta key not allowed")
			return
		}
		s.m[key] = b
		_, _ = io.WriteString(w, "metadata updated")
	case "DELETE":
		if _, held := s.m[key]; !held && s.dupRefused {
			w.WriteHeader(404)
			_, _ = io.WriteString(w, "metadata not found")
			return
		}
		delete(s.m, key)
		_, _ = io.WriteString(w, "metadata deleted")
	default:
		w.WriteHeader(405)
	}
}

func (s *mooncakeExample) get(key string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[key]
	return v, ok
}

func (s *mooncakeExample) set(key string, v []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[key] = v
}

func newExample(t *testing.T, dupRefused bool) (*mooncakeExample, string) {
	ex := &mooncakeExample{m: map[string][]byte{}, dupRefused: dupRefused}
	srv := httptest.NewServer(ex)
	t.Cleanup(srv.Close)
	return ex, srv.URL + "/metadata"
}

func open(t *testing.T, conn string, cfg directory.Config, opt Options) *Directory {
	t.Helper()
	if cfg.ClusterID == "" {
		cfg.ClusterID = t.Name()
	}
	if cfg.TTL == 0 {
		cfg.TTL = 3 * time.Second
	}
	if cfg.Poll == 0 {
		cfg.Poll = 20 * time.Millisecond
	}
	d, err := Open(conn, cfg, opt)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = d.Close(ctx)
	})
	return d
}

// rawGet reads key as Mooncake's plugin does.
func rawGet(t *testing.T, conn, key string) (int, string) {
	resp, err := nethttp.Get(conn + "?key=" + EscapeKey(key))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// rawPut writes key as Mooncake's plugin does (no TTL).
func rawPut(t *testing.T, conn, key, val string) {
	req, err := nethttp.NewRequest("PUT", conn+"?key="+EscapeKey(key), strings.NewReader(val))
	require.NoError(t, err)
	resp, err := nethttp.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
}

// ctxT is a test's context for its calls: a hang guard longer than the waits a test may
// make before its last call (eventually's bound, a server restart), so that a call made
// after a long wait on a loaded machine does not find it expired. Each call is bounded on
// its own besides (the directory's Timeout, the client's read and dial timeouts).
func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 60 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func runRegisterHelper() int {
	d, err := directory.Open(os.Getenv(helperConnEnv), directory.Config{ClusterID: os.Getenv(helperCIDEnv), TTL: 2 * time.Second})
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := d.Register(ctx, "victim", directory.Entry{Host: "127.0.0.1", Port: 4242}); err != nil {
		fmt.Println("error:", err)
		return 1
	}
	fmt.Println("registered")
	<-ctx.Done()
	return 1
}

func startHelper(t *testing.T, conn string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=register", helperConnEnv+"="+conn, helperCIDEnv+"="+t.Name())
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "registered\n", line)
	return cmd
}
