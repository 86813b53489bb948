package oob

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// FuzzParser: feeding a stream in pieces of any size gives the same frames and the same
// first error as parsing it whole.
func FuzzParser(f *testing.F) {
	f.Add(mooncakeNotify, uint8(1))
	f.Add(append(AppendFrame(nil, TypeProbe, []byte(`{}`)), mooncakeNotify...), uint8(3))
	f.Add(hdr(0, 2), uint8(2))
	f.Add(hdr(1<<40, 2), uint8(5))
	f.Add(append(hdr(3, 9), '{', '}'), uint8(4))
	f.Add(append(hdr(2, '{'), '}'), uint8(1)) // no type byte: Mooncake's older protocol
	f.Add(append(hdr(3, 0x80), '{', '}'), uint8(2))
	f.Fuzz(func(t *testing.T, stream []byte, step uint8) {
		const max = MinMaxFrame
		type fr struct {
			t    MsgType
			body string
		}
		// Whole.
		var whole []fr
		var wholeErr error
		for in := stream; ; {
			typ, body, n, err := ParseFrame(in, max)
			if err != nil {
				wholeErr = err
				break
			}
			if n == 0 {
				break
			}
			whole = append(whole, fr{typ, string(body)})
			in = in[n:]
		}
		// Pieces.
		s := int(step)%17 + 1
		p := Parser{MaxFrame: max}
		var pieces []fr
		var piecesErr error
	outer:
		for off := 0; off < len(stream); off += s {
			in := stream[off:min(off+s, len(stream))]
			for len(in) > 0 {
				typ, body, n, ok, err := p.Next(in)
				if err != nil {
					piecesErr = err
					break outer
				}
				if ok {
					pieces = append(pieces, fr{typ, string(body)})
				}
				in = in[n:]
				if n == 0 && !ok {
					break
				}
			}
		}
		require.Equal(t, whole, pieces)
		if wholeErr == nil {
			require.NoError(t, piecesErr)
		} else {
			require.Error(t, piecesErr)
			require.Equal(t, wholeErr.Error(), piecesErr.Error())
		}
	})
}

// FuzzHandshakeDecode: the decoder never panics; what it accepts is valid JSON, and
// re-encoding what it decoded decodes to the same descriptor.
func FuzzHandshakeDecode(f *testing.F) {
	f.Add([]byte(`{"local_nic_path":"a@d","peer_nic_path":"__ctrl__","qp_num":[],"local_lid":1,"local_gid":"fe:80","reply_msg":"","ctrl_channel":true,"notify_qp_num":5,"notify_rq_depth":64}`))
	f.Add([]byte(`{"qp_num":[1,2,3],"ts_mtu":1024,"ts_psn":5,"ts_peer":"h:1","x":{"y":[null,1e5,"\u00e9"]}}` + "\n"))
	f.Add([]byte(`{"notify_rq_depth":0}`))
	f.Add([]byte(`{"local_gid":"\ud83d\ude00"}`))
	f.Add([]byte(`{"reply_msg":"no","ts_token":18446744073709551615,"ts_refuse":"no_ctrl","ts_to":7}`))
	f.Add([]byte(`{"ts_refuse":"Busy"}`))
	f.Add([]byte(`{"ts_refuse":"limit","ts_refuse_cause":"device","ts_token":3}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		d, m, err := decodeHandshake(body)
		if err != nil {
			require.ErrorIs(t, err, ErrBadFrame)
			return
		}
		require.True(t, json.Valid(body), "accepted invalid JSON %q", body)
		if d.NotifyRQDepth == 0 {
			require.NotContains(t, string(body), `"notify_rq_depth":0`)
		}
		fr := appendHandshake(nil, d, m)
		d2, m2, err := decodeHandshake(fr[HeaderSize:])
		require.NoError(t, err)
		if len(d.QPNum) == 0 {
			d.QPNum = nil
		}
		require.Equal(t, d, d2)
		require.Equal(t, m.hasID, m2.hasID)
		require.Equal(t, m.id, m2.id)
	})
}

// FuzzNotifyDecode: same properties for notify bodies, and encoding/json agrees on the
// strings when they are valid UTF-8.
func FuzzNotifyDecode(f *testing.F) {
	f.Add([]byte(`{"name":"a","notify_msg":"hi"}`))
	f.Add([]byte(`{"name":"a","notify_msg":"","ts_msg_b64":"AP8=","ts_id":3,"ts_seq":9}`))
	f.Add([]byte(`{"name":"\u00e9\ud83d\ude00\n","notify_msg":"a\"b\\c\/"}`))
	f.Add([]byte(`{"name":"a","notify_msg":"m","ts_token":1,"ts_to":2,"ts_nid":"x","ts_skip_from":3,"ts_skip_n":4}`))
	f.Add([]byte(`{"name":"a","notify_msg":"","ts_skip_from":18446744073709551615,"ts_skip_n":2}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var d notifyDecoder
		req, m, err := d.decode(body)
		if err != nil {
			require.ErrorIs(t, err, ErrBadFrame)
			return
		}
		require.True(t, json.Valid(body), "accepted invalid JSON %q", body)
		// encoding/json agrees on the (case-sensitive, last-wins) name when it is valid text.
		var std map[string]json.RawMessage
		if json.Unmarshal(body, &std) == nil && utf8.ValidString(req.Name) && !bytes.Contains(body, []byte(`\ud`)) && !bytes.Contains(body, []byte(`\uD`)) {
			var name string
			if raw, ok := std["name"]; ok && json.Unmarshal(raw, &name) == nil {
				require.Equal(t, name, req.Name)
			}
		}
		cp := *req
		cp.Msg = append([]byte(nil), req.Msg...)
		fr := appendNotifyRequest(nil, &cp, m, true)
		var d2 notifyDecoder
		req2, _, err := d2.decode(fr[HeaderSize:])
		require.NoError(t, err)
		require.Equal(t, cp.Name, req2.Name)
		require.Equal(t, cp.Msg, req2.Msg)
		require.Equal(t, cp.Seq, req2.Seq)
		require.Equal(t, cp.Token, req2.Token)
		require.Equal(t, cp.To, req2.To)
		require.Equal(t, cp.ID, req2.ID)
		require.Equal(t, cp.SkipFrom, req2.SkipFrom)
		require.Equal(t, cp.SkipCount, req2.SkipCount)
		require.LessOrEqual(t, len(req2.ID), MaxNotifyIDLen)
		require.LessOrEqual(t, len(req2.From), MaxFromLen)
	})
}

