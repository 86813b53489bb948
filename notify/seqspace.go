package notify

// seqSpace is the send side of one sequence space (this engine towards one peer session).
// A seq is drawn only for a notify accepted for sending, and stays unresolved until it is
// acknowledged (delivered) or given up and its fence posted. At most size seqs are
// unresolved at a time, which is the receiver's window: a sender never makes its peer hold
// more than that. Pure.
type seqSpace struct {
	next uint64 // the next seq to draw
	low  uint64 // the lowest unresolved seq (== next when none)
	size uint64
	done []bool // ring over [low, low+size): resolved out of order

	fences []seqRange // given up, fence not yet posted; merged, bounded by size
}

type seqRange struct{ first, count uint64 }

func newSeqSpace(size int) *seqSpace {
	return &seqSpace{next: 1, low: 1, size: uint64(size)}
}

// full reports whether drawing another seq would exceed the window.
func (s *seqSpace) full() bool { return s.next-s.low >= s.size }

// draw returns the next seq; call only when !full().
func (s *seqSpace) draw() uint64 {
	seq := s.next
	s.next++
	return seq
}

// unresolved is how many seqs are drawn and not resolved.
func (s *seqSpace) unresolved() uint64 { return s.next - s.low }

// resolve marks seq acknowledged (or its fence posted). Resolving twice, or a seq not
// drawn, does nothing.
func (s *seqSpace) resolve(seq uint64) {
	if seq < s.low || seq >= s.next {
		return
	}
	if s.done == nil {
		s.done = make([]bool, s.size)
	}
	s.done[seq%s.size] = true
	for s.low < s.next && s.done[s.low%s.size] {
		s.done[s.low%s.size] = false
		s.low++
	}
}

// giveUp records that seq will never be sent again: the receiver must be told (a fence)
// before the seq counts as resolved.
func (s *seqSpace) giveUp(seq uint64) {
	if seq < s.low || seq >= s.next {
		return
	}
	if n := len(s.fences); n > 0 {
		last := &s.fences[n-1]
		if last.first+last.count == seq {
			last.count++
			return
		}
	}
	s.fences = append(s.fences, seqRange{seq, 1})
}

// takeFences returns the ranges to fence and forgets them; the caller posts them, then
// resolves their seqs once the peer has them (fenced), or gives them back (refence).
func (s *seqSpace) takeFences() []seqRange {
	f := s.fences
	s.fences = nil
	return f
}

// refence puts back a range whose fence may not have reached the peer.
func (s *seqSpace) refence(r seqRange) { s.fences = append(s.fences, r) }

// fenced resolves every seq of r.
func (s *seqSpace) fenced(r seqRange) {
	for q := r.first; q < r.first+r.count; q++ {
		s.resolve(q)
	}
}
