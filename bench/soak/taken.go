package soak

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A killed agent takes with it the delivery events still in its output buffers: to the
// checker they look like notifies its engines lost. So that a kill's losses can be held to
// the contract's bound (what the engine held: its receive queue, and per channel one RECV
// ring), each agent counts the delivery events it puts on their way to the parent in a file
// the parent made and the agent maps shared. The count survives kill -9; the parent reads
// it once the process is reaped and tells the checker (KindTaken), which then knows how many
// deliveries of the killed engine it never read.
//
// Layout: per engine of the agent's spec, in spec order, two native-endian uint64 words:
// the incarnation counted, then its count.

const takenWords = 2

// takenFile is an agent's side of the counts.
type takenFile struct {
	mem []byte
}

// openTaken maps the parent's file at path for n engines.
func openTaken(path string, n int) (*takenFile, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("taken counts: %w", err)
	}
	defer f.Close()
	size := n * takenWords * 8
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("taken counts: %w", err)
	}
	if st.Size() != int64(size) {
		return nil, fmt.Errorf("taken counts: %s: %d bytes, want %d", path, st.Size(), size)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("taken counts: mmap %s: %w", path, err)
	}
	return &takenFile{mem: mem}, nil
}

func (t *takenFile) word(i int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&t.mem[i*8])) // mmap memory is page-aligned
}

// begin starts counting incarnation inc of engine i (its count first, so that a count read
// with the incarnation is never an earlier one's).
func (t *takenFile) begin(i, inc int) {
	t.word(i*takenWords + 1).Store(0)
	t.word(i * takenWords).Store(uint64(inc))
}

// put counts one delivery event of incarnation inc of engine i, before it is queued.
func (t *takenFile) put(i, inc int) {
	if t.word(i*takenWords).Load() == uint64(inc) {
		t.word(i*takenWords + 1).Add(1)
	}
}

// newTakenFile makes the parent's file for an agent of n engines.
func newTakenFile(path string, n int) error {
	return os.WriteFile(path, make([]byte, n*takenWords*8), 0o600)
}

// readTaken reads the parent's file: per engine, in spec order, the incarnation counted
// (0: none) and its count.
func readTaken(path string, n int) (incs []int, counts []uint64, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	if len(b) != n*takenWords*8 {
		return nil, nil, fmt.Errorf("taken counts: %s: %d bytes, want %d", path, len(b), n*takenWords*8)
	}
	const stride = takenWords * 8
	for i := range n {
		incs = append(incs, int(binary.NativeEndian.Uint64(b[i*stride:])))
		counts = append(counts, binary.NativeEndian.Uint64(b[i*stride+8:]))
	}
	return incs, counts, nil
}
