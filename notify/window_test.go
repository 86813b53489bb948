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
