// Package kvdir is the directory of the key-value metadata services without a watch that
// Mooncake uses, Redis and its HTTP metadata servers: a Store does the backend's reads and
// writes, Dir keeps the cache (polled, see Cache), the registrations (refreshed) and the
// reads in flight. Status: internal to notify/directory's redis and http backends.
package kvdir

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twosided/twosided/notify/directory"
)

// Store is one metadata service's key-value operations. Every call is bounded by its ctx.
// An error that wraps no directory sentinel is the service being unreachable (or refusing:
// the text says why); the driver wraps it in directory.ErrUnavailable with the backend and
// the key.
type Store interface {
	// Get reads key: its value and true, or false when the key is absent.
	Get(ctx context.Context, key string) ([]byte, bool, error)
	// GetMany reads keys; vals[i] is nil when keys[i] is absent.
	GetMany(ctx context.Context, keys []string) ([][]byte, error)
	// Put publishes val at key for ttl (as far as the service keeps a TTL), whatever the
	// key holds.
	Put(ctx context.Context, key string, val []byte, ttl time.Duration) error
	// Refresh keeps val at key for another ttl when the key is absent or holds val, and
	// fails with directory.ErrNameTaken, saying what the key holds, otherwise.
	Refresh(ctx context.Context, key string, val []byte, ttl time.Duration) error
	// Delete removes key if it holds val.
	Delete(ctx context.Context, key string, val []byte) error
	// Close releases the store's connections.
	Close() error
}

// Options are a backend's settings of the driver.
type Options struct {
	// Conn names the service in messages: "redis://host:port", "http://host:port/path".
	Conn string
	// Refresh is the period of a registration's refresh (a third of the TTL).
	Refresh time.Duration
	// Sweep and Round bound a poll round (see Cache).
	Sweep, Round int
	// Expires says what becomes of an entry that could not be deleted, for messages
	// ("it expires within 10s", "it stays until deleted or overwritten").
	Expires string
}

// maxFlights bounds the distinct names read at once for resolves.
const maxFlights = 4096

// Dir is a directory.Directory over a Store.
//
// Cache: a resolve's read is cached (an absent name too, so that sending to a host:port
// that is no server name costs one read, not one per send). Every cfg.Poll the names
// looked up since their last read are read again (see Cache), so a cached name follows a
// peer that restarts on a new address within about one poll period. While the service is
// down the poll fails and cached names keep resolving as they were; a cached address whose
// key a poll finds absent keeps resolving for a grace of one refresh period and one poll
// (the service restarted empty: the registrations come back within a refresh), so a
// deleted name is seen within about that. A resolve of an
// uncached name after a failed read fails at once with ErrUnavailable while a read goes on
// in the background.
//
// Registrations: Register puts the entry, taking the name whatever it held (a process that
// restarts under its name wins over its dead predecessor's entry); a keeper refreshes it
// every Options.Refresh, putting it back if it went (the service restarted empty, or the
// TTL lapsed during an outage), but never over another process's value
// (directory.ErrNameTaken, logged, and the keeper stops).
type Dir struct {
	cfg    directory.Config
	opt    Options
	st     Store
	prefix string
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	cache   *Cache
	flights map[string]*flight
	regs    map[string]*registration
	seq     uint64 // numbers the reads in the order they start
	down    bool   // the last read failed
	lastErr error  // its error
	closed  bool
}

type flight struct {
	seq  uint64
	done chan struct{}
	res  Result
}

// New starts a directory over st; cfg has its defaults. It owns st and closes it on Close.
func New(st Store, cfg directory.Config, opt Options) *Dir {
	d := &Dir{
		cfg:     cfg,
		opt:     opt,
		st:      st,
		prefix:  directory.Prefix(cfg.ClusterID),
		cache:   NewCache(cfg.MaxCache, opt.Sweep, opt.Round, opt.Refresh+cfg.Poll),
		flights: make(map[string]*flight),
		regs:    make(map[string]*registration),
	}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	d.wg.Add(1)
	go d.pollLoop()
	return d
}

func (d *Dir) String() string { return d.opt.Conn }

// Key is the key of name.
func (d *Dir) Key(name string) string { return d.prefix + name }

