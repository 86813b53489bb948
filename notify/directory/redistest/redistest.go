// Package redistest runs a real redis-server (Debian's package redis-server, which make
// test installs) for the tests of the Redis backend: on a temporary directory, a free
// loopback port, no persistence. Status: a helper for tests and the bench; not API.
package redistest

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Binary is the redis-server run, found on PATH (or $REDIS_SERVER).
func Binary() (string, error) {
	if p := os.Getenv("REDIS_SERVER"); p != "" {
		return p, nil
	}
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("redistest: redis-server not found on PATH (Debian: apt-get install redis-server; make test installs it as root): %w", err)
	}
	return p, nil
}

// Config adds settings to a server.
type Config struct {
	// Password sets requirepass (the default user's password).
	Password string
	// User and UserPassword add an ACL user with every right.
	User, UserPassword string
	// TLSCert and TLSKey serve TLS on the port (and no plain TCP): rediss://.
	TLSCert, TLSKey string
}

// Server is one redis-server process. Stop and Start may alternate; the server keeps its
// port and, having no persistence, starts empty, as a rebuilt Redis would.
type Server struct {
	bin, dir string
	port     int
	cfg      Config
	cmd      *exec.Cmd
	exited   chan struct{}
}

// New starts a redis-server under dir on a free loopback port.
func New(dir string, cfg Config) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, dir: dir, cfg: cfg}
	for range 5 { // another process may take the free port before redis-server binds it
		if s.port, err = freePort(); err != nil {
			return nil, err
		}
		if err = s.Start(); err == nil {
			return s, nil
		}
	}
	return nil, err
}

// Addr is host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Conn is the metadata connection string that reaches the server.
func (s *Server) Conn() string {
	if s.cfg.TLSCert != "" {
		return "rediss://" + s.Addr()
	}
	return "redis://" + s.Addr()
}

// Start starts the server (again) and waits until it accepts connections.
func (s *Server) Start() error {
	if s.cmd != nil {
		return nil
	}
	args := []string{"--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", s.dir,
		"--loglevel", "warning", "--daemonize", "no", "--protected-mode", "no"}
	port := strconv.Itoa(s.port)
	if s.cfg.TLSCert != "" {
		args = append(args, "--port", "0", "--tls-port", port, "--tls-cert-file", s.cfg.TLSCert,
			"--tls-key-file", s.cfg.TLSKey, "--tls-auth-clients", "no")
	} else {
		args = append(args, "--port", port)
	}
	if s.cfg.Password != "" {
		args = append(args, "--requirepass", s.cfg.Password)
	}
	if s.cfg.User != "" {
		args = append(args, "--user", s.cfg.User, "on", ">"+s.cfg.UserPassword, "~*", "&*", "+@all")
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = s.dir
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redistest: start %s: %w", s.bin, err)
	}
	exited := make(chan struct{})
	ready := make(chan struct{})
	var logTail []string
	go func() {
		sc := bufio.NewScanner(out)
		once := false
		for sc.Scan() {
			line := sc.Text()
			if len(logTail) < 20 {
				logTail = append(logTail, line)
			}
			if !once && strings.Contains(line, "Ready to accept connections") {
				once = true
				close(ready)
			}
		}
		_ = cmd.Wait()
		close(exited)
	}()
	// --loglevel warning hides the ready line: wait for the port instead.
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-exited:
			return fmt.Errorf("redistest: redis-server exited: %s", strings.Join(logTail, "; "))
		case <-ready:
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			return errors.New("redistest: redis-server did not accept connections within 30 s")
		}
	}
	s.cmd, s.exited = cmd, exited
	return nil
}

// Stop kills the server (SIGKILL: nothing is saved) and waits for it to exit.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.exited
	s.cmd = nil
}

// Close stops the server.
func (s *Server) Close() { s.Stop() }

// Dir is the server's working directory.
func (s *Server) Dir() string { return s.dir }

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("redistest: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// SelfSigned writes a self-signed certificate for 127.0.0.1 and its key under dir, as
// PEM files; the certificate is its own authority (pass it as the CA file).
func SelfSigned(dir string) (certFile, keyFile string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "redistest"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", "", err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}
