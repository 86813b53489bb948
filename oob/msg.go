package oob

import (
	"encoding/base64"
	"fmt"
	"net/netip"
	"strconv"
	"unicode/utf8"
)

// NotifyRequest is one notify. Every field but Name and Msg is a twosided extension,
// optional (""/0 = absent) and sent to twosided peers only; they let the receiver drop
// duplicates across paths and check who sends.
//
// On the receiving side the *NotifyRequest is reused after HandleNotify returns; its Msg
// (a fresh slice per request) and strings may be kept.
type NotifyRequest struct {
	Name                string
	Msg                 []byte
	From                string // ts_from: the sender's listen host:port, at most MaxFromLen bytes
	Session, Epoch, Seq uint64 // ts_session, ts_epoch, ts_seq
	// Token (ts_token) is the per-pair secret of the handshake that set up this pair.
	Token uint64
	// To (ts_to) is the session the sender believes the receiver runs; 0 = unknown.
	To uint64
	// ID (ts_nid) is the caller's idempotency id, at most MaxNotifyIDLen bytes.
	ID string
	// SkipFrom, SkipCount (ts_skip_from, ts_skip_n): the sender gave up seqs
	// SkipFrom..SkipFrom+SkipCount-1 of this pair, so the receiver waits for none of them.
	SkipFrom, SkipCount uint64
}

// Bounds of the variable-length twosided notify members.
const (
	MaxNotifyIDLen = 255 // NotifyRequest.ID (ts_nid), bytes
	MaxFromLen     = 255 // NotifyRequest.From (ts_from), bytes
)

// HandshakeDesc is the handshake RPC body (type Connection): Mooncake's fields, the
// ctrl-channel additions and the twosided extensions (ts_*, zero = absent).
type HandshakeDesc struct {
	LocalNICPath, PeerNICPath string
	QPNum                     []uint32
	LocalLID                  uint16
	LocalGID                  string
	ReplyMsg                  string

	CtrlChannel   bool
	NotifyQPNum   uint32
	NotifyRQDepth uint16

	// twosided extensions (ts_*), zero = absent
	MTU        uint32
	PSN        uint32
	Session    uint64
	Epoch      uint64
	BufSize    uint32
	Extensions bool
	PeerName   string
	// Token (ts_token) is the per-pair secret the initiator draws; the responder checks it
	// on later requests of that pair (NotifyRequest.Token).
	Token uint64
	// Refuse (ts_refuse) is the typed reason of a refusal reply, one of the Refuse*
	// codes; ReplyMsg still carries text for Mooncake readers.
	Refuse string
	// RefuseCause (ts_refuse_cause) says, beside Refuse, what made the responder refuse
	// when the code alone does not: CauseDevice. A peer that does not know the member
	// skips it and acts on Refuse as before. "" = not said.
	RefuseCause string
	// To (ts_to) is the session the initiator believes it talks to; 0 = unknown.
	To uint64
	// Proof (ts_proof) is the token the responder issued the initiator in an earlier
	// handshake of the pair: a handshake claiming a session the responder knows must
	// carry it. 0 = none.
	Proof uint64
	// Fresh (ts_fresh), in a reply that carries a token (an accepting one, or a refusal
	// that keeps the responder's entry: superseded, a channel limit): the responder's state
	// for the initiator's session holds nothing of the pair, so its sequence space toward
	// the initiator and its receive window both start at 1. An initiator that kept its own
	// state (the responder forgot an idle pair) starts the pair over, or each side's seqs
	// would land in a window expecting others.
	Fresh bool
	// MaxNotify (ts_max_notify) is the largest name+msg the sender of this message
	// delivers (its max_notify_size): the other side refuses a larger notify itself,
	// before it is sent, instead of having it refused on arrival. 0 = not said.
	MaxNotify uint32
	// Remote is the address a request came from, set by the Node for its Handler; it is
	// not on the wire (zero in what a client sends or gets).
	Remote netip.Addr
}

