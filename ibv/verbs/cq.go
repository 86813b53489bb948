//go:build rdma

package verbs

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/twosided/twosided/ibv"
)

// compChannel is ibv.CompChannel over struct ibv_comp_channel (fd non-blocking).
type compChannel struct {
	ctx *deviceContext
	ch  *C.struct_ibv_comp_channel
	ev  *C.struct_tsv_cq_event // C memory: what ibv_get_cq_event writes, so GetEvent allocates nothing

	// cqs are the channel's CQs, copied on write (CQs come and go on any goroutine): an
	// event's CQ is found here without the handle table's lock and map.
	cqs   atomic.Pointer[[]*cq]
	cqsMu sync.Mutex
}

func (ch *compChannel) attach(q *cq) {
	ch.cqsMu.Lock()
	defer ch.cqsMu.Unlock()
	var s []*cq
	if p := ch.cqs.Load(); p != nil {
		s = append(s, *p...)
	}
	s = append(s, q)
	ch.cqs.Store(&s)
}

func (ch *compChannel) detach(q *cq) {
	ch.cqsMu.Lock()
	defer ch.cqsMu.Unlock()
	p := ch.cqs.Load()
	if p == nil {
		return
	}
	s := make([]*cq, 0, len(*p))
	for _, x := range *p {
		if x != q {
			s = append(s, x)
		}
	}
	ch.cqs.Store(&s)
}

// find is the channel's CQ of handle h, nil if none.
func (ch *compChannel) find(h uintptr) *cq {
	if p := ch.cqs.Load(); p != nil {
		for _, q := range *p {
			if q.handle == h {
				return q
			}
		}
	}
	return nil
}

// cptr is the address of C memory for the shim's hot calls, which take it as uintptr_t:
// cgo checks each argument of a pointer type for Go memory at every call, and these never
// point to Go memory.
func cptr[T any](p *T) C.uintptr_t { return C.uintptr_t(uintptr(unsafe.Pointer(p))) }

var _ ibv.CompChannel = (*compChannel)(nil)

func (ch *compChannel) Fd() int {
	if ch.ch == nil {
		return -1
	}
	return int(ch.ch.fd)
}

// GetEvent is a non-blocking ibv_get_cq_event: the CQ named by the event's cq_context
// handle, or ibv.ErrWouldBlock when the channel is empty.
func (ch *compChannel) GetEvent() (ibv.CQ, error) {
	if ch.ch == nil {
		return nil, fmt.Errorf("verbs: get cq event: %w", ibv.ErrClosed)
	}
	rc := C.tsv_get_cq_event(cptr(ch.ch), cptr(ch.ev))
	if rc == C.EAGAIN {
		return nil, ibv.ErrWouldBlock
	}
	if rc != 0 {
		return nil, fmt.Errorf("verbs: ibv_get_cq_event: %w", syscall.Errno(rc))
	}
	q := ch.find(uintptr(ch.ev.handle))
	if q == nil {
		q, _ = lookupHandle(uintptr(ch.ev.handle)).(*cq)
	}
	if q == nil {
		// Not ours any more: acknowledge it here, or destroying that CQ would wait forever.
		C.tsv_ack_cq_events(cptr(ch.ev.cq), 1)
		return nil, fmt.Errorf("verbs: cq event for unknown cq handle %d: %w", uintptr(ch.ev.handle), ibv.ErrClosed)
	}
	q.events.Add(1)
	return q, nil
}

// Close is ibv_destroy_comp_channel; it fails with EBUSY while a CQ uses the channel.
func (ch *compChannel) Close() error {
	if ch.ch == nil {
		return fmt.Errorf("verbs: close comp channel: %w", ibv.ErrClosed)
	}
	if rc, errno := C.tsv_destroy_comp_channel(ch.ch); rc != 0 {
		return fmt.Errorf("verbs: ibv_destroy_comp_channel: %w", rcErr(rc, errno))
	}
	ch.ch = nil
	C.free(unsafe.Pointer(ch.ev))
	ch.ev = nil
	return nil
}

// maxPollBatch bounds the C WC array of a CQ; Poll loops when asked for more.
const maxPollBatch = 256

// cq is ibv.CQ over struct ibv_cq. cq_context holds handle, never a Go pointer.
type cq struct {
	ctx    *deviceContext
	cq     *C.struct_ibv_cq
	ch     *compChannel
	handle uintptr
	cqe    int
	vector int // the completion vector (interrupt) its events are raised on

	raw  *C.struct_ibv_wc  // C array of batch entries, for ibv_poll_cq
	flat []C.struct_tsv_wc // C array of batch entries, the flattened copy Go reads

	events      atomic.Int64 // completion events got and not yet acknowledged
	asyncEvents atomic.Int64 // async events got and not yet acknowledged
}

