package notify

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/twosided/twosided/notify/directory"
)

// Peer names through a directory (package notify/directory).
//
// Without a directory (the default) a peer is its host:port, as before. With one
// (WithMetadata, WithDirectory, or MC_METADATA_SERVER under FromEnv; etcd needs the
// registration import of notify/directory/etcd), SendNotify accepts a
// server name or a host:port: the name is looked up first (Mooncake's getRpcMetaEntry does
// the same, and a Mooncake server name is often itself "ip:port" with another rpc_port);
// a string of the form host:port that is no server name is used as an address, and so is
// one the directory cannot look up while etcd is unreachable (after one bounded wait;
// once a read has failed, lookups fail at once until etcd answers again). The engine
// registers its server name (WithServerName) once its listener serves, under a lease kept
// alive, and removes it on Close.
//
// Who waits on the directory. SendNotify resolves on the caller's goroutine, within its
// context (and the directory's request timeout, 5 s). SendNotifyAsync never waits: it uses
// the cache only, so a handler on the reactor thread never waits on etcd. A name it finds
// neither cached nor of the form host:port fails at once with ErrNotResolved: call
// Resolve (or SendNotify) for the name first; the cache then follows the name through the
// directory's watch. Resolving on a goroutine instead would let a later cached send
// overtake an earlier one and break per-peer FIFO.

var (
	// ErrPeerUnknown: the directory has no usable entry for the peer name (not registered,
	// not host:port in P2P mode, or a value that does not decode; the error says which).
	ErrPeerUnknown = errors.New("notify: peer unknown")
	// ErrDirectoryUnavailable: the directory could not answer within the send's deadline.
	ErrDirectoryUnavailable = directory.ErrUnavailable
	// ErrNotResolved: SendNotifyAsync got a server name that is not in the directory's
	// cache (it never waits on the directory).
	ErrNotResolved = directory.ErrNotCached
)

// dirConfig is the directory part of config.
type dirConfig struct {
	metadata   string              // connection string; "" and no dir: no directory
	dir        directory.Directory // WithDirectory: the caller's, not closed by the engine
	serverName string
	clusterID  string
	ttl        time.Duration
}

// engineDir is the engine's directory state. The directory is published atomically: the
// listener already serves when it is opened, and a handler may send at once. owned and
// registered are set before New returns and read after.
type engineDir struct {
	p          atomic.Pointer[dirRef]
	owned      bool   // opened by the engine: closed by it
	registered string // the server name registered, "" if none
}

type dirRef struct{ d directory.Directory }

// get is the engine's directory, nil without one.
func (ed *engineDir) get() directory.Directory {
	if r := ed.p.Load(); r != nil {
		return r.d
	}
	return nil
}

// WithMetadata sets Mooncake's metadata connection string: "P2PHANDSHAKE" (a name is
// host:port), "etcd://h1:2379,h2:2379", or "h1:2379" (etcd, as Mooncake reads a string
// without "://"). Environment (FromEnv): MC_METADATA_SERVER. Default: none (a peer is its
// host:port).
//
// etcd needs its backend linked into the program, which package notify does not do (it
// would pull the etcd client, gRPC and zap into every program):
//
//	import _ "github.com/twosided/twosided/notify/directory/etcd"
//
// Without it New and FromEnv fail with ErrConfig naming that import.
func WithMetadata(conn string) Option {
	return func(c *config) {
		if err := directory.CheckConn(conn); err != nil {
			c.fail("metadata", "%v", err)
		}
		c.dir.metadata = conn
	}
}

// WithDirectory uses d to resolve peer names and register this engine's server name; the
// engine does not close d. Default: none (WithMetadata's, if set). For etcd, d is
// etcd.Open's (package notify/directory/etcd), which one directory can share between
// engines.
func WithDirectory(d directory.Directory) Option { return func(c *config) { c.dir.dir = d } }

// WithServerName registers this engine in the directory under name (a Mooncake server
// name): peers then reach it by name. It needs a directory other than P2P. Default: none
// (nothing is registered; peers reach the engine by its host:port).
func WithServerName(name string) Option {
	return func(c *config) {
		if err := directory.CheckName(name); err != nil {
			c.fail("server_name", "%v", err)
		}
		c.dir.serverName = name
	}
}

// WithMetadataClusterID puts keys under mooncake/<id>/rpc_meta/ (Mooncake's
// MC_METADATA_CLUSTER_ID, read by FromEnv). Default: "" (keys under mooncake/rpc_meta/).
func WithMetadataClusterID(id string) Option { return func(c *config) { c.dir.clusterID = id } }

// WithDirectoryTTL sets the lease TTL of the registration (whole seconds, 1 s..1 h; default
// 10 s): the entry of an engine that dies without Close disappears within about it.
func WithDirectoryTTL(d time.Duration) Option { return func(c *config) { c.dir.ttl = d } }

// dirFromEnv reads Mooncake's metadata variables.
func (c *config) dirFromEnv(lookup func(string) (string, bool)) {
	if s, ok := lookup("MC_METADATA_SERVER"); ok && s != "" {
		if err := directory.CheckConn(s); err != nil {
			c.fail("MC_METADATA_SERVER", "%v", err)
		}
		c.dir.metadata = s
	}
	if s, ok := lookup("MC_METADATA_CLUSTER_ID"); ok {
		c.dir.clusterID = s
	}
}