// stripExtensions leaves what a Mooncake peer reads: its own members and the ctrl-channel
// additions. A refusal keeps its reason as reply_msg text.
func (d *HandshakeDesc) stripExtensions() {
	if d.Refuse != "" && d.ReplyMsg == "" {
		d.ReplyMsg = d.Refuse
	}
	d.MTU, d.PSN, d.Session, d.Epoch, d.BufSize, d.Extensions, d.PeerName = 0, 0, 0, 0, 0, false, ""
	d.Token, d.Refuse, d.To, d.Proof, d.Fresh, d.MaxNotify = 0, "", 0, 0, false, 0
	d.RefuseCause = ""
}

// JSON member names.
const (
	fName       = "name"
	fNotifyMsg  = "notify_msg"
	fMsgB64     = "ts_msg_b64"
	fFrom       = "ts_from"
	fSession    = "ts_session"
	fEpoch      = "ts_epoch"
	fSeq        = "ts_seq"
	fID         = "ts_id"
	fHello      = "ts_hello"
	fError      = "ts_error"
	fLocalNIC   = "local_nic_path"
	fPeerNIC    = "peer_nic_path"
	fQPNum      = "qp_num"
	fLocalLID   = "local_lid"
	fLocalGID   = "local_gid"
	fReplyMsg   = "reply_msg"
	fCtrl       = "ctrl_channel"
	fNotifyQPN  = "notify_qp_num"
	fNotifyRQD  = "notify_rq_depth"
	fMTU        = "ts_mtu"
	fPSN        = "ts_psn"
	fBufSize    = "ts_buf_size"
	fExtensions = "ts_extensions"
	fPeer       = "ts_peer"
	fToken      = "ts_token"
	fRefuse     = "ts_refuse"
	fCause      = "ts_refuse_cause"
	fTo         = "ts_to"
	fProof      = "ts_proof"
	fFresh      = "ts_fresh"
	fNID        = "ts_nid"
	fSkipFrom   = "ts_skip_from"
	fSkipN      = "ts_skip_n"
	fMaxFrame   = "ts_max_frame"
	fBye        = "ts_bye"
	fMaxNotify  = "ts_max_notify"
	fCompact    = "ts_compact"

	replySuccess = "success"
	helloVersion = 1
	maxPSN       = 1<<24 - 1
)

// reqMeta is what every twosided request or reply may carry besides its body.
type reqMeta struct {
	id       uint64
	hasID    bool
	twosided bool // saw any ts_* member
	old      bool // the request had no type byte (TypeOldProtocol): so has its reply
	compact  bool // the request was a compact Notify (TypeNotifyCompact): so is its reply
}

// appendNotifyRequest writes a Notify frame. twosided adds the ts_* members, and base64
// for a Msg that is not UTF-8 or that escaping would make longer than base64 does (see
// msgAsBase64); a Mooncake peer gets exactly name and notify_msg.
func appendNotifyRequest(dst []byte, req *NotifyRequest, m reqMeta, twosided bool) []byte {
	dst, at := beginFrame(dst, TypeNotify)
	o := jsonObj{b: append(dst, '{')}
	o.str(fName, req.Name)
	if twosided && msgAsBase64(req.Msg) {
		o.str(fNotifyMsg, "")
		o.key(fMsgB64)
		o.b = append(o.b, '"')
		o.b = base64.StdEncoding.AppendEncode(o.b, req.Msg)
		o.b = append(o.b, '"')
	} else {
		o.bytes(fNotifyMsg, req.Msg)
	}
	if twosided {
		if m.hasID {
			o.uint(fID, m.id)
		}
		o.optStr(fFrom, req.From)
		o.optUint(fSession, req.Session)
		o.optUint(fEpoch, req.Epoch)
		o.optUint(fSeq, req.Seq)
		o.optUint(fToken, req.Token)
		o.optUint(fTo, req.To)
		o.optStr(fNID, req.ID)
		if req.SkipCount != 0 {
			o.uint(fSkipFrom, req.SkipFrom)
			o.uint(fSkipN, req.SkipCount)
		}
	}
	return finishFrame(append(o.b, '}'), at)
}

// b64Overhead is what the base64 form adds besides the encoded msg: notify_msg's empty
// string, a comma and the ts_msg_b64 key (`"",` and `"ts_msg_b64":`).
const b64Overhead = len(`"",`) + len(`"`+fMsgB64+`":`)

