// Package http is the HTTP backend of package directory: server names kept by an HTTP
// metadata server as Mooncake's HTTP plugin uses one (MC_METADATA_SERVER=http://host:port/path:
// GET, PUT and DELETE of <path>?key=<percent-encoded key>, 200 meaning success), with the
// keys and values of mooncake/[cluster id/]rpc_meta/<name>. The servers are Mooncake's Go
// example http-metadata-server, the one built into Mooncake Store's master, the Python one
// of its wheel, and `twosided metadata-server`.
//
// Status: API. It is a package of its own, linked in by a registration import as etcd's and
// redis's are (package notify imports none of them):
//
//	import _ "github.com/twosided/twosided/notify/directory/http"
//
// Then notify.WithMetadata("http://10.0.0.1:8080/metadata"), MC_METADATA_SERVER under
// notify.FromEnv and directory.Open accept http:// and https:// strings. https verifies the
// server against the system's roots, or against the PEM file TWOSIDED_METADATA_CA_FILE
// names.
//
// Liveness. The protocol has no TTL, so Mooncake's entries outlive a crashed process. A
// registration here is put again every third of directory.Config.TTL while the engine
// lives (so it comes back after the server restarts empty) and deleted on Close. Each put
// carries the header TTLHeader with the TTL in seconds: `twosided metadata-server` drops an
// entry not put again within it, so there the entry of a process killed with -9 goes
// within the TTL; Mooncake's servers ignore the header and keep the entry until it is
// deleted or put again, and a peer that resolves it finds a dead address: its handshake
// fails at once (connection refused), naming the address.
//
// Resolutions are cached and the cache kept current by polling (a GET per name in use per
// directory.Config.Poll, at most 64 a round); cached names keep resolving while the server
// is down.
package http

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	nethttp "net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twosided/twosided/notify/directory"
	"github.com/twosided/twosided/notify/directory/internal/kvdir"
)

func init() { directory.RegisterBackend(directory.BackendHTTP, openBackend) }

func openBackend(c directory.Conn, cfg directory.Config) (directory.Directory, error) {
	ca, _ := os.LookupEnv(kvdir.CAFileEnv)
	return newHTTP(c, cfg, Options{CAFile: ca})
}

// TTLHeader is the request header of a PUT that asks the server to drop the entry unless
// it is put again within that many seconds. Mooncake's clients never send it (their
// entries stay until deleted); Mooncake's servers ignore it.
const TTLHeader = "X-Twosided-Ttl"

// Options are the HTTP settings that are not in the connection string.
type Options struct {
	// CAFile: PEM certificate authorities for https:// (default: the system's roots).
	CAFile string
	// Client, if set, sends the requests instead of the backend's own client (it is not
	// closed).
	Client *nethttp.Client
}

// Open returns an HTTP directory for conn ("http://host:port/path" or https://) for
// notify.WithDirectory. It does not wait for the server. The caller closes it after the
// engines that use it.
func Open(conn string, cfg directory.Config, opt Options) (*Directory, error) {
	c, err := directory.ParseConn(conn)
	if err != nil {
		return nil, err
	}
	if c.Backend != directory.BackendHTTP {
		return nil, fmt.Errorf("%w: %q is not an http connection string", directory.ErrBadConn, conn)
	}
	if cfg, err = cfg.WithDefaults(); err != nil {
		return nil, err
	}
	return newHTTP(c, cfg, opt)
}

// Directory is the HTTP backend, a directory.Directory (see kvdir.Dir for the cache and
// the registrations).
type Directory struct {
	*kvdir.Dir
}

func newHTTP(c directory.Conn, cfg directory.Config, opt Options) (*Directory, error) {
	st := &store{base: c.URL, ttl: cfg.TTL}
	if opt.Client != nil {
		st.cli = opt.Client
	} else {
		tr := nethttp.DefaultTransport.(*nethttp.Transport).Clone()
		tr.MaxIdleConnsPerHost = getConcurrency
		tr.DialContext = (&net.Dialer{Timeout: cfg.Timeout, KeepAlive: 15 * time.Second}).DialContext
		if c.TLS {
			host, _, _ := net.SplitHostPort(c.Endpoints[0])
			lookup := func(string) (string, bool) { return opt.CAFile, opt.CAFile != "" }
			tc, err := kvdir.TLSConfig(strings.Trim(host, "[]"), lookup)
			if err != nil {
				return nil, err
			}
			tr.TLSClientConfig = tc
		}
		st.cli, st.own = &nethttp.Client{Transport: tr}, tr
	}
	return &Directory{kvdir.New(st, cfg, kvdir.Options{
		Conn:    c.URL,
		Refresh: cfg.TTL / 3,
		Sweep:   8,
		Round:   64,
		Expires: "it stays until deleted or put again, or, on twosided metadata-server, for its TTL",
	})}, nil
}

// getConcurrency bounds the GETs of one poll round in flight at once.
const getConcurrency = 4

// maxErrBody bounds the bytes of an error response quoted in a message.
const maxErrBody = 200

// store is the HTTP Store.
type store struct {
	base string
	ttl  time.Duration
	cli  *nethttp.Client
	own  *nethttp.Transport // closed on Close; nil for a caller's client
}

