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

// stackGoid is the goroutine id as the runtime prints it ("goroutine N [..."); -1 when the
// line does not read so.
func stackGoid() int64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	i := bytes.IndexByte(b, ' ')
	if i <= 0 {
		return -1
	}
	id, err := strconv.ParseInt(string(b[:i]), 10, 64)
	if err != nil {
		return -1
	}
	return id
}

// The turn's identity (InLoop) compares goroutine ids read from the runtime's goroutine
// record by github.com/petermattis/goid, which knows that record's layout per Go release.
// A Go release that moves the field fails here, before InLoop answers wrong.
func TestGoroutineIDIsTheRuntimes(t *testing.T) {
	var wg sync.WaitGroup
	ids, fromStack := make([]int64, 8), make([]int64, 8)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fromStack[i], ids[i] = stackGoid(), goid.Get()
		}()
	}
	wg.Wait()
	require.Equal(t, fromStack, ids)
	require.Equal(t, stackGoid(), goid.Get())
	seen := map[int64]bool{}
	for _, id := range ids {
		require.False(t, seen[id], "two goroutines with one id")
		seen[id] = true
	}
}
