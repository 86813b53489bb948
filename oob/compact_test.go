package oob

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func compactBody(frame []byte) []byte {
	return frame[HeaderSize:]
}

func TestCompactRequestRoundTrip(t *testing.T) {
	for _, req := range []NotifyRequest{
		{},
		{Name: "kv.done", Msg: []byte("0123456789abcdef")},
		{Name: "n", Msg: []byte{0, 0xff, '"', '\\', '\n'}, From: "10.0.0.1:12001", Session: 1<<64 - 1, Epoch: 2, Seq: 3,
			Token: 4, To: 5, ID: strings.Repeat("i", MaxNotifyIDLen), SkipFrom: 6, SkipCount: 7},
		{Name: strings.Repeat("é", 300), From: strings.Repeat("f", MaxFromLen), SkipFrom: 1<<64 - 1, SkipCount: 1},
	} {
		m := reqMeta{id: 42, hasID: true, twosided: true, compact: true}
		fr := appendNotifyCompact(nil, &req, m)
		typ, body, n, err := ParseFrame(fr, MinMaxFrame)
		require.NoError(t, err)
		require.Equal(t, len(fr), n)
		require.Equal(t, TypeNotifyCompact, typ)
		var d notifyDecoder
		got, gm, err := d.decodeCompact(body)
		require.NoError(t, err)
		require.Equal(t, m, gm)
		if req.Msg == nil {
			req.Msg = []byte{}
		}
		require.Equal(t, req, *got)
		require.Equal(t, fr, appendNotifyCompact(nil, got, gm), "decode then encode gives the same bytes")
	}
}

func TestCompactReplyRoundTrip(t *testing.T) {
	m := reqMeta{id: 9, hasID: true, twosided: true, compact: true}
	var ri replyInfo
	fr := appendNotifyReply(nil, m, nil)
	require.Equal(t, TypeNotifyCompact, MsgType(fr[8]), "a compact request gets a compact reply")
	require.NoError(t, ri.decodeCompact(compactBody(fr)))
	require.True(t, ri.notifyOK)
	require.Equal(t, m, ri.m)
	require.Empty(t, ri.errMsg)

	fr = appendNotifyReply(nil, m, &RefusedError{Code: RefuseBusy, Msg: "too many"})
	require.NoError(t, ri.decodeCompact(compactBody(fr)))
	require.False(t, ri.notifyOK)
	require.Equal(t, RefuseBusy, string(ri.refuse))
	require.Contains(t, string(ri.errMsg), "too many")

	fr = appendNotifyReply(nil, m, errors.New(strings.Repeat("x", 2*maxCompactError)))
	require.NoError(t, ri.decodeCompact(compactBody(fr)))
	require.False(t, ri.notifyOK)
	require.Empty(t, ri.refuse)
	require.Len(t, ri.errMsg, maxCompactError, "a long reason is cut")

	fr = appendNotifyReply(nil, m, errors.New("x"+strings.Repeat("é", maxCompactError)))
	require.NoError(t, ri.decodeCompact(compactBody(fr)))
	require.Len(t, ri.errMsg, maxCompactError-1, "cut before a character, not inside it")
	require.True(t, utf8.Valid(ri.errMsg))
}

