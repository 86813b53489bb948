package oob

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/twosided/twosided/reactor/limits"
)

// A Mooncake notify frame written out by hand: len=31 (1 type byte + 30 JSON bytes).
var mooncakeNotify = []byte{
	31, 0, 0, 0, 0, 0, 0, 0, // u64 LE length, counts the type byte
	2, // Notify
	'{', '"', 'n', 'a', 'm', 'e', '"', ':', '"', 'a', '"', ',',
	'"', 'n', 'o', 't', 'i', 'f', 'y', '_', 'm', 's', 'g', '"', ':', '"', 'h', 'i', '"', '}',
}

func TestAppendFrameBytes(t *testing.T) {
	got := AppendFrame(nil, TypeNotify, []byte(`{"name":"a","notify_msg":"hi"}`))
	require.Equal(t, mooncakeNotify, got)

	req := &NotifyRequest{Name: "a", Msg: []byte("hi")}
	require.Equal(t, mooncakeNotify, appendNotifyRequest(nil, req, reqMeta{}, false), "a Mooncake peer gets exactly name and notify_msg")

	succ := appendNotifyReply(nil, reqMeta{}, nil)
	want := AppendFrame(nil, TypeNotify, []byte(`{"name":"","notify_msg":"success"}`))
	require.Equal(t, want, succ)
}

func hdr(n uint64, t byte) []byte {
	b := binary.LittleEndian.AppendUint64(nil, n)
	return append(b, t)
}

func TestParseFrameTable(t *testing.T) {
	const max = DefaultMaxFrame
	body := []byte(`{"x":1}`)
	good := AppendFrame(nil, TypeProbe, body)
	for _, tc := range []struct {
		name    string
		in      []byte
		wantN   int
		wantErr error
		reason  string
	}{
		{"good", good, len(good), nil, ""},
		{"good with trailing next frame", append(append([]byte{}, good...), 1, 2), len(good), nil, ""},
		{"empty", nil, 0, nil, ""},
		{"partial length", good[:5], 0, nil, ""},
		{"header only", good[:HeaderSize], 0, nil, ""},
		{"truncated body", good[:len(good)-1], 0, nil, ""},
		{"zero length", hdr(0, 2), 0, ErrBadFrame, "length 0"},
		{"zero length, 8 bytes", hdr(0, 2)[:8], 0, ErrBadFrame, "length 0"},
		{"huge length", hdr(1<<40, 2), 0, ErrFrameTooLarge, "above maximum"},
		{"just above max", hdr(max+1, 1), 0, ErrFrameTooLarge, "above maximum"},
		{"max is fine", hdr(max, 1), 0, nil, ""},
		{"notify: just above its limit", hdr(uint64(NotifyFrameLimit(max))+1, 2), 0, ErrFrameTooLarge, "above maximum"},
		{"notify: its limit is fine", hdr(uint64(NotifyFrameLimit(max)), 2), 0, nil, ""},
		{"bad type", append(hdr(3, 0x80), '{', '}'), 0, ErrBadFrame, "unknown type 128"},
		{"no type byte (Mooncake old protocol)", append(hdr(2, '{'), '}'), 10, nil, ""},
		{"type only body", hdr(1, 3), HeaderSize, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, n, err := ParseFrame(tc.in, max)
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				require.Contains(t, err.Error(), tc.reason)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.wantN, n)
		})
	}
	var fe *FrameError
	_, _, _, err := ParseFrame(hdr(1<<40, 1), max)
	require.True(t, errors.As(err, &fe))
	require.True(t, fe.HasType)
	require.Equal(t, TypeMetadata, fe.Type, "error reply must carry the request's type")
}

func TestParserPieces(t *testing.T) {
	var stream []byte
	var want []string
	for i, b := range []string{`{"a":1}`, ``, `{"name":"x","notify_msg":"` + strings.Repeat("z", 5000) + `"}`, `{}`} {
		stream = AppendFrame(stream, MsgType(i%4), []byte(b))
		want = append(want, b)
	}
	for _, step := range []int{1, 2, 3, 7, 9, 10, 100, 4096, len(stream)} {
		p := Parser{MaxFrame: DefaultMaxFrame}
		var got []string
		for off := 0; off < len(stream); off += step {
			in := stream[off:min(off+step, len(stream))]
			for {
				_, body, n, ok, err := p.Next(in)
				require.NoError(t, err)
				if ok {
					got = append(got, string(body))
				}
				in = in[n:]
				if !ok && n == 0 || len(in) == 0 && !ok {
					break
				}
			}
		}
		require.Equal(t, want, got, "step %d", step)
		require.Zero(t, p.Buffered())
	}
}

