package notify

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func collect(out *[]string) func(Notify) {
	return func(n Notify) { *out = append(*out, string(n.Msg)) }
}

func nm(seq uint64) Notify { return Notify{Msg: []byte(fmt.Sprint(seq))} }

func TestWindowInOrderAndDuplicates(t *testing.T) {
	w := newRecvWindow(8, 4)
	var got []string
	t0 := time.Unix(0, 0)
	require.Equal(t, arrDelivered, w.arrive(t0, 1, "", nm(1), collect(&got)))
	require.Equal(t, arrHeld, w.arrive(t0, 3, "", nm(3), collect(&got)))
	require.Equal(t, arrDuplicate, w.arrive(t0, 3, "", nm(3), collect(&got)))
	require.Equal(t, arrDuplicate, w.arrive(t0, 1, "", nm(1), collect(&got)))
	require.Equal(t, []string{"1"}, got)
	require.Equal(t, arrDelivered, w.arrive(t0, 2, "", nm(2), collect(&got)))
	require.Equal(t, []string{"1", "2", "3"}, got)
	require.Equal(t, uint64(4), w.next)
	require.Zero(t, w.held)
	require.True(t, w.gapSince.IsZero())
}

func TestWindowRefusesBeyond(t *testing.T) {
	w := newRecvWindow(8, 0)
	var got []string
	require.Equal(t, arrRefused, w.arrive(time.Time{}, 9, "", nm(9), collect(&got)))
	require.Equal(t, arrHeld, w.arrive(time.Time{}, 8, "", nm(8), collect(&got)))
	require.Equal(t, uint64(1), w.stats.Refused)
}

func TestWindowSkipReleases(t *testing.T) {
	w := newRecvWindow(16, 0)
	var got []string
	t0 := time.Unix(0, 0)
	w.arrive(t0, 4, "", nm(4), collect(&got))
	w.arrive(t0, 2, "", nm(2), collect(&got))
	w.skip(t0, 3, 1, collect(&got)) // 3 given up: nothing yet, 1 is missing
	require.Empty(t, got)
	w.skip(t0, 1, 1, collect(&got))
	require.Equal(t, []string{"2", "4"}, got)
	// A given-up seq that comes late is dropped, never delivered out of order.
	require.Equal(t, arrDuplicate, w.arrive(t0, 3, "", nm(3), collect(&got)))
	// A skip of what was delivered changes nothing; a huge one is clamped.
	w.skip(t0, 1, 5, collect(&got))
	w.skip(t0, 6, ^uint64(0), collect(&got))
	require.Equal(t, []string{"2", "4"}, got)
	require.Equal(t, uint64(6+16), w.next)
}

func TestWindowGapTimeout(t *testing.T) {
	w := newRecvWindow(16, 0)
	var got []string
	t0 := time.Unix(100, 0)
	w.arrive(t0, 3, "", nm(3), collect(&got))
	require.Equal(t, t0.Add(time.Minute), w.gapDeadline(time.Minute))
	w.expire(t0.Add(59*time.Second), time.Minute, collect(&got))
	require.Empty(t, got)
	w.arrive(t0.Add(59*time.Second), 6, "", nm(6), collect(&got))
	w.expire(t0.Add(time.Minute), time.Minute, collect(&got))
	require.Equal(t, []string{"3"}, got)
	// The gap before 6 starts its own clock when 3 is released.
	require.Equal(t, t0.Add(2*time.Minute), w.gapDeadline(time.Minute))
	w.expire(t0.Add(2*time.Minute), time.Minute, collect(&got))
	require.Equal(t, []string{"3", "6"}, got)
	require.Equal(t, uint64(4), w.stats.GapsTimedOut) // 1, 2, then 4 and 5
	require.Zero(t, w.held)
	require.True(t, w.gapDeadline(time.Minute).IsZero())
	// A late copy of a timed-out seq is told apart from a duplicate of a delivered one.
	require.True(t, w.gaveUp(1))
	require.True(t, w.gaveUp(5))
	require.False(t, w.gaveUp(3))
	require.False(t, w.gaveUp(6))
	require.True(t, w.takeGaveUp(5), "a late channel copy is taken once")
	require.False(t, w.gaveUp(5))
	require.Equal(t, uint64(1), w.stats.Late)
}