func TestCompactDecodeErrors(t *testing.T) {
	good := compactBody(appendNotifyCompact(nil, &NotifyRequest{Name: "name", From: "h:1", ID: "x", Msg: []byte("m")}, reqMeta{id: 1}))
	with := func(off int, v uint64) []byte {
		b := append([]byte(nil), good...)
		binary.LittleEndian.PutUint64(b[off:], v)
		return b
	}
	skip := func(from, n uint64) []byte {
		b := with(48, from)
		binary.LittleEndian.PutUint64(b[56:], n)
		return b
	}
	longName := append([]byte(nil), good...)
	binary.LittleEndian.PutUint32(longName[66:], 6)
	for _, c := range []struct {
		name string
		body []byte
		want string
	}{
		{"empty", nil, `field "ts_id": body of 0 bytes, the fixed fields take 70`},
		{"short", good[:compactReqFixed-1], `body of 69 bytes`},
		{"name past the body", longName, `field "name": ts_from 3, ts_nid 1 and name 6 bytes, the body has 9 after the fixed fields`},
		{"from past the body", good[:compactReqFixed+2], `field "name": ts_from 3, ts_nid 1 and name 4 bytes, the body has 2`},
		{"skip_from 0", skip(0, 3), `field "ts_skip_from": 0 with ts_skip_n 3`},
		{"skip_n 0", skip(5, 0), `field "ts_skip_n": 0 with ts_skip_from 5`},
		{"skip past 2^64", skip(1<<64-1, 2), `field "ts_skip_n": 2 out of range 0..1`},
	} {
		var d notifyDecoder
		_, _, err := d.decodeCompact(c.body)
		require.ErrorIs(t, err, ErrBadFrame, c.name)
		require.ErrorContains(t, err, c.want, c.name)
		require.ErrorContains(t, err, "compact notify", c.name)
	}

	ok := compactBody(appendCompactReply(nil, reqMeta{id: 1}, nil))
	rej := compactBody(appendCompactReply(nil, reqMeta{id: 1}, &RefusedError{Code: "busy", Msg: "m"}))
	badCode := append([]byte(nil), rej...)
	badCode[compactRejFixed] = 'B'
	for _, c := range []struct {
		name string
		body []byte
		want string
	}{
		{"empty", nil, `field "ts_id": reply of 0 bytes`},
		{"status", append(append([]byte(nil), ok[:8]...), 7), `field "notify_msg": status 7`},
		{"success with more", append(append([]byte(nil), ok...), 0), `success reply of 10 bytes, want 9`},
		{"rejection short", rej[:compactRejFixed-1], `field "ts_error": rejection of 11 bytes`},
		{"rejection cut", rej[:len(rej)-1], `field "ts_error": rejection of`},
		{"rejection long", append(append([]byte(nil), rej...), 'x'), `field "ts_error": rejection of`},
		{"refuse code", badCode, `field "ts_refuse": "Busy" is not`},
	} {
		var ri replyInfo
		err := ri.decodeCompact(c.body)
		require.ErrorIs(t, err, ErrBadFrame, c.name)
		require.ErrorContains(t, err, c.want, c.name)
	}
}

// splitFrames parses a recorded byte stream into its frames' types.
func splitFrames(t *testing.T, b []byte) []MsgType {
	var types []MsgType
	for len(b) > 0 {
		typ, _, n, err := ParseFrame(b, MinMaxFrame)
		require.NoError(t, err)
		require.NotZero(t, n, "a whole frame")
		types = append(types, typ)
		b = b[n:]
	}
	return types
}

// Two Nodes speak compact notifies both ways once the hello offered them; every field
// arrives, and rejections and refusals keep their reason and code.
func TestCompactBetweenNodes(t *testing.T) {
	hb := newHandler()
	a := listen(t, newLoop(t), newHandler(), Config{})
	b := listen(t, newLoop(t), hb, Config{})
	rec := newRecorder(t, b.Addr())
	ctx := bg(t)
	req := NotifyRequest{Name: "kv", Msg: []byte{0, 1, 0xff}, From: a.Addr(), Session: 11, Epoch: 12, Seq: 13, Token: 14, To: 15,
		ID: "nid", SkipFrom: 2, SkipCount: 3}
	require.NoError(t, a.Notify(ctx, rec.ln.Addr().String(), &req))
	got := hb.notifies()
	require.Len(t, got, 1)
	require.Equal(t, req, got[0])

	err := a.Notify(ctx, rec.ln.Addr().String(), &NotifyRequest{Name: "reject-me"})
	require.ErrorIs(t, err, ErrRejected)
	require.ErrorContains(t, err, "no such receiver reject-me")
	err = a.Notify(ctx, rec.ln.Addr().String(), &NotifyRequest{Name: "refuse:busy"})
	var re *RefusedError
	require.ErrorAs(t, err, &re)
	require.Equal(t, RefuseBusy, re.Code)
	require.Contains(t, re.Msg, "refused by test")

	up, down := rec.transcript()
	require.Equal(t, []MsgType{TypeProbe, TypeNotifyCompact, TypeNotifyCompact, TypeNotifyCompact}, splitFrames(t, up))
	require.Equal(t, []MsgType{TypeProbe, TypeNotifyCompact, TypeNotifyCompact, TypeNotifyCompact}, splitFrames(t, down))
	require.Contains(t, string(down), `"ts_compact":1`, "the hello reply offers the form")
	require.Zero(t, b.Stats().BadFrames)
}

// A twosided server whose hello does not offer the compact form (an earlier version) gets
// JSON notifies, and its JSON replies are read.
func TestCompactNotOfferedSpeaksJSON(t *testing.T) {
	types := make(chan MsgType, 4)
	addr := helloServer(t, `{"ts_hello":1,"ts_max_frame":1048576}`, func(c net.Conn) {
		for {
			typ, body, err := readTyped(c)
			if err != nil {
				return
			}
			types <- typ
			var d notifyDecoder
			_, m, err := d.decode(body)
			if err != nil {
				return
			}
			_, _ = c.Write(appendNotifyReply(nil, m, nil))
		}
	})
	a := listen(t, newLoop(t), newHandler(), Config{})
	ctx := bg(t)
	for i := 0; i < 2; i++ {
		require.NoError(t, a.Notify(ctx, addr, &NotifyRequest{Name: "n", Msg: []byte("m"), Session: 1, Seq: uint64(i + 1)}))
		require.Equal(t, TypeNotify, <-types)
	}
}