// FuzzReplyDecode: the probe and reply decoders never panic, accept only valid JSON and
// agree on the ts_id they read.
func FuzzReplyDecode(f *testing.F) {
	f.Add([]byte(`{"name":"","notify_msg":"success","ts_id":7}`))
	f.Add([]byte(`{"ts_hello":1}`))
	f.Add([]byte("null\n"))
	f.Add([]byte(`{"name":"","notify_msg":"","reply_msg":"bad","ts_error":"bad","ts_id":1}`))
	f.Add([]byte(`{"ts_hello":1,"ts_auth":"hmac-sha256","ts_nonce":"000102030405060708090a0b0c0d0e0f","ts_auth_required":true,"ts_mac":"` + strings.Repeat("ab", 32) + `"}`))
	f.Add([]byte(`{"ts_id":3,"ts_mac":"` + strings.Repeat("AB", 32) + `"}`))
	f.Add([]byte(`{"ts_nonce":"00"}`))
	f.Add([]byte(`{"name":"","notify_msg":"","ts_error":"x","ts_refuse":"busy","ts_id":2}`))
	f.Add([]byte(`{"ts_hello":1,"ts_max_frame":1048576}`))
	f.Add([]byte(`{"ts_bye":1,"ts_from":"10.0.0.1:12001"}`))
	f.Add([]byte(`{"ts_bye":1,"ts_from":"10.0.0.1:12001","ts_session":18446744073709551615}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var ri replyInfo
		_, err := ri.decode(body, nil)
		var pd probeDecoder
		p, perr := pd.decode(body)
		if err != nil {
			require.ErrorIs(t, err, ErrBadFrame)
		} else {
			require.True(t, json.Valid(body), "accepted invalid JSON %q", body)
			if len(ri.refuse) > 0 {
				require.True(t, validRefuseCode(ri.refuse), "%q", ri.refuse)
			}
		}
		if perr != nil {
			require.ErrorIs(t, perr, ErrBadFrame)
		}
		if err == nil && perr == nil {
			require.Equal(t, ri.m.hasID, p.m.hasID)
			require.Equal(t, ri.m.id, p.m.id)
			require.Equal(t, ri.hello, p.hello)
			require.Equal(t, ri.hasNonce, p.hasNonce)
			require.Equal(t, ri.nonce, p.nonce)
			require.Equal(t, ri.hasMAC, p.hasMAC)
			require.Equal(t, ri.mac, p.mac)
			require.Equal(t, ri.bye, p.bye)
			require.Equal(t, ri.session, p.session)
			require.LessOrEqual(t, len(p.from), MaxFromLen)
		}
	})
}
