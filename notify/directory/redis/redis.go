// Package redis is the Redis backend of package directory: server names in the keys and
// values a Mooncake cluster keeps in Redis (MC_METADATA_SERVER=redis://host:port; plain GET,
// SET and DEL of mooncake/[cluster id/]rpc_meta/<name>), through go-redis.
//
// Status: API. It is a package of its own so that a program that does not name peers through
// Redis does not link the Redis client: package notify does not import it. Link it in with a
// registration import, as database/sql drivers are:
//
//	import _ "github.com/twosided/twosided/notify/directory/redis"
//
// Then notify.WithMetadata("redis://10.0.0.1:6379"), MC_METADATA_SERVER under notify.FromEnv
// and directory.Open accept redis:// and rediss:// (TLS) strings. Or open one explicitly
// with Open and share it between engines with notify.WithDirectory.
//
// The connection string holds the address only, as Mooncake's does; Mooncake's variables
// give the rest: MC_REDIS_USERNAME and MC_REDIS_PASSWORD (AUTH), MC_REDIS_DB_INDEX (SELECT,
// 0..255). rediss:// verifies the server's certificate against the system's roots, or
// against the PEM file TWOSIDED_METADATA_CA_FILE names.
//
// Unlike Mooncake's entries, which have no expiry and outlive a crashed process, a
// registration is SET with a TTL (directory.Config.TTL, 10 s by default) that a keeper
// refreshes every third of it: the entry of a process killed with -9 is gone within the
// TTL. Resolutions are cached; the cache is kept current by polling (one MGET per
// directory.Config.Poll for the names in use, see docs/directory.md), and cached names
// keep resolving while Redis is down.
package redis

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/twosided/twosided/notify/directory"
	"github.com/twosided/twosided/notify/directory/internal/kvdir"
)

func init() { directory.RegisterBackend(directory.BackendRedis, openBackend) }

func openBackend(c directory.Conn, cfg directory.Config) (directory.Directory, error) {
	opt, err := OptionsFromEnv(os.LookupEnv)
	if err != nil {
		return nil, err
	}
	return newRedis(c, cfg, opt)
}

// Mooncake's environment variables of its Redis plugin.
const (
	UsernameEnv = "MC_REDIS_USERNAME"
	PasswordEnv = "MC_REDIS_PASSWORD"
	DBIndexEnv  = "MC_REDIS_DB_INDEX"
)

// Options are the Redis settings that are not in the connection string.
type Options struct {
	Username, Password string
	DB                 int // 0..255, as Mooncake reads MC_REDIS_DB_INDEX
	// CAFile: PEM certificate authorities for rediss:// (default: the system's roots).
	CAFile string
}

// OptionsFromEnv reads MC_REDIS_USERNAME, MC_REDIS_PASSWORD, MC_REDIS_DB_INDEX and
// TWOSIDED_METADATA_CA_FILE. A database index that is not a number in 0..255 is an error
// (Mooncake logs it and uses 0).
func OptionsFromEnv(lookup func(string) (string, bool)) (Options, error) {
	var o Options
	o.Username, _ = lookup(UsernameEnv)
	o.Password, _ = lookup(PasswordEnv)
	o.CAFile, _ = lookup(kvdir.CAFileEnv)
	if s, ok := lookup(DBIndexEnv); ok && strings.TrimSpace(s) != "" {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 0 || n > 255 {
			return o, fmt.Errorf("%w: %s=%q: want a database index in 0..255", directory.ErrBadConn, DBIndexEnv, s)
		}
		o.DB = n
	}
	return o, nil
}

// Open returns a Redis directory for conn ("redis://host:port" or "rediss://host:port")
// with opt (OptionsFromEnv reads Mooncake's variables), for notify.WithDirectory. It does
// not wait for Redis. The caller closes it after the engines that use it.
func Open(conn string, cfg directory.Config, opt Options) (*Directory, error) {
	c, err := directory.ParseConn(conn)
	if err != nil {
		return nil, err
	}
	if c.Backend != directory.BackendRedis {
		return nil, fmt.Errorf("%w: %q is not a redis connection string", directory.ErrBadConn, conn)
	}
	if cfg, err = cfg.WithDefaults(); err != nil {
		return nil, err
	}
	return newRedis(c, cfg, opt)
}

// Directory is the Redis backend, a directory.Directory (see kvdir.Dir for the cache and
// the registrations).
type Directory struct {
	*kvdir.Dir
}

