//go:build rdma

package verbs

import "sync"

// handles maps the integers stored in cq_context and qp_context back to their Go objects:
// C memory must not hold Go pointers, and the kernel hands these contexts back in CQ and
// async events.
var handles struct {
	sync.RWMutex
	next uintptr
	m    map[uintptr]any
}

func newHandle(obj any) uintptr {
	handles.Lock()
	defer handles.Unlock()
	if handles.m == nil {
		handles.m = make(map[uintptr]any)
	}
	handles.next++
	handles.m[handles.next] = obj
	return handles.next
}

func lookupHandle(h uintptr) any {
	handles.RLock()
	defer handles.RUnlock()
	return handles.m[h]
}

func freeHandle(h uintptr) {
	handles.Lock()
	defer handles.Unlock()
	delete(handles.m, h)
}
