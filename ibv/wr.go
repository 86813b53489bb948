package ibv

import "fmt"

// SGE is struct ibv_sge: a byte range inside a registered MR. Addr is the address of the
// first byte (for a Go buffer, MR.Addr() plus an offset).
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// WROpcode is enum ibv_wr_opcode. twosided uses the two-sided opcodes only.
type WROpcode uint8

// Work request opcodes, with libibverbs' values.
const (
	WRRDMAWrite        WROpcode = 0
	WRRDMAWriteWithImm WROpcode = 1
	WRSend             WROpcode = 2
	WRSendWithImm      WROpcode = 3
	WRRDMARead         WROpcode = 4
)

func (o WROpcode) String() string {
	switch o {
	case WRRDMAWrite:
		return "RDMA_WRITE"
	case WRRDMAWriteWithImm:
		return "RDMA_WRITE_WITH_IMM"
	case WRSend:
		return "SEND"
	case WRSendWithImm:
		return "SEND_WITH_IMM"
	case WRRDMARead:
		return "RDMA_READ"
	}
	return fmt.Sprintf("WROpcode(%d)", uint8(o))
}

// SendFlags is enum ibv_send_flags.
type SendFlags uint32

// Send flags.
const (
	SendFence     SendFlags = 1 << 0
	SendSignaled  SendFlags = 1 << 1
	SendSolicited SendFlags = 1 << 2
	SendInline    SendFlags = 1 << 3
)

// SendWR is struct ibv_send_wr. Next chains WRs as in libibverbs; PostSend stops at the
// first one it cannot post and returns it.
type SendWR struct {
	WRID      uint64
	Next      *SendWR
	SGList    []SGE
	Opcode    WROpcode
	SendFlags SendFlags
	ImmData   uint32 // host order; carried when Opcode is WRSendWithImm
}

// RecvWR is struct ibv_recv_wr.
type RecvWR struct {
	WRID   uint64
	Next   *RecvWR
	SGList []SGE
}

// WCOpcode is enum ibv_wc_opcode.
type WCOpcode uint8

// Work completion opcodes, with libibverbs' values.
const (
	WCSend            WCOpcode = 0
	WCRDMAWrite       WCOpcode = 1
	WCRDMARead        WCOpcode = 2
	WCCompSwap        WCOpcode = 3
	WCFetchAdd        WCOpcode = 4
	WCBindMW          WCOpcode = 5
	WCRecv            WCOpcode = 128
	WCRecvRDMAWithImm WCOpcode = 129
)

func (o WCOpcode) String() string {
	switch o {
	case WCSend:
		return "SEND"
	case WCRDMAWrite:
		return "RDMA_WRITE"
	case WCRDMARead:
		return "RDMA_READ"
	case WCCompSwap:
		return "COMP_SWAP"
	case WCFetchAdd:
		return "FETCH_ADD"
	case WCBindMW:
		return "BIND_MW"
	case WCRecv:
		return "RECV"
	case WCRecvRDMAWithImm:
		return "RECV_RDMA_WITH_IMM"
	}
	return fmt.Sprintf("WCOpcode(%d)", uint8(o))
}

// WCFlags is enum ibv_wc_flags.
type WCFlags uint32

// Work completion flags.
const (
	WCGRH     WCFlags = 1 << 0
	WCWithImm WCFlags = 1 << 1
)

// WC is struct ibv_wc. On an error status only WRID, Status, QPNum and VendorErr are valid,
// as with hardware.
type WC struct {
	WRID      uint64
	Status    WCStatus
	Opcode    WCOpcode
	VendorErr uint32
	ByteLen   uint32
	ImmData   uint32
	QPNum     uint32
	SrcQP     uint32
	WCFlags   WCFlags
}

// WCStatus is enum ibv_wc_status.
type WCStatus uint8

