package reactor

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRingFIFOAndBounds(t *testing.T) {
	for _, size := range []int{1, 2, 3, 7, 8, 64} {
		r := newRing(size)
		var got []int
		for lap := 0; lap < 3; lap++ {
			for i := 0; i < size; i++ {
				v := lap*size + i
				require.True(t, r.push(func() { got = append(got, v) }), "size %d lap %d push %d", size, lap, i)
			}
			require.False(t, r.push(func() {}), "size %d: push into a full ring", size)
			for i := 0; i < size; i++ {
				require.True(t, r.ready())
				f, ok := r.pop()
				require.True(t, ok)
				f()
			}
			require.False(t, r.ready())
			_, ok := r.pop()
			require.False(t, ok)
		}
		want := make([]int, 3*size)
		for i := range want {
			want[i] = i
		}
		require.Equal(t, want, got, "size %d", size)
	}
}

func TestRingConcurrentProducers(t *testing.T) {
	const producers, each = 4, 5000
	r := newRing(64)
	seen := make([][]int, producers)
	var wg sync.WaitGroup
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				f := func() { seen[p] = append(seen[p], i) }
				for !r.push(f) {
					// full: the consumer below frees room; a test-only retry
				}
			}
		}()
	}
	total := 0
	for total < producers*each {
		if f, ok := r.pop(); ok {
			f()
			total++
		}
	}
	wg.Wait()
	for p := 0; p < producers; p++ {
		require.Len(t, seen[p], each)
		for i, v := range seen[p] {
			require.Equal(t, i, v, "producer %d out of order", p)
		}
	}
}

// FuzzRing drives the ring with a byte script (push or pop) against a slice model.
func FuzzRing(f *testing.F) {
	f.Add(uint8(3), []byte{0, 0, 0, 0, 1, 1, 0, 1, 1, 1, 1})
	f.Add(uint8(1), []byte{0, 0, 1, 1, 0})
	f.Fuzz(func(t *testing.T, size uint8, script []byte) {
		n := int(size%16) + 1
		r := newRing(n)
		var model []int
		var out []int
		next := 0
		for _, op := range script {
			if op&1 == 0 {
				v := next
				ok := r.push(func() { out = append(out, v) })
				require.Equal(t, len(model) < n, ok)
				if ok {
					model = append(model, v)
					next++
				}
			} else {
				f, ok := r.pop()
				require.Equal(t, len(model) > 0, ok)
				if ok {
					f()
					require.Equal(t, model[0], out[len(out)-1])
					model = model[1:]
				}
			}
			require.Equal(t, len(model) > 0, r.ready())
		}
	})
}
