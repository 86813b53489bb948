package etcd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/twosided/twosided/notify/directory"
)

func init() { directory.RegisterBackend(directory.BackendEtcd, openBackend) }

func openBackend(c directory.Conn, cfg directory.Config) (directory.Directory, error) {
	return newEtcd(c.Endpoints, cfg)
}

// Open returns an etcd directory for conn, a metadata connection string
// ("etcd://h1:2379,h2:2379", or "h1:2379" as Mooncake reads it), for notify.WithDirectory.
// It does not wait for etcd: it connects in the background, and its calls report
// directory.ErrUnavailable until it can. The caller closes it (after the engines that use
// it).
func Open(conn string, cfg directory.Config) (*Directory, error) {
	c, err := directory.ParseConn(conn)
	if err != nil {
		return nil, err
	}
	if c.Backend != directory.BackendEtcd {
		return nil, fmt.Errorf("%w: %q is not an etcd connection string", directory.ErrBadConn, conn)
	}
	if cfg, err = cfg.WithDefaults(); err != nil {
		return nil, err
	}
	return newEtcd(c.Endpoints, cfg)
}

// Directory is the etcd backend, a directory.Directory. Create it with Open, or with
// directory.Open (and notify's WithMetadata, MC_METADATA_SERVER) once this package is linked.
//
// Cache. A resolution is cached with the etcd revision it was read at; one watch on the
// rpc_meta prefix applies every later put and delete of a cached name, so a cached entry
// follows a peer that restarts on a new address as soon as the watch delivers the put
// (while etcd is reachable). A name is cached only when the watch covers the revision it
// was read at; otherwise the result is returned but not kept. While etcd is down the watch
// waits to resume and cached names keep resolving as they were. If etcd compacted the
// revisions the watch missed, the cache is dropped and names are read again on demand.
// Absent names are cached too (a put of the name replaces them), so sending to a host:port
// that is no server name costs one etcd read, not one per send.
type Directory struct {
	cfg    directory.Config
	conn   string
	prefix string
	cli    *clientv3.Client
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	cache     map[string]cached
	flights   map[string]*flight
	regs      map[string]*registration
	watchFrom int64         // the watch delivers every event after this revision; 0: no watch yet
	ready     chan struct{} // closed once the watch first started: reads are cached from then
	closed    bool
	readyOnce sync.Once
	// down: the last read of etcd failed. Resolves of uncached names then fail at once
	// (a read goes on in the background) instead of each waiting out the timeout.
	down bool
}

// cached is one name's resolution as of etcd revision rev: an address, or the error a
// resolve returns (not registered, bad value).
type cached struct {
	addr string
	err  error
	rev  int64
}

func (c cached) result() (string, error) { return c.addr, c.err }

// flight is one read of a name from etcd that concurrent resolves wait for. ev is the
// newest watch event for the name seen while the read was in flight.
type flight struct {
	done chan struct{}
	res  cached
	ev   *cached
}

func newEtcd(endpoints []string, cfg directory.Config) (*Directory, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            endpoints,
		DialTimeout:          cfg.Timeout,
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
		Logger:               zap.NewNop(),
		// grpc's reconnect backoff grows to 120 s by default; capped at 1 s, a directory
		// is back within about a second of etcd's return.
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		})},
	})
	if err != nil {
		return nil, fmt.Errorf("%w: etcd client for %v: %v", directory.ErrBadConn, endpoints, err)
	}
	d := &Directory{
		cfg:     cfg,
		conn:    "etcd://" + strings.Join(endpoints, ","),
		prefix:  directory.Prefix(cfg.ClusterID),
		cli:     cli,
		cache:   make(map[string]cached),
		flights: make(map[string]*flight),
		regs:    make(map[string]*registration),
		ready:   make(chan struct{}),
	}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	d.wg.Add(1)
	go d.watchLoop()
	return d, nil
}

func (d *Directory) String() string { return d.conn }

// Key is the etcd key of name.
func (d *Directory) Key(name string) string { return d.prefix + name }

func (d *Directory) notFound(name string) error {
	return fmt.Errorf("%w: %s (key %s in %s)", directory.ErrNotFound, name, d.prefix+name, d.conn)
}

// Cached implements Directory.
func (d *Directory) Cached(name string) (string, error) {
	if err := directory.CheckName(name); err != nil {
		return "", err
	}
	d.mu.Lock()
	c, ok := d.cache[name]
	closed := d.closed
	d.mu.Unlock()
	switch {
	case closed:
		return "", directory.ErrClosed
	case !ok:
		return "", fmt.Errorf("%w: %s", directory.ErrNotCached, name)
	}
	return c.result()
}