// msgAsBase64 reports whether a twosided peer gets msg as ts_msg_b64: when it is not
// UTF-8 (JSON strings carry text), or when its JSON escaping would be longer than base64's
// 4 bytes per 3 (a control byte takes 6 bytes escaped, a quote or a newline 2). So a
// notify's encoded msg is never above a third more than its bytes, plus a few: one of the
// notify size limit fits the peer's frame limit for a notify (NotifyFrameLimit) whatever
// its bytes.
func msgAsBase64(msg []byte) bool {
	if !utf8.Valid(msg) {
		return true
	}
	budget := base64.StdEncoding.EncodedLen(len(msg)) + b64Overhead - len(msg) // escapes' extra bytes that text may take
	for _, c := range msg {
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		switch c {
		case '"', '\\', '\n', '\r', '\t':
			budget-- // a backslash before it
		default:
			budget -= 5 // \u00XX
		}
		if budget < 0 {
			return true
		}
	}
	return false
}

// checkNotify validates the lengths of a notify's variable twosided members before it is
// sent; the receiver refuses what is longer.
func checkNotify(req *NotifyRequest) error {
	if len(req.ID) > MaxNotifyIDLen {
		return fmt.Errorf("%w: NotifyRequest.ID (ts_nid): %d bytes, at most %d", ErrBadRequest, len(req.ID), MaxNotifyIDLen)
	}
	if len(req.From) > MaxFromLen {
		return fmt.Errorf("%w: NotifyRequest.From (ts_from): %d bytes, at most %d", ErrBadRequest, len(req.From), MaxFromLen)
	}
	if req.SkipCount != 0 && req.SkipFrom == 0 {
		return fmt.Errorf("%w: NotifyRequest.SkipFrom (ts_skip_from): 0 with SkipCount %d; seqs start at 1", ErrBadRequest, req.SkipCount)
	}
	return nil
}

// notifyDecoder decodes Notify request bodies into reused buffers; loop-only.
type notifyDecoder struct {
	key, name, msg, from, b64, nid []byte
	lastName, lastFrom             string
	req                            NotifyRequest
}

func (d *notifyDecoder) decode(body []byte) (*NotifyRequest, reqMeta, error) {
	var m reqMeta
	r := jsonReader{b: body}
	d.name, d.msg, d.from, d.b64, d.nid = d.name[:0], d.msg[:0], d.from[:0], d.b64[:0], d.nid[:0]
	d.req = NotifyRequest{}
	hasB64, hasSkipFrom, hasName, hasMsg := false, false, false, false
	var err error
	d.key, err = r.object(d.key, func(k []byte) error {
		var err error
		switch string(k) {
		case fName:
			hasName = true
		case fNotifyMsg:
			hasMsg = true
		}
		if r.isNull() {
			return nil // JsonCpp reads null as ""
		}
		switch string(k) {
		case fName:
			d.name, err = r.str(fName, d.name)
		case fNotifyMsg:
			d.msg, err = r.str(fNotifyMsg, d.msg)
		case fMsgB64:
			m.twosided, hasB64 = true, true
			d.b64, err = r.str(fMsgB64, d.b64)
		case fFrom:
			m.twosided = true
			d.from, err = r.strMax(fFrom, d.from[:0], MaxFromLen)
		case fSession:
			m.twosided = true
			d.req.Session, err = r.uint(fSession, 1<<64-1)
		case fEpoch:
			m.twosided = true
			d.req.Epoch, err = r.uint(fEpoch, 1<<64-1)
		case fSeq:
			m.twosided = true
			d.req.Seq, err = r.uint(fSeq, 1<<64-1)
		case fID:
			m.twosided, m.hasID = true, true
			m.id, err = r.uint(fID, 1<<64-1)
		case fToken:
			m.twosided = true
			d.req.Token, err = r.uint(fToken, 1<<64-1)
		case fTo:
			m.twosided = true
			d.req.To, err = r.uint(fTo, 1<<64-1)
		case fNID:
			m.twosided = true
			d.nid, err = r.strMax(fNID, d.nid[:0], MaxNotifyIDLen)
		case fSkipFrom:
			m.twosided, hasSkipFrom = true, true
			d.req.SkipFrom, err = r.uint(fSkipFrom, 1<<64-1)
			if err == nil && d.req.SkipFrom == 0 {
				err = jsonErr(fSkipFrom, "0 out of range 1..%d", uint64(1<<64-1))
			}
		case fSkipN:
			m.twosided = true
			d.req.SkipCount, err = r.uint(fSkipN, 1<<64-1)
		default:
			err = r.skip(0)
		}
		return err
	})
	if err == nil {
		err = r.end()
	}
	switch {
	case err != nil:
	case !hasName:
		// Mooncake always writes both members (an empty name included); a request without
		// them is not a notify.
		err = jsonErr(fName, "missing (a notify has \"name\" and \"notify_msg\"; either may be empty)")
	case !hasMsg:
		err = jsonErr(fNotifyMsg, "missing (a notify has \"name\" and \"notify_msg\"; either may be empty)")
	}
	if err == nil && (d.req.SkipCount != 0) != hasSkipFrom {
		err = jsonErr(fSkipN, "ts_skip_from and a non-zero ts_skip_n come together")
	}
	if err == nil && d.req.SkipCount > ^uint64(0)-(d.req.SkipFrom-1) {
		err = jsonErr(fSkipN, "%d out of range 0..%d (seqs past 2^64-1)", d.req.SkipCount, ^uint64(0)-(d.req.SkipFrom-1))
	}
	if err != nil {
		return nil, m, err
	}
	if hasB64 {
		n := base64.StdEncoding.DecodedLen(len(d.b64))
		d.msg = growLen(d.msg[:0], n)
		n, err = base64.StdEncoding.Decode(d.msg, d.b64)
		if err != nil {
			return nil, m, jsonErr(fMsgB64, "bad base64: %v", err)
		}
		d.msg = d.msg[:n]
	}
	d.lastName = intern(d.lastName, d.name)
	d.lastFrom = intern(d.lastFrom, d.from)
	d.req.Name, d.req.From, d.req.Msg = d.lastName, d.lastFrom, d.msg
	if len(d.nid) > 0 {
		d.req.ID = string(d.nid)
	}
	return &d.req, m, nil
}

