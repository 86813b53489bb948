package directory

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"unicode"
)

// Errors; test with errors.Is.
var (
	// ErrNotFound: no entry for the name (etcd, redis, http), or the name is not host:port
	// (P2P).
	ErrNotFound = errors.New("directory: name not registered")
	// ErrNotCached: Cached found nothing for the name; Resolve would ask the directory.
	ErrNotCached = errors.New("directory: name not cached")
	// ErrUnavailable: the directory could not be reached within the call's deadline.
	ErrUnavailable = errors.New("directory: unreachable")
	// ErrBadValue: an entry in the directory does not decode; the message names the key
	// and the field.
	ErrBadValue = errors.New("directory: bad value")
	// ErrBadName: a server name the directory cannot hold (empty, too long, '/', control
	// characters).
	ErrBadName = errors.New("directory: bad server name")
	// ErrBadConn: a metadata connection string this package cannot use.
	ErrBadConn = errors.New("directory: bad metadata connection string")
	// ErrNameTaken: another process registered the name after this one lost its lease;
	// this one does not take it back.
	ErrNameTaken = errors.New("directory: name taken by another process")
	// ErrClosed: the directory was closed.
	ErrClosed = errors.New("directory: closed")
)

// P2PHandshake is Mooncake's metadata connection string for "no metadata service": a
// server's name is its host:port.
const P2PHandshake = "P2PHANDSHAKE"

// Limits.
const (
	MaxNameLen  = 512       // bytes of a server name
	MaxValueLen = 4 << 10   // bytes of an rpc_meta value; Mooncake's are ~50
	maxHostLen  = 255       // a DNS name or an address literal
	maxPort     = 1<<16 - 1 // rpc_port is a u16 in Mooncake (RpcMetaDesc)
)

// Entry is where a server's handshake daemon listens: Mooncake's RpcMetaDesc.
type Entry struct {
	Host string `json:"ip_or_host_name"`
	Port int    `json:"rpc_port"`
}

// Addr is host:port, as the engine dials it.
func (e Entry) Addr() string { return net.JoinHostPort(e.Host, strconv.Itoa(e.Port)) }

// EntryFromAddr splits host:port into an Entry, checking both parts as Decode does.
func EntryFromAddr(addr string) (Entry, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return Entry{}, fmt.Errorf("%q: not host:port: %w", addr, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return Entry{}, fmt.Errorf("%q: port %q is not a number", addr, port)
	}
	e := Entry{Host: host, Port: p}
	if err := e.Check(); err != nil {
		return Entry{}, fmt.Errorf("%q: %w", addr, err)
	}
	return e, nil
}

// Check reports whether e can be registered: a host name or address literal, a port in
// 1..65535.
func (e Entry) Check() error {
	if err := checkHost(e.Host); err != nil {
		return fmt.Errorf("ip_or_host_name: %w", err)
	}
	if e.Port < 1 || e.Port > maxPort {
		return fmt.Errorf("rpc_port: %d out of range 1..%d", e.Port, maxPort)
	}
	return nil
}

func checkHost(h string) error {
	switch {
	case h == "":
		return errors.New("empty")
	case len(h) > maxHostLen:
		return fmt.Errorf("%d bytes, the maximum is %d", len(h), maxHostLen)
	}
	for _, r := range h {
		if unicode.IsSpace(r) || unicode.IsControl(r) || r == '/' || r == '@' || r == '[' || r == ']' {
			return fmt.Errorf("%q: contains %q", h, r)
		}
	}
	if strings.Contains(h, ":") && net.ParseIP(h) == nil {
		return fmt.Errorf("%q: has ':' but is not an IPv6 address", h)
	}
	return nil
}

// Encode is the value Mooncake's addRpcMetaEntry writes: jsoncpp's FastWriter output, keys
// in sorted order, one trailing newline.
func Encode(e Entry) []byte {
	host, _ := json.Marshal(e.Host)
	b := make([]byte, 0, 48+len(host))
	b = append(b, `{"ip_or_host_name":`...)
	b = append(b, host...)
	b = append(b, `,"rpc_port":`...)
	b = strconv.AppendInt(b, int64(e.Port), 10)
	return append(b, "}\n"...)
}

