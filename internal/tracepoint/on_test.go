//go:build tracepoints

package tracepoint

import (
	"bytes"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Stamps come out in the order they were taken, with their points and arguments, on a
// clock that does not go back.
func TestMarkDump(t *testing.T) {
	from := next.Load()
	Mark(ReadStart, 0)
	Mark(ReadEnd, 253)
	Mark(WriteEnd, -1)
	var b bytes.Buffer
	require.NoError(t, Dump(&b))
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")[from:]
	require.Len(t, lines, 3)
	var last int64
	for i, want := range []string{" 3 0", " 4 253", " 10 -1"} {
		require.True(t, strings.HasSuffix(lines[i], want), "line %d: %q, want the suffix %q", i, lines[i], want)
		ts, err := strconv.ParseInt(strings.Fields(lines[i])[0], 10, 64)
		require.NoError(t, err)
		require.GreaterOrEqual(t, ts, last)
		last = ts
	}
}