// unavailable wraps a store error: a directory sentinel it wraps is kept, anything else
// is the service unreachable.
func (d *Dir) unavailable(op, key string, err error) error {
	for _, s := range []error{directory.ErrNameTaken, directory.ErrUnavailable, directory.ErrBadConn, directory.ErrBadValue} {
		if errors.Is(err, s) {
			return fmt.Errorf("%s: %s %s: %w", d.opt.Conn, op, key, err)
		}
	}
	return fmt.Errorf("%w: %s: %s %s: %v", directory.ErrUnavailable, d.opt.Conn, op, key, err)
}

func (d *Dir) result(name string, val []byte) Result {
	key := d.prefix + name
	if val == nil {
		return Result{Err: fmt.Errorf("%w: %s (key %s in %s)", directory.ErrNotFound, name, key, d.opt.Conn), Absent: true}
	}
	e, err := directory.Decode(key, val)
	if err != nil {
		return Result{Err: fmt.Errorf("%w (in %s)", err, d.opt.Conn)}
	}
	return Result{Addr: e.Addr()}
}

// Cached implements directory.Directory: a map lookup under a mutex, no wait.
func (d *Dir) Cached(name string) (string, error) {
	if err := directory.CheckName(name); err != nil {
		return "", err
	}
	d.mu.Lock()
	res, ok := d.cache.Lookup(name)
	closed := d.closed
	d.mu.Unlock()
	switch {
	case closed:
		return "", directory.ErrClosed
	case !ok:
		return "", fmt.Errorf("%w: %s", directory.ErrNotCached, name)
	}
	return res.Addr, res.Err
}

// Resolve implements directory.Directory. Concurrent resolves of one name share one read;
// each waits for it within its own ctx and the directory's timeout.
func (d *Dir) Resolve(ctx context.Context, name string) (string, error) {
	if addr, err := d.Cached(name); !errors.Is(err, directory.ErrNotCached) {
		return addr, err
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return "", directory.ErrClosed
	}
	if res, ok := d.cache.Lookup(name); ok {
		d.mu.Unlock()
		return res.Addr, res.Err
	}
	f := d.flights[name]
	if f == nil {
		if len(d.flights) >= maxFlights {
			d.mu.Unlock()
			return "", fmt.Errorf("%w: %s: resolving %s: %d reads in flight already", directory.ErrUnavailable, d.opt.Conn, name, maxFlights)
		}
		d.seq++
		f = &flight{seq: d.seq, done: make(chan struct{})}
		d.flights[name] = f
		d.wg.Add(1)
		go d.fetch(name, f)
	}
	down, lastErr := d.down, d.lastErr
	d.mu.Unlock()
	if down {
		return "", fmt.Errorf("%w: %s: resolving %s (key %s): the last read failed, reading again: %v",
			directory.ErrUnavailable, d.opt.Conn, name, d.prefix+name, lastErr)
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	defer cancel()
	select {
	case <-f.done:
		return f.res.Addr, f.res.Err
	case <-ctx.Done():
		return "", fmt.Errorf("%w: %s: resolving %s (key %s): %w", directory.ErrUnavailable, d.opt.Conn, name, d.prefix+name, ctx.Err())
	}
}

// fetch reads name for flight f, bounded by the directory's timeout.
func (d *Dir) fetch(name string, f *flight) {
	defer d.wg.Done()
	key := d.prefix + name
	ctx, cancel := context.WithTimeout(d.ctx, d.cfg.Timeout)
	val, ok, err := d.st.Get(ctx, key)
	cancel()
	var res Result
	if err != nil {
		res.Err = d.unavailable("get", key, err)
	} else {
		if !ok {
			val = nil
		} else if val == nil {
			val = []byte{}
		}
		res = d.result(name, val)
	}
	d.mu.Lock()
	d.down, d.lastErr = err != nil, err
	if err == nil && !d.closed {
		d.cache.Store(name, res, f.seq, true, time.Now())
	}
	delete(d.flights, name)
	f.res = res
	d.mu.Unlock()
	close(f.done)
}

// pollLoop reads the due names again every cfg.Poll.
func (d *Dir) pollLoop() {
	defer d.wg.Done()
	t := time.NewTicker(d.cfg.Poll)
	defer t.Stop()
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-t.C:
		}
		d.poll()
	}
}

