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

func (p *pd) Dealloc() error {
	if p.pd == nil {
		return fmt.Errorf("verbs: dealloc pd: %w", ibv.ErrClosed)
	}
	if rc, errno := C.ibv_dealloc_pd(p.pd); rc != 0 {
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
func (m *mr) Dereg() error {
	if m.mr == nil {
		return fmt.Errorf("verbs: dereg mr: %w", ibv.ErrClosed)
	}
	if rc, errno := C.ibv_dereg_mr(m.mr); rc != 0 {
		return fmt.Errorf("verbs: ibv_dereg_mr: %w", rcErr(rc, errno))
	}
	m.mr = nil
	m.pin.Unpin()
	return nil
}
