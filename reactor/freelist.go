package reactor

// FreeList keeps up to Max objects for reuse, so a hot path that makes one per event
// allocates nothing once warm. Not safe for concurrent use: one per loop (or per pure
// machine), used from its goroutine only; the zero value keeps nothing.
type FreeList[T any] struct {
	items []*T
	Max   int
}

// Get returns a kept object (nil when there is none). It is as Put left it.
func (f *FreeList[T]) Get() *T {
	n := len(f.items)
	if n == 0 {
		return nil
	}
	x := f.items[n-1]
	f.items[n-1] = nil
	f.items = f.items[:n-1]
	return x
}

// Put keeps x for a later Get, unless Max are kept already; it reports whether x was
// kept. The caller clears x first, and must not use it after a true return.
func (f *FreeList[T]) Put(x *T) bool {
	if len(f.items) >= f.Max {
		return false
	}
	f.items = append(f.items, x)
	return true
}

// Len is how many objects are kept.
func (f *FreeList[T]) Len() int { return len(f.items) }
