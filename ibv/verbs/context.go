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

	"github.com/twosided/twosided/ibv"
)

// deviceContext is ibv.Context over struct ibv_context.
type deviceContext struct {
	ctx  *C.struct_ibv_context
	info ibv.DeviceInfo

	cqs atomic.Uint64 // CQs created: the i-th goes to completion vector i % num_comp_vectors

	asyncMu  sync.Mutex
	asyncRaw *C.struct_ibv_async_event // Go memory without Go pointers, reused per event
	asyncOut *C.struct_tsv_async
}

var _ ibv.Context = (*deviceContext)(nil)

func (c *deviceContext) Device() ibv.DeviceInfo { return c.info }

// nextCompVector spreads CQs over the device's completion vectors, round robin (as
// Mooncake's RdmaContext does), so that their interrupts do not all land on one core.
func (c *deviceContext) nextCompVector() int {
	return compVector(c.cqs.Add(1)-1, int(C.tsv_num_comp_vectors(c.ctx)))
}

// compVector is the vector of the i-th CQ (from 0) of a device with n completion vectors.
func compVector(i uint64, n int) int {
	if n <= 1 {
		return 0
	}
	return int(i % uint64(n))
}

func (c *deviceContext) QueryPort(port uint8) (ibv.PortAttr, error) {
	if c.ctx == nil {
		return ibv.PortAttr{}, fmt.Errorf("verbs: query port %d: %w", port, ibv.ErrClosed)
	}
	pa, err := queryPort(c.ctx, port, queryGIDTable(c.ctx))
	if err != nil {
		return ibv.PortAttr{}, fmt.Errorf("verbs: %s: %w", c.info.Name, err)
	}
	return pa, nil
}

func (c *deviceContext) AllocPD() (ibv.PD, error) {
	if c.ctx == nil {
		return nil, fmt.Errorf("verbs: alloc pd: %w", ibv.ErrClosed)
	}
	p, errno := C.tsv_alloc_pd(c.ctx)
	if p == nil {
		return nil, fmt.Errorf("verbs: %s: ibv_alloc_pd: %w", c.info.Name, errnoErr(errno))
	}
	return &pd{ctx: c, pd: p}, nil
}

// CreateCompChannel is ibv_create_comp_channel; its fd is made non-blocking, so GetEvent
// returns ibv.ErrWouldBlock instead of waiting.
func (c *deviceContext) CreateCompChannel() (ibv.CompChannel, error) {
	if c.ctx == nil {
		return nil, fmt.Errorf("verbs: create comp channel: %w", ibv.ErrClosed)
	}
	ch, errno := C.tsv_create_comp_channel(c.ctx)
	if ch == nil {
		return nil, fmt.Errorf("verbs: %s: ibv_create_comp_channel: %w", c.info.Name, errnoErr(errno))
	}
	if rc := C.tsv_set_nonblock(ch.fd); rc != 0 {
		C.tsv_destroy_comp_channel(ch)
		return nil, fmt.Errorf("verbs: %s: comp channel fd O_NONBLOCK: %w", c.info.Name, syscall.Errno(rc))
	}
	ev := (*C.struct_tsv_cq_event)(C.calloc(1, C.sizeof_struct_tsv_cq_event))
	if ev == nil {
		C.tsv_destroy_comp_channel(ch)
		return nil, fmt.Errorf("verbs: %s: comp channel: event buffer: %w", c.info.Name, syscall.ENOMEM)
	}
	return &compChannel{ctx: c, ch: ch, ev: ev}, nil
}

func (c *deviceContext) CreateCQ(cqe int, ch ibv.CompChannel) (ibv.CQ, error) {
	if c.ctx == nil {
		return nil, fmt.Errorf("verbs: create cq: %w", ibv.ErrClosed)
	}
	if cqe <= 0 {
		return nil, fmt.Errorf("verbs: create cq: cqe %d: must be positive: %w", cqe, ibv.ErrInvalid)
	}
	var cch *compChannel
	if ch != nil {
		var ok bool
		if cch, ok = ch.(*compChannel); !ok || cch.ch == nil {
			return nil, fmt.Errorf("verbs: create cq: channel: not an open verbs comp channel: %w", ibv.ErrInvalid)
		}
	}
	return newCQ(c, cqe, cch)
}

func (c *deviceContext) AsyncFd() int {
	if c.ctx == nil {
		return -1
	}
	return int(c.ctx.async_fd)
}

// GetAsyncEvent is a non-blocking ibv_get_async_event. An event on a QP or CQ counts
// against that object until AckAsyncEvent: libibverbs' destroy would otherwise wait for it.
func (c *deviceContext) GetAsyncEvent() (ibv.AsyncEvent, error) {
	if c.ctx == nil {
		return ibv.AsyncEvent{}, fmt.Errorf("verbs: get async event: %w", ibv.ErrClosed)
	}
	c.asyncMu.Lock()
	defer c.asyncMu.Unlock()
	rc := C.tsv_get_async(c.ctx, c.asyncRaw, c.asyncOut)
	if rc == C.EAGAIN {
		return ibv.AsyncEvent{}, ibv.ErrWouldBlock
	}
	if rc != 0 {
		return ibv.AsyncEvent{}, fmt.Errorf("verbs: %s: ibv_get_async_event: %w", c.info.Name, syscall.Errno(rc))
	}
	out := c.asyncOut
	ev := ibv.AsyncEvent{Type: ibv.AsyncEventType(out._type)}
	switch out.kind {
	case C.TSV_ELEM_CQ:
		if q, ok := lookupHandle(uintptr(out.handle)).(*cq); ok {
			q.asyncEvents.Add(1)
			ev.CQ = q
		} else {
			C.tsv_ack_async_raw(c.asyncRaw)
		}
	case C.TSV_ELEM_QP:
		if q, ok := lookupHandle(uintptr(out.handle)).(*qp); ok {
			q.asyncEvents.Add(1)
			ev.QP = q
		} else {
			C.tsv_ack_async_raw(c.asyncRaw)
		}
	case C.TSV_ELEM_PORT:
		ev.Port = uint8(out.port)
	}
	return ev, nil
}

func (c *deviceContext) AckAsyncEvent(ev ibv.AsyncEvent) {
	switch {
	case ev.QP != nil:
		if q, ok := ev.QP.(*qp); ok && q.qp != nil && q.asyncEvents.Load() > 0 {
			C.tsv_ack_async_qp(q.qp, C.int(ev.Type))
			q.asyncEvents.Add(-1)
		}
	case ev.CQ != nil:
		if q, ok := ev.CQ.(*cq); ok && q.cq != nil && q.asyncEvents.Load() > 0 {
			C.tsv_ack_async_cq(q.cq, C.int(ev.Type))
			q.asyncEvents.Add(-1)
		}
	}
}

// Close is ibv_close_device. Every object created from the context must be destroyed first.
func (c *deviceContext) Close() error {
	if c.ctx == nil {
		return fmt.Errorf("verbs: close %s: %w", c.info.Name, ibv.ErrClosed)
	}
	if rc, errno := C.tsv_close_device(c.ctx); rc != 0 {
		return fmt.Errorf("verbs: %s: ibv_close_device: %w", c.info.Name, rcErr(rc, errno))
	}
	c.ctx = nil
	return nil
}

// tsvNumCompVectors is the context's num_comp_vectors.
func tsvNumCompVectors(c *deviceContext) int { return int(C.tsv_num_comp_vectors(c.ctx)) }