func TestParserErrorAcrossPieces(t *testing.T) {
	p := Parser{MaxFrame: DefaultMaxFrame}
	h := hdr(1<<30, 2)
	_, _, n, ok, err := p.Next(h[:4])
	require.NoError(t, err)
	require.False(t, ok)
	require.Equal(t, 4, n)
	_, _, _, _, err = p.Next(h[4:])
	require.ErrorIs(t, err, ErrFrameTooLarge)
}

func TestNotifyDecodeTable(t *testing.T) {
	for _, tc := range []struct {
		name    string
		body    string
		want    NotifyRequest
		wantErr string
	}{
		{"mooncake", `{"name":"a","notify_msg":"hi"}`, NotifyRequest{Name: "a", Msg: []byte("hi")}, ""},
		{"jsoncpp trailing newline", "{\"name\":\"a\",\"notify_msg\":\"hi\"}\n", NotifyRequest{Name: "a", Msg: []byte("hi")}, ""},
		{"unknown fields skipped", `{"x":{"y":[1,2.5e3,true,null,"s"]},"name":"a","notify_msg":"m"}`, NotifyRequest{Name: "a", Msg: []byte("m")}, ""},
		{"escapes", `{"name":"\u00e9\ud83d\ude00\n","notify_msg":"a\"b\\c\/"}`, NotifyRequest{Name: "é😀\n", Msg: []byte(`a"b\c/`)}, ""},
		{"lone surrogate", `{"name":"\ud800x","notify_msg":""}`, NotifyRequest{Name: "\uFFFDx", Msg: []byte{}}, ""},
		{"twosided", `{"name":"a","notify_msg":"m","ts_from":"h:1","ts_session":5,"ts_epoch":6,"ts_seq":7,"ts_id":9}`,
			NotifyRequest{Name: "a", Msg: []byte("m"), From: "h:1", Session: 5, Epoch: 6, Seq: 7}, ""},
		{"base64", `{"name":"a","notify_msg":"","ts_msg_b64":"AP8="}`, NotifyRequest{Name: "a", Msg: []byte{0, 0xff}}, ""},
		{"null is absent", `{"name":null,"notify_msg":"m"}`, NotifyRequest{Msg: []byte("m")}, ""},
		{"bad json", `{"name":"a",`, NotifyRequest{}, "json"},
		{"not an object", `[1]`, NotifyRequest{}, "json"},
		{"trailing data", `{"name":"a"} x`, NotifyRequest{}, "trailing"},
		{"name wrong type", `{"name":5,"notify_msg":"m"}`, NotifyRequest{}, `field "name": want string, got number`},
		{"msg wrong type", `{"name":"a","notify_msg":{"x":1}}`, NotifyRequest{}, `field "notify_msg": want string, got object`},
		{"seq negative", `{"name":"a","ts_seq":-1}`, NotifyRequest{}, `field "ts_seq": negative`},
		{"seq fraction", `{"name":"a","ts_seq":1.5}`, NotifyRequest{}, `field "ts_seq": want unsigned integer`},
		{"seq overflow", `{"name":"a","ts_seq":18446744073709551616}`, NotifyRequest{}, `field "ts_seq": 18446744073709551616 out of range`},
		{"bad base64", `{"name":"a","notify_msg":"","ts_msg_b64":"!!"}`, NotifyRequest{}, `field "ts_msg_b64": bad base64`},
		{"control byte", "{\"name\":\"a\x01\"}", NotifyRequest{}, "control byte"},
		{"empty object", `{}`, NotifyRequest{}, `field "name": missing`},
		{"no notify_msg", `{"name":"a"}`, NotifyRequest{}, `field "notify_msg": missing`},
		{"no name", `{"notify_msg":"m","ts_from":"h:1"}`, NotifyRequest{}, `field "name": missing`},
		{"empty name and msg (Mooncake)", `{"name":"","notify_msg":""}`, NotifyRequest{Msg: []byte{}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var d notifyDecoder
			got, _, err := d.decode([]byte(tc.body))
			if tc.wantErr != "" {
				require.ErrorIs(t, err, ErrBadFrame)
				require.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			if len(tc.want.Msg) == 0 {
				require.Empty(t, got.Msg)
				tc.want.Msg, got.Msg = nil, nil
			}
			require.Equal(t, tc.want, *got)
		})
	}
}

func TestNotifyEncodeRoundTrip(t *testing.T) {
	for _, req := range []NotifyRequest{
		{Name: "a", Msg: []byte("hello")},
		{Name: "quote\"back\\slash\x00\x1f", Msg: []byte("\t\n\r\u2028é")},
		{Name: "bin", Msg: []byte{0xff, 0x00, 0xc3, 0x28}, From: "10.0.0.1:12001", Session: 1, Epoch: 2, Seq: 1 << 63},
	} {
		for _, twosided := range []bool{false, true} {
			fr := appendNotifyRequest(nil, &req, reqMeta{id: 42, hasID: true}, twosided)
			typ, body, n, err := ParseFrame(fr, DefaultMaxFrame)
			require.NoError(t, err)
			require.Equal(t, len(fr), n)
			require.Equal(t, TypeNotify, typ)
			require.True(t, json.Valid(body), "%s", body)
			var d notifyDecoder
			got, m, err := d.decode(body)
			require.NoError(t, err)
			require.Equal(t, req.Name, got.Name)
			require.Equal(t, req.Msg, got.Msg, "binary-safe")
			if twosided {
				require.Equal(t, req, *got)
				require.Equal(t, reqMeta{id: 42, hasID: true, twosided: true}, m)
			} else {
				require.False(t, m.hasID)
				require.NotContains(t, string(body), "ts_")
			}
		}
	}
}

// Towards a twosided peer a msg goes as base64 when escaping would make it longer: a
// notify of the notify size limit (1 MiB by default, the default frame limit) fits the
// peer's Notify frame limit whatever its bytes, and the decoder reads it back. A Mooncake
// peer still gets the escaped text (it has no base64), as large as that is.
func TestNotifyEncodingSize(t *testing.T) {
	const n = DefaultMaxFrame
	mixed := bytes.Repeat([]byte("abc\"\n"), n/5)
	for _, tc := range []struct {
		name string
		msg  []byte
		b64  bool
	}{
		{"text", bytes.Repeat([]byte{'a'}, n), false},
		{"binary", bytes.Repeat([]byte{0xff}, n), true},
		{"zeros", make([]byte, n), true},
		{"quotes", bytes.Repeat([]byte{'"'}, n), true},
		{"newlines", bytes.Repeat([]byte{'\n'}, n), true},
		{"backslashes", bytes.Repeat([]byte{'\\'}, n), true},
		{"a quarter quotes", bytes.Repeat([]byte(`abc"`), n/4), false}, // 5/4 < 4/3: text
		{"two fifths escaped", mixed, true},                            // 7/5 > 4/3
		{"one zero", append(bytes.Repeat([]byte{'a'}, 100), 0), false},
		{"empty", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.b64, msgAsBase64(tc.msg))
			req := NotifyRequest{Name: "kv", Msg: tc.msg, From: "10.0.0.1:12001", Seq: 1}
			fr := appendNotifyRequest(nil, &req, reqMeta{id: 1, hasID: true}, true)
			body := fr[HeaderSize:]
			require.Equal(t, tc.b64, bytes.Contains(body, []byte(`"ts_msg_b64":`)))
			limit := base64.StdEncoding.EncodedLen(len(tc.msg)) + b64Overhead + 128 // name, ids, keys
			require.LessOrEqual(t, len(body), limit, "the encoding is at most base64's")
			if len(tc.msg) == n {
				require.LessOrEqual(t, len(body), NotifyFrameLimit(DefaultMaxFrame))
			}
			typ, b, _, err := ParseFrame(fr, DefaultMaxFrame)
			require.NoError(t, err)
			require.Equal(t, TypeNotify, typ)
			var d notifyDecoder
			got, _, err := d.decode(b)
			require.NoError(t, err)
			require.True(t, bytes.Equal(tc.msg, got.Msg), "the msg changed on its way")

			// A Mooncake peer: escaped text, never base64.
			fr = appendNotifyRequest(nil, &req, reqMeta{}, false)
			require.NotContains(t, string(fr[HeaderSize:]), "ts_msg_b64")
		})
	}
	// The worst case of escaped text chosen: every escape that keeps it within base64.
	msg := bytes.Repeat([]byte{'a'}, 3000)
	for i := 0; i < 1016/5; i++ { // 1000 extra + 16 of overhead, 5 each: 1 left
		msg[i*7] = 0x01
	}
	require.False(t, msgAsBase64(msg))
	msg[2998] = '"' // 1 left: 0
	require.False(t, msgAsBase64(msg), "as long as base64: text")
	msg[2999] = '"'
	require.True(t, msgAsBase64(msg), "one byte past base64's length")
}