// A compact frame on a connection that did not say hello, or before the client proved a
// required key, is refused with a JSON error reply that names the reason; the server goes
// on serving others.
func TestCompactRefusedOutsideItsConnection(t *testing.T) {
	hb := newHandler()
	b := listen(t, newLoop(t), hb, Config{})
	frame := appendNotifyCompact(nil, &NotifyRequest{Name: "n", Msg: []byte("m")}, reqMeta{id: 5})

	p := dialRaw(t, b.Addr())
	p.write(frame)
	typ, ri, body := p.reply()
	require.Equal(t, TypeNotify, typ, body)
	require.Contains(t, body, `ts_compact`)
	require.Contains(t, body, `did not say hello`)
	require.False(t, ri.notifyOK)
	requireEOF(t, p.c)

	keyed := listen(t, newLoop(t), hb, Config{AuthKey: keyA})
	p = dialRaw(t, keyed.Addr())
	require.True(t, p.hello(nil).compact)
	p.write(frame)
	p.requireRefused(TypeNotify, errAuthRequired.Error())

	a := listen(t, newLoop(t), newHandler(), Config{})
	require.NoError(t, a.Notify(bg(t), b.Addr(), &NotifyRequest{Name: "after"}))
	require.Len(t, hb.notifies(), 1, "only the notify of a connection that said hello reached the handler")
	require.EqualValues(t, 1, b.Stats().BadFrames)
}

// A compact reply on a connection whose server did not offer the form is a bad reply: the
// connection closes with the reason, as for any reply the client cannot read.
func TestCompactReplyNotOffered(t *testing.T) {
	addr := helloServer(t, `{"ts_hello":1}`, func(c net.Conn) {
		_, body, err := readTyped(c)
		if err != nil {
			return
		}
		var d notifyDecoder
		if _, m, err := d.decode(body); err == nil {
			m.compact = true
			_, _ = c.Write(appendNotifyReply(nil, m, nil))
		}
		_, _ = io.Copy(io.Discard, c)
	})
	a := listen(t, newLoop(t), newHandler(), Config{})
	err := a.Notify(bg(t), addr, &NotifyRequest{Name: "n"})
	require.ErrorIs(t, err, ErrPeerUnreachable)
	require.ErrorContains(t, err, "a compact reply on a connection that sent none")
}

func FuzzCompactNotifyDecode(f *testing.F) {
	f.Add(compactBody(appendNotifyCompact(nil, &NotifyRequest{Name: "a", Msg: []byte("hi")}, reqMeta{id: 1})))
	f.Add(compactBody(appendNotifyCompact(nil, &NotifyRequest{Name: "n", From: "h:1", ID: "x", Session: 2, Seq: 3,
		SkipFrom: 4, SkipCount: 5}, reqMeta{id: 7})))
	f.Add(bytes.Repeat([]byte{0xff}, compactReqFixed+4))
	f.Fuzz(func(t *testing.T, body []byte) {
		var d notifyDecoder
		req, m, err := d.decodeCompact(body)
		if err != nil {
			require.ErrorIs(t, err, ErrBadFrame)
			return
		}
		require.True(t, m.hasID && m.twosided && m.compact)
		require.LessOrEqual(t, len(req.From), MaxFromLen)
		require.LessOrEqual(t, len(req.ID), MaxNotifyIDLen)
		require.Equal(t, req.SkipCount != 0, req.SkipFrom != 0)
		require.NoError(t, checkNotify(req))
		require.Equal(t, body, compactBody(appendNotifyCompact(nil, req, m)), "what decodes encodes to the same bytes")
	})
}

func FuzzCompactReplyDecode(f *testing.F) {
	f.Add(compactBody(appendCompactReply(nil, reqMeta{id: 3}, nil)))
	f.Add(compactBody(appendCompactReply(nil, reqMeta{id: 3}, &RefusedError{Code: "busy", Msg: "m"})))
	f.Add(compactBody(appendCompactReply(nil, reqMeta{id: 3}, errors.New("no"))))
	f.Fuzz(func(t *testing.T, body []byte) {
		var ri replyInfo
		err := ri.decodeCompact(body)
		if err != nil {
			require.ErrorIs(t, err, ErrBadFrame)
			return
		}
		require.True(t, ri.m.hasID && ri.hasNotifyMsg)
		if ri.notifyOK {
			require.Empty(t, ri.errMsg)
			require.Empty(t, ri.refuse)
			return
		}
		require.NotEmpty(t, ri.errMsg)
		require.True(t, len(ri.refuse) == 0 || validRefuseCode(ri.refuse))
	})
}
