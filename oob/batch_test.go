package oob

import (
	"context"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
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

// A turn's requests (dialed connections) are written before its replies (served ones):
// a handler that answers a notify with a notify of its own puts that answer on the wire
// ahead of the ACK the peer waits for, so the peer finds both in one wake-up. Both
// connections here write into one socket, so the byte stream shows the order of the writes.
func TestTurnWritesRequestsBeforeReplies(t *testing.T) {
	loop := newLoop(t)
	s := listen(t, loop, newHandler(), Config{})
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	require.NoError(t, err)
	defer unix.Close(sp[1])
	done := make(chan struct{})
	require.NoError(t, loop.Submit(func() {
		defer close(done)
		served := s.newConn(sp[0], connServer, nil)
		fd2, err := unix.Dup(sp[0])
		if err != nil {
			t.Error(err)
			return
		}
		dialed := s.newConn(fd2, connPersistent, nil)
		served.state, dialed.state = stateOpen, stateOpen
		served.send([]byte("reply1;"))   // dirty first
		dialed.send([]byte("request1;")) // then the request its handler sent
		served.send([]byte("reply2;"))
		s.flushBatches()
		for _, c := range []*conn{served, dialed} { // neither is registered: no close()
			if c.tmArmed {
				c.tm.Stop()
				c.tmArmed = false
			}
			c.state = stateClosed
			_ = unix.Close(c.fd)
		}
	}))
	<-done
	got := make([]byte, 0, 64)
	buf := make([]byte, 64)
	for {
		k, err := unix.Read(sp[1], buf)
		require.NoError(t, err)
		if k == 0 {
			break
		}
		got = append(got, buf[:k]...)
	}
	require.Equal(t, "request1;reply1;reply2;", string(got))
}
