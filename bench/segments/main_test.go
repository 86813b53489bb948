package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/internal/tracepoint"
)

// writeStamps writes a dump as a tracepoints build does.
func writeStamps(t *testing.T, path string, st []stamp) {
	t.Helper()
	var b strings.Builder
	for _, s := range st {
		fmt.Fprintf(&b, "%d %d %d\n", s.t, s.p, s.arg)
	}
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o644))
}

// The table holds each pair's count and median, leaves out the rare pairs, and pairs each
// write with the other process's next wake-up.
func TestSegments(t *testing.T) {
	dir := t.TempDir()
	var parent, child []stamp
	for i := int64(0); i < 10; i++ {
		base := i * 100_000
		parent = append(parent,
			stamp{base, tracepoint.Submit, i},
			stamp{base + 1_000, tracepoint.WriteStart, 64},
			stamp{base + 11_000, tracepoint.WriteEnd, 64})
		child = append(child,
			stamp{base + 15_000 + i, tracepoint.LoopWoke, 1}, // 14 µs after the write's start
			stamp{base + 15_500 + i, tracepoint.ReadStart, 0})
	}
	child = append(child, stamp{2_000_000, tracepoint.Flush, 0}) // one rare pair
	writeStamps(t, filepath.Join(dir, "parent.1"), parent)
	writeStamps(t, filepath.Join(dir, "child.2"), child)
	var out bytes.Buffer
	require.NoError(t, run(&out, dir, 0.2))
	s := out.String()
	require.Regexp(t, `submit +→ write> +10 +1\.00`, s)
	require.Regexp(t, `write> +→ write< +10 +10\.00`, s)
	require.Regexp(t, `loop-woke +→ read> +10 +0\.50`, s)
	require.NotContains(t, s, "flush", "a pair seen once of ten is left out")
	require.Regexp(t, `parent sends → child woke +10 +14\.0`, s)
	require.Contains(t, s, "child sends → parent woke: none")
}

// A directory without both processes' files, or a malformed line, is an error that says so.
func TestSegmentsBadInput(t *testing.T) {
	dir := t.TempDir()
	require.ErrorContains(t, run(&bytes.Buffer{}, dir, 0.2), "want one parent.PID file, found 0")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "parent.1"), []byte("1 2\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "child.2"), nil, 0o644))
	require.ErrorContains(t, run(&bytes.Buffer{}, dir, 0.2), "parent.1:1: want 3 fields, got 2")
}
