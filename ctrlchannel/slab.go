package ctrlchannel

// msgSlab copies received messages out of the RECV ring into the application's hands
// without an allocation per message: small messages are carved, one after another, from a
// shared chunk, each with its capacity clipped to its length (an append by the
// application reallocates instead of writing into its neighbour). A chunk is garbage once
// no message cut from it is referenced, so a retained small message keeps at most one
// chunk (slabChunk bytes) alive; a message above slabMax gets an allocation of its own.
// Loop-only (one per Channel).
type msgSlab struct {
	buf []byte // the current chunk's unused tail
}

const (
	slabChunk = 16 << 10
	slabMax   = 1 << 10
)

// copyOf returns a copy of b that the caller owns (nil for an empty b).
func (s *msgSlab) copyOf(b []byte) []byte {
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
