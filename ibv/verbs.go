package ibv

import (
	"errors"
	"fmt"
	"syscall"
)

// Errors. Providers wrap these with context (which call, which object, why); callers test
// them with errors.Is. The errno-valued ones match what libibverbs returns.
var (
	// ErrWouldBlock: a non-blocking GetEvent/GetAsyncEvent found nothing (EAGAIN).
	ErrWouldBlock error = syscall.EAGAIN
	// ErrNoMem: a queue is full (post beyond max_send_wr/max_recv_wr) or a resource limit (ENOMEM).
	ErrNoMem error = syscall.ENOMEM
	// ErrInvalid: bad argument or an operation in the wrong QP state (EINVAL).
	ErrInvalid error = syscall.EINVAL
	// ErrBusy: destroying an object still in use, e.g. a CQ with unacked events (EBUSY).
	ErrBusy error = syscall.EBUSY
	// ErrNoDevice: no RDMA device exists, or none with an active port.
	ErrNoDevice = errors.New("no RDMA device")
	// ErrNoProvider: no provider of that name is registered.
	ErrNoProvider = errors.New("no such ibv provider")
	// ErrClosed: the object or its context was closed or destroyed.
	ErrClosed = errors.New("ibv: closed")
)

// Provider is one implementation of the verbs API.
type Provider interface {
	// Name is the provider's name: "soft" or "verbs".
	Name() string
	// GetDeviceList is ibv_get_device_list + ibv_query_device/port for every device.
	// A provider without devices returns an error wrapping ErrNoDevice.
	GetDeviceList() ([]DeviceInfo, error)
	// Open is ibv_open_device on the device of that name.
	Open(name string) (Context, error)
}

// ForkIniter is a provider that can make registered memory safe across fork()
// (ibv_fork_init). It must be called before any memory is registered.
type ForkIniter interface {
	ForkInit() error
}

// Context is struct ibv_context: an open device.
type Context interface {
	Device() DeviceInfo
	QueryPort(port uint8) (PortAttr, error)
	AllocPD() (PD, error)
	CreateCompChannel() (CompChannel, error)
	// CreateCQ is ibv_create_cq with cqe entries; ch may be nil (no events).
	CreateCQ(cqe int, ch CompChannel) (CQ, error)
	// AsyncFd is the async event fd (non-blocking), for the reactor's epoll set.
	AsyncFd() int
	// GetAsyncEvent is a non-blocking ibv_get_async_event: ErrWouldBlock when none.
	GetAsyncEvent() (AsyncEvent, error)
	// AckAsyncEvent is ibv_ack_async_event.
	AckAsyncEvent(ev AsyncEvent)
	Close() error
}

// PD is struct ibv_pd.
type PD interface {
	// RegMR registers buf (caller memory, kept alive by the MR until Dereg).
	RegMR(buf []byte, access AccessFlags) (MR, error)
	CreateQP(attr QPInitAttr) (QP, error)
	Dealloc() error
}

// MR is struct ibv_mr.
type MR interface {
	LKey() uint32
	RKey() uint32
	// Addr is the address of the first byte, for SGE.Addr.
	Addr() uint64
	Len() int
	Access() AccessFlags
	// Buf is the registered memory.
	Buf() []byte
	Dereg() error
}

// CompChannel is struct ibv_comp_channel: a non-blocking fd that becomes readable when an
// armed CQ attached to it gets a new completion.
type CompChannel interface {
	Fd() int
	// GetEvent is a non-blocking ibv_get_cq_event: the CQ that fired, or ErrWouldBlock.
	// Every event must be acknowledged with CQ.AckEvents before the CQ is destroyed.
	GetEvent() (CQ, error)
	Close() error
}

// CQ is struct ibv_cq.
type CQ interface {
	// Poll is ibv_poll_cq into wcs; it returns how many were filled. It allocates nothing.
	Poll(wcs []WC) (int, error)
	// ReqNotify is ibv_req_notify_cq: arm once; the next new CQE (a solicited one when
	// solicitedOnly) makes the channel readable, then the CQ is disarmed.
	ReqNotify(solicitedOnly bool) error
	// AckEvents is ibv_ack_cq_events: acknowledges n events got from the channel.
	AckEvents(n int)
	// CQE is the CQ's capacity.
	CQE() int
	Channel() CompChannel
	Destroy() error
}

// QP is struct ibv_qp (RC).
type QP interface {
	QPNum() uint32
	State() QPState
	// Modify is ibv_modify_qp: applies the fields of attr named by mask.
	Modify(attr *QPAttr, mask QPAttrMask) error
	// Query returns the current attributes and the capabilities granted at creation
	// (ibv_query_qp; some drivers refuse it in RESET).
	Query() (QPAttr, QPCap, error)
	// Cap is the capabilities ibv_create_qp granted (what it wrote back into the init
	// attributes), without a query.
	Cap() QPCap
	// PostSend is ibv_post_send. On error bad is the first WR not posted.
	PostSend(wr *SendWR) (bad *SendWR, err error)
	// PostRecv is ibv_post_recv. On error bad is the first WR not posted.
	PostRecv(wr *RecvWR) (bad *RecvWR, err error)
	Destroy() error
}

// AsyncEventType is enum ibv_event_type.
type AsyncEventType uint8

// Async event types, with libibverbs' values.
const (
	EventCQErr AsyncEventType = iota
	EventQPFatal
	EventQPReqErr
	EventQPAccessErr
	EventCommEst
	EventSQDrained
	EventPathMig
	EventPathMigErr
	EventDeviceFatal
	EventPortActive
	EventPortErr
	EventLIDChange
	EventPKeyChange
	EventSMChange
	EventSRQErr
	EventSRQLimitReached
	EventQPLastWQEReached
	EventClientReregister
	EventGIDChange
)

var asyncEventStr = [...]string{"CQ error", "local work queue catastrophic error",
	"invalid request local work queue error", "local access violation work queue error",
	"communication established", "send queue drained", "path migrated",
	"path migration request error", "local catastrophic error", "port active",
	"port error", "LID change", "P_Key change", "SM change", "SRQ catastrophic error",
	"SRQ limit reached", "last WQE reached", "client reregistration", "GID table change"}

// String is ibv_event_type_str.
func (t AsyncEventType) String() string {
	if int(t) < len(asyncEventStr) {
		return asyncEventStr[t]
	}
	return fmt.Sprintf("unknown async event %d", uint8(t))
}

// AsyncEvent is struct ibv_async_event. One of QP, CQ or Port is set, by type.
type AsyncEvent struct {
	Type AsyncEventType
	QP   QP
	CQ   CQ
	Port uint8
}