var _ ibv.CQ = (*cq)(nil)

func newCQ(c *deviceContext, cqe int, ch *compChannel) (*cq, error) {
	q := &cq{ctx: c, ch: ch}
	q.handle = newHandle(q)
	var cch *C.struct_ibv_comp_channel
	if ch != nil {
		cch = ch.ch
	}
	q.vector = c.nextCompVector()
	r, errno := C.tsv_create_cq(c.ctx, C.int(cqe), C.uintptr_t(q.handle), cch, C.int(q.vector))
	if r == nil {
		freeHandle(q.handle)
		return nil, fmt.Errorf("verbs: %s: ibv_create_cq (cqe %d): %w", c.info.Name, cqe, errnoErr(errno))
	}
	q.cq = r
	q.cqe = int(r.cqe)
	if ch != nil {
		ch.attach(q)
	}
	batch := min(q.cqe, maxPollBatch)
	q.raw = (*C.struct_ibv_wc)(C.calloc(C.size_t(batch), C.sizeof_struct_ibv_wc))
	flat := (*C.struct_tsv_wc)(C.calloc(C.size_t(batch), C.sizeof_struct_tsv_wc))
	q.flat = unsafe.Slice(flat, batch)
	return q, nil
}

// Poll is ibv_poll_cq into the CQ's C array, converted into wcs. It allocates nothing.
func (q *cq) Poll(wcs []ibv.WC) (int, error) {
	if q.cq == nil {
		return 0, fmt.Errorf("verbs: poll cq: %w", ibv.ErrClosed)
	}
	total := 0
	for total < len(wcs) {
		n := min(len(wcs)-total, len(q.flat))
		got := int(C.tsv_poll(cptr(q.cq), C.int(n), q.raw, &q.flat[0]))
		if got < 0 {
			return total, fmt.Errorf("verbs: ibv_poll_cq: %w", syscall.EIO)
		}
		for i, f := range q.flat[:got] {
			wcs[total+i] = ibv.WC{
				WRID:      uint64(f.wr_id),
				Status:    ibv.WCStatus(f.status),
				Opcode:    ibv.WCOpcode(f.opcode),
				VendorErr: uint32(f.vendor_err),
				ByteLen:   uint32(f.byte_len),
				ImmData:   uint32(f.imm_data),
				QPNum:     uint32(f.qp_num),
				SrcQP:     uint32(f.src_qp),
				WCFlags:   ibv.WCFlags(f.wc_flags),
			}
		}
		total += got
		if got < n {
			break
		}
	}
	return total, nil
}

func (q *cq) ReqNotify(solicitedOnly bool) error {
	if q.cq == nil {
		return fmt.Errorf("verbs: req notify cq: %w", ibv.ErrClosed)
	}
	so := C.int(0)
	if solicitedOnly {
		so = 1
	}
	if rc := C.tsv_req_notify(cptr(q.cq), so); rc != 0 {
		return fmt.Errorf("verbs: ibv_req_notify_cq: %w", rcErr(rc, nil))
	}
	return nil
}

// AckEvents is ibv_ack_cq_events. It acknowledges at most the events GetEvent returned for
// this CQ and not yet acknowledged: acking more would corrupt libibverbs' counts.
func (q *cq) AckEvents(n int) {
	if q.cq == nil || n <= 0 {
		return
	}
	n = int(min(int64(n), q.events.Load()))
	if n <= 0 {
		return
	}
	C.tsv_ack_cq_events(cptr(q.cq), C.uint(n))
	q.events.Add(int64(-n))
}

func (q *cq) CQE() int { return q.cqe }

func (q *cq) Channel() ibv.CompChannel {
	if q.ch == nil {
		return nil
	}
	return q.ch
}

// Destroy is ibv_destroy_cq. It refuses with ibv.ErrBusy while events are unacknowledged,
// where libibverbs would block forever.
func (q *cq) Destroy() error {
	if q.cq == nil {
		return fmt.Errorf("verbs: destroy cq: %w", ibv.ErrClosed)
	}
	if n, a := q.events.Load(), q.asyncEvents.Load(); n > 0 || a > 0 {
		return fmt.Errorf("verbs: destroy cq: %d completion and %d async events unacknowledged: %w", n, a, ibv.ErrBusy)
	}
	if rc, errno := C.tsv_destroy_cq(q.cq); rc != 0 {
		return fmt.Errorf("verbs: ibv_destroy_cq: %w", rcErr(rc, errno))
	}
	q.cq = nil
	if q.ch != nil {
		q.ch.detach(q)
	}
	freeHandle(q.handle)
	C.free(unsafe.Pointer(q.raw))
	C.free(unsafe.Pointer(unsafe.SliceData(q.flat)))
	q.raw, q.flat = nil, nil
	return nil
}
