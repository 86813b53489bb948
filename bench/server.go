package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"time"

	"github.com/twosided/twosided/ibv"
)

// The bench server is the receiving side of a two-process run made network-facing and
// long-lived: `twosided bench --server` on one host, `twosided bench --client host:port` on
// another. Each run of the client opens a control connection, sends a hello with the spec
// of its receiving side, and the server builds those nodes on the address the client
// reached, runs the session as a child process would, and closes them when the connection
// ends. One session at a time: a second client is refused as busy, so two runs never share
// the server's CPU and their figures stay apart.
//
// Trust. The server runs what a client asks within the spec's bounds, and sends notifies
// only to the client's own IP (echo and bidi); it has no authentication: run it on a
// trusted network for the time of a measurement.

// DefaultServerPort is the port of `twosided bench --server` when none is given.
const DefaultServerPort = 18515

// helloTimeout bounds the hello exchange, on both sides.
const helloTimeout = 10 * time.Second

// Server is a bench server: a listener and the session it serves.
type Server struct {
	ln  net.Listener
	log io.Writer
	one chan struct{} // held by the session in progress
	wg  sync.WaitGroup
}

// busyWait is how long a session waits for the one before it to close its nodes: the
// next run of the same client arrives as the last one closes.
const busyWait = 30 * time.Second

// NewServer listens on addr (host:port; an empty host listens on every address). log gets
// one line per session; nil: none. When the host is a specific non-loopback address and
// TWOSIDED_SOFT_ADDR is unset, the soft provider's devices of this process listen there
// too, so rdma_twosided on the soft provider reaches across hosts.
func NewServer(addr string) (*Server, error) {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("%w: server: %q: want host:port or :port: %v", ErrConfig, addr, err)
	}
	ln, err := net.Listen("tcp4", addr)
	if err != nil {
		return nil, fmt.Errorf("%w: server: listen %s: %v", ErrConfig, addr, err)
	}
	if ap, err := netip.ParseAddrPort(ln.Addr().String()); err == nil {
		softAddrFor(ap.Addr())
	}
	return &Server{ln: ln, one: make(chan struct{}, 1)}, nil
}

// softAddrFor points the soft provider's devices at ip when it is a specific non-loopback
// address and the user set no TWOSIDED_SOFT_ADDR.
func softAddrFor(ip netip.Addr) {
	if _, set := os.LookupEnv("TWOSIDED_SOFT_ADDR"); set || !ip.Is4() || ip.IsLoopback() || ip.IsUnspecified() {
		return
	}
	_ = os.Setenv("TWOSIDED_SOFT_ADDR", netip.AddrPortFrom(ip, 0).String())
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Serve accepts control connections until ctx ends, then closes the listener and every
// session and returns once they are gone. log gets one line per session (nil: none).
func (s *Server) Serve(ctx context.Context, log io.Writer) error {
	if log == nil {
		log = io.Discard
	}
	s.log = log
	stop := context.AfterFunc(ctx, func() { _ = s.ln.Close() })
	defer stop()
	defer s.wg.Wait()
	for {
		conn, err := s.ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			_ = s.ln.Close()
			return fmt.Errorf("bench: server: accept: %w", err)
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.session(ctx, conn)
		}()
	}
}

// Close stops the listener (Serve returns once the sessions are gone).
func (s *Server) Close() error { return s.ln.Close() }

func (s *Server) info(conn net.Conn) *ServerInfo {
	var names []string
	for _, p := range ibv.Providers() {
		names = append(names, p.Name())
	}
	return &ServerInfo{Addr: conn.LocalAddr().String(), GoVersion: runtime.Version(), GOOS: runtime.GOOS,
		GOARCH: runtime.GOARCH, NumCPU: runtime.NumCPU(), Provider: deviceInUse(""), Providers: names,
		Commit: commit(), ClientAddr: conn.RemoteAddr().String()}
}

