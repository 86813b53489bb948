package metaserver

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func do(s *Server, method, key string, body []byte, hdr map[string]string) *httptest.ResponseRecorder {
	// Built by hand: any method reaches the handler, as from a real connection.
	req := &http.Request{Method: method, URL: &url.URL{Path: "/metadata", RawQuery: "key=" + url.QueryEscape(key)},
		Header: http.Header{}, Body: io.NopCloser(bytes.NewReader(body))}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	s.ServeHTTP(w, req)
	return w
}

func TestMooncakeProtocol(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	s, err := New("", Limits{}, c.now)
	require.NoError(t, err)
	key := "mooncake/rpc_meta/decode-7"
	val := []byte("{\"ip_or_host_name\":\"10.0.0.7\",\"rpc_port\":12001}\n")
	w := do(s, http.MethodGet, key, nil, nil)
	require.Equal(t, 404, w.Code)
	require.Equal(t, "metadata not found", w.Body.String())
	w = do(s, http.MethodPut, key, val, nil)
	require.Equal(t, 200, w.Code)
	require.Equal(t, "metadata updated", w.Body.String())
	w = do(s, http.MethodGet, key, nil, nil)
	require.Equal(t, 200, w.Code)
	require.Equal(t, val, w.Body.Bytes())
	require.Contains(t, w.Header().Get("Content-Type"), "application/json")
	// A PUT replaces (as Mooncake's Go example does); without a TTL the entry stays.
	w = do(s, http.MethodPut, key, []byte("x"), nil)
	require.Equal(t, 200, w.Code)
	c.t = c.t.Add(100 * time.Hour)
	require.Equal(t, "x", do(s, http.MethodGet, key, nil, nil).Body.String())
	require.Equal(t, 200, do(s, http.MethodDelete, key, nil, nil).Code)
	require.Equal(t, 200, do(s, http.MethodDelete, key, nil, nil).Code, "DELETE of an absent key: 200, as the Go example")
	require.Equal(t, 404, do(s, http.MethodGet, key, nil, nil).Code)
	// No key, another method, another path.
	require.Equal(t, 400, do(s, http.MethodGet, "", nil, nil).Code)
	require.Equal(t, 405, do(s, http.MethodPost, key, nil, nil).Code)
	w = httptest.NewRecorder()
	s.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/other?key=a", nil))
	require.Equal(t, 404, w.Code)
	w = httptest.NewRecorder()
	s.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/health", nil))
	require.Equal(t, 200, w.Code)
}

func TestTTL(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	s, err := New("/m", Limits{}, c.now)
	require.NoError(t, err)
	put := func(key, ttlHdr, ttlQ string) int {
		u := "/m?key=" + key
		if ttlQ != "" {
			u += "&ttl=" + ttlQ
		}
		req := httptest.NewRequest(http.MethodPut, u, bytes.NewReader([]byte("v")))
		if ttlHdr != "" {
			req.Header.Set(TTLHeader, ttlHdr)
		}
		w := httptest.NewRecorder()
		s.ServeHTTP(w, req)
		return w.Code
	}
	get := func(key string) int {
		w := httptest.NewRecorder()
		s.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/m?key="+key, nil))
		return w.Code
	}
	require.Equal(t, 200, put("a", "10", ""))
	require.Equal(t, 200, put("b", "", "5"))
	require.Equal(t, 200, put("c", "", ""))
	c.t = c.t.Add(9 * time.Second)
	require.Equal(t, 200, put("a", "10", "")) // refreshed: 10 s from now
	require.Equal(t, 404, get("b"))
	c.t = c.t.Add(9 * time.Second)
	require.Equal(t, 200, get("a"))
	c.t = c.t.Add(time.Second)
	require.Equal(t, 404, get("a"))
	require.Equal(t, 200, get("c"))
	for _, bad := range []string{"x", "-1", "3601", "1.5"} {
		require.Equal(t, 400, put("d", bad, ""), bad)
	}
	require.Equal(t, 200, put("e", "1", ""))
	c.t = c.t.Add(time.Hour)
	require.Equal(t, 1, s.Sweep())
	keys, _ := s.Stats()
	require.Equal(t, 1, keys) // c
}

func TestBounds(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	s, err := New("", Limits{MaxKeys: 2, MaxValue: 8, MaxBytes: 40}, c.now)
	require.NoError(t, err)
	require.Equal(t, 413, do(s, http.MethodPut, "k", make([]byte, 9), nil).Code)
	require.Equal(t, 200, do(s, http.MethodPut, "k1", make([]byte, 8), nil).Code)
	require.Equal(t, 200, do(s, http.MethodPut, "k2", make([]byte, 8), map[string]string{TTLHeader: "1"}).Code)
	require.Equal(t, 507, do(s, http.MethodPut, "k3", make([]byte, 1), nil).Code)
	require.Equal(t, 200, do(s, http.MethodPut, "k1", make([]byte, 2), nil).Code, "a replacement needs no new key")
	c.t = c.t.Add(2 * time.Second) // k2 expired: its room is taken back
	require.Equal(t, 200, do(s, http.MethodPut, "k3", make([]byte, 8), nil).Code)
	_, err = New("x", Limits{}, nil)
	require.Error(t, err)
	st := NewStore(Limits{MaxKeys: 10, MaxValue: 10, MaxBytes: 12, MaxTTL: time.Hour})
	require.NoError(t, st.Put("a", make([]byte, 10), 0, c.t))
	require.ErrorIs(t, st.Put("b", []byte("xx"), 0, c.t), ErrFull)
	require.ErrorIs(t, st.Put("", nil, 0, c.t), ErrBadKey)
}

// FuzzHandler: any request leaves the store within its bounds, a 200 PUT is read back by a
// GET, and nothing panics.
func FuzzHandler(f *testing.F) {
	f.Add("PUT", "mooncake/rpc_meta/a", []byte(`{"ip_or_host_name":"h","rpc_port":1}`), "10", uint8(0))
	f.Add("GET", "k", []byte(nil), "", uint8(1))
	f.Add("DELETE", "k", []byte(nil), "x", uint8(2))
	f.Fuzz(func(t *testing.T, method, key string, body []byte, ttl string, step uint8) {
		c := &clock{t: time.Unix(1000, 0)}
		lim := Limits{MaxKeys: 4, MaxValue: 64, MaxBytes: 256, MaxTTL: time.Minute}
		s, err := New("", lim, c.now)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 6 {
			k := key
			if i%2 == 1 {
				k = key + string(rune('a'+i))
			}
			w := do(s, method, k, body, map[string]string{TTLHeader: ttl})
			if method == http.MethodPut && w.Code == 200 {
				g := do(s, http.MethodGet, k, nil, nil)
				if g.Code != 200 || !bytes.Equal(g.Body.Bytes(), body) {
					t.Fatalf("PUT %q then GET: %d %q", k, g.Code, g.Body.Bytes())
				}
			}
			c.t = c.t.Add(time.Duration(step) * time.Second)
			keys, n := s.Stats()
			if keys > lim.MaxKeys || n > lim.MaxBytes || n < 0 {
				t.Fatalf("bounds: %d keys, %d bytes", keys, n)
			}
		}
		if _, err := ParseTTL(ttl, time.Minute); err != nil && errors.Is(err, ErrFull) {
			t.Fatal(err)
		}
	})
}
