//go:build rdma

package verbs

/*
#include "shim.h"
*/
import "C"

import "github.com/twosided/twosided/ibv"

// abiPair is one ibv constant and the libibverbs value it must equal: the provider casts
// between them without translation tables.
type abiPair struct {
	name  string
	goVal uint64
	cVal  uint64
}

// abiPairs lists every constant the provider passes to or reads from libibverbs unchanged.
func abiPairs() []abiPair {
	return []abiPair{
		{"IBV_MTU_256", uint64(ibv.MTU256), C.IBV_MTU_256},
		{"IBV_MTU_4096", uint64(ibv.MTU4096), C.IBV_MTU_4096},
		{"IBV_PORT_ACTIVE", uint64(ibv.PortActive), C.IBV_PORT_ACTIVE},
		{"IBV_PORT_ACTIVE_DEFER", uint64(ibv.PortActiveDefer), C.IBV_PORT_ACTIVE_DEFER},
		{"IBV_ACCESS_LOCAL_WRITE", uint64(ibv.AccessLocalWrite), C.IBV_ACCESS_LOCAL_WRITE},
		{"IBV_ACCESS_REMOTE_WRITE", uint64(ibv.AccessRemoteWrite), C.IBV_ACCESS_REMOTE_WRITE},
		{"IBV_ACCESS_REMOTE_READ", uint64(ibv.AccessRemoteRead), C.IBV_ACCESS_REMOTE_READ},
		{"IBV_ACCESS_REMOTE_ATOMIC", uint64(ibv.AccessRemoteAtomic), C.IBV_ACCESS_REMOTE_ATOMIC},
		{"IBV_QPT_RC", uint64(ibv.QPTypeRC), C.IBV_QPT_RC},
		{"IBV_QPT_UD", uint64(ibv.QPTypeUD), C.IBV_QPT_UD},
		{"IBV_QPS_RESET", uint64(ibv.QPSReset), C.IBV_QPS_RESET},
		{"IBV_QPS_RTS", uint64(ibv.QPSRTS), C.IBV_QPS_RTS},
		{"IBV_QPS_ERR", uint64(ibv.QPSErr), C.IBV_QPS_ERR},
		{"IBV_QP_STATE", uint64(ibv.AttrState), C.IBV_QP_STATE},
		{"IBV_QP_ACCESS_FLAGS", uint64(ibv.AttrAccessFlags), C.IBV_QP_ACCESS_FLAGS},
		{"IBV_QP_AV", uint64(ibv.AttrAV), C.IBV_QP_AV},
		{"IBV_QP_PATH_MTU", uint64(ibv.AttrPathMTU), C.IBV_QP_PATH_MTU},
		{"IBV_QP_MIN_RNR_TIMER", uint64(ibv.AttrMinRNRTimer), C.IBV_QP_MIN_RNR_TIMER},
		{"IBV_QP_SQ_PSN", uint64(ibv.AttrSqPSN), C.IBV_QP_SQ_PSN},
		{"IBV_QP_MAX_DEST_RD_ATOMIC", uint64(ibv.AttrMaxDestRdAtomic), C.IBV_QP_MAX_DEST_RD_ATOMIC},
		{"IBV_QP_DEST_QPN", uint64(ibv.AttrDestQPN), C.IBV_QP_DEST_QPN},
		{"IBV_WR_RDMA_WRITE", uint64(ibv.WRRDMAWrite), C.IBV_WR_RDMA_WRITE},
		{"IBV_WR_SEND", uint64(ibv.WRSend), C.IBV_WR_SEND},
		{"IBV_WR_SEND_WITH_IMM", uint64(ibv.WRSendWithImm), C.IBV_WR_SEND_WITH_IMM},
		{"IBV_WR_RDMA_READ", uint64(ibv.WRRDMARead), C.IBV_WR_RDMA_READ},
		{"IBV_SEND_FENCE", uint64(ibv.SendFence), C.IBV_SEND_FENCE},
		{"IBV_SEND_SIGNALED", uint64(ibv.SendSignaled), C.IBV_SEND_SIGNALED},
		{"IBV_SEND_SOLICITED", uint64(ibv.SendSolicited), C.IBV_SEND_SOLICITED},
		{"IBV_SEND_INLINE", uint64(ibv.SendInline), C.IBV_SEND_INLINE},
		{"IBV_WC_SEND", uint64(ibv.WCSend), C.IBV_WC_SEND},
		{"IBV_WC_BIND_MW", uint64(ibv.WCBindMW), C.IBV_WC_BIND_MW},
		{"IBV_WC_RECV", uint64(ibv.WCRecv), C.IBV_WC_RECV},
		{"IBV_WC_RECV_RDMA_WITH_IMM", uint64(ibv.WCRecvRDMAWithImm), C.IBV_WC_RECV_RDMA_WITH_IMM},
		{"IBV_WC_GRH", uint64(ibv.WCGRH), C.IBV_WC_GRH},
		{"IBV_WC_WITH_IMM", uint64(ibv.WCWithImm), C.IBV_WC_WITH_IMM},
		{"IBV_WC_WR_FLUSH_ERR", uint64(ibv.WCWRFlushErr), C.IBV_WC_WR_FLUSH_ERR},
		{"IBV_WC_RNR_RETRY_EXC_ERR", uint64(ibv.WCRNRRetryExcErr), C.IBV_WC_RNR_RETRY_EXC_ERR},
		{"IBV_WC_TM_RNDV_INCOMPLETE", uint64(ibv.WCTMRndvIncomplete), C.IBV_WC_TM_RNDV_INCOMPLETE},
		{"IBV_EVENT_QP_FATAL", uint64(ibv.EventQPFatal), C.IBV_EVENT_QP_FATAL},
		{"IBV_EVENT_DEVICE_FATAL", uint64(ibv.EventDeviceFatal), C.IBV_EVENT_DEVICE_FATAL},
		{"IBV_EVENT_SRQ_ERR", uint64(ibv.EventSRQErr), C.IBV_EVENT_SRQ_ERR},
		{"IBV_EVENT_GID_CHANGE", uint64(ibv.EventGIDChange), C.IBV_EVENT_GID_CHANGE},
		{"IBV_GID_TYPE_ROCE_V2", uint64(gidTypeRoCEv2), C.IBV_GID_TYPE_ROCE_V2},
		{"IBV_GID_TYPE_IB", uint64(gidTypeIB), C.IBV_GID_TYPE_IB},
		{"IBV_GID_TYPE_ROCE_V1", uint64(gidTypeRoCEv1), C.IBV_GID_TYPE_ROCE_V1},
	}
}
