package reactor

import (
	"bytes"
	"runtime"
	"strconv"
	"sync"
	"testing"

	"github.com/petermattis/goid"
	"github.com/stretchr/testify/require"
)

// stackGoid is the goroutine id as the runtime prints it ("goroutine N [...").
func stackGoid(t *testing.T) int64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	i := bytes.IndexByte(b, ' ')
	require.Positive(t, i)
	id, err := strconv.ParseInt(string(b[:i]), 10, 64)
	require.NoError(t, err)
	return id
}

// The turn's identity (InLoop) compares goroutine ids read from the runtime's goroutine
// record by github.com/petermattis/goid, which knows that record's layout per Go release.
// A Go release that moves the field fails here, before InLoop answers wrong.
func TestGoroutineIDIsTheRuntimes(t *testing.T) {
	var wg sync.WaitGroup
	ids := make([]int64, 8)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			require.Equal(t, stackGoid(t), goid.Get())
			ids[i] = goid.Get()
		}()
	}
	wg.Wait()
	require.Equal(t, stackGoid(t), goid.Get())
	seen := map[int64]bool{}
	for _, id := range ids {
		require.False(t, seen[id], "two goroutines with one id")
		seen[id] = true
	}
}