func TestWindowIdempotentIDs(t *testing.T) {
	w := newRecvWindow(16, 2)
	var got []string
	t0 := time.Time{}
	w.arrive(t0, 1, "a", nm(1), collect(&got))
	// The caller retried "a" (outcome unknown) under a new seq: dropped, the seq resolved.
	require.Equal(t, arrDuplicate, w.arrive(t0, 2, "a", nm(2), collect(&got)))
	require.Equal(t, arrDelivered, w.arrive(t0, 3, "b", nm(3), collect(&got)))
	// An early duplicate id resolves its slot too.
	w.arrive(t0, 5, "b", nm(5), collect(&got))
	w.arrive(t0, 4, "c", nm(4), collect(&got))
	require.Equal(t, []string{"1", "3", "4"}, got)
	require.Equal(t, uint64(6), w.next)
	// Only the last idCap ids are kept: "a" fell out.
	require.Equal(t, arrDelivered, w.arrive(t0, 6, "a", nm(6), collect(&got)))
}

// TestWindowHeldCopiesOfOneID: two copies of one notify (the same id under two seqs: a
// retry sent while the first try was still on its way) both held behind a gap are
// delivered once when the gap fills; the second counts as a duplicate id. Found by
// TestContractRetrySameIDHeldCopies (tests/), where slow OOB receivers delivered up
// to 832 of 1000 ids twice.
func TestWindowHeldCopiesOfOneID(t *testing.T) {
	w := newRecvWindow(16, 8)
	var got []string
	t0 := time.Time{}
	require.Equal(t, arrHeld, w.arrive(t0, 2, "x", nm(2), collect(&got)))
	require.Equal(t, arrHeld, w.arrive(t0, 3, "x", nm(3), collect(&got)))
	require.Equal(t, arrHeld, w.arrive(t0, 4, "y", nm(4), collect(&got)))
	require.Equal(t, arrDelivered, w.arrive(t0, 1, "", nm(1), collect(&got)))
	require.Equal(t, []string{"1", "2", "4"}, got)
	require.Equal(t, uint64(1), w.stats.DuplicateIDs)
	require.Equal(t, uint64(1), w.takeHeldDupIDs())
	require.Zero(t, w.takeHeldDupIDs())
	require.Equal(t, 0, w.held)
	// The same when the gap is given up (fence) or times out instead of filling.
	got = nil
	w.arrive(t0, 6, "z", nm(6), collect(&got))
	w.arrive(t0, 7, "z", nm(7), collect(&got))
	w.skip(t0, 5, 1, collect(&got))
	require.Equal(t, []string{"6"}, got)
	got = nil
	t1 := time.Unix(1000, 0) // the gap clock starts at a real time
	w.arrive(t1, 9, "w", nm(9), collect(&got))
	w.arrive(t1, 10, "w", nm(10), collect(&got))
	w.expire(t1.Add(time.Hour), time.Second, collect(&got))
	require.Equal(t, []string{"9"}, got)
	require.Equal(t, uint64(3), w.stats.DuplicateIDs)
}