// intern returns last when it equals b, so a stream of notifies with one name allocates
// its string once.
func intern(last string, b []byte) string {
	if last == string(b) {
		return last
	}
	return string(b)
}

func growLen(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}

// appendNotifyReply writes the reply to a Notify: "success" when err is nil, else ""
// (rejected) with, for a twosided requester, the reason in ts_error and, when err is or
// wraps a *RefusedError, its code in ts_refuse.
func appendNotifyReply(dst []byte, m reqMeta, err error) []byte {
	if m.compact {
		return appendCompactReply(dst, m, err)
	}
	dst, at := beginFrame(dst, TypeNotify)
	o := jsonObj{b: append(dst, '{')}
	o.str(fName, "")
	if err != nil {
		o.str(fNotifyMsg, "")
	} else {
		o.str(fNotifyMsg, replySuccess)
	}
	if m.twosided {
		if m.hasID {
			o.uint(fID, m.id)
		}
		if err != nil {
			code, msg := refusalOf(err)
			o.str(fError, msg)
			o.optStr(fRefuse, code)
		}
	}
	return finishFrame(append(o.b, '}'), at)
}

// appendErrorReply writes the reply to a request that could not be parsed or served: the
// reason in reply_msg and ts_error, and the code in ts_refuse when err is or wraps a
// *RefusedError. A Mooncake reader sees an empty notify_msg and a non-empty reply_msg.
func appendErrorReply(dst []byte, t MsgType, m reqMeta, err error) []byte {
	code, reason := refusalOf(err)
	if t == TypeNotifyCompact {
		t = TypeNotify // an error reply is JSON, which every client reads
	}
	dst, at := beginFrame(dst, t)
	o := jsonObj{b: append(dst, '{')}
	o.str(fName, "")
	o.str(fNotifyMsg, "")
	o.str(fReplyMsg, reason)
	o.str(fError, reason)
	o.optStr(fRefuse, code)
	if m.hasID {
		o.uint(fID, m.id)
	}
	return finishFrame(append(o.b, '}'), at)
}

// appendProbe writes a Probe request or reply: hello (negotiation) and/or an id.
func appendProbe(dst []byte, m reqMeta, hello bool) []byte {
	dst, at := beginFrame(dst, TypeProbe)
	o := jsonObj{b: append(dst, '{')}
	if hello {
		o.uint(fHello, helloVersion)
	}
	if m.hasID {
		o.uint(fID, m.id)
	}
	return finishFrame(append(o.b, '}'), at)
}

