package reactor

// Slab copies received messages (out of a RECV ring, or a socket's read buffer) into the
// application's hands without an allocation per message: small messages are carved, one
// after another, from a shared chunk, each with its capacity clipped to its length (an
// append by the application reallocates instead of writing into its neighbour). A chunk is garbage once
// no message cut from it is referenced, so a retained small message keeps at most one
// chunk (slabChunk bytes) alive; a message above slabMax gets an allocation of its own.
// Loop-only (one per ctrl channel, one per OOB node); the zero value is ready.
type Slab struct {
	buf []byte // the current chunk's unused tail
}

const (
	slabChunk = 16 << 10
	slabMax   = 1 << 10
)

// Copy returns a copy of b that the caller owns (nil for an empty b).
func (s *Slab) Copy(b []byte) []byte {
	n := len(b)
	switch {
	case n == 0:
		return nil
	case n > slabMax:
		return append([]byte(nil), b...)
	case n > len(s.buf):
		s.buf = make([]byte, slabChunk)
	}
	out := s.buf[:n:n]
	copy(out, b)
	s.buf = s.buf[n:]
	return out
}
