package oob

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNotifyExtensionsDecodeTable(t *testing.T) {
	long := strings.Repeat("i", MaxNotifyIDLen+1)
	for _, tc := range []struct {
		name    string
		body    string
		want    NotifyRequest
		wantErr string
	}{
		{"all", `{"name":"a","notify_msg":"m","ts_token":18446744073709551615,"ts_to":9,"ts_nid":"req-1","ts_skip_from":3,"ts_skip_n":2}`,
			NotifyRequest{Name: "a", Msg: []byte("m"), Token: 1<<64 - 1, To: 9, ID: "req-1", SkipFrom: 3, SkipCount: 2}, ""},
		{"nid at the bound", `{"name":"a","notify_msg":"","ts_nid":"` + long[1:] + `"}`, NotifyRequest{Name: "a", ID: long[1:]}, ""},
		{"token wrong type", `{"name":"a","notify_msg":"","ts_token":"1"}`, NotifyRequest{}, `field "ts_token": want number, got string`},
		{"token negative", `{"name":"a","notify_msg":"","ts_token":-1}`, NotifyRequest{}, `field "ts_token": negative`},
		{"to overflow", `{"name":"a","notify_msg":"","ts_to":18446744073709551616}`, NotifyRequest{}, `field "ts_to": 18446744073709551616 out of range`},
		{"nid wrong type", `{"name":"a","notify_msg":"","ts_nid":5}`, NotifyRequest{}, `field "ts_nid": want string, got number`},
		{"nid too long", `{"name":"a","notify_msg":"","ts_nid":"` + long + `"}`, NotifyRequest{}, `field "ts_nid": 256 bytes, at most 255`},
		{"from too long", `{"name":"a","notify_msg":"","ts_from":"` + strings.Repeat("h", MaxFromLen+1) + `"}`, NotifyRequest{}, `field "ts_from": 256 bytes, at most 255`},
		{"skip_from 0", `{"name":"a","notify_msg":"","ts_skip_from":0,"ts_skip_n":1}`, NotifyRequest{}, `field "ts_skip_from": 0 out of range`},
		{"skip_from alone", `{"name":"a","notify_msg":"","ts_skip_from":4}`, NotifyRequest{}, `field "ts_skip_n"`},
		{"skip_n alone", `{"name":"a","notify_msg":"","ts_skip_n":4}`, NotifyRequest{}, `field "ts_skip_n"`},
		{"skip past 2^64", `{"name":"a","notify_msg":"","ts_skip_from":18446744073709551615,"ts_skip_n":2}`, NotifyRequest{}, `field "ts_skip_n": 2 out of range 0..1`},
		{"skip_n wrong type", `{"name":"a","notify_msg":"","ts_skip_from":1,"ts_skip_n":true}`, NotifyRequest{}, `field "ts_skip_n": want number, got bool`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var d notifyDecoder
			got, m, err := d.decode([]byte(tc.body))
			if tc.wantErr != "" {
				require.ErrorIs(t, err, ErrBadFrame)
				require.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.True(t, m.twosided)
			if len(got.Msg) == 0 {
				got.Msg = nil
			}
			require.Equal(t, tc.want, *got)
		})
	}
}

func TestNotifyExtensionsEncode(t *testing.T) {
	req := NotifyRequest{Name: "a", Msg: []byte("m"), From: "h:1", Session: 1, Epoch: 2, Seq: 3,
		Token: 4, To: 5, ID: "id\"1", SkipFrom: 6, SkipCount: 7}
	fr := appendNotifyRequest(nil, &req, reqMeta{id: 1, hasID: true}, true)
	var d notifyDecoder
	got, _, err := d.decode(fr[HeaderSize:])
	require.NoError(t, err)
	require.Equal(t, req, *got)

	// A Mooncake peer sees none of them.
	fr = appendNotifyRequest(nil, &req, reqMeta{}, false)
	require.Equal(t, `{"name":"a","notify_msg":"m"}`, string(fr[HeaderSize:]))

	for _, tc := range []struct {
		req   NotifyRequest
		field string
	}{
		{NotifyRequest{ID: strings.Repeat("x", 256)}, "NotifyRequest.ID (ts_nid): 256 bytes, at most 255"},
		{NotifyRequest{From: strings.Repeat("x", 256)}, "NotifyRequest.From (ts_from)"},
		{NotifyRequest{SkipCount: 1}, "NotifyRequest.SkipFrom (ts_skip_from)"},
	} {
		err := checkNotify(&tc.req)
		require.ErrorIs(t, err, ErrBadRequest)
		require.Contains(t, err.Error(), tc.field)
	}
}

