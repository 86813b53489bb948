package kvdir

import (
	"errors"
	"fmt"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCacheFetchInsertsPollUpdates(t *testing.T) {
	c := NewCache(2, 0, 10)
	_, ok := c.Lookup("a")
	require.False(t, ok)
	require.False(t, c.Store("a", Result{Addr: "h:1"}, 1, false), "a poll does not insert")
	require.True(t, c.Store("a", Result{Addr: "h:1"}, 2, true))
	r, ok := c.Lookup("a")
	require.True(t, ok)
	require.Equal(t, "h:1", r.Addr)
	// An older read's answer loses to a newer one, a newer poll's wins.
	require.False(t, c.Store("a", Result{Addr: "h:0"}, 1, false))
	require.True(t, c.Store("a", Result{Addr: "h:2"}, 3, false))
	r, _ = c.Lookup("a")
	require.Equal(t, "h:2", r.Addr)
	// Absence is cached as the error.
	gone := errors.New("gone")
	require.True(t, c.Store("a", Result{Err: gone}, 4, false))
	r, _ = c.Lookup("a")
	require.ErrorIs(t, r.Err, gone)
}

func TestCacheBound(t *testing.T) {
	c := NewCache(3, 0, 100)
	for i := range 10 {
		require.True(t, c.Store(fmt.Sprint(i), Result{Addr: "h:1"}, uint64(i+1), true))
		require.LessOrEqual(t, c.Len(), 3)
	}
	require.Equal(t, 3, c.Len())
	_, ok := c.Lookup("9")
	require.True(t, ok, "the newest name is kept")
	c.Clear()
	require.Zero(t, c.Len())
}

func TestCacheDue(t *testing.T) {
	c := NewCache(100, 2, 5)
	for i := range 10 {
		c.Store(fmt.Sprint(i), Result{}, 1, true)
	}
	// Nothing used: the sweep only.
	require.Len(t, c.Due(), 2)
	// Three used: those three and two swept.
	for _, n := range []string{"1", "4", "7"} {
		c.Lookup(n)
	}
	due := c.Due()
	require.Len(t, due, 5)
	for _, n := range []string{"1", "4", "7"} {
		require.Contains(t, due, n)
	}
	// Their marks were cleared.
	require.Len(t, c.Due(), 2)
	// More used names than a round holds: the rest stay marked for the next round.
	for i := range 8 {
		c.Lookup(fmt.Sprint(i))
	}
	first := c.Due()
	require.Len(t, first, 5)
	second := c.Due()
	seen := map[string]bool{}
	for _, n := range append(first, second...) {
		seen[n] = true
	}
	for i := range 8 {
		require.True(t, seen[fmt.Sprint(i)], "used name %d read in one of two rounds", i)
	}
	sort.Strings(second)
	require.LessOrEqual(t, len(second), 5)
}