// Resolve implements Directory. Concurrent resolves of one name share one etcd read; each
// waits for it within its own ctx. The first resolves of a new directory wait for its watch
// to start, so that what they read is cached.
func (d *Directory) Resolve(ctx context.Context, name string) (string, error) {
	if addr, err := d.Cached(name); !errors.Is(err, directory.ErrNotCached) {
		return addr, err // a hit, a bad name, or closed: no timer, no wait
	}
	d.mu.Lock()
	down := d.down
	d.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	defer cancel()
	if !down {
		select {
		case <-d.ready:
		case <-ctx.Done():
			if !errors.Is(ctx.Err(), context.Canceled) { // a caller that gives up says nothing of etcd
				d.setDown(true)
			}
			return "", fmt.Errorf("%w: %s: resolving %s: %w", directory.ErrUnavailable, d.conn, name, ctx.Err())
		case <-d.ctx.Done():
			return "", directory.ErrClosed
		}
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return "", directory.ErrClosed
	}
	if c, ok := d.cache[name]; ok {
		d.mu.Unlock()
		return c.result()
	}
	f := d.flights[name]
	if f == nil {
		f = &flight{done: make(chan struct{})}
		d.flights[name] = f
		d.wg.Add(1)
		go d.fetch(name, f)
	}
	d.mu.Unlock()
	if down {
		return "", fmt.Errorf("%w: %s: resolving %s: etcd did not answer the last read (trying again)", directory.ErrUnavailable, d.conn, name)
	}
	select {
	case <-f.done:
		return f.res.result()
	case <-ctx.Done():
		return "", fmt.Errorf("%w: %s: resolving %s: %w", directory.ErrUnavailable, d.conn, name, ctx.Err())
	}
}

// fetch reads name from etcd for flight f, bounded by the directory's timeout (a caller
// that gives up earlier stops waiting; the read still completes for the others).
func (d *Directory) fetch(name string, f *flight) {
	defer d.wg.Done()
	key := d.prefix + name
	ctx, cancel := context.WithTimeout(d.ctx, d.cfg.Timeout)
	resp, err := d.cli.Get(ctx, key)
	cancel()
	var res cached
	switch {
	case err != nil:
		res.err = fmt.Errorf("%w: %s: get %s: %v", directory.ErrUnavailable, d.conn, key, err)
	case len(resp.Kvs) == 0:
		res = cached{err: d.notFound(name), rev: resp.Header.Revision}
	default:
		e, derr := directory.Decode(key, resp.Kvs[0].Value)
		res = cached{addr: e.Addr(), err: derr, rev: resp.Header.Revision}
		if derr != nil {
			res.addr = ""
		}
	}
	d.mu.Lock()
	d.down = err != nil
	if f.ev != nil && (err != nil || f.ev.rev > res.rev) {
		res = *f.ev
	}
	if res.rev > 0 && d.watchFrom > 0 && res.rev >= d.watchFrom && !d.closed {
		d.insert(name, res)
	}
	delete(d.flights, name)
	f.res = res
	d.mu.Unlock()
	close(f.done)
}

func (d *Directory) setDown(v bool) {
	d.mu.Lock()
	d.down = v
	d.mu.Unlock()
}

// insert caches c under name; at the bound an arbitrary other entry makes room. d.mu held.
func (d *Directory) insert(name string, c cached) {
	if _, ok := d.cache[name]; !ok && len(d.cache) >= d.cfg.MaxCache {
		for victim := range d.cache {
			delete(d.cache, victim)
			break
		}
	}
	d.cache[name] = c
}

// apply folds one watch event into the cache and into a read in flight for the name.
func (d *Directory) apply(ev *clientv3.Event) {
	key := string(ev.Kv.Key)
	name, ok := strings.CutPrefix(key, d.prefix)
	if !ok || directory.CheckName(name) != nil {
		return
	}
	c := cached{rev: ev.Kv.ModRevision}
	if ev.Type == mvccpb.DELETE {
		c.err = d.notFound(name)
	} else if e, err := directory.Decode(key, ev.Kv.Value); err != nil {
		c.err = err
	} else {
		c.addr = e.Addr()
	}
	d.mu.Lock()
	if f := d.flights[name]; f != nil && (f.ev == nil || c.rev > f.ev.rev) {
		f.ev = &c
	}
	if old, ok := d.cache[name]; ok && c.rev > old.rev {
		d.cache[name] = c
	}
	d.mu.Unlock()
}

