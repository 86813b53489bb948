// Package metaserver is an HTTP metadata server speaking Mooncake's protocol (GET, PUT and
// DELETE of <path>?key=<key>, 200 meaning success), the server of `twosided
// metadata-server`: a small cluster's Mooncake nodes and twosided engines find each other
// through it without etcd or Redis.
//
// It behaves as Mooncake's Go example http-metadata-server: a PUT stores the body as the
// key's value, replacing what it held; a GET answers the value (application/json) or 404
// "metadata not found"; a DELETE answers 200 whether the key was there or not. Beyond it:
//
//   - An optional TTL per entry: a PUT with the header X-Twosided-Ttl (or the query
//     parameter ttl) of N seconds keeps the entry N seconds unless it is put again; the
//     twosided HTTP backend sends it with each refresh, so the entry of an engine killed
//     with -9 goes within its TTL. Mooncake's clients send none: their entries stay until
//     deleted, as on Mooncake's servers.
//   - Bounds: the number of keys, the bytes of one value and of all; a PUT past them is
//     refused (413, 507) and nothing is evicted.
//   - GET /health answers 200 "OK", as Mooncake Store's master does.
//
// Status: API of the binary's subcommand; the package is importable for tests.
package metaserver

import (
	"errors"
	"fmt"
	"time"
)

// Limits of a Store. The zero value takes every default.
type Limits struct {
	MaxKeys  int           // default 65536
	MaxValue int           // bytes of one value; default 4 MiB (a Mooncake segment's descriptor can be large)
	MaxBytes int64         // bytes of all keys and values; default 256 MiB
	MaxTTL   time.Duration // default 1 h
}

// Defaults.
const (
	DefaultMaxKeys  = 1 << 16
	DefaultMaxValue = 4 << 20
	DefaultMaxBytes = 256 << 20
	DefaultMaxTTL   = time.Hour
	MaxKeyLen       = 4 << 10 // bytes of a key
)

// WithDefaults fills zero fields and checks the others.
func (l Limits) WithDefaults() (Limits, error) {
	if l.MaxKeys == 0 {
		l.MaxKeys = DefaultMaxKeys
	}
	if l.MaxValue == 0 {
		l.MaxValue = DefaultMaxValue
	}
	if l.MaxBytes == 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if l.MaxTTL == 0 {
		l.MaxTTL = DefaultMaxTTL
	}
	switch {
	case l.MaxKeys < 1:
		return l, fmt.Errorf("max keys: %d: want at least 1", l.MaxKeys)
	case l.MaxValue < 1:
		return l, fmt.Errorf("max value: %d: want at least 1", l.MaxValue)
	case l.MaxBytes < int64(l.MaxValue):
		return l, fmt.Errorf("max bytes: %d: want at least the max value (%d)", l.MaxBytes, l.MaxValue)
	case l.MaxTTL < time.Second:
		return l, fmt.Errorf("max ttl: %v: want at least 1s", l.MaxTTL)
	}
	return l, nil
}

// Errors of Put.
var (
	ErrTooLarge = errors.New("metaserver: value too large")
	ErrFull     = errors.New("metaserver: store full")
	ErrBadKey   = errors.New("metaserver: bad key")
)

type item struct {
	val     []byte
	expires time.Time // zero: never
}

// Store is the server's pure state: keys, values and expiry times, with time as an input.
// It is not safe for concurrent use (the Server locks it).
type Store struct {
	lim   Limits
	m     map[string]item
	bytes int64
}

// NewStore returns an empty store; lim has its defaults (WithDefaults).
func NewStore(lim Limits) *Store { return &Store{lim: lim, m: make(map[string]item)} }

func (s *Store) live(key string, now time.Time) (item, bool) {
	it, ok := s.m[key]
	if ok && !it.expires.IsZero() && !now.Before(it.expires) {
		s.drop(key, it)
		return item{}, false
	}
	return it, ok
}

func (s *Store) drop(key string, it item) {
	delete(s.m, key)
	s.bytes -= int64(len(key) + len(it.val))
}

// Get returns key's value if it is there and not expired at now.
func (s *Store) Get(key string, now time.Time) ([]byte, bool) {
	it, ok := s.live(key, now)
	return it.val, ok
}

// Put stores val at key, expiring ttl after now (0: never), within the limits.
func (s *Store) Put(key string, val []byte, ttl time.Duration, now time.Time) error {
	switch {
	case key == "" || len(key) > MaxKeyLen:
		return fmt.Errorf("%w: %d bytes (1..%d)", ErrBadKey, len(key), MaxKeyLen)
	case len(val) > s.lim.MaxValue:
		return fmt.Errorf("%w: %d bytes, the maximum is %d", ErrTooLarge, len(val), s.lim.MaxValue)
	case ttl < 0 || ttl > s.lim.MaxTTL:
		return fmt.Errorf("%w: ttl %v out of range 0..%v", ErrBadKey, ttl, s.lim.MaxTTL)
	}
	old, had := s.live(key, now)
	size := s.bytes + int64(len(key)+len(val))
	if had {
		size -= int64(len(key) + len(old.val))
	}
	if !had && len(s.m) >= s.lim.MaxKeys {
		s.Sweep(now)
		if len(s.m) >= s.lim.MaxKeys {
			return fmt.Errorf("%w: %d keys, the maximum", ErrFull, len(s.m))
		}
	}
	if size > s.lim.MaxBytes {
		return fmt.Errorf("%w: %d bytes held, the maximum is %d", ErrFull, s.bytes, s.lim.MaxBytes)
	}
	it := item{val: append([]byte(nil), val...)}
	if ttl > 0 {
		it.expires = now.Add(ttl)
	}
	s.m[key] = it
	s.bytes = size
	return nil
}

// Delete removes key; it reports whether the key was there.
func (s *Store) Delete(key string, now time.Time) bool {
	it, ok := s.live(key, now)
	if ok {
		s.drop(key, it)
	}
	return ok
}

// Sweep drops the entries expired at now and returns how many.
func (s *Store) Sweep(now time.Time) int {
	n := 0
	for k, it := range s.m {
		if !it.expires.IsZero() && !now.Before(it.expires) {
			s.drop(k, it)
			n++
		}
	}
	return n
}

// Len and Bytes are the keys held and their bytes (keys and values).
func (s *Store) Len() int     { return len(s.m) }
func (s *Store) Bytes() int64 { return s.bytes }