func (s *Server) session(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	peer := conn.RemoteAddr().String()
	enc := json.NewEncoder(conn)
	refuse := func(code, format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		_ = enc.Encode(helloReply{Proto: ProtoName, Version: ProtoVersion, Code: code, Err: msg})
		fmt.Fprintf(s.log, "bench server: %s: refused (%s): %s\n", peer, code, msg)
	}
	_ = conn.SetDeadline(time.Now().Add(helloTimeout))
	sc := newCtrlScanner(conn)
	if !sc.Scan() {
		return // a port scan, or a client that gave up
	}
	h, err := decodeHello(sc.Bytes())
	switch {
	case err != nil:
		refuse(codeBad, "%v", err)
		return
	case h.Version != ProtoVersion:
		refuse(codeVersion, "client speaks version %d, this server %d", h.Version, ProtoVersion)
		return
	case h.Anchor != "":
		s.anchor(ctx, conn, sc, enc, refuse)
		return
	case h.Spec == nil:
		_ = enc.Encode(helloReply{Proto: ProtoName, Version: ProtoVersion, Info: s.info(conn)})
		return
	}
	spec := *h.Spec
	if spec.Provider != "" {
		if _, err := ibv.LookupProvider(spec.Provider); err != nil {
			refuse(codeUnsupported, "provider %q is not built into the server's binary (the verbs provider needs -tags rdma)", spec.Provider)
			return
		}
	}
	clientIP := addrIP(conn.RemoteAddr())
	for _, p := range spec.Parent {
		if ap, _ := netip.ParseAddrPort(p); ap.Addr() != clientIP {
			refuse(codeBad, "parent address %s is not the client's (%s): the server sends only to its client", p, clientIP)
			return
		}
	}
	if !s.acquire(ctx, refuse) {
		return
	}
	defer func() { <-s.one }()
	if err := enc.Encode(helloReply{Proto: ProtoName, Version: ProtoVersion, Info: s.info(conn)}); err != nil {
		return
	}
	_ = conn.SetDeadline(time.Time{})
	// The client's half-close ends the session; the server closes the connection only once
	// its nodes are closed, so the client's next run never meets them.
	host := addrIP(conn.LocalAddr()).String()
	fmt.Fprintf(s.log, "bench server: %s: %s, %d receivers, %d B\n", peer, spec.Transport, spec.Receivers, spec.Size)
	runChild(ctx, spec, host, sc, conn)
}

// acquire waits for the session in progress to end (busyWait at most).
func (s *Server) acquire(ctx context.Context, refuse func(code, format string, args ...any)) bool {
	wait := time.NewTimer(busyWait)
	defer wait.Stop()
	select {
	case s.one <- struct{}{}:
		return true
	case <-wait.C:
		refuse(codeBusy, "another client's run has been in progress for %v", busyWait)
	case <-ctx.Done():
	}
	return false
}

// anchor runs ucx_perftest's server for one client run: it says the port, and stops the
// process when the client closes the control connection (after its ucx_perftest client).
func (s *Server) anchor(ctx context.Context, conn net.Conn, sc *bufio.Scanner, enc *json.Encoder, refuse func(code, format string, args ...any)) {
	path, err := exec.LookPath("ucx_perftest")
	if err != nil {
		refuse(codeUnsupported, "ucx_perftest is not installed on the server (Debian/Ubuntu package ucx-utils)")
		return
	}
	if !s.acquire(ctx, refuse) {
		return
	}
	defer func() { <-s.one }()
	port, err := freePort(addrIP(conn.LocalAddr()).String())
	if err != nil {
		refuse(codeUnsupported, "%v", err)
		return
	}
	rctx, cancel := context.WithTimeout(ctx, childLife)
	defer cancel()
	us, err := startUCXServer(rctx, path, port)
	if err != nil {
		refuse(codeUnsupported, "%v", err)
		return
	}
	defer us.stop()
	if err := enc.Encode(helloReply{Proto: ProtoName, Version: ProtoVersion, Info: s.info(conn), AnchorPort: port}); err != nil {
		return
	}
	_ = conn.SetDeadline(time.Time{})
	fmt.Fprintf(s.log, "bench server: %s: ucx_perftest server on port %d\n", conn.RemoteAddr(), port)
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		for sc.Scan() { // nothing is expected: the client's half-close ends the run
		}
	}()
	select {
	case <-closed:
	case <-us.exited:
	case <-rctx.Done():
	}
	_ = conn.Close()
	<-closed
}

// remoteUCX is a ucx_perftest server a bench server runs for this client.
type remoteUCX struct {
	conn net.Conn
	host string
	port int
	done chan struct{} // closed when the server ends the run
}

// startRemoteUCX asks the bench server for a ucx_perftest server.
func startRemoteUCX(ctx context.Context, server string) (*remoteUCX, error) {
	conn, _, sc, port, err := dialServerFor(ctx, server, hello{Proto: ProtoName, Version: ProtoVersion, Anchor: anchorUCXServer})
	if err != nil {
		return nil, err
	}
	if port == 0 {
		_ = conn.Close()
		return nil, fmt.Errorf("%w: --client %s: no ucx_perftest port in its reply", ErrNotServer, server)
	}
	r := &remoteUCX{conn: conn, host: addrIP(conn.RemoteAddr()).String(), port: port, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for sc.Scan() {
		}
	}()
	return r, nil
}

// close half-closes the control connection and waits (10 s at most) for the server to stop
// its ucx_perftest.
func (r *remoteUCX) close() {
	_ = halfCloser{r.conn}.Close()
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case <-r.done:
	case <-t.C:
	}
	_ = r.conn.Close()
	<-r.done
}

