//go:build rdma

package verbs

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/twosided/twosided/ibv"
)

// pd is ibv.PD over struct ibv_pd.
type pd struct {
	ctx *deviceContext
	pd  *C.struct_ibv_pd
}

var _ ibv.PD = (*pd)(nil)

// RegMR is ibv_reg_mr over Go memory. The NIC keeps buf's address until Dereg, which cgo
// allows only for pinned memory: the MR holds a runtime.Pinner on buf for its lifetime, which
// also keeps buf alive while only the NIC refers to it.
func (p *pd) RegMR(buf []byte, access ibv.AccessFlags) (ibv.MR, error) {
	if p.pd == nil {
		return nil, fmt.Errorf("verbs: reg mr: %w", ibv.ErrClosed)
	}
	if len(buf) == 0 {
		return nil, fmt.Errorf("verbs: reg mr: buf: empty: %w", ibv.ErrInvalid)
	}
	m := &mr{pd: p, buf: buf, access: access}
	m.pin.Pin(&buf[0])
	r, errno := C.tsv_reg_mr(p.pd, unsafe.Pointer(&buf[0]), C.size_t(len(buf)), C.int(access))
	if r == nil {
		m.pin.Unpin()
		return nil, fmt.Errorf("verbs: ibv_reg_mr (%d bytes, access %#x): %w", len(buf), uint32(access), errnoErr(errno))
	}
	m.mr = r
	return m, nil
}

func (p *pd) CreateQP(attr ibv.QPInitAttr) (ibv.QP, error) {
	if p.pd == nil {
		return nil, fmt.Errorf("verbs: create qp: %w", ibv.ErrClosed)
	}
	return newQP(p, attr)
}

// Dealloc is ibv_dealloc_pd. It first tries again to deregister the PD's MRs whose Dereg
// failed (see mr.Dereg), since the PD cannot go while they exist.
func (p *pd) Dealloc() error {
	if p.pd == nil {
		return fmt.Errorf("verbs: dealloc pd: %w", ibv.ErrClosed)
	}
	for _, m := range stuck.of(p) {
		_ = m.Dereg()
	}
	if rc, errno := C.tsv_dealloc_pd(p.pd); rc != 0 {
		return fmt.Errorf("verbs: ibv_dealloc_pd: %w", rcErr(rc, errno))
	}
	p.pd = nil
	return nil
}

// mr is ibv.MR over struct ibv_mr.
type mr struct {
	pd     *pd
	mr     *C.struct_ibv_mr
	buf    []byte
	access ibv.AccessFlags
	pin    runtime.Pinner
}

var _ ibv.MR = (*mr)(nil)

func (m *mr) LKey() uint32 { return uint32(m.mr.lkey) }
func (m *mr) RKey() uint32 { return uint32(m.mr.rkey) }

func (m *mr) Addr() uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(m.buf)))) }

func (m *mr) Len() int                { return len(m.buf) }
func (m *mr) Access() ibv.AccessFlags { return m.access }
func (m *mr) Buf() []byte             { return m.buf }

// Dereg is ibv_dereg_mr; the buffer is unpinned once the NIC no longer refers to it.
//
// When ibv_dereg_mr fails the NIC may still write into the buffer, so it stays pinned; and
// a caller that drops the MR then must not leave the Pinner to the garbage collector (Go
// panics "found leaking pinned pointer" when a Pinner holding a pin is collected). A failed
// MR is therefore kept in a package list, with its pin and its buffer, until a later Dereg
// of it succeeds: the caller's again, or its PD's Dealloc, which tries its failed MRs first.
// Memory that the NIC could not release stays allocated; StuckMRs counts it.
func (m *mr) Dereg() error {
	if m.mr == nil {
		return fmt.Errorf("verbs: dereg mr: %w", ibv.ErrClosed)
	}
	rc, err := deregMR(m.mr)
	if rc != 0 {
		stuck.add(m)
		return fmt.Errorf("verbs: ibv_dereg_mr (%d bytes kept pinned until a Dereg succeeds): %w", len(m.buf), err)
	}
	stuck.remove(m)
	m.mr = nil
	m.pin.Unpin()
	return nil
}

// deregFault, when not 0, makes ibv_dereg_mr fail with that errno without calling it (a
// test hook: softverbs never fails it for a live MR).
var deregFault atomic.Int32

func deregMR(r *C.struct_ibv_mr) (C.int, error) {
	if e := deregFault.Load(); e != 0 {
		return C.int(e), syscall.Errno(e)
	}
	rc, errno := C.tsv_dereg_mr(r)
	if rc != 0 {
		return rc, rcErr(rc, errno)
	}
	return 0, nil
}

// stuck holds the MRs whose deregistration failed, so that their pins and buffers live on.
var stuck stuckMRs

type stuckMRs struct {
	mu sync.Mutex
	m  map[*mr]struct{}
}

func (s *stuckMRs) add(m *mr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = make(map[*mr]struct{})
	}
	s.m[m] = struct{}{}
}

func (s *stuckMRs) remove(m *mr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, m)
}

func (s *stuckMRs) of(p *pd) []*mr {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*mr
	for m := range s.m {
		if m.pd == p {
			out = append(out, m)
		}
	}
	return out
}

// StuckMRs is the number of MRs whose ibv_dereg_mr failed and that no later Dereg (nor their
// PD's Dealloc) released yet: their buffers stay pinned and allocated.
func StuckMRs() int {
	stuck.mu.Lock()
	defer stuck.mu.Unlock()
	return len(stuck.m)
}
