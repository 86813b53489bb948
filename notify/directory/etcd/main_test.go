package etcd

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

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/twosided/twosided/notify/directory"
	"github.com/twosided/twosided/notify/directory/etcdtest"
)

// Environment of the helper process of TestLeaseExpiresAfterKill9.
const (
	helperEnv     = "TWOSIDED_DIRECTORY_TEST_HELPER"
	helperConnEnv = "TWOSIDED_DIRECTORY_TEST_CONN"
	helperCIDEnv  = "TWOSIDED_DIRECTORY_TEST_CLUSTER"
)

var (
	sharedOnce sync.Once
	shared     *etcdtest.Server
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
		// No ignores: a closed client and a closed embedded server leave no goroutine.
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// sharedEtcd is one embedded etcd for the tests that do not stop it; each test works under
// its own cluster id.
func sharedEtcd(t *testing.T) *etcdtest.Server {
	t.Helper()
	sharedOnce.Do(func() {
		sharedDir, sharedErr = os.MkdirTemp("", "directory-etcd-")
		if sharedErr == nil {
			shared, sharedErr = etcdtest.New(sharedDir)
		}
	})
	require.NoError(t, sharedErr)
	return shared
}

// open opens an etcd directory on srv under the test's own cluster id.
func open(t *testing.T, srv *etcdtest.Server, cfg directory.Config) *Directory {
	t.Helper()
	if cfg.ClusterID == "" {
		cfg.ClusterID = t.Name()
	}
	if cfg.TTL == 0 {
		cfg.TTL = 2 * time.Second
	}
	d, err := directory.Open(srv.Conn(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = d.Close(ctx)
	})
	return d.(*Directory)
}

// rawClient is a plain etcd client, as a Mooncake node or an operator would use.
func rawClient(t *testing.T, srv *etcdtest.Server) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// eventually polls cond until it holds; the bound is a liveness limit, not a measurement.
func eventually(t *testing.T, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	// A hang guard, not a measurement: an embedded etcd under -race on a loaded 2-core
	// machine takes tens of seconds to come back and renew.
	deadline := start.Add(3 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 3 min", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

// runRegisterHelper is the process TestLeaseExpiresAfterKill9 kills: it registers a name,
// says so on stdout and waits to be killed.
func runRegisterHelper() int {
	d, err := directory.Open(os.Getenv(helperConnEnv), directory.Config{ClusterID: os.Getenv(helperCIDEnv), TTL: 2 * time.Second})
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
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
func startHelper(t *testing.T, srv *etcdtest.Server) *exec.Cmd {
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