// appendBye writes the Probe a closing Node sends on its twosided persistent connections:
// {"ts_bye":1,"ts_from":name,"ts_session":session} (no ts_session when 0). It expects no
// reply.
func appendBye(dst []byte, name string, session uint64) []byte {
	dst, at := beginFrame(dst, TypeProbe)
	o := jsonObj{b: append(dst, '{')}
	o.uint(fBye, 1)
	if len(name) <= MaxFromLen {
		o.optStr(fFrom, name)
	}
	if session != 0 {
		o.uint(fSession, session)
	}
	return finishFrame(append(o.b, '}'), at)
}

// replyInfo is what a client reads from a Notify or Probe reply.
type replyInfo struct {
	m            reqMeta
	hasNotifyMsg bool
	notifyOK     bool // notify_msg non-empty
	hello        uint64
	errMsg       []byte // reply_msg or ts_error
	refuse       []byte // ts_refuse
	bye          uint64 // ts_bye: the server is closing
	session      uint64 // ts_session of a bye: the closing server's session
	maxFrame     uint64 // ts_max_frame of a hello reply: the server's frame limit
	compact      bool   // ts_compact of a hello reply: the server takes compact notifies

	// Authentication members of a hello reply.
	auth         authOffer
	authRequired bool
	nonce        [nonceSize]byte
	hasNonce     bool
	mac          [macSize]byte
	hasMAC       bool
	text         []byte // scratch for hex members
}

// authOffer is the ts_auth member of a hello reply.
type authOffer uint8

const (
	offerNone    authOffer = iota // absent: the server has no key
	offerHMAC                     // "hmac-sha256"
	offerUnknown                  // a scheme this version does not speak
)

func (ri *replyInfo) decode(body []byte, key []byte) ([]byte, error) {
	r := jsonReader{b: body}
	errBuf, text, refuse := ri.errMsg[:0], ri.text, ri.refuse[:0]
	*ri = replyInfo{text: text, refuse: refuse}
	key, err := r.object(key, func(k []byte) error {
		var err error
		if r.isNull() {
			return nil
		}
		switch string(k) {
		case fNotifyMsg:
			ri.hasNotifyMsg = true
			ri.notifyOK, err = r.strNonEmpty(fNotifyMsg)
		case fReplyMsg, fError:
			field := fReplyMsg
			if k[0] == 't' {
				ri.m.twosided = true
				field = fError
			}
			if len(errBuf) == 0 {
				errBuf, err = r.str(field, errBuf[:0])
			} else {
				_, err = r.strNonEmpty(field)
			}
		case fHello:
			ri.m.twosided = true
			ri.hello, err = r.uint(fHello, 1<<32-1)
		case fID:
			ri.m.twosided, ri.m.hasID = true, true
			ri.m.id, err = r.uint(fID, 1<<64-1)
		case fRefuse:
			ri.m.twosided = true
			ri.refuse, err = r.refuseCode(fRefuse, ri.refuse[:0])
		case fBye:
			ri.m.twosided = true
			ri.bye, err = r.uint(fBye, 1<<32-1)
		case fSession:
			ri.m.twosided = true
			ri.session, err = r.uint(fSession, 1<<64-1)
		case fMaxFrame:
			ri.m.twosided = true
			ri.maxFrame, err = r.uint(fMaxFrame, MaxMaxFrame)
			if err == nil && ri.maxFrame < MinMaxFrame {
				err = jsonErr(fMaxFrame, "%d out of range %d..%d", ri.maxFrame, MinMaxFrame, MaxMaxFrame)
			}
		case fAuth:
			ri.m.twosided = true
			ri.text, err = r.str(fAuth, ri.text[:0])
			ri.auth = offerUnknown
			if string(ri.text) == authScheme {
				ri.auth = offerHMAC
			}
		case fAuthRequired:
			ri.m.twosided = true
			ri.authRequired, err = r.boolean(fAuthRequired)
		case fCompact:
			ri.m.twosided = true
			var v uint64
			v, err = r.uint(fCompact, 1<<32-1)
			ri.compact = v != 0
		case fNonce:
			ri.m.twosided, ri.hasNonce = true, true
			ri.text, err = r.hexFixed(fNonce, ri.nonce[:], ri.text)
		case fMAC:
			ri.m.twosided, ri.hasMAC = true, true
			ri.text, err = r.hexFixed(fMAC, ri.mac[:], ri.text)
		default:
			err = r.skip(0)
		}
		return err
	})
	ri.errMsg = errBuf
	if err == nil {
		err = r.end()
	}
	return key, err
}