func newRedis(c directory.Conn, cfg directory.Config, opt Options) (*Directory, error) {
	scheme := "redis://"
	o := &goredis.Options{
		Addr:                  c.Endpoints[0],
		Username:              opt.Username,
		Password:              opt.Password,
		DB:                    opt.DB,
		Protocol:              2, // plain RESP2 GET/SET, as Mooncake's hiredis speaks
		DisableIdentity:       true,
		DialTimeout:           cfg.Timeout,
		ReadTimeout:           cfg.Timeout,
		WriteTimeout:          cfg.Timeout,
		ContextTimeoutEnabled: true, // a caller's deadline bounds the command
		MaxRetries:            1,
		DialerRetries:         1,
		PoolSize:              8,
		MaintNotificationsConfig: &maintnotifications.Config{
			Mode: maintnotifications.ModeDisabled,
		},
	}
	if c.TLS {
		scheme = "rediss://"
		host := c.Endpoints[0]
		if i := strings.LastIndexByte(host, ':'); i >= 0 {
			host = strings.Trim(host[:i], "[]")
		}
		lookup := func(string) (string, bool) { return opt.CAFile, opt.CAFile != "" }
		tc, err := kvdir.TLSConfig(host, lookup)
		if err != nil {
			return nil, err
		}
		o.TLSConfig = tc
	}
	conn := scheme + c.Endpoints[0]
	st := &store{cli: goredis.NewClient(o), db: opt.DB}
	ttl := cfg.TTL
	return &Directory{kvdir.New(st, cfg, kvdir.Options{
		Conn:    conn,
		Refresh: ttl / 3,
		Sweep:   256,
		Round:   4096,
		Expires: fmt.Sprintf("it expires within %v", ttl),
	})}, nil
}

// store is the Redis Store: GET, MGET and SET with a TTL, and two scripts that change a key
// only while it holds this process's value.
type store struct {
	cli *goredis.Client
	db  int
}

// refreshScript keeps ARGV[1] at KEYS[1] for ARGV[2] ms if the key is absent or holds it;
// else it returns what the key holds.
var refreshScript = goredis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == false or v == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return false
end
return v`)

// deleteScript deletes KEYS[1] if it holds ARGV[1].
var deleteScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0`)

// mgetBatch bounds the keys of one MGET.
const mgetBatch = 512

// cause names an authentication failure as such; other errors pass through.
func cause(err error) error {
	if err == nil {
		return nil
	}
	s := err.Error()
	if strings.Contains(s, "WRONGPASS") || strings.Contains(s, "NOAUTH") || strings.Contains(s, "invalid password") ||
		strings.Contains(s, "invalid username-password") {
		return fmt.Errorf("authentication failed (%s, %s): %w", UsernameEnv, PasswordEnv, err)
	}
	if strings.Contains(s, "DB index is out of range") {
		return fmt.Errorf("%s: %w", DBIndexEnv, err)
	}
	return err
}

func (s *store) Get(ctx context.Context, key string) ([]byte, bool, error) {
	v, err := s.cli.Get(ctx, key).Bytes()
	if errors.Is(err, goredis.Nil) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, cause(err)
	}
	return v, true, nil
}

func (s *store) GetMany(ctx context.Context, keys []string) ([][]byte, error) {
	vals := make([][]byte, 0, len(keys))
	for len(keys) > 0 {
		n := min(len(keys), mgetBatch)
		res, err := s.cli.MGet(ctx, keys[:n]...).Result()
		if err != nil {
			return nil, cause(err)
		}
		for _, r := range res {
			switch v := r.(type) {
			case string:
				vals = append(vals, []byte(v))
			default:
				vals = append(vals, nil)
			}
		}
		keys = keys[n:]
	}
	return vals, nil
}

func (s *store) Put(ctx context.Context, key string, val []byte, ttl time.Duration) error {
	return cause(s.cli.Set(ctx, key, val, ttl).Err())
}

func (s *store) Refresh(ctx context.Context, key string, val []byte, ttl time.Duration) error {
	v, err := refreshScript.Run(ctx, s.cli, []string{key}, val, ttl.Milliseconds()).Result()
	switch {
	case errors.Is(err, goredis.Nil):
		return nil
	case err != nil:
		return cause(err)
	}
	held, _ := v.(string)
	return fmt.Errorf("%w: %s holds %q", directory.ErrNameTaken, key, strings.TrimSpace(held))
}

func (s *store) Delete(ctx context.Context, key string, val []byte) error {
	return cause(deleteScript.Run(ctx, s.cli, []string{key}, val).Err())
}

func (s *store) Close() error { return s.cli.Close() }
