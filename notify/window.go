package notify

import "time"

// recvWindow is the receive side of one sequence space (one sending session towards this
// engine): it delivers in seq order whatever path a notify took (a channel, an older
// channel drained at replacement, an OOB fallback), drops what it already delivered, and
// holds what arrived early. Pure: no clock, no I/O; time is an argument.
//
// Every seq below next was delivered or given up. A seq in [next, next+size) that arrived
// early is held; a seq the sender gave up (a FENCE or ts_skip) is marked resolved, so the
// window moves past it. A seq at or above next+size is refused: a sender never has that
// many unresolved seqs, so only a forged or broken sender sends one. A gap that the sender
// neither fills nor fences within the gap timeout is given up (counted), so nothing waits
// forever; a seq that arrives after its gap was given up is a late arrival and is dropped.
//
// Idempotency ids: a notify that carries an id is dropped when the same id was delivered
// among the last idCap ids of this window, so a caller may retry after an error that
// leaves the outcome unknown. The check is made when a notify is delivered, so of two
// copies held behind one gap only the first is.
type recvWindow struct {
	next  uint64
	size  uint64
	slots []winSlot // ring over [next, next+size), allocated on the first early arrival
	held  int       // slots in use (arrived early or resolved by a fence)

	gapSince time.Time // when the oldest gap started holding items; zero: none

	ids    map[string]struct{} // allocated with the first id
	idRing []string
	idHead int
	idCap  int

	stats windowStats
	// heldDupIDs counts held notifies dropped at release as duplicates by id, until the
	// machine takes the count (takeHeldDupIDs) into its own duplicate counters.
	heldDupIDs uint64

	// timedOut remembers the last seqs whose gap timed out, so a late OOB copy of one is
	// refused (not delivered) rather than taken for a duplicate (delivered). Bounded ring.
	timedOut    []uint64
	timedOutPos int
}

const timedOutCap = 256

func (w *recvWindow) noteGaveUp(seq uint64) {
	if w.timedOut == nil {
		w.timedOut = make([]uint64, timedOutCap)
	}
	w.timedOut[w.timedOutPos] = seq
	w.timedOutPos = (w.timedOutPos + 1) % timedOutCap
}

// gaveUp reports whether seq's gap timed out here (among the last timedOutCap such seqs).
func (w *recvWindow) gaveUp(seq uint64) bool {
	for _, s := range w.timedOut {
		if s == seq && seq != 0 {
			return true
		}
	}
	return false
}

// takeGaveUp is gaveUp for a late arrival that is delivered: it counts it and forgets the
// seq, so a second copy is a duplicate.
func (w *recvWindow) takeGaveUp(seq uint64) bool {
	for i, s := range w.timedOut {
		if s == seq && seq != 0 {
			w.timedOut[i] = 0
			w.stats.Late++
			return true
		}
	}
	return false
}

type winSlot struct {
	state uint8 // slotEmpty, slotHeld, slotSkipped
	n     Notify
	id    string
}

const (
	slotEmpty uint8 = iota
	slotHeld
	slotSkipped
)

// windowStats are one window's counters.
type windowStats struct {
	Delivered, Duplicates, DuplicateIDs, Refused, Held, GapsTimedOut, Skipped, Late uint64
}

// arrival is what a window did with one notify.
type arrival uint8

const (
	arrDelivered arrival = iota // delivered now, possibly with held successors
	arrHeld                     // held until the gap before it fills
	arrDuplicate                // already delivered (or given up): dropped
	arrRefused                  // beyond the window: dropped; an OOB sender is told
)

func newRecvWindow(size int, idCap int) *recvWindow {
	return &recvWindow{next: 1, size: uint64(size), idCap: idCap}
}

// start sets the first seq expected (a sender's space may begin above 1).
func (w *recvWindow) start(seq uint64) {
	if w.held == 0 && seq > w.next {
		w.next = seq
	}
}

func (w *recvWindow) slot(seq uint64) *winSlot {
	if w.slots == nil {
		w.slots = make([]winSlot, w.size)
	}
	return &w.slots[seq%w.size]
}

// arrive offers seq; deliver is called, in seq order, for each notify the window releases
// (this one and any held successors). now starts the gap clock when an item is held.
func (w *recvWindow) arrive(now time.Time, seq uint64, id string, n Notify, deliver func(Notify)) arrival {
	switch {
	case seq < w.next:
		w.stats.Duplicates++
		return arrDuplicate
	case seq >= w.next+w.size:
		w.stats.Refused++
		return arrRefused
	case id != "" && w.seenID(id):
		// The same notify under another seq (a caller's retry): resolve the seq, drop it.
		w.stats.DuplicateIDs++
		if seq == w.next {
			w.next++
			w.release(now, deliver)
		} else if s := w.slot(seq); s.state == slotEmpty {
			*s = winSlot{state: slotSkipped}
			w.held++
		}
		return arrDuplicate
	case seq == w.next:
		w.emit(n, id, deliver)
		w.next++
		w.release(now, deliver)
		return arrDelivered
	}
	s := w.slot(seq)
	if s.state != slotEmpty {
		w.stats.Duplicates++
		return arrDuplicate
	}
	*s = winSlot{state: slotHeld, n: n, id: id}
	w.held++
	w.stats.Held++
	if w.gapSince.IsZero() {
		w.gapSince = now
	}
	return arrHeld
}