// appendHandshake writes a Connection frame (request or reply).
func appendHandshake(dst []byte, d *HandshakeDesc, m reqMeta) []byte {
	t := TypeConnection
	if m.old {
		t = TypeOldProtocol
	}
	dst, at := beginFrame(dst, t)
	o := jsonObj{b: append(dst, '{')}
	o.str(fLocalNIC, d.LocalNICPath)
	o.str(fPeerNIC, d.PeerNICPath)
	o.key(fQPNum)
	o.b = append(o.b, '[')
	for i, q := range d.QPNum {
		if i > 0 {
			o.b = append(o.b, ',')
		}
		o.b = strconv.AppendUint(o.b, uint64(q), 10)
	}
	o.b = append(o.b, ']')
	o.uint(fLocalLID, uint64(d.LocalLID))
	o.str(fLocalGID, d.LocalGID)
	o.str(fReplyMsg, d.ReplyMsg)
	if d.CtrlChannel {
		o.boolean(fCtrl, true)
	}
	o.optUint(fNotifyQPN, uint64(d.NotifyQPNum))
	o.optUint(fNotifyRQD, uint64(d.NotifyRQDepth))
	o.optUint(fMTU, uint64(d.MTU))
	o.optUint(fPSN, uint64(d.PSN))
	o.optUint(fSession, d.Session)
	o.optUint(fEpoch, d.Epoch)
	o.optUint(fBufSize, uint64(d.BufSize))
	if d.Extensions {
		o.boolean(fExtensions, true)
	}
	o.optStr(fPeer, d.PeerName)
	o.optUint(fToken, d.Token)
	o.optStr(fRefuse, d.Refuse)
	o.optStr(fCause, d.RefuseCause)
	o.optUint(fTo, d.To)
	o.optUint(fProof, d.Proof)
	if d.Fresh {
		o.boolean(fFresh, true)
	}
	o.optUint(fMaxNotify, uint64(d.MaxNotify))
	if m.hasID {
		o.uint(fID, m.id)
	}
	return finishFrame(append(o.b, '}'), at)
}

// checkHandshake validates the ranges of fields set by the caller before sending.
func checkHandshake(d *HandshakeDesc) error {
	if d.MTU != 0 && !validMTU(d.MTU) {
		return fmt.Errorf("%w: HandshakeDesc.MTU: %d is not one of 256, 512, 1024, 2048, 4096", ErrBadRequest, d.MTU)
	}
	if d.PSN > maxPSN {
		return fmt.Errorf("%w: HandshakeDesc.PSN: %d above 24 bits", ErrBadRequest, d.PSN)
	}
	if d.Refuse != "" && !validRefuseCode(d.Refuse) {
		return fmt.Errorf("%w: HandshakeDesc.Refuse (ts_refuse): %q is not 1..%d bytes of a-z and _", ErrBadRequest, d.Refuse, maxRefuseLen)
	}
	if d.RefuseCause != "" && !validRefuseCode(d.RefuseCause) {
		return fmt.Errorf("%w: HandshakeDesc.RefuseCause (ts_refuse_cause): %q is not 1..%d bytes of a-z and _", ErrBadRequest, d.RefuseCause, maxRefuseLen)
	}
	return nil
}

func validMTU[T uint64 | uint32](v T) bool {
	switch v {
	case 256, 512, 1024, 2048, 4096:
		return true
	}
	return false
}

// DecodeHandshake strictly decodes a Connection body. A wrong-typed or out-of-range field
// is an ErrBadFrame error naming the field.
func DecodeHandshake(body []byte) (*HandshakeDesc, error) {
	d, _, err := decodeHandshake(body)
	return d, err
}

