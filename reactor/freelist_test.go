package reactor

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFreeList(t *testing.T) {
	f := FreeList[int]{Max: 2}
	require.Nil(t, f.Get())
	a, b, c := new(int), new(int), new(int)
	require.True(t, f.Put(a))
	require.True(t, f.Put(b))
	require.False(t, f.Put(c), "over Max: not kept")
	require.Equal(t, 2, f.Len())
	require.Same(t, b, f.Get(), "last in, first out")
	require.Same(t, a, f.Get())
	require.Nil(t, f.Get())
	var zero FreeList[int]
	require.False(t, zero.Put(a), "the zero value keeps nothing")
	require.Equal(t, 0.0, testing.AllocsPerRun(100, func() {
		f.Put(a)
		_ = f.Get()
	}))
}
