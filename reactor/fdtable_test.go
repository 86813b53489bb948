package reactor

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFDTable(t *testing.T) {
	var tab fdTable
	require.Nil(t, tab.get(0))
	require.Nil(t, tab.get(-1))
	a, b, c := &fdEntry{gen: 1}, &fdEntry{gen: 2}, &fdEntry{gen: 3}
	tab.set(3, a)
	tab.set(1000, b) // grows past the doubling
	tab.set(70, c)
	require.Same(t, a, tab.get(3))
	require.Same(t, b, tab.get(1000))
	require.Same(t, c, tab.get(70))
	require.Nil(t, tab.get(4))
	require.Nil(t, tab.get(1001))
	require.Nil(t, tab.get(1<<40))
	tab.del(3)
	tab.del(5000) // never registered: nothing to do
	tab.del(-2)
	require.Nil(t, tab.get(3))
	require.Same(t, b, tab.get(1000))
}
