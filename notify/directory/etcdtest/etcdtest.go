// Package etcdtest runs a single-member etcd server inside the test process, on a temporary
// directory and free loopback ports, so the directory's tests (and the bench) need nothing
// installed by hand. Status: a helper for tests, examples and the bench, kept importable
// for them; not API. Neither notify nor notify/directory/etcd imports it, so an engine's
// importers never link the etcd server.
package etcdtest

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Server is one embedded etcd member. Stop and Start may alternate; the member keeps its
// data directory and its ports, as a restarted etcd would.
type Server struct {
	dir                string
	clientURL, peerURL url.URL
	e                  *embed.Etcd
}

// New picks a data directory under dir and two free loopback ports, and starts the member.
func New(dir string) (*Server, error) {
	cport, err := freePort()
	if err != nil {
		return nil, err
	}
	pport, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &Server{
		dir:       dir,
		clientURL: url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", cport)},
		peerURL:   url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", pport)},
	}
	if err := s.Start(); err != nil {
		return nil, err
	}
	return s, nil
}

// Endpoint is the member's client host:port.
func (s *Server) Endpoint() string { return s.clientURL.Host }

// Conn is the metadata connection string that reaches this member.
func (s *Server) Conn() string { return "etcd://" + s.clientURL.Host }

// Start starts the member (again), waiting until it serves.
func (s *Server) Start() error {
	if s.e != nil {
		return nil
	}
	cfg := embed.NewConfig()
	cfg.Name = "etcdtest"
	cfg.Dir = s.dir
	cfg.ListenClientUrls = []url.URL{s.clientURL}
	cfg.AdvertiseClientUrls = []url.URL{s.clientURL}
	cfg.ListenPeerUrls = []url.URL{s.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{s.peerURL}
	cfg.InitialCluster = cfg.Name + "=" + s.peerURL.String()
	// Short ticks make leader election (and the smallest lease TTL, 1.5 election
	// timeouts) quick; one member never loses its leadership to them.
	cfg.TickMs = 20
	cfg.ElectionMs = 200
	cfg.UnsafeNoFsync = true
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("etcdtest: start: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("etcdtest: start: %w", err)
	case <-time.After(60 * time.Second):
		e.Close()
		return fmt.Errorf("etcdtest: not ready within 60 s")
	}
	s.e = e
	return nil
}

// Stop stops the member; its data stays for Start.
func (s *Server) Stop() {
	if s.e != nil {
		s.e.Close()
		s.e = nil
	}
}

// Wipe stops the member and removes its data: the next Start serves an empty store, as a
// rebuilt etcd would.
func (s *Server) Wipe() error {
	s.Stop()
	return os.RemoveAll(s.dir)
}

// Close stops the member and removes its data.
func (s *Server) Close() {
	s.Stop()
	_ = os.RemoveAll(s.dir)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("etcdtest: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
