package oob

import "testing"

// BenchmarkNotifyCodec: the per-notify codec work of a twosided pair, 64-byte text msg, as
// JSON (what a twosided peer of an earlier version gets) and as the compact frame, in the
// same run.
func BenchmarkNotifyCodec(b *testing.B) {
	msg := []byte("00000000000000a1xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx")
	req := &NotifyRequest{Name: "bench", Msg: msg, From: "127.0.0.1:40123", Session: 0x1234567890abcdef, Epoch: 3, Seq: 123456,
		Token: 0xfedcba9876543210, To: 0x1122334455667788}
	m := reqMeta{id: 987654, hasID: true, twosided: true}
	cm := m
	cm.compact = true
	fr, rep := appendNotifyRequest(nil, req, m, true), appendNotifyReply(nil, m, nil)
	cfr, crep := appendNotifyCompact(nil, req, cm), appendNotifyReply(nil, cm, nil)
	b.Logf("request frame %d bytes, reply %d; compact %d and %d", len(fr), len(rep), len(cfr), len(crep))
	var (
		buf = make([]byte, 0, 512)
		d   notifyDecoder
		ri  replyInfo
		key []byte
		err error
	)
	for _, c := range []struct {
		name string
		op   func()
	}{
		{"json/encode-request", func() { buf = appendNotifyRequest(buf[:0], req, m, true) }},
		{"json/decode-request", func() { _, _, err = d.decode(fr[HeaderSize:]) }},
		{"json/encode-reply", func() { buf = appendNotifyReply(buf[:0], m, nil) }},
		{"json/decode-reply", func() { key, err = ri.decode(rep[HeaderSize:], key) }},
		{"compact/encode-request", func() { buf = appendNotifyCompact(buf[:0], req, cm) }},
		{"compact/decode-request", func() { _, _, err = d.decodeCompact(cfr[HeaderSize:]) }},
		{"compact/encode-reply", func() { buf = appendNotifyReply(buf[:0], cm, nil) }},
		{"compact/decode-reply", func() { err = ri.decodeCompact(crep[HeaderSize:]) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				c.op()
			}
			if err != nil {
				b.Fatal(err)
			}
		})
	}
}