func TestHandshakeExtensions(t *testing.T) {
	d := &HandshakeDesc{LocalNICPath: "a@d", QPNum: []uint32{}, ReplyMsg: "no", Token: 1<<64 - 1, Refuse: RefuseNoCtrl, To: 42, Fresh: true,
		MaxNotify: 1 << 20, RefuseCause: CauseDevice}
	fr := appendHandshake(nil, d, reqMeta{})
	got, m, err := decodeHandshake(fr[HeaderSize:])
	require.NoError(t, err)
	require.True(t, m.twosided)
	got.QPNum = []uint32{}
	require.Equal(t, d, got)

	// Toward Mooncake: the extensions go, a refusal keeps its text.
	cp := HandshakeDesc{Refuse: RefuseLimit, RefuseCause: CauseDevice, Token: 3, To: 4, Fresh: true, MaxNotify: 1000}
	cp.stripExtensions()
	require.Equal(t, HandshakeDesc{ReplyMsg: RefuseLimit}, cp)

	for _, tc := range []struct{ body, wantErr string }{
		{`{"ts_token":"x"}`, `field "ts_token": want number, got string`},
		{`{"ts_to":-3}`, `field "ts_to": negative`},
		{`{"ts_fresh":1}`, `field "ts_fresh"`},
		{`{"ts_max_notify":4294967296}`, `field "ts_max_notify"`},
		{`{"ts_max_notify":"1"}`, `field "ts_max_notify": want number`},
		{`{"ts_refuse":1}`, `field "ts_refuse": want string, got number`},
		{`{"ts_refuse":""}`, `field "ts_refuse": "" is not 1..32 bytes`},
		{`{"ts_refuse":"Busy"}`, `field "ts_refuse": "Busy" is not`},
		{`{"ts_refuse":"` + strings.Repeat("a", 33) + `"}`, `field "ts_refuse"`},
		{`{"ts_refuse_cause":2}`, `field "ts_refuse_cause": want string, got number`},
		{`{"ts_refuse_cause":"Device"}`, `field "ts_refuse_cause": "Device" is not`},
	} {
		_, err := DecodeHandshake([]byte(tc.body))
		require.ErrorIs(t, err, ErrBadFrame, tc.body)
		require.Contains(t, err.Error(), tc.wantErr)
	}
	// An unknown but well-formed code decodes: a newer peer's refusal is still a refusal.
	got, err = DecodeHandshake([]byte(`{"ts_refuse":"future_code"}`))
	require.NoError(t, err)
	require.Equal(t, "future_code", got.Refuse)
	require.ErrorIs(t, checkHandshake(&HandshakeDesc{Refuse: "No"}), ErrBadRequest)
	require.ErrorIs(t, checkHandshake(&HandshakeDesc{Refuse: RefuseLimit, RefuseCause: "a b"}), ErrBadRequest)
	// An unknown cause decodes too.
	got, err = DecodeHandshake([]byte(`{"ts_refuse":"limit","ts_refuse_cause":"future_cause"}`))
	require.NoError(t, err)
	require.Equal(t, "future_cause", got.RefuseCause)
}

