package metaserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// TTLHeader and TTLParam carry a PUT's TTL in whole seconds (the twosided HTTP backend
// sends the header).
const (
	TTLHeader = "X-Twosided-Ttl"
	TTLParam  = "ttl"
)

// DefaultPath is the path Mooncake's servers serve.
const DefaultPath = "/metadata"

const jsonType = "application/json; charset=utf-8"

// Server is the HTTP handler over a Store.
type Server struct {
	path string
	lim  Limits
	now  func() time.Time
	mu   sync.Mutex
	st   *Store
}

// New returns a server of path (DefaultPath if empty) with lim (defaults filled) and now
// as its clock (time.Now if nil).
func New(path string, lim Limits, now func() time.Time) (*Server, error) {
	if path == "" {
		path = DefaultPath
	}
	if !strings.HasPrefix(path, "/") {
		return nil, fmt.Errorf("path %q: want a path starting with /", path)
	}
	lim, err := lim.WithDefaults()
	if err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	return &Server{path: path, lim: lim, now: now, st: NewStore(lim)}, nil
}

// ParseTTL reads a TTL of whole seconds, 0 (none) up to max.
func ParseTTL(s string, max time.Duration) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > int64(max/time.Second) {
		return 0, fmt.Errorf("ttl %q: want whole seconds in 0..%d", s, int64(max/time.Second))
	}
	return time.Duration(n) * time.Second, nil
}

func reply(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", jsonType)
	w.WriteHeader(status)
	_, _ = io.WriteString(w, body)
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/health" && r.Method == http.MethodGet {
		reply(w, http.StatusOK, "OK")
		return
	}
	if r.URL.Path != s.path {
		reply(w, http.StatusNotFound, "404 page not found")
		return
	}
	q := r.URL.Query()
	key := q.Get("key")
	if key == "" {
		reply(w, http.StatusBadRequest, "metadata key is required")
		return
	}
	switch r.Method {
	case http.MethodGet:
		s.mu.Lock()
		v, ok := s.st.Get(key, s.now())
		s.mu.Unlock()
		if !ok {
			reply(w, http.StatusNotFound, "metadata not found")
			return
		}
		w.Header().Set("Content-Type", jsonType)
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(v)
	case http.MethodPut:
		ttlText := r.Header.Get(TTLHeader)
		if ttlText == "" {
			ttlText = q.Get(TTLParam)
		}
		ttl, err := ParseTTL(ttlText, s.lim.MaxTTL)
		if err != nil {
			reply(w, http.StatusBadRequest, err.Error())
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, int64(s.lim.MaxValue)+1))
		if err != nil {
			reply(w, http.StatusBadRequest, "invalid request")
			return
		}
		if len(body) > s.lim.MaxValue {
			reply(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("value over %d bytes", s.lim.MaxValue))
			return
		}
		s.mu.Lock()
		err = s.st.Put(key, body, ttl, s.now())
		s.mu.Unlock()
		switch {
		case errors.Is(err, ErrFull):
			reply(w, http.StatusInsufficientStorage, err.Error())
		case err != nil:
			reply(w, http.StatusBadRequest, err.Error())
		default:
			reply(w, http.StatusOK, "metadata updated")
		}
	case http.MethodDelete:
		s.mu.Lock()
		s.st.Delete(key, s.now())
		s.mu.Unlock()
		reply(w, http.StatusOK, "metadata deleted")
	default:
		w.Header().Set("Allow", "GET, PUT, DELETE")
		reply(w, http.StatusMethodNotAllowed, "method not allowed")
	}
}

// Sweep drops the expired entries and returns how many.
func (s *Server) Sweep() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st.Sweep(s.now())
}

// Stats are the keys held and their bytes.
func (s *Server) Stats() (keys int, bytes int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st.Len(), s.st.Bytes()
}

// Serve serves on ln until ctx ends, sweeping expired entries every second; it returns
// nil once stopped by ctx.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	hs := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		WriteTimeout:      time.Minute,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_ = hs.Shutdown(sctx)
				cancel()
				_ = hs.Close()
				return
			case <-t.C:
				s.Sweep()
			}
		}
	}()
	err := hs.Serve(ln)
	close(done)
	wg.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