// poll runs one round. A failed read keeps every cached name as it was.
func (d *Dir) poll() {
	d.mu.Lock()
	names := d.cache.Due()
	d.seq++
	seq := d.seq
	d.mu.Unlock()
	if len(names) == 0 {
		return
	}
	keys := make([]string, len(names))
	for i, n := range names {
		keys[i] = d.prefix + n
	}
	ctx, cancel := context.WithTimeout(d.ctx, d.cfg.Timeout)
	vals, err := d.st.GetMany(ctx, keys)
	cancel()
	if err != nil {
		d.mu.Lock()
		d.down, d.lastErr = true, err
		d.mu.Unlock()
		d.cfg.Logger.Debug().Err(err).Str("directory", d.opt.Conn).Msg("directory poll: the service did not answer; cached names stay")
		return
	}
	res := make([]Result, len(names))
	for i, n := range names {
		res[i] = d.result(n, vals[i])
	}
	now := time.Now()
	d.mu.Lock()
	d.down, d.lastErr = false, nil
	if !d.closed {
		for i, n := range names {
			d.cache.Store(n, res[i], seq, false, now)
		}
	}
	d.mu.Unlock()
}

// registration is one name this directory publishes, refreshed by its keeper.
type registration struct {
	name, key string
	value     []byte
	ctx       context.Context
	cancel    context.CancelFunc
	done      chan struct{}
}

// Register implements directory.Directory.
func (d *Dir) Register(ctx context.Context, name string, e directory.Entry) error {
	if err := directory.CheckName(name); err != nil {
		return err
	}
	if err := e.Check(); err != nil {
		return fmt.Errorf("%w: %s: %v", directory.ErrBadValue, name, err)
	}
	r := &registration{name: name, key: d.prefix + name, value: directory.Encode(e), done: make(chan struct{})}
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
	d.wg.Add(1) // the keeper's, or this call's until its put failed
	d.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	err := d.st.Put(ctx, r.key, r.value, d.cfg.TTL)
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
		return d.unavailable("put", r.key, err)
	}
	go d.keep(r)
	return nil
}

// keep refreshes r every Options.Refresh; after a failure it tries again sooner (a capped
// backoff), and it stops when the name was taken by another process.
func (d *Dir) keep(r *registration) {
	defer d.wg.Done()
	defer close(r.done)
	wait := d.opt.Refresh
	failing := false
	for {
		t := time.NewTimer(wait)
		select {
		case <-r.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(r.ctx, d.cfg.Timeout)
		err := d.st.Refresh(ctx, r.key, r.value, d.cfg.TTL)
		cancel()
		switch {
		case err == nil:
			if failing {
				d.cfg.Logger.Info().Str("name", r.name).Str("directory", d.opt.Conn).Msg("directory: registration refreshed again")
			}
			failing, wait = false, d.opt.Refresh
		case errors.Is(err, directory.ErrNameTaken):
			d.cfg.Logger.Error().Err(d.unavailable("refresh", r.key, err)).Str("name", r.name).Msg("directory: the name was taken; not registering again")
			return
		case r.ctx.Err() != nil:
			return
		default:
			if !failing {
				d.cfg.Logger.Warn().Err(d.unavailable("refresh", r.key, err)).Str("name", r.name).Msg("directory: refresh failed; trying again")
				wait = 25 * time.Millisecond
			}
			failing = true
			wait = min(2*wait, time.Second, d.opt.Refresh)
		}
	}
}

// Unregister implements directory.Directory: the keeper stops and the entry is deleted if
// it still holds this registration's value.
func (d *Dir) Unregister(ctx context.Context, name string) error {
	d.mu.Lock()
	r := d.regs[name]
	delete(d.regs, name)
	d.mu.Unlock()
	if r == nil {
		return fmt.Errorf("%w: %s: not registered by this directory", directory.ErrNotFound, name)
	}
	r.cancel()
	<-r.done
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	defer cancel()
	if err := d.st.Delete(ctx, r.key, r.value); err != nil {
		return fmt.Errorf("%w (%s)", d.unavailable("delete", r.key, err), d.opt.Expires)
	}
	return nil
}

// Close implements directory.Directory: every registration is unregistered (bounded by
// ctx), the poll and the reads stop and the store closes.
func (d *Dir) Close(ctx context.Context) error {
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
	d.cache.Clear()
	d.mu.Unlock()
	var errs []error
	for _, n := range names {
		errs = append(errs, d.Unregister(ctx, n))
	}
	d.cancel()
	d.wg.Wait()
	errs = append(errs, d.st.Close())
	return errors.Join(errs...)
}

// Registered reports whether name is registered by this directory and its keeper runs
// (for tests).
func (d *Dir) Registered(name string) bool {
	d.mu.Lock()
	r := d.regs[name]
	d.mu.Unlock()
	if r == nil {
		return false
	}
	select {
	case <-r.done:
		return false
	default:
		return true
	}
}
