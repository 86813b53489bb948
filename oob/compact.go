package oob

import (
	"encoding/binary"
	"fmt"
	"unicode/utf8"
)

// The compact notify frame: a Notify request and its reply between two twosided Nodes, in
// fixed binary fields instead of JSON. A twosided server offers it in its hello reply
// ("ts_compact":1); a client that reads the offer sends its notifies on that connection as
// TypeNotifyCompact frames, and the server answers each in kind. A Mooncake peer never
// says hello, so it never sees one, and a twosided peer of an earlier version does not
// offer it, so it gets JSON. The fields are those of the JSON form (see appendNotifyRequest
// and appendNotifyReply): the codec is not a second protocol, only a cheaper spelling of the
// same one, and an error reply to a compact frame that cannot be read is the JSON one.
//
// Request body, integers little-endian:
//
//	u64 ts_id, ts_session, ts_epoch, ts_seq, ts_token, ts_to, ts_skip_from, ts_skip_n
//	u8 len(ts_from), u8 len(ts_nid), u32 len(name)
//	ts_from, ts_nid, name, then the msg: the rest of the body
//
// Reply body:
//
//	u64 ts_id, u8 status (0 success, 1 rejected)
//	rejected: u8 len(ts_refuse), u16 len(ts_error), ts_refuse, ts_error
const (
	compactReqFixed   = 8*8 + 1 + 1 + 4
	compactReplyFixed = 8 + 1
	compactRejFixed   = compactReplyFixed + 1 + 2

	compactOK       = 0
	compactRejected = 1

	// maxCompactError bounds a compact reply's reason text; a longer one is cut (the JSON
	// form carries it whole, and a reason is a sentence).
	maxCompactError = 4096
)

// appendNotifyCompact writes a Notify request as a compact frame; m.id is its ts_id.
func appendNotifyCompact(dst []byte, req *NotifyRequest, m reqMeta) []byte {
	dst, at := beginFrame(dst, TypeNotifyCompact)
	dst = binary.LittleEndian.AppendUint64(dst, m.id)
	dst = binary.LittleEndian.AppendUint64(dst, req.Session)
	dst = binary.LittleEndian.AppendUint64(dst, req.Epoch)
	dst = binary.LittleEndian.AppendUint64(dst, req.Seq)
	dst = binary.LittleEndian.AppendUint64(dst, req.Token)
	dst = binary.LittleEndian.AppendUint64(dst, req.To)
	dst = binary.LittleEndian.AppendUint64(dst, req.SkipFrom)
	dst = binary.LittleEndian.AppendUint64(dst, req.SkipCount)
	// checkNotify bounds From and ID to MaxFromLen and MaxNotifyIDLen (255) before a
	// request is encoded; Name's length is bounded by the frame limit (checkFrame).
	dst = append(dst, byte(len(req.From)), byte(len(req.ID)))
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(req.Name)))
	dst = append(dst, req.From...)
	dst = append(dst, req.ID...)
	dst = append(dst, req.Name...)
	dst = append(dst, req.Msg...)
	return finishFrame(dst, at)
}

func compactErr(field, format string, args ...any) error {
	return &FrameError{Err: ErrBadFrame, Type: TypeNotifyCompact, HasType: true,
		Reason: fmt.Sprintf("compact notify: field %q: ", field) + fmt.Sprintf(format, args...)}
}