// watchLoop keeps the watch on the prefix: it takes the current revision, drops what the
// cache cannot know is current, and watches from there; on compaction it starts again.
func (d *Directory) watchLoop() {
	defer d.wg.Done()
	var bo retry
	for d.ctx.Err() == nil {
		ctx, cancel := context.WithTimeout(d.ctx, d.cfg.Timeout)
		resp, err := d.cli.Get(ctx, d.prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		cancel()
		d.setDown(err != nil)
		if err != nil {
			d.cfg.Logger.Debug().Err(err).Str("directory", d.conn).Msg("directory watch: etcd unreachable")
			if !bo.wait(d.ctx) {
				return
			}
			continue
		}
		bo.reset()
		rev := resp.Header.Revision
		d.mu.Lock()
		clear(d.cache)
		d.watchFrom = rev
		d.mu.Unlock()
		d.readyOnce.Do(func() { close(d.ready) })
		wctx, wcancel := context.WithCancel(d.ctx)
		for wr := range d.cli.Watch(wctx, d.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
			if err := wr.Err(); err != nil {
				d.cfg.Logger.Warn().Err(err).Str("directory", d.conn).Msg("directory watch ended; the cache starts again")
				break
			}
			for _, ev := range wr.Events {
				d.apply(ev)
			}
		}
		wcancel()
		d.mu.Lock()
		d.watchFrom = 0
		d.mu.Unlock()
	}
}

// retry is a capped exponential backoff between attempts to reach etcd.
type retry struct{ next time.Duration }

const (
	retryMin = 50 * time.Millisecond
	retryMax = time.Second
)

func (r *retry) reset() { r.next = 0 }

// wait sleeps the next backoff interval; false when ctx ended first.
func (r *retry) wait(ctx context.Context) bool {
	r.next = min(max(2*r.next, retryMin), retryMax)
	t := time.NewTimer(r.next)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// registration is one name this directory publishes, under a lease its keeper keeps alive.
type registration struct {
	name, key string
	value     []byte
	ctx       context.Context
	cancel    context.CancelFunc
	done      chan struct{}
	lease     clientv3.LeaseID // written by the keeper only, read after done
	// firstLease is the lease of the first put, for tests.
	firstLease clientv3.LeaseID
}

// Register implements Directory. The first put takes the name unconditionally (a process
// restarting under its old name must win over its dead predecessor's entry); a put after
// the lease was lost (etcd unreachable longer than the TTL) does not take the name from a
// process that registered it since (ErrNameTaken, logged).
func (d *Directory) Register(ctx context.Context, name string, e directory.Entry) error {
	if err := directory.CheckName(name); err != nil {
		return err
	}
	if err := e.Check(); err != nil {
		return fmt.Errorf("%w: %s: %v", directory.ErrBadValue, name, err)
	}
	r := &registration{name: name, key: d.prefix + name, value: directory.Encode(e), done: make(chan struct{})}
	// Set before r is seen in d.regs: an Unregister or Close that races with this Register
	// cancels it and waits for done, which the keeper (or a failed publish) closes.
	r.ctx, r.cancel = context.WithCancel(d.ctx)
	d.mu.Lock()
	switch {
	case d.closed:
		d.mu.Unlock()
		r.cancel()
		return directory.ErrClosed
	case d.regs[name] != nil:
		d.mu.Unlock()
		r.cancel()
		return fmt.Errorf("%w: %s: already registered by this directory", directory.ErrBadName, name)
	}
	d.regs[name] = r
	d.wg.Add(1) // the keeper's, or this call's until its publish failed
	d.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	lease, err := d.publish(ctx, r, 0, true)
	cancel()
	if err != nil {
		d.mu.Lock()
		if d.regs[name] == r {
			delete(d.regs, name)
		}
		d.mu.Unlock()
		r.cancel()
		close(r.done)
		d.wg.Done()
		return err
	}
	r.lease, r.firstLease = lease, lease // before the keeper starts: its done orders them before Unregister's reads
	go d.keep(r)
	return nil
}

// publish grants a lease and puts r's value under it. Unless takeOver, the put happens only
// if the key is absent, still ours (on prev), or holds our value.
func (d *Directory) publish(ctx context.Context, r *registration, prev clientv3.LeaseID, takeOver bool) (clientv3.LeaseID, error) {
	unavailable := func(op string, err error) error {
		return fmt.Errorf("%w: %s: %s %s: %v", directory.ErrUnavailable, d.conn, op, r.key, err)
	}
	g, err := d.cli.Grant(ctx, int64(d.cfg.TTL/time.Second))
	if err != nil {
		return 0, unavailable("lease for", err)
	}
	put := clientv3.OpPut(r.key, string(r.value), clientv3.WithLease(g.ID))
	if takeOver {
		if _, err := d.cli.Put(ctx, r.key, string(r.value), clientv3.WithLease(g.ID)); err != nil {
			d.revoke(g.ID)
			return 0, unavailable("put", err)
		}
		return g.ID, nil
	}
	for range 3 {
		resp, err := d.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(r.key), "=", 0)).
			Then(put).Else(clientv3.OpGet(r.key)).Commit()
		if err != nil {
			d.revoke(g.ID)
			return 0, unavailable("put", err)
		}
		if resp.Succeeded {
			return g.ID, nil
		}
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		if len(kvs) == 0 {
			continue // deleted in between
		}
		kv := kvs[0]
		if clientv3.LeaseID(kv.Lease) != prev && !bytes.Equal(kv.Value, r.value) {
			d.revoke(g.ID)
			return 0, fmt.Errorf("%w: %s holds %q", directory.ErrNameTaken, r.key, bytes.TrimSpace(kv.Value))
		}
		resp, err = d.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(r.key), "=", kv.ModRevision)).
			Then(put).Commit()
		if err != nil {
			d.revoke(g.ID)
			return 0, unavailable("put", err)
		}
		if resp.Succeeded {
			return g.ID, nil
		}
	}
	d.revoke(g.ID)
	return 0, unavailable("put", errors.New("key changed under three attempts in a row"))
}