// Every ibv_wc_status value, in libibverbs' order.
const (
	WCSuccess WCStatus = iota
	WCLocLenErr
	WCLocQPOpErr
	WCLocEECOpErr
	WCLocProtErr
	WCWRFlushErr
	WCMWBindErr
	WCBadRespErr
	WCLocAccessErr
	WCRemInvReqErr
	WCRemAccessErr
	WCRemOpErr
	WCRetryExcErr
	WCRNRRetryExcErr
	WCLocRDDViolErr
	WCRemInvRDReqErr
	WCRemAbortErr
	WCInvEECNErr
	WCInvEECStateErr
	WCFatalErr
	WCRespTimeoutErr
	WCGeneralErr
	WCTMErr
	WCTMRndvIncomplete
)

var wcStatusStr = [...]string{
	WCSuccess:          "success",
	WCLocLenErr:        "local length error",
	WCLocQPOpErr:       "local QP operation error",
	WCLocEECOpErr:      "local EE context operation error",
	WCLocProtErr:       "local protection error",
	WCWRFlushErr:       "Work Request Flushed Error",
	WCMWBindErr:        "memory management operation error",
	WCBadRespErr:       "bad response error",
	WCLocAccessErr:     "local access error",
	WCRemInvReqErr:     "remote invalid request error",
	WCRemAccessErr:     "remote access error",
	WCRemOpErr:         "remote operation error",
	WCRetryExcErr:      "transport retry counter exceeded",
	WCRNRRetryExcErr:   "RNR retry counter exceeded",
	WCLocRDDViolErr:    "local RDD violation error",
	WCRemInvRDReqErr:   "remote invalid RD request",
	WCRemAbortErr:      "aborted error",
	WCInvEECNErr:       "invalid EE context number",
	WCInvEECStateErr:   "invalid EE context state",
	WCFatalErr:         "fatal error",
	WCRespTimeoutErr:   "response timeout error",
	WCGeneralErr:       "general error",
	WCTMErr:            "TM error",
	WCTMRndvIncomplete: "TM software rendezvous",
}

// String is ibv_wc_status_str.
func (s WCStatus) String() string {
	if int(s) < len(wcStatusStr) {
		return wcStatusStr[s]
	}
	return fmt.Sprintf("unknown WC status %d", uint8(s))
}

// Name is the enum constant's name, e.g. "IBV_WC_RNR_RETRY_EXC_ERR".
func (s WCStatus) Name() string {
	names := [...]string{"SUCCESS", "LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_EEC_OP_ERR",
		"LOC_PROT_ERR", "WR_FLUSH_ERR", "MW_BIND_ERR", "BAD_RESP_ERR", "LOC_ACCESS_ERR",
		"REM_INV_REQ_ERR", "REM_ACCESS_ERR", "REM_OP_ERR", "RETRY_EXC_ERR",
		"RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR", "REM_INV_RD_REQ_ERR", "REM_ABORT_ERR",
		"INV_EECN_ERR", "INV_EEC_STATE_ERR", "FATAL_ERR", "RESP_TIMEOUT_ERR", "GENERAL_ERR",
		"TM_ERR", "TM_RNDV_INCOMPLETE"}
	if int(s) < len(names) {
		return "IBV_WC_" + names[s]
	}
	return fmt.Sprintf("IBV_WC_%d", uint8(s))
}

// WCError is the error a consumer builds from a failed WC; errors.Is matches the status.
type WCError struct {
	Status WCStatus
	WRID   uint64
	QPNum  uint32
}

func (e *WCError) Error() string {
	return fmt.Sprintf("ibv: qp %d wr %d: %s (%s)", e.QPNum, e.WRID, e.Status, e.Status.Name())
}

// Is matches another *WCError with the same status.
func (e *WCError) Is(target error) bool {
	t, ok := target.(*WCError)
	return ok && t.Status == e.Status && t.WRID == 0 && t.QPNum == 0
}

// Err is the WC's error, or nil on success.
func (wc *WC) Err() error {
	if wc.Status == WCSuccess {
		return nil
	}
	return &WCError{Status: wc.Status, WRID: wc.WRID, QPNum: wc.QPNum}
}