func TestDecodeAllocs(t *testing.T) {
	fr := appendNotifyRequest(nil, &NotifyRequest{Name: "peer", Msg: []byte("payload"), From: "h:1", Seq: 3}, reqMeta{id: 1, hasID: true}, true)
	body := fr[HeaderSize:]
	var d notifyDecoder
	_, _, err := d.decode(body)
	require.NoError(t, err)
	allocs := testing.AllocsPerRun(100, func() {
		_, _, _ = d.decode(body)
	})
	require.Zero(t, allocs)
	buf := make([]byte, 0, 256)
	req := &NotifyRequest{Name: "peer", Msg: []byte("payload")}
	allocs = testing.AllocsPerRun(100, func() {
		buf = appendNotifyRequest(buf[:0], req, reqMeta{id: 1, hasID: true}, true)
	})
	require.Zero(t, allocs)
	var ri replyInfo
	var key []byte
	rb := appendNotifyReply(nil, reqMeta{id: 7, hasID: true, twosided: true}, nil)[HeaderSize:]
	allocs = testing.AllocsPerRun(100, func() {
		key, _ = ri.decode(rb, key)
	})
	require.Zero(t, allocs)
}

func TestHandshakeRoundTrip(t *testing.T) {
	d := &HandshakeDesc{
		LocalNICPath: "10.0.0.1:12001@mlx5_0", PeerNICPath: "__ctrl__",
		LocalLID: 7, LocalGID: "fe:80:00:00:00:00:00:00:02:42:ac:ff:fe:11:00:02",
		CtrlChannel: true, NotifyQPNum: 1 << 23, NotifyRQDepth: 65535,
		MTU: 4096, PSN: maxPSN, Session: 1 << 60, Epoch: 3, BufSize: 4096, Extensions: true, PeerName: "10.0.0.1:12001",
	}
	fr := appendHandshake(nil, d, reqMeta{})
	require.Equal(t, byte(TypeConnection), fr[8])
	got, err := DecodeHandshake(fr[HeaderSize:])
	require.NoError(t, err)
	require.Equal(t, d, got)

	// A plain Mooncake descriptor carries none of the optional members.
	plain := appendHandshake(nil, &HandshakeDesc{LocalNICPath: "a@d", PeerNICPath: "b@d", QPNum: []uint32{1, 2}}, reqMeta{})
	require.JSONEq(t, `{"local_nic_path":"a@d","peer_nic_path":"b@d","qp_num":[1,2],"local_lid":0,"local_gid":"","reply_msg":""}`, string(plain[HeaderSize:]))
}

