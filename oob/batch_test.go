package oob

import (
	"context"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

// The replies to every request one read brought leave in one write: a client that writes
// a window of notifies at once costs the server at most one write per read that brought
// bytes, not one per request. Also checked: every reply comes, once, in request order.
func TestRepliesOfATurnLeaveInOneWrite(t *testing.T) {
	loop := newLoop(t)
	h := newHandler()
	s := listen(t, loop, h, Config{})
	c, err := net.Dial("tcp", s.Addr())
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write(appendHello(nil, nil))
	require.NoError(t, err)
	typ, _ := readFrame(t, c)
	require.Equal(t, TypeProbe, typ)

	counts := func() (reads, writes uint64) {
		done := make(chan struct{})
		require.NoError(t, loop.Submit(func() { reads, writes = s.dataReads, s.writeCalls; close(done) }))
		<-done
		return
	}
	reads0, writes0 := counts()
	const window = 200
	var burst []byte
	for i := uint64(1); i <= window; i++ {
		burst = appendNotifyRequest(burst, &NotifyRequest{Name: "b", Msg: []byte("0123456789abcdef")},
			reqMeta{id: i, hasID: true, twosided: true}, true)
	}
	_, err = c.Write(burst)
	require.NoError(t, err)
	var ri replyInfo
	for i := uint64(1); i <= window; i++ {
		typ, body := readFrame(t, c)
		require.Equal(t, TypeNotify, typ)
		_, err := ri.decode(body, nil)
		require.NoError(t, err)
		require.True(t, ri.m.hasID)
		require.Equal(t, i, ri.m.id, "replies in request order")
		require.True(t, ri.notifyOK)
	}
	reads, writes := counts()
	t.Logf("reads %d writes %d", reads-reads0, writes-writes0)
	require.LessOrEqual(t, writes-writes0, reads-reads0, "at most one write per read that brought requests")
	require.Len(t, h.notifies(), window)
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	require.NoError(t, s.Close(ctx))
}
