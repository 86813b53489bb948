//go:build tracepoints

package tracepoint

import (
	"bufio"
	"io"
	"strconv"
	"sync/atomic"
	_ "unsafe" // runtime.nanotime
)

// Enabled reports whether this build records stamps.
const Enabled = true

//go:linkname nanotime runtime.nanotime
func nanotime() int64

type stamp struct {
	t   int64
	p   Point
	arg int32
}

// capacity bounds the buffer: 4 Mi stamps (64 MiB); later ones are dropped.
const capacity = 4 << 20

var (
	buf  = make([]stamp, capacity)
	next atomic.Int64
)

// init touches every page of the buffer, so that no stamp pays a page fault (a few µs on
// a VM) in the middle of the path it measures.
func init() {
	for i := 0; i < capacity; i += 256 {
		buf[i].arg = 1
	}
}

// Mark records p with arg at the current CLOCK_MONOTONIC time.
func Mark(p Point, arg int) {
	i := next.Add(1) - 1
	if i < capacity {
		buf[i] = stamp{t: nanotime(), p: p, arg: int32(arg)}
	}
}

// Dump writes every stamp recorded so far, one "ns point arg" line each, in the order
// they were taken. Call it once the marking has stopped (a Mark running meanwhile may be
// missed, or its slot read half-written).
func Dump(w io.Writer) error {
	bw := bufio.NewWriterSize(w, 1<<20)
	n := min(next.Load(), capacity)
	var line []byte
	for _, s := range buf[:n] {
		line = strconv.AppendInt(line[:0], s.t, 10)
		line = append(line, ' ')
		line = strconv.AppendUint(line, uint64(s.p), 10)
		line = append(line, ' ')
		line = strconv.AppendInt(line, int64(s.arg), 10)
		line = append(line, '\n')
		if _, err := bw.Write(line); err != nil {
			return err
		}
	}
	return bw.Flush()
}