// Decode reads an rpc_meta value. key names the entry in errors. Other fields are ignored,
// as Mooncake ignores them; the two it reads must be there with the right types: a
// non-empty host and a port in 1..65535 (Mooncake would truncate a larger one to 16 bits
// and dial the wrong port).
func Decode(key string, val []byte) (Entry, error) {
	bad := func(field, format string, args ...any) (Entry, error) {
		return Entry{}, fmt.Errorf("%w: %s: %s: %s", ErrBadValue, key, field, fmt.Sprintf(format, args...))
	}
	if len(val) > MaxValueLen {
		return bad("value", "%d bytes, the maximum is %d", len(val), MaxValueLen)
	}
	var raw struct {
		Host json.RawMessage `json:"ip_or_host_name"`
		Port json.RawMessage `json:"rpc_port"`
	}
	if err := json.Unmarshal(val, &raw); err != nil {
		return bad("value", "not a JSON object: %v", err)
	}
	var e Entry
	if raw.Host == nil || bytes.Equal(raw.Host, []byte("null")) {
		return bad("ip_or_host_name", "missing")
	}
	if err := json.Unmarshal(raw.Host, &e.Host); err != nil {
		return bad("ip_or_host_name", "%s is not a string", raw.Host)
	}
	if raw.Port == nil || bytes.Equal(raw.Port, []byte("null")) {
		return bad("rpc_port", "missing")
	}
	var port json.Number // also takes a quoted number: rejected first, Mooncake reads a number
	if raw.Port[0] == '"' {
		return bad("rpc_port", "%s is not a number", raw.Port)
	}
	if err := json.Unmarshal(raw.Port, &port); err != nil {
		return bad("rpc_port", "%s is not a number", raw.Port)
	}
	p, err := strconv.ParseInt(port.String(), 10, 64)
	if err != nil {
		return bad("rpc_port", "%s is not an integer", port)
	}
	if p < 1 || p > maxPort {
		return bad("rpc_port", "%d out of range 1..%d", p, maxPort)
	}
	e.Port = int(p)
	if err := checkHost(e.Host); err != nil {
		return bad("ip_or_host_name", "%v", err)
	}
	return e, nil
}

// CheckName reports whether name can be a server name in the directory.
func CheckName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty", ErrBadName)
	case len(name) > MaxNameLen:
		return fmt.Errorf("%w: %d bytes, the maximum is %d", ErrBadName, len(name), MaxNameLen)
	}
	for _, r := range name {
		if r == '/' || unicode.IsControl(r) || r == unicode.ReplacementChar {
			return fmt.Errorf("%w: %q contains %q", ErrBadName, name, r)
		}
	}
	return nil
}

// Prefix is the key prefix of rpc_meta entries: mooncake/rpc_meta/, or with a cluster id
// (MC_METADATA_CLUSTER_ID) mooncake/<id>/rpc_meta/, a '/' appended to the id as Mooncake
// does.
func Prefix(clusterID string) string {
	if clusterID != "" && !strings.HasSuffix(clusterID, "/") {
		clusterID += "/"
	}
	return "mooncake/" + clusterID + "rpc_meta/"
}

// Backends.
const (
	BackendP2P   = "p2p"
	BackendEtcd  = "etcd"
	BackendRedis = "redis" // redis:// and rediss:// (TLS)
	BackendHTTP  = "http"  // http:// and https://
)

// Conn is a parsed metadata connection string.
type Conn struct {
	Backend   string   // BackendP2P, BackendEtcd, BackendRedis or BackendHTTP
	Endpoints []string // etcd: host:port of each member; redis: the server's host:port
	// TLS: the scheme was rediss:// or https://.
	TLS bool
	// URL: http: the connection string as given (scheme://host[:port][/path]); a key is
	// read at URL?key=<key percent-encoded>, as Mooncake's HTTP plugin does.
	URL string
}

// DefaultRedisPort is the port of a redis:// string without one.
const DefaultRedisPort = "6379"

