package tracepoint

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Every point has a name of its own (the segment table's labels), and a number past the
// list prints as one.
func TestPointNames(t *testing.T) {
	seen := map[string]Point{}
	for p := Point(1); p < numPoints; p++ {
		s := p.String()
		require.NotEmpty(t, s, "point %d", p)
		q, dup := seen[s]
		require.False(t, dup, "points %d and %d are both %q", q, p, s)
		seen[s] = p
	}
	require.Equal(t, "point-200", Point(200).String())
}

// In a build without the tag, marking records nothing and a dump is empty.
func TestOffBuildRecordsNothing(t *testing.T) {
	if Enabled {
		t.Skip("a tracepoints build")
	}
	Mark(ReadStart, 1)
	var b []byte
	w := writerFunc(func(p []byte) (int, error) { b = append(b, p...); return len(p), nil })
	require.NoError(t, Dump(w))
	require.Empty(t, b)
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
