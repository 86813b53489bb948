package directory

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// Directory maps server names to the host:port of their handshake daemon.
type Directory interface {
	// Resolve returns name's host:port, from the cache or else from the directory, waiting
	// at most until ctx's deadline (and the directory's own request timeout).
	Resolve(ctx context.Context, name string) (string, error)
	// Cached returns name's host:port from the cache without waiting: ErrNotCached when
	// the cache does not know the name, ErrNotFound when it knows the name is not there.
	Cached(name string) (string, error)
	// Register publishes name at e until Unregister or Close.
	Register(ctx context.Context, name string, e Entry) error
	// Unregister removes what Register published.
	Unregister(ctx context.Context, name string) error
	// Close stops the directory; registrations end as by Unregister, bounded by ctx.
	Close(ctx context.Context) error
	// String is the connection string, for messages.
	String() string
}

// Config tunes Open. The zero value takes every default.
type Config struct {
	// ClusterID is Mooncake's MC_METADATA_CLUSTER_ID: keys live under
	// mooncake/<ClusterID>/rpc_meta/.
	ClusterID string
	// TTL of a registration (default 10 s, 1 s..1 h, whole seconds): etcd's lease, Redis's
	// key TTL, the TTL header sent to an HTTP server (which only twosided metadata-server
	// honours); the entry of a process that dies without Close disappears within it.
	TTL time.Duration
	// Timeout bounds each request to the service made without a shorter deadline
	// (default 5 s).
	Timeout time.Duration
	// MaxCache bounds the names the cache holds (default 65536).
	MaxCache int
	// Poll is how often the redis and http backends read again the cached names that were
	// used since their last read (default 1 s, 10 ms..1 h); etcd's watch needs none. A
	// peer that restarts on a new address is seen within about it.
	Poll time.Duration
	// Logger (default: nothing is logged).
	Logger *zerolog.Logger
}

// Defaults.
const (
	DefaultTTL      = 10 * time.Second
	DefaultTimeout  = 5 * time.Second
	DefaultMaxCache = 1 << 16
	DefaultPoll     = time.Second
)

// WithDefaults returns c with every zero field set to its default, or ErrBadConn naming a
// field out of range. Open applies it; a backend opened directly (etcd.Open) too.
func (c Config) WithDefaults() (Config, error) {
	err := c.fill()
	return c, err
}

func (c *Config) fill() error {
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxCache == 0 {
		c.MaxCache = DefaultMaxCache
	}
	if c.Poll == 0 {
		c.Poll = DefaultPoll
	}
	if c.Logger == nil {
		nop := zerolog.Nop()
		c.Logger = &nop
	}
	switch {
	case c.TTL < time.Second || c.TTL > time.Hour || c.TTL%time.Second != 0:
		return fmt.Errorf("%w: ttl: %v: want whole seconds in 1s..1h", ErrBadConn, c.TTL)
	case c.Timeout < time.Millisecond || c.Timeout > 10*time.Minute:
		return fmt.Errorf("%w: timeout: %v out of range 1ms..10m", ErrBadConn, c.Timeout)
	case c.MaxCache < 1 || c.MaxCache > 1<<24:
		return fmt.Errorf("%w: max_cache: %d out of range 1..%d", ErrBadConn, c.MaxCache, 1<<24)
	case c.Poll < 10*time.Millisecond || c.Poll > time.Hour:
		return fmt.Errorf("%w: poll: %v out of range 10ms..1h", ErrBadConn, c.Poll)
	}
	return nil
}

// Open returns the directory a metadata connection string names (see ParseConn). P2P is
// built in; etcd, redis and http need their backend linked in (import _
// "github.com/twosided/twosided/notify/directory/etcd", …/redis, …/http), else Open fails
// with ErrBadConn saying so. A directory does not wait for its service: it connects in the
// background, and its calls report ErrUnavailable until it can.
func Open(conn string, cfg Config) (Directory, error) {
	c, err := ParseConn(conn)
	if err != nil {
		return nil, err
	}
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	if c.Backend == BackendP2P {
		return P2P{}, nil
	}
	open, err := backend(conn, c.Backend)
	if err != nil {
		return nil, err
	}
	return open(c, cfg)
}

// CheckConn parses a metadata connection string as Open does and checks that its backend
// is linked in, without opening anything.
func CheckConn(conn string) error {
	c, err := ParseConn(conn)
	if err != nil || c.Backend == BackendP2P {
		return err
	}
	_, err = backend(conn, c.Backend)
	return err
}

// Opener opens a backend's directory for a parsed connection string; cfg has its defaults.
type Opener func(c Conn, cfg Config) (Directory, error)

var backends struct {
	sync.RWMutex
	m map[string]Opener
}

// RegisterBackend makes Open serve connection strings of backend name (BackendEtcd,
// BackendRedis, BackendHTTP) with
// open. A backend package calls it from its init; registering a name twice panics.
func RegisterBackend(name string, open Opener) {
	backends.Lock()
	defer backends.Unlock()
	if open == nil {
		panic("directory: RegisterBackend " + name + ": nil Opener")
	}
	if _, dup := backends.m[name]; dup {
		panic("directory: RegisterBackend " + name + " twice")
	}
	if backends.m == nil {
		backends.m = make(map[string]Opener)
	}
	backends.m[name] = open
}

// backend is the Opener registered for name.
func backend(conn, name string) (Opener, error) {
	backends.RLock()
	open := backends.m[name]
	backends.RUnlock()
	if open == nil {
		return nil, fmt.Errorf("%w: %q: the %s backend is not linked into this program: import _ %q",
			ErrBadConn, conn, name, "github.com/twosided/twosided/notify/directory/"+name)
	}
	return open, nil
}

// P2P is the directory of Mooncake's P2PHANDSHAKE mode: a server's name is its host:port.
// It holds nothing and never waits.
type P2P struct{}

// Resolve checks that name is host:port and returns it.
func (P2P) Resolve(_ context.Context, name string) (string, error) { return P2P{}.Cached(name) }

// Cached checks that name is host:port and returns it.
func (P2P) Cached(name string) (string, error) {
	if _, err := EntryFromAddr(name); err != nil {
		return "", fmt.Errorf("%w: %s: a name is host:port in P2P mode: %v", ErrNotFound, name, err)
	}
	return name, nil
}

// Register does nothing: a P2P name is its address.
func (P2P) Register(context.Context, string, Entry) error { return nil }

// Unregister does nothing.
func (P2P) Unregister(context.Context, string) error { return nil }

// Close does nothing.
func (P2P) Close(context.Context) error { return nil }

func (P2P) String() string { return P2PHandshake }