// startDirectory opens the directory and registers the server name; on failure the engine
// is closed. Called once the listener serves, so a peer that resolves the name can connect.
func (e *Engine) startDirectory() error {
	dc := e.cfg.dir
	fail := func(err error) error {
		_ = e.Close(context.Background())
		return err
	}
	var d directory.Directory
	switch {
	case dc.dir != nil:
		d = dc.dir
	case dc.metadata != "":
		lg := e.cfg.logger
		od, err := directory.Open(dc.metadata, directory.Config{ClusterID: dc.clusterID, TTL: dc.ttl, Logger: &lg})
		if err != nil {
			return fail(fmt.Errorf("%w: metadata: %v", ErrConfig, err))
		}
		d, e.dir.owned = od, true
	}
	if d != nil {
		e.dir.p.Store(&dirRef{d: d})
	}
	if dc.serverName == "" {
		return nil
	}
	if _, p2p := d.(directory.P2P); d == nil || p2p {
		return fail(fmt.Errorf("%w: server_name %q: needs a metadata service (etcd://…); in P2P mode a name is host:port", ErrConfig, dc.serverName))
	}
	entry, err := directory.EntryFromAddr(e.name)
	if err != nil {
		return fail(fmt.Errorf("%w: server_name %q: the engine's address %w", ErrConfig, dc.serverName, err))
	}
	ctx, cancel := context.WithTimeout(context.Background(), directory.DefaultTimeout)
	defer cancel()
	if err := d.Register(ctx, dc.serverName, entry); err != nil {
		return fail(fmt.Errorf("notify: register %q in %s: %w", dc.serverName, d, err))
	}
	e.dir.registered = dc.serverName
	e.cfg.logger.Info().Str("server_name", dc.serverName).Str("addr", e.name).Str("directory", d.String()).Msg("registered")
	return nil
}

// stopDirectory removes the registration and closes a directory the engine opened.
func (e *Engine) stopDirectory(ctx context.Context) error {
	d := e.dir.get()
	if d == nil {
		return nil
	}
	var err error
	if e.dir.owned {
		err = d.Close(ctx)
	} else if e.dir.registered != "" {
		err = d.Unregister(ctx, e.dir.registered)
	}
	if err != nil {
		return fmt.Errorf("directory: %w", err)
	}
	return nil
}

// ServerName is the name this engine registered in its directory ("" if none).
func (e *Engine) ServerName() string { return e.dir.registered }

// Resolve returns the host:port SendNotify would send to for peer (a server name or a
// host:port), waiting on the directory within ctx; the name is then cached for
// SendNotifyAsync. Without a directory it returns peer.
func (e *Engine) Resolve(ctx context.Context, peer string) (string, error) {
	return e.resolvePeer(ctx, peer)
}

// resolvePeer is SendNotify's lookup: the cache, and on a miss the directory, waited for on
// the caller's goroutine; on the reactor thread the cache only. A hit costs no system call.
func (e *Engine) resolvePeer(ctx context.Context, peer string) (string, error) {
	return e.resolve(ctx, peer, !e.loop.InLoop())
}

// resolveCached is SendNotifyAsync's lookup: the cache only, never a wait.
func (e *Engine) resolveCached(peer string) (string, error) {
	return e.resolve(context.Background(), peer, false)
}

// resolve looks peer up in the directory's cache and, on a miss with wait, in the
// directory itself within ctx.
func (e *Engine) resolve(ctx context.Context, peer string, wait bool) (string, error) {
	d := e.dir.get()
	if d == nil || peer == "" {
		return peer, nil
	}
	addr, err := d.Cached(peer)
	if err == nil {
		return addr, nil
	}
	if wait && errors.Is(err, directory.ErrNotCached) {
		if cerr := ctx.Err(); cerr != nil {
			if _, aerr := directory.EntryFromAddr(peer); aerr == nil {
				return peer, nil // the send says its context ended
			}
			return "", sendErr(ErrTimeout, peer, "directory", cerr, false)
		}
		if addr, err = d.Resolve(ctx, peer); err == nil {
			return addr, nil
		}
		if cerr := ctx.Err(); errors.Is(cerr, context.Canceled) {
			if _, aerr := directory.EntryFromAddr(peer); aerr != nil {
				// The caller gave up, not the directory: "canceled", as any send.
				return "", sendErr(ErrTimeout, peer, "directory", cerr, false)
			}
		}
	}
	return e.resolveFailed(peer, err)
}

// resolveFailed turns a directory error into the send's: a host:port that is no server
// name, or that the directory could not look up (etcd unreachable), is an address;
// otherwise an error naming the peer and wrapping the right sentinel.
func (e *Engine) resolveFailed(peer string, err error) (string, error) {
	missing := errors.Is(err, directory.ErrNotFound) || errors.Is(err, directory.ErrNotCached) || errors.Is(err, directory.ErrBadName)
	if missing || errors.Is(err, directory.ErrUnavailable) {
		if _, aerr := directory.EntryFromAddr(peer); aerr == nil {
			return peer, nil
		}
	}
	switch {
	case errors.Is(err, directory.ErrNotCached):
		return "", fmt.Errorf("notify: send to %s: %w: SendNotifyAsync never waits on the directory; call Resolve or SendNotify for the name first", peer, err)
	case missing, errors.Is(err, directory.ErrBadValue):
		return "", fmt.Errorf("%w: %s: %w", ErrPeerUnknown, peer, err)
	case errors.Is(err, directory.ErrClosed):
		return "", ErrClosed
	}
	return "", fmt.Errorf("notify: send to %s: %w", peer, err)
}