// revoke drops a lease, best effort, bounded by the directory's timeout.
func (d *Directory) revoke(id clientv3.LeaseID) error {
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.Timeout)
	defer cancel()
	_, err := d.cli.Revoke(ctx, id)
	return err
}

// keep keeps r's lease alive; when the lease is lost (etcd unreachable for longer than the
// TTL, or the lease revoked by hand) it publishes r again, retrying until etcd answers.
func (d *Directory) keep(r *registration) {
	defer d.wg.Done()
	defer close(r.done)
	var bo retry
	for {
		if ch, err := d.cli.KeepAlive(r.ctx, r.lease); err == nil {
			for range ch {
			}
		}
		if r.ctx.Err() != nil {
			return
		}
		d.cfg.Logger.Warn().Str("name", r.name).Str("directory", d.conn).Msg("directory: lease lost; registering again")
		for {
			if !bo.wait(r.ctx) {
				return
			}
			ctx, cancel := context.WithTimeout(r.ctx, d.cfg.Timeout)
			lease, err := d.publish(ctx, r, r.lease, false)
			cancel()
			if err == nil {
				old := r.lease
				r.lease = lease
				_ = d.revoke(old) // usually expired already; if not, it holds nothing now
				bo.reset()
				d.cfg.Logger.Info().Str("name", r.name).Str("directory", d.conn).Msg("directory: registered again")
				break
			}
			if errors.Is(err, directory.ErrNameTaken) {
				d.cfg.Logger.Error().Err(err).Str("name", r.name).Msg("directory: the name was taken; not registering again")
				return
			}
			if r.ctx.Err() != nil {
				return
			}
		}
	}
}

// Unregister implements Directory: the keeper stops and the lease is revoked, which deletes
// the entry if it is still ours. If etcd cannot be reached the entry expires within the TTL.
func (d *Directory) Unregister(ctx context.Context, name string) error {
	d.mu.Lock()
	r := d.regs[name]
	delete(d.regs, name)
	d.mu.Unlock()
	if r == nil {
		return fmt.Errorf("%w: %s: not registered by this directory", directory.ErrNotFound, name)
	}
	r.cancel()
	<-r.done
	if r.lease == 0 {
		return nil // its Register failed to publish (and said so)
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	defer cancel()
	if _, err := d.cli.Revoke(ctx, r.lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("%w: %s: revoke the lease of %s (it expires within %v): %v", directory.ErrUnavailable, d.conn, r.key, d.cfg.TTL, err)
	}
	return nil
}

// Close implements Directory: every registration is unregistered (bounded by ctx), the
// watch stops and the client closes.
func (d *Directory) Close(ctx context.Context) error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	names := make([]string, 0, len(d.regs))
	for n := range d.regs {
		names = append(names, n)
	}
	d.mu.Unlock()
	var errs []error
	for _, n := range names {
		errs = append(errs, d.Unregister(ctx, n))
	}
	d.cancel()
	d.wg.Wait()
	errs = append(errs, d.cli.Close())
	return errors.Join(errs...)
}