// EscapeKey percent-encodes key as curl_easy_escape does, which Mooncake's HTTP plugin
// uses: every byte but ASCII letters, digits and "-._~" becomes %XX (upper-case hex).
func EscapeKey(key string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(key) * 3)
	for i := 0; i < len(key); i++ {
		c := key[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

func (s *store) url(key string) string { return s.base + "?key=" + EscapeKey(key) }

// reply is one response: its status and its body, read up to limit bytes.
type reply struct {
	status int
	body   []byte
}

func (r reply) String() string {
	b := bytes.TrimSpace(r.body)
	if len(b) > maxErrBody {
		b = append(b[:maxErrBody:maxErrBody], "…"...)
	}
	return fmt.Sprintf("HTTP %d %q", r.status, b)
}

// do sends one request bounded by ctx and reads at most limit bytes of the answer.
func (s *store) do(ctx context.Context, method, key string, body []byte, limit int64) (reply, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := nethttp.NewRequestWithContext(ctx, method, s.url(key), rd)
	if err != nil {
		return reply{}, fmt.Errorf("%s: %w", method, err)
	}
	if method == nethttp.MethodPut {
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(TTLHeader, strconv.FormatInt(int64(s.ttl/time.Second), 10))
	}
	resp, err := s.cli.Do(req)
	if err != nil {
		return reply{}, fmt.Errorf("%s: %w", method, unwrapURL(err))
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return reply{}, fmt.Errorf("%s: reading the answer: %w", method, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // let the connection be reused
	return reply{status: resp.StatusCode, body: b}, nil
}

// unwrapURL drops url.Error's repetition of the method and URL (the message names them).
func unwrapURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// absent reports whether a 404 says the key is not there: Mooncake's servers answer
// "metadata not found"; a 404 with another body is a wrong path (a router's page).
func absent(r reply) bool {
	if r.status != nethttp.StatusNotFound {
		return false
	}
	b := bytes.TrimSpace(r.body)
	return len(b) == 0 || bytes.Contains(bytes.ToLower(b), []byte("metadata not found"))
}

func (s *store) Get(ctx context.Context, key string) ([]byte, bool, error) {
	r, err := s.do(ctx, nethttp.MethodGet, key, nil, directory.MaxValueLen+1)
	switch {
	case err != nil:
		return nil, false, err
	case r.status == nethttp.StatusOK:
		return r.body, true, nil
	case absent(r):
		return nil, false, nil
	case r.status == nethttp.StatusNotFound:
		return nil, false, fmt.Errorf("GET: %v: not a metadata server's answer (is the path of %s right?)", r, s.base)
	}
	return nil, false, fmt.Errorf("GET: %v", r)
}

func (s *store) GetMany(ctx context.Context, keys []string) ([][]byte, error) {
	vals := make([][]byte, len(keys))
	errs := make([]error, len(keys))
	sem := make(chan struct{}, getConcurrency)
	var wg sync.WaitGroup
	for i, k := range keys {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			v, ok, err := s.Get(ctx, k)
			if ok {
				if v == nil {
					v = []byte{}
				}
				vals[i] = v
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("%s: %w", keys[i], err)
		}
	}
	return vals, nil
}

// put PUTs val at key; ok is the 200.
func (s *store) put(ctx context.Context, key string, val []byte) (reply, error) {
	return s.do(ctx, nethttp.MethodPut, key, val, maxErrBody+1)
}

// Put takes key whatever it holds: a server that refuses to overwrite an rpc_meta key
// (Mooncake's Python server and Store master answer 400 "Duplicate rpc_meta key") has the
// old entry deleted first, as a process restarting under its name must replace its dead
// predecessor's.
func (s *store) Put(ctx context.Context, key string, val []byte, _ time.Duration) error {
	r, err := s.put(ctx, key, val)
	if err != nil || r.status == nethttp.StatusOK {
		return err
	}
	if r.status != nethttp.StatusBadRequest {
		return fmt.Errorf("PUT: %v", r)
	}
	held, ok, err := s.Get(ctx, key)
	if err != nil {
		return err
	}
	if ok && bytes.Equal(held, val) {
		return nil
	}
	if err := s.del(ctx, key); err != nil {
		return err
	}
	if r, err = s.put(ctx, key, val); err != nil {
		return err
	}
	if r.status != nethttp.StatusOK {
		return fmt.Errorf("PUT after DELETE: %v", r)
	}
	return nil
}

// Refresh puts val again where the key is absent or holds it; another value is another
// process's (ErrNameTaken).
func (s *store) Refresh(ctx context.Context, key string, val []byte, _ time.Duration) error {
	held, ok, err := s.Get(ctx, key)
	if err != nil {
		return err
	}
	if ok && !bytes.Equal(held, val) {
		return fmt.Errorf("%w: %s holds %q", directory.ErrNameTaken, key, bytes.TrimSpace(held))
	}
	r, err := s.put(ctx, key, val)
	switch {
	case err != nil:
		return err
	case r.status == nethttp.StatusOK:
		return nil
	case ok && r.status == nethttp.StatusBadRequest:
		return nil // a server that refuses to put an rpc_meta key again: it holds our value
	}
	return fmt.Errorf("PUT: %v", r)
}

func (s *store) del(ctx context.Context, key string) error {
	r, err := s.do(ctx, nethttp.MethodDelete, key, nil, maxErrBody+1)
	switch {
	case err != nil:
		return err
	case r.status == nethttp.StatusOK || absent(r):
		return nil
	}
	return fmt.Errorf("DELETE: %v", r)
}

// Delete deletes key if it holds val (read first: the protocol has no conditional delete).
func (s *store) Delete(ctx context.Context, key string, val []byte) error {
	held, ok, err := s.Get(ctx, key)
	if err != nil || !ok || !bytes.Equal(held, val) {
		return err
	}
	return s.del(ctx, key)
}

func (s *store) Close() error {
	if s.own != nil {
		s.own.CloseIdleConnections()
	}
	return nil
}
