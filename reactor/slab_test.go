package reactor

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSlabCopies(t *testing.T) {
	var s Slab
	require.Nil(t, s.Copy(nil))
	a := s.Copy([]byte("first"))
	b := s.Copy([]byte("second"))
	require.Equal(t, "first", string(a))
	require.Equal(t, "second", string(b))
	require.Equal(t, len(a), cap(a), "capacity clipped to the message")
	// An append by the application reallocates: the neighbour is untouched.
	a = append(a, "-grown"...)
	require.Equal(t, "first-grown", string(a))
	require.Equal(t, "second", string(b))
	// The copy does not alias its source (the RECV buffer, reposted after delivery).
	src := []byte("ring")
	c := s.Copy(src)
	src[0] = 'X'
	require.Equal(t, "ring", string(c))

	big := bytes.Repeat([]byte{7}, slabMax+1)
	d := s.Copy(big)
	require.Equal(t, big, d)
	// A chunk too short for the next message is replaced, never overrun.
	for i := 0; i < 3*slabChunk/slabMax; i++ {
		m := bytes.Repeat([]byte{byte(i)}, slabMax)
		require.Equal(t, m, s.Copy(m))
	}
}

// TestSlabAllocs: a 64 B message costs one allocation per slabChunk/64 messages.
func TestSlabAllocs(t *testing.T) {
	var s Slab
	msg := make([]byte, 64)
	allocs := testing.AllocsPerRun(10000, func() { _ = s.Copy(msg) })
	require.LessOrEqual(t, allocs, 64.0/slabChunk+0.001)
	big := make([]byte, slabMax+1)
	require.Equal(t, 1.0, testing.AllocsPerRun(100, func() { _ = s.Copy(big) }))
}