// ParseConn reads a metadata connection string as Mooncake does: "P2PHANDSHAKE"; or
// "proto://rest" where proto is the backend; or no "://" at all, which Mooncake reads as
// etcd. etcd endpoints are separated by ',' or ';' (Mooncake's etcd wrapper accepts both).
// redis://host[:port] (rediss:// for TLS) names one Redis server; its credentials and
// database are not in the string (MC_REDIS_USERNAME, MC_REDIS_PASSWORD, MC_REDIS_DB_INDEX,
// read by the redis backend). http://host[:port][/path] (or https://) is a metadata server
// spoken to as Mooncake's HTTP plugin does; it takes no query or fragment.
func ParseConn(s string) (Conn, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Conn{}, fmt.Errorf("%w: empty", ErrBadConn)
	}
	if s == P2PHandshake {
		return Conn{Backend: BackendP2P}, nil
	}
	proto, rest := BackendEtcd, s
	if i := strings.Index(s, "://"); i >= 0 {
		proto, rest = s[:i], s[i+3:]
	}
	switch proto {
	case BackendEtcd:
		return parseEtcd(s, rest)
	case "redis", "rediss":
		return parseRedis(s, rest, proto == "rediss")
	case "http", "https":
		return parseHTTP(s, proto == "https")
	}
	return Conn{}, fmt.Errorf("%w: %q: backend %q is not supported (use %s, etcd://host:port[,host:port...], redis://host:port or http://host:port/path)",
		ErrBadConn, s, proto, P2PHandshake)
}

// checkEndpoint checks host:port with a port in 1..65535.
func checkEndpoint(s, what, ep string) error {
	host, port, err := net.SplitHostPort(ep)
	if err != nil || host == "" {
		return fmt.Errorf("%w: %q: %s %q is not host:port", ErrBadConn, s, what, ep)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > maxPort {
		return fmt.Errorf("%w: %q: %s %q: port out of range 1..%d", ErrBadConn, s, what, ep, maxPort)
	}
	if err := checkHost(strings.Trim(host, "[]")); err != nil {
		return fmt.Errorf("%w: %q: %s %q: host %v", ErrBadConn, s, what, ep, err)
	}
	return nil
}

func parseEtcd(s, rest string) (Conn, error) {
	var eps []string
	for _, ep := range strings.FieldsFunc(rest, func(r rune) bool { return r == ',' || r == ';' }) {
		ep = strings.TrimSpace(ep)
		if ep == "" {
			continue
		}
		if err := checkEndpoint(s, "endpoint", ep); err != nil {
			return Conn{}, err
		}
		eps = append(eps, ep)
	}
	if len(eps) == 0 {
		return Conn{}, fmt.Errorf("%w: %q: no etcd endpoint", ErrBadConn, s)
	}
	return Conn{Backend: BackendEtcd, Endpoints: eps}, nil
}

// parseRedis reads host[:port] as Mooncake's parseHostNameWithPort does (one server, the
// port 6379 if none); a trailing '/' is allowed, anything else after the address is not
// (Mooncake would dial it as part of the host).
func parseRedis(s, rest string, tls bool) (Conn, error) {
	ep := strings.TrimSuffix(rest, "/")
	if ep == "" || strings.ContainsAny(ep, "/?#@,; ") {
		return Conn{}, fmt.Errorf("%w: %q: want redis://host[:port] (credentials in MC_REDIS_USERNAME/MC_REDIS_PASSWORD, the database in MC_REDIS_DB_INDEX)", ErrBadConn, s)
	}
	if _, _, err := net.SplitHostPort(ep); err != nil {
		ep = net.JoinHostPort(strings.Trim(ep, "[]"), DefaultRedisPort)
	}
	if err := checkEndpoint(s, "address", ep); err != nil {
		return Conn{}, err
	}
	return Conn{Backend: BackendRedis, Endpoints: []string{ep}, TLS: tls}, nil
}

func parseHTTP(s string, tls bool) (Conn, error) {
	u, err := url.Parse(s)
	if err != nil {
		return Conn{}, fmt.Errorf("%w: %q: %v", ErrBadConn, s, err)
	}
	switch {
	case u.Host == "":
		return Conn{}, fmt.Errorf("%w: %q: no host", ErrBadConn, s)
	case u.User != nil:
		return Conn{}, fmt.Errorf("%w: %q: user information is not supported", ErrBadConn, s)
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return Conn{}, fmt.Errorf("%w: %q: a query or fragment is not allowed (keys are sent as ?key=)", ErrBadConn, s)
	}
	ep := u.Host
	if u.Port() == "" {
		port := "80"
		if tls {
			port = "443"
		}
		ep = net.JoinHostPort(u.Hostname(), port)
	}
	if err := checkEndpoint(s, "address", ep); err != nil {
		return Conn{}, err
	}
	return Conn{Backend: BackendHTTP, Endpoints: []string{ep}, TLS: tls, URL: s}, nil
}
