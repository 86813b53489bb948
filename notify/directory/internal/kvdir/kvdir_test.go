package kvdir

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/twosided/twosided/notify/directory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeStore is a map behind a gate: Get waits for gate when it is set.
type fakeStore struct {
	mu   sync.Mutex
	m    map[string][]byte
	err  error
	gets atomic.Int32
	gate chan struct{}
}

func (f *fakeStore) Get(ctx context.Context, key string) ([]byte, bool, error) {
	f.gets.Add(1)
	if f.gate != nil {
		select {
		case <-f.gate:
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, false, f.err
	}
	v, ok := f.m[key]
	return v, ok, nil
}

func (f *fakeStore) GetMany(ctx context.Context, keys []string) ([][]byte, error) {
	out := make([][]byte, len(keys))
	for i, k := range keys {
		v, ok, err := f.Get(ctx, k)
		if err != nil {
			return nil, err
		}
		if ok {
			out[i] = v
		}
	}
	return out, nil
}

func (f *fakeStore) Put(_ context.Context, key string, val []byte, _ time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	f.m[key] = val
	return nil
}

func (f *fakeStore) Refresh(ctx context.Context, key string, val []byte, ttl time.Duration) error {
	f.mu.Lock()
	held, ok := f.m[key]
	f.mu.Unlock()
	if ok && string(held) != string(val) {
		return directory.ErrNameTaken
	}
	return f.Put(ctx, key, val, ttl)
}

func (f *fakeStore) Delete(_ context.Context, key string, val []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if string(f.m[key]) == string(val) {
		delete(f.m, key)
	}
	return nil
}

func (f *fakeStore) Close() error { return nil }

func newDir(t testing.TB, st Store) *Dir {
	cfg, err := directory.Config{Poll: time.Hour, TTL: 3 * time.Second}.WithDefaults()
	require.NoError(t, err)
	d := New(st, cfg, Options{Conn: "fake://x", Refresh: time.Second, Sweep: 1, Round: 10, Expires: "never"})
	t.Cleanup(func() { _ = d.Close(context.Background()) })
	return d
}

// Concurrent resolves of one name share one read; the answer is cached, a hit reads nothing.
func TestResolveSharesOneRead(t *testing.T) {
	st := &fakeStore{m: map[string][]byte{"mooncake/rpc_meta/a": directory.Encode(directory.Entry{Host: "h", Port: 1})}, gate: make(chan struct{})}
	d := newDir(t, st)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	addrs := make([]string, 8)
	for i := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			addrs[i], _ = d.Resolve(ctx, "a")
		}()
	}
	for st.gets.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	close(st.gate)
	wg.Wait()
	for _, a := range addrs {
		require.Equal(t, "h:1", a)
	}
	require.Equal(t, int32(1), st.gets.Load())
	a, err := d.Cached("a")
	require.NoError(t, err)
	require.Equal(t, "h:1", a)
	_, err = d.Resolve(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, int32(1), st.gets.Load())
}

// After a failed read, resolves of uncached names fail at once, naming the key and the last
// cause; cached names still resolve.
func TestDownFailsAtOnce(t *testing.T) {
	st := &fakeStore{m: map[string][]byte{"mooncake/rpc_meta/a": directory.Encode(directory.Entry{Host: "h", Port: 1})}}
	d := newDir(t, st)
	ctx := context.Background()
	_, err := d.Resolve(ctx, "a")
	require.NoError(t, err)
	st.mu.Lock()
	st.err = errors.New("connection refused")
	st.mu.Unlock()
	_, err = d.Resolve(ctx, "b")
	require.ErrorIs(t, err, directory.ErrUnavailable)
	require.ErrorContains(t, err, "fake://x")
	require.ErrorContains(t, err, "mooncake/rpc_meta/b")
	require.ErrorContains(t, err, "connection refused")
	st.gate = make(chan struct{}) // a read now would wait: the next resolve must not
	_, err = d.Resolve(ctx, "c")
	require.ErrorIs(t, err, directory.ErrUnavailable)
	require.ErrorContains(t, err, "the last read failed")
	require.ErrorContains(t, err, "mooncake/rpc_meta/c")
	a, err := d.Resolve(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, "h:1", a)
	close(st.gate)
}

// A registration failing its put is not kept; one whose key another process took stops
// its keeper, and Unregister leaves the other value.
func TestRegistrationTaken(t *testing.T) {
	st := &fakeStore{m: map[string][]byte{}}
	d := newDir(t, st)
	ctx := context.Background()
	st.err = errors.New("refused")
	err := d.Register(ctx, "n", directory.Entry{Host: "h", Port: 1})
	require.ErrorIs(t, err, directory.ErrUnavailable)
	require.ErrorContains(t, err, "put mooncake/rpc_meta/n")
	require.False(t, d.Registered("n"))
	st.mu.Lock()
	st.err = nil
	st.mu.Unlock()
	require.NoError(t, d.Register(ctx, "n", directory.Entry{Host: "h", Port: 1}))
	require.ErrorIs(t, d.Register(ctx, "n", directory.Entry{Host: "h", Port: 1}), directory.ErrBadName)
	st.mu.Lock()
	st.m["mooncake/rpc_meta/n"] = []byte("other")
	st.mu.Unlock()
	deadline := time.Now().Add(60 * time.Second)
	for d.Registered("n") {
		require.True(t, time.Now().Before(deadline), "keeper did not stop")
		time.Sleep(5 * time.Millisecond)
	}
	require.NoError(t, d.Unregister(ctx, "n"))
	require.Equal(t, "other", string(st.m["mooncake/rpc_meta/n"]))
}

// BenchmarkCached is the cost of a cache hit (SendNotify's and SendNotifyAsync's lookup of
// a server name already resolved), the same for the Redis and HTTP backends.
func BenchmarkCached(b *testing.B) {
	st := &fakeStore{m: map[string][]byte{"mooncake/rpc_meta/a": directory.Encode(directory.Entry{Host: "h", Port: 1})}}
	d := newDir(b, st)
	if _, err := d.Resolve(context.Background(), "a"); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := d.Cached("a"); err != nil {
			b.Fatal(err)
		}
	}
}