// decodeCompact reads a compact Notify request body into the decoder's reused request, as
// decode does a JSON one. The returned request's Msg aliases body.
func (d *notifyDecoder) decodeCompact(body []byte) (*NotifyRequest, reqMeta, error) {
	m := reqMeta{twosided: true, compact: true}
	if len(body) < compactReqFixed {
		return nil, m, compactErr(fID, "body of %d bytes, the fixed fields take %d", len(body), compactReqFixed)
	}
	le := binary.LittleEndian
	m.id, m.hasID = le.Uint64(body), true
	d.req = NotifyRequest{
		Session:   le.Uint64(body[8:]),
		Epoch:     le.Uint64(body[16:]),
		Seq:       le.Uint64(body[24:]),
		Token:     le.Uint64(body[32:]),
		To:        le.Uint64(body[40:]),
		SkipFrom:  le.Uint64(body[48:]),
		SkipCount: le.Uint64(body[56:]),
	}
	fromLen, nidLen := int(body[64]), int(body[65])
	nameLen := uint64(le.Uint32(body[66:]))
	rest := body[compactReqFixed:]
	if uint64(len(rest)) < uint64(fromLen+nidLen)+nameLen {
		return nil, m, compactErr(fName, "ts_from %d, ts_nid %d and name %d bytes, the body has %d after the fixed fields",
			fromLen, nidLen, nameLen, len(rest))
	}
	switch r := &d.req; {
	case r.SkipCount != 0 && r.SkipFrom == 0:
		return nil, m, compactErr(fSkipFrom, "0 with ts_skip_n %d (seqs start at 1)", r.SkipCount)
	case r.SkipCount == 0 && r.SkipFrom != 0:
		return nil, m, compactErr(fSkipN, "0 with ts_skip_from %d (ts_skip_from and a non-zero ts_skip_n come together)", r.SkipFrom)
	case r.SkipCount > ^uint64(0)-(r.SkipFrom-1):
		return nil, m, compactErr(fSkipN, "%d out of range 0..%d (seqs past 2^64-1)", r.SkipCount, ^uint64(0)-(r.SkipFrom-1))
	}
	from := rest[:fromLen]
	nid := rest[fromLen : fromLen+nidLen]
	name := rest[fromLen+nidLen : uint64(fromLen+nidLen)+nameLen]
	d.lastName = intern(d.lastName, name)
	d.lastFrom = intern(d.lastFrom, from)
	d.req.Name, d.req.From = d.lastName, d.lastFrom
	d.req.Msg = rest[uint64(fromLen+nidLen)+nameLen:]
	if nidLen > 0 {
		d.req.ID = string(nid)
	}
	return &d.req, m, nil
}

// appendCompactReply writes the compact reply to a compact Notify: success when err is
// nil, else rejected with the reason and, when err is or wraps a *RefusedError, its code.
func appendCompactReply(dst []byte, m reqMeta, err error) []byte {
	dst, at := beginFrame(dst, TypeNotifyCompact)
	dst = binary.LittleEndian.AppendUint64(dst, m.id)
	if err == nil {
		return finishFrame(append(dst, compactOK), at)
	}
	code, msg := refusalOf(err)
	if len(msg) > maxCompactError {
		cut := maxCompactError
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut-- // not inside a character
		}
		msg = msg[:cut]
	}
	dst = append(dst, compactRejected, byte(len(code)))
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(msg)))
	dst = append(dst, code...)
	dst = append(dst, msg...)
	return finishFrame(dst, at)
}

// decodeCompact reads a compact reply into ri as decode does a JSON one: a success is a
// non-empty notify_msg, a rejection an empty one with ts_error and maybe ts_refuse.
func (ri *replyInfo) decodeCompact(body []byte) error {
	errBuf, text, refuse := ri.errMsg[:0], ri.text, ri.refuse[:0]
	*ri = replyInfo{text: text, refuse: refuse, errMsg: errBuf}
	ri.m.twosided, ri.m.compact = true, true
	if len(body) < compactReplyFixed {
		return compactErr(fID, "reply of %d bytes, the fixed fields take %d", len(body), compactReplyFixed)
	}
	ri.m.id, ri.m.hasID = binary.LittleEndian.Uint64(body), true
	ri.hasNotifyMsg = true
	switch body[8] {
	case compactOK:
		if len(body) != compactReplyFixed {
			return compactErr(fNotifyMsg, "success reply of %d bytes, want %d", len(body), compactReplyFixed)
		}
		ri.notifyOK = true
		return nil
	case compactRejected:
	default:
		return compactErr(fNotifyMsg, "status %d (0 success, 1 rejected)", body[8])
	}
	if len(body) < compactRejFixed {
		return compactErr(fError, "rejection of %d bytes, the fixed fields take %d", len(body), compactRejFixed)
	}
	codeLen, msgLen := int(body[9]), int(binary.LittleEndian.Uint16(body[10:]))
	if len(body) != compactRejFixed+codeLen+msgLen {
		return compactErr(fError, "rejection of %d bytes, ts_refuse %d and ts_error %d bytes want %d",
			len(body), codeLen, msgLen, compactRejFixed+codeLen+msgLen)
	}
	code := body[compactRejFixed : compactRejFixed+codeLen]
	if codeLen > 0 && !validRefuseCode(code) {
		return compactErr(fRefuse, "%q is not 1..%d bytes of a-z and _", code, maxRefuseLen)
	}
	ri.refuse = append(ri.refuse, code...)
	ri.errMsg = append(ri.errMsg, body[compactRejFixed+codeLen:]...)
	if len(ri.errMsg) == 0 {
		ri.errMsg = append(ri.errMsg, "rejected"...)
	}
	return nil
}