func addrIP(a net.Addr) netip.Addr {
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// dialServer opens a control connection to a bench server and exchanges the hello: spec
// nil asks for the server's info only. On success the scanner reads the session's lines.
func dialServer(ctx context.Context, server string, spec *childSpec) (net.Conn, *ServerInfo, *bufio.Scanner, error) {
	conn, info, sc, _, err := dialServerFor(ctx, server, hello{Proto: ProtoName, Version: ProtoVersion, Spec: spec})
	return conn, info, sc, err
}

// dialServerFor sends h and returns the connection, the server's info and the anchor port
// of its reply.
func dialServerFor(ctx context.Context, server string, h hello) (net.Conn, *ServerInfo, *bufio.Scanner, int, error) {
	d := net.Dialer{Timeout: helloTimeout}
	conn, err := d.DialContext(ctx, "tcp4", server)
	if err != nil {
		return nil, nil, nil, 0, fmt.Errorf("%w: --client %s: %v", ErrServerUnreachable, server, err)
	}
	fail := func(err error) (net.Conn, *ServerInfo, *bufio.Scanner, int, error) {
		_ = conn.Close()
		return nil, nil, nil, 0, err
	}
	_ = conn.SetDeadline(time.Now().Add(helloTimeout))
	b, _ := json.Marshal(h)
	if _, err := conn.Write(append(b, '\n')); err != nil {
		return fail(fmt.Errorf("%w: --client %s: hello: %v", ErrNotServer, server, err))
	}
	sc := newCtrlScanner(conn)
	if !sc.Scan() {
		cause := "it closed the connection without a reply"
		if err := sc.Err(); err != nil {
			cause = err.Error()
		}
		return fail(fmt.Errorf("%w: --client %s: %s", ErrNotServer, server, cause))
	}
	r, err := decodeHelloReply(sc.Bytes())
	if err != nil {
		return fail(fmt.Errorf("%w: --client %s: its reply: %v", ErrNotServer, server, err))
	}
	switch {
	case r.Code == codeVersion || r.Version != ProtoVersion:
		return fail(fmt.Errorf("%w: --client %s: the server speaks version %d, this binary %d (%s): run the same twosided release on both hosts",
			ErrVersion, server, r.Version, ProtoVersion, r.Err))
	case r.Code != "" || r.Err != "":
		return fail(fmt.Errorf("%w: --client %s: %s: %s", ErrServerRefused, server, r.Code, r.Err))
	case r.Info == nil:
		return fail(fmt.Errorf("%w: --client %s: a reply without the server's info", ErrNotServer, server))
	}
	_ = conn.SetDeadline(time.Time{})
	return conn, r.Info, sc, r.AnchorPort, nil
}

// probeServer asks the server for its info and returns it with this host's address on the
// route to it (where the client's nodes listen).
func probeServer(ctx context.Context, server string) (*ServerInfo, string, error) {
	conn, info, _, err := dialServer(ctx, server, nil)
	if err != nil {
		return nil, "", err
	}
	defer conn.Close()
	local := addrIP(conn.LocalAddr())
	if !local.Is4() {
		return nil, "", fmt.Errorf("%w: --client %s: the route to it is not IPv4 (%s): the bench speaks IPv4", ErrConfig, server, local)
	}
	return info, local.String(), nil
}

// startRemote opens a session on a bench server for spec and returns its nodes' addresses.
func startRemote(ctx context.Context, server string, spec childSpec) (*child, []string, error) {
	conn, _, sc, err := dialServer(ctx, server, &spec)
	if err != nil {
		return nil, nil, err
	}
	c := &child{remote: server, stdin: halfCloser{conn}, conn: conn, lines: make(chan []byte, 4), stderr: &syncBuffer{}, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		defer close(c.lines)
		for sc.Scan() {
			c.lines <- append([]byte(nil), sc.Bytes()...)
		}
	}()
	var rep childReply
	if err := c.read(ctx, &rep); err != nil {
		c.kill()
		if rep.Err != "" { // its nodes could not be made: a transport or device it lacks
			return nil, nil, fmt.Errorf("%w: --client %s: %s", ErrServerRefused, server, rep.Err)
		}
		return nil, nil, err
	}
	return c, rep.Addrs, nil
}

// halfCloser closes the write side of the control connection: the server ends the session,
// closes its nodes and then the connection.
type halfCloser struct{ net.Conn }

func (h halfCloser) Close() error {
	if tc, ok := h.Conn.(*net.TCPConn); ok {
		return tc.CloseWrite()
	}
	return h.Conn.Close()
}
