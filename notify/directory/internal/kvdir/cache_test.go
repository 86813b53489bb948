package kvdir

import (
	"errors"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var t0 = time.Unix(1000, 0)

func TestCacheFetchInsertsPollUpdates(t *testing.T) {
	c := NewCache(2, 0, 10, 0)
	_, ok := c.Lookup("a")
	require.False(t, ok)
	require.False(t, c.Store("a", Result{Addr: "h:1"}, 1, false, t0), "a poll does not insert")
	require.True(t, c.Store("a", Result{Addr: "h:1"}, 2, true, t0))
	r, ok := c.Lookup("a")
	require.True(t, ok)
	require.Equal(t, "h:1", r.Addr)
	// An older read's answer loses to a newer one, a newer poll's wins.
	require.False(t, c.Store("a", Result{Addr: "h:0"}, 1, false, t0))
	require.True(t, c.Store("a", Result{Addr: "h:2"}, 3, false, t0))
	r, _ = c.Lookup("a")
	require.Equal(t, "h:2", r.Addr)
	// Absence is cached as the error.
	gone := errors.New("gone")
	require.True(t, c.Store("a", Result{Err: gone}, 4, false, t0))
	r, _ = c.Lookup("a")
	require.ErrorIs(t, r.Err, gone)
}

func TestCacheBound(t *testing.T) {
	c := NewCache(3, 0, 100, 0)
	for i := range 10 {
		require.True(t, c.Store(fmt.Sprint(i), Result{Addr: "h:1"}, uint64(i+1), true, t0))
		require.LessOrEqual(t, c.Len(), 3)
	}
	require.Equal(t, 3, c.Len())
	_, ok := c.Lookup("9")
	require.True(t, ok, "the newest name is kept")
	c.Clear()
	require.Zero(t, c.Len())
}

func TestCacheDue(t *testing.T) {
	c := NewCache(100, 2, 5, 0)
	for i := range 10 {
		c.Store(fmt.Sprint(i), Result{}, 1, true, t0)
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

// A key found absent by polls keeps its address for the grace (a service restarted
// empty), then the absence wins; a fetch's absence and a found key act at once.
func TestCacheAbsentGrace(t *testing.T) {
	c := NewCache(10, 0, 10, 3*time.Second)
	absent := Result{Err: errors.New("not registered"), Absent: true}
	c.Store("a", Result{Addr: "h:1"}, 1, true, t0)
	require.False(t, c.Store("a", absent, 2, false, t0))
	require.False(t, c.Store("a", absent, 3, false, t0.Add(2*time.Second)))
	r, _ := c.Lookup("a")
	require.Equal(t, "h:1", r.Addr)
	// Back before the grace ran out: the clock starts again.
	require.True(t, c.Store("a", Result{Addr: "h:1"}, 4, false, t0.Add(2500*time.Millisecond)))
	require.False(t, c.Store("a", absent, 5, false, t0.Add(4*time.Second)))
	require.False(t, c.Store("a", absent, 6, false, t0.Add(6*time.Second)))
	require.True(t, c.Store("a", absent, 7, false, t0.Add(7*time.Second)))
	r, _ = c.Lookup("a")
	require.True(t, r.Absent)
	// An absent name stays absent until found; a fetch's answer applies at once.
	require.True(t, c.Store("a", Result{Addr: "h:2"}, 8, false, t0.Add(8*time.Second)))
	require.True(t, c.Store("a", absent, 9, true, t0.Add(8*time.Second)))
}