func TestNotifyReplyRefusal(t *testing.T) {
	m := reqMeta{id: 7, hasID: true, twosided: true}
	fr := appendNotifyReply(nil, m, &RefusedError{Code: RefuseBusy, Msg: "queue full"})
	require.JSONEq(t, `{"name":"","notify_msg":"","ts_id":7,"ts_error":"refused (busy): queue full","ts_refuse":"busy"}`, string(fr[HeaderSize:]))
	var ri replyInfo
	_, err := ri.decode(fr[HeaderSize:], nil)
	require.NoError(t, err)
	require.Equal(t, "busy", string(ri.refuse))
	require.False(t, ri.notifyOK)

	// A Mooncake requester sees only an empty notify_msg.
	fr = appendNotifyReply(nil, reqMeta{}, &RefusedError{Code: RefuseBusy})
	require.Equal(t, `{"name":"","notify_msg":""}`, string(fr[HeaderSize:]))

	for _, body := range []string{`{"ts_refuse":3}`, `{"ts_refuse":"BUSY"}`} {
		_, err := ri.decode([]byte(body), nil)
		require.ErrorIs(t, err, ErrBadFrame)
		require.Contains(t, err.Error(), `field "ts_refuse"`)
	}
}

func TestRefusedErrorSentinels(t *testing.T) {
	for code, want := range map[string]error{
		RefuseNoCtrl: ErrNoCtrl, RefuseLimit: ErrLimit, RefuseAuth: ErrAuth, RefuseClosed: ErrPeerClosed,
		RefuseInvalid: ErrInvalid, RefuseBusy: ErrBusy, RefuseStale: ErrStale,
	} {
		err := error(&RefusedError{Code: code, Msg: "x"})
		require.ErrorIs(t, err, ErrRejected, code)
		require.ErrorIs(t, err, want, code)
		for _, other := range []error{ErrNoCtrl, ErrLimit, ErrPeerClosed, ErrInvalid, ErrBusy, ErrStale} {
			if other != want {
				require.NotErrorIs(t, err, other, code)
			}
		}
	}
	err := error(&RefusedError{Code: "future"})
	require.ErrorIs(t, err, ErrRejected)
	require.NotErrorIs(t, err, ErrBusy)
}

// A Handler's typed refusal reaches the client as the code's sentinel, on persistent and
// one-request connections, for notifies and handshakes.
func TestRefusalEndToEnd(t *testing.T) {
	loop := newLoop(t)
	b := listen(t, loop, newHandler(), Config{})
	a := listen(t, newLoop(t), newHandler(), Config{})
	ctx := bg(t)
	for _, classic := range []bool{false, true} {
		send := a.Notify
		if classic {
			send = a.NotifyClassic
		}
		err := send(ctx, b.Addr(), &NotifyRequest{Name: "refuse:busy"})
		require.ErrorIs(t, err, ErrBusy, "classic=%v", classic)
		require.ErrorIs(t, err, ErrRejected)
		var re *RefusedError
		require.True(t, errors.As(err, &re))
		require.Equal(t, RefuseBusy, re.Code)
		require.Contains(t, re.Msg, "refused by test")

		err = send(ctx, b.Addr(), &NotifyRequest{Name: "refuse:stale"})
		require.ErrorIs(t, err, ErrStale)
		require.NoError(t, send(ctx, b.Addr(), &NotifyRequest{Name: "fine"}), "a refusal costs only its request")
	}
	resp, err := a.Handshake(ctx, b.Addr(), &HandshakeDesc{LocalNICPath: "refuse:no_ctrl"})
	require.ErrorIs(t, err, ErrNoCtrl)
	require.ErrorIs(t, err, ErrRejected)
	require.Equal(t, RefuseNoCtrl, resp.Refuse)
	require.Contains(t, resp.ReplyMsg, "refused by test", "reply_msg still carries the text")
}

// A Mooncake client gets a refusal as reply_msg text only.
func TestRefusalToMooncake(t *testing.T) {
	b := listen(t, newLoop(t), newHandler(), Config{})
	p := dialRaw(t, b.Addr())
	p.write(appendHandshake(nil, &HandshakeDesc{LocalNICPath: "refuse:limit", QPNum: []uint32{}}, reqMeta{}))
	typ, _, body := p.reply()
	require.Equal(t, TypeConnection, typ)
	require.Contains(t, body, `"reply_msg":"refused (limit): refused by test"`)
	require.NotContains(t, body, "ts_")
	require.NoError(t, p.c.Close())
}