// TestWindowSkipOverHeld: a fence whose range holds a seq that is held here (the sender
// gave up a try whose copy came anyway: its deadline passed on the way) releases it, and
// marks no slot of the seqs the release moved past. Before, the fence went on over the
// seqs below next as if they were ahead, and marked their ring slots given up: those slots
// are the seqs a window ahead, which, when they came, were answered as duplicates
// (acknowledged) and never delivered.
func TestWindowSkipOverHeld(t *testing.T) {
	const size = 8
	w := newRecvWindow(size, 16)
	var got []string
	t0 := time.Time{}
	require.Equal(t, arrDelivered, w.arrive(t0, 1, "a", nm(1), collect(&got)))
	require.Equal(t, arrHeld, w.arrive(t0, 3, "c", nm(3), collect(&got)))
	require.Equal(t, arrHeld, w.arrive(t0, 5, "e", nm(5), collect(&got)))
	// The sender gave up 2 to 5 (3 and 5 were sent, their tries ended before the answers).
	w.skip(t0, 2, 4, collect(&got))
	require.Equal(t, []string{"1", "3", "5"}, got)
	require.Equal(t, uint64(6), w.next)
	require.Zero(t, w.held, "the fence marked slots behind next")
	// The seqs a window ahead of 3 and 5 are delivered when they come.
	for seq := uint64(6); seq <= 5+size; seq++ {
		require.Equal(t, arrDelivered, w.arrive(t0, seq, "", nm(seq), collect(&got)), "seq %d", seq)
	}
	require.Len(t, got, 3+size)
	require.Zero(t, w.stats.Duplicates)
	require.Zero(t, w.held)
}

// TestWindowRandomOrder: any permutation of arrivals, with duplicates, delivers each seq
// once and in order; skipped seqs are never delivered.
func TestWindowRandomOrder(t *testing.T) {
	for seed := uint64(0); seed < 200; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		const n = 300
		w := newRecvWindow(64, 0)
		skipped := map[uint64]bool{}
		var got []uint64
		deliver := func(x Notify) {
			var v uint64
			fmt.Sscan(string(x.Msg), &v)
			got = append(got, v)
		}
		next := uint64(1) // sender: seqs below next are sent or skipped
		var pending []uint64
		for next <= n || len(pending) > 0 {
			if next <= n && int(next)-int(w.next) < 60 && rng.IntN(2) == 0 {
				if rng.IntN(10) == 0 {
					skipped[next] = true
					w.skip(time.Time{}, next, 1, deliver)
				} else {
					pending = append(pending, next)
				}
				next++
				continue
			}
			if len(pending) == 0 {
				continue
			}
			i := rng.IntN(len(pending))
			s := pending[i]
			w.arrive(time.Time{}, s, "", nm(s), deliver)
			if rng.IntN(4) == 0 {
				w.arrive(time.Time{}, s, "", nm(s), deliver) // a duplicate
			} else {
				pending = append(pending[:i], pending[i+1:]...)
			}
		}
		var want []uint64
		for s := uint64(1); s <= n; s++ {
			if !skipped[s] {
				want = append(want, s)
			}
		}
		require.Equal(t, want, got, "seed %d", seed)
	}
}