func TestHandshakeDecodeTable(t *testing.T) {
	for _, tc := range []struct {
		name, body, wantErr string
	}{
		{"mooncake with extra field", `{"local_nic_path":"a","peer_nic_path":"b","qp_num":[1,4294967295],"reply_msg":"","barex_port":1}` + "\n", ""},
		{"qp_num wrong type", `{"qp_num":"1"}`, `field "qp_num": want array, got string`},
		{"qp_num element wrong type", `{"qp_num":[1,"2"]}`, `field "qp_num": want number, got string`},
		{"qp_num element range", `{"qp_num":[4294967296]}`, `field "qp_num": 4294967296 out of range`},
		{"local_lid range", `{"local_lid":65536}`, `field "local_lid": 65536 out of range 0..65535`},
		{"local_gid wrong type", `{"local_gid":1}`, `field "local_gid": want string`},
		{"ctrl_channel wrong type", `{"ctrl_channel":"true"}`, `field "ctrl_channel": want bool, got string`},
		{"notify_rq_depth 0", `{"notify_rq_depth":0}`, `field "notify_rq_depth": 0 out of range 1..65535`},
		{"notify_rq_depth 65536", `{"notify_rq_depth":65536}`, `field "notify_rq_depth": 65536 out of range 0..65535`},
		{"notify_qp_num range", `{"notify_qp_num":4294967296}`, `field "notify_qp_num"`},
		{"ts_mtu bad", `{"ts_mtu":1000}`, `field "ts_mtu": 1000 is not one of`},
		{"ts_psn range", `{"ts_psn":16777216}`, `field "ts_psn": 16777216 out of range`},
		{"bad json", `{"qp_num":[1,}`, `want number`},
		{"bad json object", `{"qp_num":[1] "x"}`, `json`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeHandshake([]byte(tc.body))
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrBadFrame)
			require.Contains(t, err.Error(), tc.wantErr)
		})
	}
}

