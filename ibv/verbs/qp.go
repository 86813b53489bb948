//go:build rdma

package verbs

/*
#include <stdlib.h>
#include <string.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/twosided/twosided/ibv"
)

// maxPostBatch bounds the C WR arrays of a QP; longer chains are posted in batches.
const maxPostBatch = 64

// qp is ibv.QP over struct ibv_qp (RC). qp_context holds handle, never a Go pointer. The
// send side and the receive side each own C arrays (flat WRs, SGEs, the ibv_*_wr chain) so
// that PostSend and PostRecv allocate nothing and may run on two goroutines.
type qp struct {
	pd     *pd
	qp     *C.struct_ibv_qp
	handle uintptr
	cap    ibv.QPCap

	sendIn  []C.struct_tsv_send
	sendSGE []C.struct_ibv_sge
	sendWR  *C.struct_ibv_send_wr
	sendBad *C.int

	recvIn  []C.struct_tsv_recv
	recvSGE []C.struct_ibv_sge
	recvWR  *C.struct_ibv_recv_wr
	recvBad *C.int

	asyncEvents atomic.Int64 // async events got and not yet acknowledged
}

var _ ibv.QP = (*qp)(nil)

func newQP(p *pd, attr ibv.QPInitAttr) (*qp, error) {
	if attr.Type != ibv.QPTypeRC {
		return nil, fmt.Errorf("verbs: create qp: type %d: only RC (%d) is supported: %w", attr.Type, ibv.QPTypeRC, ibv.ErrInvalid)
	}
	scq, ok := attr.SendCQ.(*cq)
	if !ok || scq.cq == nil {
		return nil, fmt.Errorf("verbs: create qp: send_cq: not a live verbs CQ: %w", ibv.ErrInvalid)
	}
	rcq, ok := attr.RecvCQ.(*cq)
	if !ok || rcq.cq == nil {
		return nil, fmt.Errorf("verbs: create qp: recv_cq: not a live verbs CQ: %w", ibv.ErrInvalid)
	}
	q := &qp{pd: p}
	q.handle = newHandle(q)
	ccap := C.struct_ibv_qp_cap{
		max_send_wr:     C.uint32_t(attr.Cap.MaxSendWR),
		max_recv_wr:     C.uint32_t(attr.Cap.MaxRecvWR),
		max_send_sge:    C.uint32_t(attr.Cap.MaxSendSGE),
		max_recv_sge:    C.uint32_t(attr.Cap.MaxRecvSGE),
		max_inline_data: C.uint32_t(attr.Cap.MaxInlineData),
	}
	sig := C.int(0)
	if attr.SqSigAll {
		sig = 1
	}
	r, errno := C.tsv_create_qp(p.pd, scq.cq, rcq.cq, &ccap, C.int(attr.Type), sig, C.uintptr_t(q.handle))
	if r == nil {
		freeHandle(q.handle)
		return nil, fmt.Errorf("verbs: ibv_create_qp (%+v): %w", attr.Cap, errnoErr(errno))
	}
	q.qp = r
	q.cap = ibv.QPCap{
		MaxSendWR:     uint32(ccap.max_send_wr),
		MaxRecvWR:     uint32(ccap.max_recv_wr),
		MaxSendSGE:    uint32(ccap.max_send_sge),
		MaxRecvSGE:    uint32(ccap.max_recv_sge),
		MaxInlineData: uint32(ccap.max_inline_data),
	}
	sb := int(min(max(q.cap.MaxSendWR, 1), maxPostBatch))
	rb := int(min(max(q.cap.MaxRecvWR, 1), maxPostBatch))
	q.sendIn = cArray[C.struct_tsv_send](sb)
	q.sendSGE = cArray[C.struct_ibv_sge](sb * int(max(q.cap.MaxSendSGE, 1)))
	q.sendWR = unsafe.SliceData(cArray[C.struct_ibv_send_wr](sb))
	q.sendBad = unsafe.SliceData(cArray[C.int](1))
	q.recvIn = cArray[C.struct_tsv_recv](rb)
	q.recvSGE = cArray[C.struct_ibv_sge](rb * int(max(q.cap.MaxRecvSGE, 1)))
	q.recvWR = unsafe.SliceData(cArray[C.struct_ibv_recv_wr](rb))
	q.recvBad = unsafe.SliceData(cArray[C.int](1))
	return q, nil
}

// cArray is n zeroed elements of C memory, freed with cFree.
func cArray[T any](n int) []T {
	var zero T
	return unsafe.Slice((*T)(C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(zero)))), n)
}

func cFree[T any](s []T) { C.free(unsafe.Pointer(unsafe.SliceData(s))) }

// Cap is what ibv_create_qp granted.
func (q *qp) Cap() ibv.QPCap { return q.cap }

func (q *qp) QPNum() uint32 {
	if q.qp == nil {
		return 0
	}
	return uint32(q.qp.qp_num)
}

// State is the QP state as the device reports it now (ibv_query_qp), or the last state
// libibverbs recorded if the query fails.
func (q *qp) State() ibv.QPState {
	if q.qp == nil {
		return ibv.QPSReset
	}
	var attr C.struct_ibv_qp_attr
	var init C.struct_ibv_qp_init_attr
	if C.tsv_query_qp(q.qp, &attr, C.IBV_QP_STATE, &init) == 0 {
		return ibv.QPState(attr.qp_state)
	}
	return ibv.QPState(q.qp.state)
}

// Modify is ibv_modify_qp with the fields of attr named by mask.
func (q *qp) Modify(attr *ibv.QPAttr, mask ibv.QPAttrMask) error {
	if q.qp == nil {
		return fmt.Errorf("verbs: modify qp: %w", ibv.ErrClosed)
	}
	if attr == nil {
		return fmt.Errorf("verbs: modify qp %d: attr: nil: %w", q.QPNum(), ibv.ErrInvalid)
	}
	if mask&ibv.AttrPathMTU != 0 && !attr.PathMTU.Valid() {
		return fmt.Errorf("verbs: modify qp %d: path_mtu: %d is not an IB MTU: %w", q.QPNum(), attr.PathMTU, ibv.ErrInvalid)
	}
	var ca C.struct_ibv_qp_attr
	ca.qp_state = uint32(attr.QPState)
	ca.path_mtu = uint32(attr.PathMTU)
	ca.qp_access_flags = C.uint(attr.QPAccessFlags)
	ca.pkey_index = C.uint16_t(attr.PKeyIndex)
	ca.port_num = C.uint8_t(attr.PortNum)
	ca.dest_qp_num = C.uint32_t(attr.DestQPNum)
	ca.rq_psn = C.uint32_t(attr.RqPSN)
	ca.sq_psn = C.uint32_t(attr.SqPSN)
	ca.max_rd_atomic = C.uint8_t(attr.MaxRdAtomic)
	ca.max_dest_rd_atomic = C.uint8_t(attr.MaxDestRdAtomic)
	ca.min_rnr_timer = C.uint8_t(attr.MinRNRTimer)
	ca.timeout = C.uint8_t(attr.Timeout)
	ca.retry_cnt = C.uint8_t(attr.RetryCnt)
	ca.rnr_retry = C.uint8_t(attr.RnrRetry)
	ah := &attr.AHAttr
	ca.ah_attr.dlid = C.uint16_t(ah.DLID)
	ca.ah_attr.sl = C.uint8_t(ah.SL)
	ca.ah_attr.port_num = C.uint8_t(ah.PortNum)
	if ah.IsGlobal {
		ca.ah_attr.is_global = 1
		ca.ah_attr.grh.dgid = *(*C.union_ibv_gid)(unsafe.Pointer(&ah.DGID))
		ca.ah_attr.grh.sgid_index = C.uint8_t(ah.SGIDIndex)
		ca.ah_attr.grh.hop_limit = C.uint8_t(ah.HopLimit)
		ca.ah_attr.grh.traffic_class = C.uint8_t(ah.TrafficClass)
	}
	if rc, errno := C.tsv_modify_qp(q.qp, &ca, C.int(mask)); rc != 0 {
		return fmt.Errorf("verbs: ibv_modify_qp %d (to %s, mask %#x): %w", q.QPNum(), attr.QPState, uint32(mask), rcErr(rc, errno))
	}
	return nil
}

// queryMask is every attribute Query reports.
const queryMask = C.IBV_QP_STATE | C.IBV_QP_ACCESS_FLAGS | C.IBV_QP_PKEY_INDEX | C.IBV_QP_PORT |
	C.IBV_QP_AV | C.IBV_QP_PATH_MTU | C.IBV_QP_TIMEOUT | C.IBV_QP_RETRY_CNT | C.IBV_QP_RNR_RETRY |
	C.IBV_QP_RQ_PSN | C.IBV_QP_MAX_QP_RD_ATOMIC | C.IBV_QP_MIN_RNR_TIMER | C.IBV_QP_SQ_PSN |
	C.IBV_QP_MAX_DEST_RD_ATOMIC | C.IBV_QP_CAP | C.IBV_QP_DEST_QPN

// Query is ibv_query_qp; the capabilities are those granted at creation.
func (q *qp) Query() (ibv.QPAttr, ibv.QPCap, error) {
	if q.qp == nil {
		return ibv.QPAttr{}, ibv.QPCap{}, fmt.Errorf("verbs: query qp: %w", ibv.ErrClosed)
	}
	var ca C.struct_ibv_qp_attr
	var init C.struct_ibv_qp_init_attr
	if rc, errno := C.tsv_query_qp(q.qp, &ca, queryMask, &init); rc != 0 {
		return ibv.QPAttr{}, ibv.QPCap{}, fmt.Errorf("verbs: ibv_query_qp %d: %w", q.QPNum(), rcErr(rc, errno))
	}
	a := ibv.QPAttr{
		QPState:         ibv.QPState(ca.qp_state),
		PathMTU:         ibv.MTU(ca.path_mtu),
		QPAccessFlags:   ibv.AccessFlags(ca.qp_access_flags),
		PKeyIndex:       uint16(ca.pkey_index),
		PortNum:         uint8(ca.port_num),
		DestQPNum:       uint32(ca.dest_qp_num),
		RqPSN:           uint32(ca.rq_psn),
		SqPSN:           uint32(ca.sq_psn),
		MaxRdAtomic:     uint8(ca.max_rd_atomic),
		MaxDestRdAtomic: uint8(ca.max_dest_rd_atomic),
		MinRNRTimer:     uint8(ca.min_rnr_timer),
		Timeout:         uint8(ca.timeout),
		RetryCnt:        uint8(ca.retry_cnt),
		RnrRetry:        uint8(ca.rnr_retry),
		AHAttr: ibv.AHAttr{
			DLID:         uint16(ca.ah_attr.dlid),
			SL:           uint8(ca.ah_attr.sl),
			IsGlobal:     ca.ah_attr.is_global != 0,
			DGID:         *(*ibv.GID)(unsafe.Pointer(&ca.ah_attr.grh.dgid)),
			SGIDIndex:    uint8(ca.ah_attr.grh.sgid_index),
			HopLimit:     uint8(ca.ah_attr.grh.hop_limit),
			TrafficClass: uint8(ca.ah_attr.grh.traffic_class),
			PortNum:      uint8(ca.ah_attr.port_num),
		},
	}
	return a, q.cap, nil
}

// PostSend is ibv_post_send. The chain is copied into the QP's C arrays (in batches of at
// most maxPostBatch WRs) and posted; nothing is allocated unless it fails.
func (q *qp) PostSend(wr *ibv.SendWR) (*ibv.SendWR, error) {
	if q.qp == nil {
		return wr, fmt.Errorf("verbs: post send: %w", ibv.ErrClosed)
	}
	for wr != nil {
		head, n, nsge := wr, 0, 0
		for wr != nil && n < len(q.sendIn) {
			k := len(wr.SGList)
			if k > int(q.cap.MaxSendSGE) {
				if n == 0 {
					return wr, fmt.Errorf("verbs: post send qp %d: sg_list: %d entries, max_send_sge is %d: %w", q.QPNum(), k, q.cap.MaxSendSGE, ibv.ErrInvalid)
				}
				break // post what is batched; the next round reports this WR
			}
			if nsge+k > len(q.sendSGE) {
				break
			}
			q.sendIn[n] = C.struct_tsv_send{
				wr_id:      C.uint64_t(wr.WRID),
				opcode:     C.uint32_t(wr.Opcode),
				send_flags: C.uint32_t(wr.SendFlags),
				imm_data:   C.uint32_t(wr.ImmData),
				num_sge:    C.uint32_t(k),
			}
			for i, s := range wr.SGList {
				q.sendSGE[nsge+i] = C.struct_ibv_sge{addr: C.uint64_t(s.Addr), length: C.uint32_t(s.Length), lkey: C.uint32_t(s.LKey)}
			}
			n, nsge, wr = n+1, nsge+k, wr.Next
		}
		if rc := C.tsv_post_send(cptr(q.qp), &q.sendIn[0], C.int(n), &q.sendSGE[0], cptr(q.sendWR), q.sendBad); rc != 0 {
			bad := head
			for i := 0; i < int(*q.sendBad) && bad.Next != nil; i++ {
				bad = bad.Next
			}
			return bad, fmt.Errorf("verbs: ibv_post_send qp %d wr %d: %w", q.QPNum(), bad.WRID, syscall.Errno(rc))
		}
	}
	return nil, nil
}

// PostRecv is ibv_post_recv, done like PostSend.
func (q *qp) PostRecv(wr *ibv.RecvWR) (*ibv.RecvWR, error) {
	if q.qp == nil {
		return wr, fmt.Errorf("verbs: post recv: %w", ibv.ErrClosed)
	}
	for wr != nil {
		head, n, nsge := wr, 0, 0
		for wr != nil && n < len(q.recvIn) {
			k := len(wr.SGList)
			if k > int(q.cap.MaxRecvSGE) {
				if n == 0 {
					return wr, fmt.Errorf("verbs: post recv qp %d: sg_list: %d entries, max_recv_sge is %d: %w", q.QPNum(), k, q.cap.MaxRecvSGE, ibv.ErrInvalid)
				}
				break
			}
			if nsge+k > len(q.recvSGE) {
				break
			}
			q.recvIn[n] = C.struct_tsv_recv{wr_id: C.uint64_t(wr.WRID), num_sge: C.uint32_t(k)}
			for i, s := range wr.SGList {
				q.recvSGE[nsge+i] = C.struct_ibv_sge{addr: C.uint64_t(s.Addr), length: C.uint32_t(s.Length), lkey: C.uint32_t(s.LKey)}
			}
			n, nsge, wr = n+1, nsge+k, wr.Next
		}
		if rc := C.tsv_post_recv(cptr(q.qp), &q.recvIn[0], C.int(n), &q.recvSGE[0], cptr(q.recvWR), q.recvBad); rc != 0 {
			bad := head
			for i := 0; i < int(*q.recvBad) && bad.Next != nil; i++ {
				bad = bad.Next
			}
			return bad, fmt.Errorf("verbs: ibv_post_recv qp %d wr %d: %w", q.QPNum(), bad.WRID, syscall.Errno(rc))
		}
	}
	return nil, nil
}

// Destroy is ibv_destroy_qp. It refuses with ibv.ErrBusy while async events on the QP are
// unacknowledged, where libibverbs would block forever.
func (q *qp) Destroy() error {
	if q.qp == nil {
		return fmt.Errorf("verbs: destroy qp: %w", ibv.ErrClosed)
	}
	if a := q.asyncEvents.Load(); a > 0 {
		return fmt.Errorf("verbs: destroy qp %d: %d async events unacknowledged: %w", q.QPNum(), a, ibv.ErrBusy)
	}
	if rc, errno := C.tsv_destroy_qp(q.qp); rc != 0 {
		return fmt.Errorf("verbs: ibv_destroy_qp %d: %w", q.QPNum(), rcErr(rc, errno))
	}
	q.qp = nil
	freeHandle(q.handle)
	cFree(q.sendIn)
	cFree(q.sendSGE)
	C.free(unsafe.Pointer(q.sendWR))
	C.free(unsafe.Pointer(q.sendBad))
	cFree(q.recvIn)
	cFree(q.recvSGE)
	C.free(unsafe.Pointer(q.recvWR))
	C.free(unsafe.Pointer(q.recvBad))
	q.sendIn, q.sendSGE, q.recvIn, q.recvSGE = nil, nil, nil, nil
	return nil
}