func decodeHandshake(body []byte) (*HandshakeDesc, reqMeta, error) {
	var m reqMeta
	d := &HandshakeDesc{}
	r := jsonReader{b: body}
	var sb []byte
	str := func(field string) (string, error) {
		var err error
		sb, err = r.str(field, sb[:0])
		return string(sb), err
	}
	_, err := r.object(nil, func(k []byte) error {
		var err error
		var v uint64
		if r.isNull() {
			return nil
		}
		switch string(k) {
		case fLocalNIC:
			d.LocalNICPath, err = str(fLocalNIC)
		case fPeerNIC:
			d.PeerNICPath, err = str(fPeerNIC)
		case fQPNum:
			d.QPNum, err = r.uint32Array(fQPNum, d.QPNum[:0])
		case fLocalLID:
			v, err = r.uint(fLocalLID, 1<<16-1)
			d.LocalLID = uint16(v)
		case fLocalGID:
			d.LocalGID, err = str(fLocalGID)
		case fReplyMsg:
			d.ReplyMsg, err = str(fReplyMsg)
		case fCtrl:
			d.CtrlChannel, err = r.boolean(fCtrl)
		case fNotifyQPN:
			v, err = r.uint(fNotifyQPN, 1<<32-1)
			d.NotifyQPNum = uint32(v)
		case fNotifyRQD:
			v, err = r.uint(fNotifyRQD, 1<<16-1)
			if err == nil && v == 0 {
				err = jsonErr(fNotifyRQD, "0 out of range 1..65535")
			}
			d.NotifyRQDepth = uint16(v)
		case fMTU:
			m.twosided = true
			v, err = r.uint(fMTU, 4096)
			if err == nil && !validMTU(v) {
				err = jsonErr(fMTU, "%d is not one of 256, 512, 1024, 2048, 4096", v)
			}
			d.MTU = uint32(v)
		case fPSN:
			m.twosided = true
			v, err = r.uint(fPSN, maxPSN)
			d.PSN = uint32(v)
		case fSession:
			m.twosided = true
			d.Session, err = r.uint(fSession, 1<<64-1)
		case fEpoch:
			m.twosided = true
			d.Epoch, err = r.uint(fEpoch, 1<<64-1)
		case fBufSize:
			m.twosided = true
			v, err = r.uint(fBufSize, 1<<32-1)
			d.BufSize = uint32(v)
		case fMaxNotify:
			m.twosided = true
			v, err = r.uint(fMaxNotify, 1<<32-1)
			d.MaxNotify = uint32(v)
		case fExtensions:
			m.twosided = true
			d.Extensions, err = r.boolean(fExtensions)
		case fPeer:
			m.twosided = true
			d.PeerName, err = str(fPeer)
		case fToken:
			m.twosided = true
			d.Token, err = r.uint(fToken, 1<<64-1)
		case fRefuse:
			m.twosided = true
			sb, err = r.refuseCode(fRefuse, sb[:0])
			d.Refuse = string(sb)
		case fCause:
			m.twosided = true
			sb, err = r.refuseCode(fCause, sb[:0])
			d.RefuseCause = string(sb)
		case fTo:
			m.twosided = true
			d.To, err = r.uint(fTo, 1<<64-1)
		case fProof:
			m.twosided = true
			d.Proof, err = r.uint(fProof, 1<<64-1)
		case fFresh:
			m.twosided = true
			d.Fresh, err = r.boolean(fFresh)
		case fID:
			m.twosided, m.hasID = true, true
			m.id, err = r.uint(fID, 1<<64-1)
		default:
			err = r.skip(0)
		}
		return err
	})
	if err == nil {
		err = r.end()
	}
	if err != nil {
		return nil, m, err
	}
	return d, m, nil
}

func (r *jsonReader) uint32Array(field string, dst []uint32) ([]uint32, error) {
	if c := r.peek(); c != '[' {
		return dst, jsonErr(field, "want array, got %s", typeName(c))
	}
	r.i++
	if r.peek() == ']' {
		r.i++
		return dst, nil
	}
	for k := 0; ; k++ {
		if k >= 1<<16 {
			return dst, jsonErr(field, "more than 65536 elements")
		}
		v, err := r.uint(field, 1<<32-1)
		if err != nil {
			return dst, err
		}
		dst = append(dst, uint32(v))
		switch r.peek() {
		case ',':
			r.i++
		case ']':
			r.i++
			return dst, nil
		default:
			return dst, jsonErr(field, "want ',' or ']'")
		}
	}
}