func TestConfigRanges(t *testing.T) {
	// The frame constants are the table's (they must stay constants for callers).
	require.EqualValues(t, limits.HandshakeMaxLength.Default, DefaultMaxFrame)
	require.EqualValues(t, limits.HandshakeMaxLength.Min, MinMaxFrame)
	require.EqualValues(t, limits.HandshakeMaxLength.Max, MaxMaxFrame)
	require.EqualValues(t, limits.AuthKeyLen.Min, MinAuthKey)
	require.EqualValues(t, limits.AuthKeyLen.Max, MaxAuthKey)
	c, err := Config{}.withDefaults()
	require.NoError(t, err)
	require.Equal(t, DefaultMaxFrame, c.MaxFrame)
	require.Equal(t, DefaultConnectTimeout, c.ConnectTimeout)
	require.Equal(t, DefaultMaxPendingHandshakes, c.MaxPendingHandshakes)
	require.Nil(t, c.AuthKey, "authentication is off by default")
	require.Zero(t, c.Keepalive, "keepalive is off by default")
	_, err = Config{IdleTimeout: time.Second, Keepalive: 500 * time.Millisecond}.withDefaults()
	require.NoError(t, err)
	key := []byte("0123456789abcdef")
	c, err = Config{AuthKey: key}.withDefaults()
	require.NoError(t, err)
	key[0] = 'X'
	require.Equal(t, "0123456789abcdef", string(c.AuthKey), "the Node keeps its own copy")
	for _, tc := range []struct {
		cfg   Config
		field string
	}{
		{Config{ListenAddr: "nohostport"}, "ListenAddr"},
		{Config{MaxFrame: 100}, "MaxFrame"},
		{Config{MaxFrame: 129 << 20}, "MaxFrame"},
		{Config{ConnectTimeout: time.Hour}, "ConnectTimeout"},
		{Config{RequestTimeout: -1}, "RequestTimeout"},
		{Config{IdleTimeout: time.Microsecond}, "IdleTimeout"},
		{Config{Keepalive: -1}, "Keepalive"},
		{Config{Keepalive: time.Microsecond}, "Keepalive"},
		{Config{IdleTimeout: time.Second, Keepalive: 501 * time.Millisecond}, "Keepalive 501ms out of range"},
		{Config{MaxConns: -1}, "MaxConns"},
		{Config{MaxConnBuffer: 1000}, "MaxConnBuffer"},
		{Config{MaxPendingHandshakes: -1}, "MaxPendingHandshakes"},
		{Config{MaxPendingHandshakes: 1<<16 + 1}, "MaxPendingHandshakes: 65537 out of range 1..65536"},
		{Config{MaxPendingHandshakesPerAddr: -1}, "MaxPendingHandshakesPerAddr"},
		{Config{MaxPeers: 1<<20 + 1}, "MaxPeers"},
		{Config{AuthKey: []byte{}}, "AuthKey: 0 bytes"},
		{Config{AuthKey: []byte("short")}, "AuthKey: 5 bytes, want 16..1024"},
		{Config{AuthKey: make([]byte, 1025)}, "AuthKey"},
	} {
		_, err := tc.cfg.withDefaults()
		require.ErrorIs(t, err, ErrBadConfig)
		require.Contains(t, err.Error(), tc.field)
	}
}
