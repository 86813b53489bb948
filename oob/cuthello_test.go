package oob

import (
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A persistent connection cut before the hello's answer (EOF: a reset path, not a reply
// that says Mooncake) sends its queued requests on one-request connections. A notify of a
// twosided pair (it carries a session) keeps its ts_* members there: stripped, it would
// reach a twosided receiver as a Mooncake notify, without seq, id or sender (delivered
// unordered and undeduplicated; a probe or a fence delivered as an empty notify).
func TestHelloCutKeepsTwosidedMembers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	got := make(chan string, 2)
	go func() {
		// Every hello is cut before its answer; a request on a one-request connection is
		// recorded and answered.
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			body, err := readFrameRaw(c)
			if err == nil && !strings.Contains(string(body), `"ts_hello"`) {
				got <- string(body)
				if strings.Contains(string(body), `"local_nic_path"`) {
					_, _ = c.Write(appendHandshake(nil, &HandshakeDesc{LocalNICPath: "b@d", Session: 8, PeerName: "b"}, reqMeta{twosided: true}))
				} else {
					_, _ = c.Write(appendNotifyReply(nil, reqMeta{twosided: true}, nil))
				}
			}
			_ = c.Close()
		}
	}()
	a := listen(t, newLoop(t), newHandler(), Config{})
	req := &NotifyRequest{Name: "n", Msg: []byte{0xff, 0}, From: "127.0.0.1:1", Session: 7, Seq: 3, Token: 9, To: 5, ID: "id-1"}
	require.NoError(t, a.Notify(bg(t), ln.Addr().String(), req))
	body := <-got
	for _, m := range []string{`"ts_session":7`, `"ts_seq":3`, `"ts_token":9`, `"ts_to":5`, `"ts_nid":"id-1"`, `"ts_from":"127.0.0.1:1"`, `"ts_msg_b64":"/wA="`} {
		require.True(t, strings.Contains(body, m), "%s missing from %s", m, body)
	}
	// A probe of the pair (session, no seq): without its members it is an empty notify.
	require.NoError(t, a.Notify(bg(t), ln.Addr().String(), &NotifyRequest{From: "127.0.0.1:1", Session: 7, Token: 9}))
	body = <-got
	require.Contains(t, body, `"ts_session":7`)
	// A handshake of a twosided engine: stripped, it would be answered as by a Mooncake
	// engine, and the pair served seq-less.
	resp, err := a.Handshake(bg(t), ln.Addr().String(), &HandshakeDesc{LocalNICPath: "a@d", PeerNICPath: "b@d", Session: 7, PeerName: "a"})
	require.NoError(t, err)
	require.Contains(t, <-got, `"ts_session":7`)
	require.EqualValues(t, 8, resp.Session)
}