// TestWindowRandomFences: a sender gives up runs of seqs, some of which it sent (their
// tries ended on the way: the copies come before or after the fence, or never), over a
// small window many times round. No arrival is answered as a duplicate unless its seq was
// delivered or given up here already; each seq is delivered at most once, in order; what
// was not given up, and what came before its fence, is delivered.
func TestWindowRandomFences(t *testing.T) {
	for seed := uint64(0); seed < 300; seed++ {
		rng := rand.New(rand.NewPCG(seed, 11))
		const size, n = 8, 400
		w := newRecvWindow(size, 0)
		var got []uint64
		delivered := map[uint64]bool{}
		deliver := func(x Notify) {
			var v uint64
			fmt.Sscan(string(x.Msg), &v)
			require.False(t, delivered[v], "seed %d: seq %d delivered twice", seed, v)
			require.True(t, len(got) == 0 || v > got[len(got)-1], "seed %d: seq %d after %v", seed, v, got)
			delivered[v] = true
			got = append(got, v)
		}
		arrived := map[uint64]bool{} // a copy came before its fence (or with none)
		fencedHere := map[uint64]bool{}
		givenUp := map[uint64]bool{}
		var inFlight []uint64 // copies on their way
		var fences []seqRange // given up, fence on its way
		next := uint64(1)
		for next <= n || len(inFlight) > 0 || len(fences) > 0 {
			switch r := rng.IntN(4); {
			case r == 0 && next <= n && next < w.next+size:
				seq := next
				next++
				sent := rng.IntN(3) > 0
				if sent {
					inFlight = append(inFlight, seq)
				}
				if !sent || rng.IntN(3) == 0 { // never sent, or its try ended: given up
					givenUp[seq] = true
					if k := len(fences); k > 0 && fences[k-1].first+fences[k-1].count == seq && rng.IntN(4) > 0 {
						fences[k-1].count++
					} else {
						fences = append(fences, seqRange{seq, 1})
					}
				}
			case r == 1 && len(inFlight) > 0:
				i := rng.IntN(len(inFlight))
				seq := inFlight[i]
				inFlight = append(inFlight[:i], inFlight[i+1:]...)
				before := delivered[seq] || fencedHere[seq] || arrived[seq]
				res := w.arrive(time.Time{}, seq, "", nm(seq), deliver)
				require.NotEqual(t, arrRefused, res, "seed %d: seq %d", seed, seq)
				if res == arrDuplicate {
					require.True(t, before, "seed %d: seq %d answered as a duplicate, yet never delivered nor given up here", seed, seq)
					continue
				}
				arrived[seq] = true
			case r == 2 && len(fences) > 0:
				i := rng.IntN(len(fences))
				f := fences[i]
				fences = append(fences[:i], fences[i+1:]...)
				w.skip(time.Time{}, f.first, f.count, deliver)
				for q := f.first; q < f.first+f.count; q++ {
					fencedHere[q] = true
				}
			}
		}
		require.Zero(t, w.held, "seed %d", seed)
		for seq := uint64(1); seq <= n; seq++ {
			if !givenUp[seq] || arrived[seq] {
				require.True(t, delivered[seq], "seed %d: seq %d (given up %v, came %v) never delivered", seed, seq, givenUp[seq], arrived[seq])
			}
		}
	}
}

func TestSeqSpace(t *testing.T) {
	s := newSeqSpace(4)
	a, b, c, d := s.draw(), s.draw(), s.draw(), s.draw()
	require.Equal(t, []uint64{1, 2, 3, 4}, []uint64{a, b, c, d})
	require.True(t, s.full())
	s.resolve(2)
	require.True(t, s.full(), "1 is still unresolved")
	s.resolve(1)
	require.False(t, s.full())
	require.Equal(t, uint64(3), s.low)
	s.giveUp(3)
	s.giveUp(4)
	require.Equal(t, []seqRange{{3, 2}}, s.fences)
	for _, r := range s.takeFences() {
		s.fenced(r)
	}
	require.Equal(t, uint64(0), s.unresolved())
	s.resolve(99) // never drawn: ignored
	s.giveUp(1)   // already resolved: ignored
	require.Empty(t, s.fences)
}

func FuzzWindow(f *testing.F) {
	f.Add([]byte{1, 3, 2, 0x83, 5})
	f.Fuzz(func(t *testing.T, ops []byte) {
		w := newRecvWindow(32, 4)
		delivered := map[uint64]bool{}
		last := uint64(0)
		deliver := func(n Notify) {
			var v uint64
			fmt.Sscan(string(n.Msg), &v)
			if delivered[v] || v <= last {
				t.Fatalf("seq %d delivered twice or out of order (last %d)", v, last)
			}
			delivered[v], last = true, v
		}
		now := time.Unix(0, 0)
		for i, op := range ops {
			seq := w.next + uint64(op&0x3f) - 8
			switch op >> 6 {
			case 0, 1:
				w.arrive(now, seq, "", nm(seq), deliver)
			case 2:
				w.skip(now, seq, uint64(op&3)+1, deliver)
			case 3:
				now = now.Add(time.Duration(i) * time.Second)
				w.expire(now, 5*time.Second, deliver)
			}
			if w.held < 0 || uint64(w.held) > w.size {
				t.Fatalf("held %d out of bounds", w.held)
			}
		}
	})
}
