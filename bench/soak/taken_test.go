package soak

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestTakenCounts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent0.1")
	require.NoError(t, newTakenFile(path, 2))
	tf, err := openTaken(path, 2)
	require.NoError(t, err)
	tf.begin(0, 3)
	tf.begin(1, 1)
	for range 5 {
		tf.put(0, 3)
	}
	tf.put(0, 2) // an earlier incarnation's late delivery: not this one's
	tf.put(1, 1)
	tf.begin(1, 2) // reopened: its count starts over
	tf.put(1, 2)
	tf.put(1, 2)
	incs, counts, err := readTaken(path, 2)
	require.NoError(t, err)
	require.Equal(t, []int{3, 2}, incs)
	require.Equal(t, []uint64{5, 2}, counts)

	_, _, err = readTaken(path, 3)
	require.ErrorContains(t, err, "want 48")
	_, err = openTaken(path, 3)
	require.ErrorContains(t, err, "32 bytes, want 48")
	require.NotContains(t, err.Error(), "nil")
}