// skip marks [first, first+count) as given up by the sender. Seqs already delivered or
// held are unaffected; the part beyond the window is clamped (the sender cannot have
// unresolved seqs there). A held seq in the range is delivered when next reaches it (the
// sender gave it up, yet its copy came: its try ended on the way), and the release that
// delivers it may move next past more of the range: those seqs are behind next and have no
// slot (their ring slots are the seqs a window ahead), so they are passed over.
func (w *recvWindow) skip(now time.Time, first, count uint64, deliver func(Notify)) {
	if count == 0 {
		return
	}
	end := first + count
	if end < first { // overflow
		end = ^uint64(0)
	}
	first = max(first, w.next)
	end = min(end, w.next+w.size)
	for seq := first; seq < end; seq++ {
		if seq < w.next {
			continue // released (delivered or given up) by this skip's release
		}
		if seq == w.next {
			w.stats.Skipped++
			w.next++
			w.release(now, deliver)
			continue
		}
		if s := w.slot(seq); s.state == slotEmpty {
			*s = winSlot{state: slotSkipped}
			w.held++
			w.stats.Skipped++
		}
	}
}

// release delivers held items from next on, and moves past given-up seqs. A gap met
// after progress starts its own clock at now.
func (w *recvWindow) release(now time.Time, deliver func(Notify)) {
	moved := false
	for w.held > 0 {
		s := w.slot(w.next)
		if s.state == slotEmpty {
			if moved {
				w.gapSince = now
			}
			return
		}
		if s.state == slotHeld {
			if s.id != "" && w.seenID(s.id) {
				// Another copy of this notify (a caller's retry under a new seq) was held
				// too, behind the same gap, and went first: this one is a duplicate.
				w.stats.DuplicateIDs++
				w.heldDupIDs++
			} else {
				w.emit(s.n, s.id, deliver)
			}
		}
		*s = winSlot{}
		w.held--
		w.next++
		moved = true
	}
	w.gapSince = time.Time{}
}

func (w *recvWindow) emit(n Notify, id string, deliver func(Notify)) {
	if id != "" {
		w.rememberID(id)
	}
	w.stats.Delivered++
	deliver(n)
}

// gapDeadline is when the oldest gap times out (zero: nothing waits).
func (w *recvWindow) gapDeadline(timeout time.Duration) time.Time {
	if w.held == 0 || w.gapSince.IsZero() {
		return time.Time{}
	}
	return w.gapSince.Add(timeout)
}

// expire gives up the gap before the oldest held item when it has waited timeout.
func (w *recvWindow) expire(now time.Time, timeout time.Duration, deliver func(Notify)) {
	for w.held > 0 && !w.gapSince.IsZero() && !now.Before(w.gapSince.Add(timeout)) {
		for w.slot(w.next).state == slotEmpty {
			w.noteGaveUp(w.next)
			w.next++
			w.stats.GapsTimedOut++
		}
		w.release(now, deliver)
	}
}

// takeHeldDupIDs returns and clears the count of held notifies dropped at release as
// duplicates by id.
func (w *recvWindow) takeHeldDupIDs() uint64 {
	n := w.heldDupIDs
	w.heldDupIDs = 0
	return n
}

func (w *recvWindow) seenID(id string) bool {
	_, ok := w.ids[id]
	return ok
}

func (w *recvWindow) rememberID(id string) {
	if w.idCap == 0 {
		return
	}
	if w.idRing == nil {
		w.idRing, w.ids = make([]string, w.idCap), make(map[string]struct{}, w.idCap)
	}
	if old := w.idRing[w.idHead]; old != "" {
		delete(w.ids, old)
	}
	w.idRing[w.idHead] = id
	w.ids[id] = struct{}{}
	w.idHead = (w.idHead + 1) % len(w.idRing)
}

// flush releases everything held, giving up every gap before it: the engine closes, and
// what its peers saw acknowledged must still reach the application.
func (w *recvWindow) flush(deliver func(Notify)) {
	for w.held > 0 {
		for w.slot(w.next).state == slotEmpty {
			w.next++
			w.stats.GapsTimedOut++
		}
		w.release(time.Time{}, deliver)
	}
}
