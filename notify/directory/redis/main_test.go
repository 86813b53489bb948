package redis

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/twosided/twosided/notify/directory"
	"github.com/twosided/twosided/notify/directory/redistest"
)

// Environment of the helper process of TestEntryGoneAfterKill9.
const (
	helperEnv     = "TWOSIDED_REDIS_TEST_HELPER"
	helperConnEnv = "TWOSIDED_REDIS_TEST_CONN"
	helperCIDEnv  = "TWOSIDED_REDIS_TEST_CLUSTER"
)

var (
	sharedOnce sync.Once
	shared     *redistest.Server
	sharedDir  string
	sharedErr  error
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "register" {
		os.Exit(runRegisterHelper())
	}
	code := m.Run()
	if shared != nil {
		shared.Close()
	}
	if sharedDir != "" {
		_ = os.RemoveAll(sharedDir)
	}
	if code == 0 {
		// go-redis's pool probes a server it cannot dial once a second until closed: a
		// closed client's prober exits within about that, which the retries cover.
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

// newServer starts a redis-server for one test, or skips the test if there is none.
func newServer(t *testing.T, cfg redistest.Config) *redistest.Server {
	t.Helper()
	if _, err := redistest.Binary(); err != nil {
		t.Skipf("SKIPPED: no redis-server, the Redis backend was not tested: %v", err)
	}
	srv, err := redistest.New(t.TempDir(), cfg)
	require.NoError(t, err)
	t.Cleanup(srv.Close)
	return srv
}

// sharedRedis is one redis-server for the tests that do not stop it; each test works under
// its own cluster id.
func sharedRedis(t *testing.T) *redistest.Server {
	t.Helper()
	if _, err := redistest.Binary(); err != nil {
		t.Skipf("SKIPPED: no redis-server, the Redis backend was not tested: %v", err)
	}
	sharedOnce.Do(func() {
		sharedDir, sharedErr = os.MkdirTemp("", "directory-redis-")
		if sharedErr == nil {
			shared, sharedErr = redistest.New(sharedDir, redistest.Config{})
		}
	})
	require.NoError(t, sharedErr)
	return shared
}

// open opens a Redis directory on srv under the test's own cluster id.
func open(t *testing.T, srv *redistest.Server, cfg directory.Config, opt Options) *Directory {
	t.Helper()
	if cfg.ClusterID == "" {
		cfg.ClusterID = t.Name()
	}
	if cfg.TTL == 0 {
		cfg.TTL = 2 * time.Second
	}
	if cfg.Poll == 0 {
		cfg.Poll = 20 * time.Millisecond
	}
	d, err := Open(srv.Conn(), cfg, opt)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = d.Close(ctx)
	})
	return d
}

// rawClient is a plain Redis client, as a Mooncake node (hiredis) or an operator uses.
func rawClient(t *testing.T, srv *redistest.Server, db int) *goredis.Client {
	t.Helper()
	cli := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), DB: db, Protocol: 2, DisableIdentity: true})
	t.Cleanup(func() { _ = cli.Close() })
	return cli
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

// eventually polls cond until it holds; the bound is a hang guard, not a measurement.
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

// runRegisterHelper is the process TestEntryGoneAfterKill9 kills: it registers a name,
// says so on stdout and waits to be killed.
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
	<-ctx.Done() // killed long before
	return 1
}

// startHelper re-runs the test binary as runRegisterHelper and waits for it to register.
func startHelper(t *testing.T, srv *redistest.Server) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=register", helperConnEnv+"="+srv.Conn(), helperCIDEnv+"="+t.Name())
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
