package oob

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// textServer accepts connections on a loopback port and answers each with reply, after
// reading the first bytes a client sends when readFirst (an HTTP server answers a request;
// an SSH server greets at once), then closes it.
func textServer(t *testing.T, reply []string, readFirst bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if readFirst {
					var b [1]byte
					if _, err := bufio.NewReader(c).Read(b[:]); err != nil {
						return
					}
				}
				for _, r := range reply { // in pieces: the text may span reads
					if _, err := c.Write([]byte(r)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// A peer that answers in another protocol is named as such, with the address and what it
// said, instead of "frame too large" from its text read as a length.
func TestPeerNotOOB(t *testing.T) {
	loop := newLoop(t)
	a := listen(t, loop, newHandler(), Config{})
	cases := []struct {
		name      string
		reply     []string
		readFirst bool
		said      string
	}{
		{"http", []string{"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"}, true, `"HTTP/1.1 400 Bad Request"`},
		{"http in pieces", []string{"HTTP/", "1.1 404 Not Found\r\n\r\n"}, true, `"HTTP/1.1 404 Not Found"`},
		{"ssh banner", []string{"SSH-2.0-OpenSSH_9.6\r\n"}, false, `"SSH-2.0-OpenSSH_9.6"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			addr := textServer(t, tc.reply, tc.readFirst)
			calls := map[string]func() error{
				"notify":    func() error { return a.Notify(bg(t), addr, &NotifyRequest{Name: "x"}) },
				"classic":   func() error { return a.NotifyClassic(bg(t), addr, &NotifyRequest{Name: "x"}) },
				"handshake": func() error { _, err := a.Handshake(bg(t), addr, &HandshakeDesc{}); return err },
			}
			for what, call := range calls {
				err := call()
				require.ErrorIs(t, err, ErrNotOOB, what)
				require.ErrorIs(t, err, ErrPeerUnreachable, what)
				require.NotErrorIs(t, err, ErrFrameTooLarge, what)
				var ne *NotOOBError
				require.ErrorAs(t, err, &ne, what)
				require.Equal(t, addr, ne.Addr, what)
				require.Contains(t, err.Error(), addr+" answered "+tc.said, what)
			}
		})
	}
}

func TestIsText(t *testing.T) {
	frame := AppendFrame(nil, TypeNotify, []byte(`{"name":"x","notify_msg":"y"}`))
	big := binary.LittleEndian.AppendUint64(nil, MaxMaxFrame)
	for _, tc := range []struct {
		b    []byte
		text bool
	}{
		{[]byte("HTTP/1.1 200 OK"), true},
		{[]byte("SSH-2.0-"), true},
		{[]byte("HTTP/1."), false}, // fewer than 8 bytes: cannot tell yet
		{frame, false},
		{big, false},
		{[]byte("HTTP/1\x001"), false},
	} {
		require.Equal(t, tc.text, isText(tc.b), "%q", tc.b)
	}
}

// A notify whose name+msg is as large as the peer's frame limit fits over OOB to a twosided
// peer, text or binary (base64), persistent or one-request: the peer's Notify frame limit
// absorbs the encoding. To a peer that announces no limit (Mooncake) the whole frame
// stays within DefaultMaxFrame, and the error says so.
func TestNotifyAsLargeAsTheFrameLimit(t *testing.T) {
	// A 1 MiB frame of escaped JSON under -race takes seconds on a quiet machine and
	// several times that on a loaded one: the timeouts here are hang guards only.
	slow := Config{RequestTimeout: 5 * time.Minute, IdleTimeout: 5 * time.Minute}
	hb := newHandler()
	b := listen(t, newLoop(t), hb, slow)
	a := listen(t, newLoop(t), newHandler(), slow)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const name = "kv"
	for _, fill := range []byte{'a', 0xff} {
		msg := bytes.Repeat([]byte{fill}, DefaultMaxFrame-len(name))
		require.NoError(t, a.Notify(ctx, b.Addr(), &NotifyRequest{Name: name, Msg: msg}), "fill %q", fill)
		<-hb.ch
		require.NoError(t, a.NotifyClassic(ctx, b.Addr(), &NotifyRequest{Name: name, Msg: msg}), "fill %q, one request", fill)
		<-hb.ch
	}
	for _, n := range hb.notifies() {
		require.Len(t, n.Msg, DefaultMaxFrame-len(name))
	}

	f := newFakeMooncake(t)
	err := a.Notify(ctx, f.ln.Addr().String(), &NotifyRequest{Name: name, Msg: bytes.Repeat([]byte("a"), DefaultMaxFrame-len(name))})
	require.ErrorIs(t, err, ErrTooLarge)
	require.ErrorContains(t, err, "above 1048576, the frame limit of a peer that does not announce one")
}

func TestNotifyFrameLimit(t *testing.T) {
	require.Equal(t, 1<<20+(1<<20)/3+64<<10, NotifyFrameLimit(DefaultMaxFrame))
	require.Equal(t, 64<<10, NotifyFrameLimit(64<<10), "no allowance below MinMaxFrame (before authentication)")
	require.Equal(t, DefaultMaxFrame, frameLimit(TypeConnection, DefaultMaxFrame))
	require.Equal(t, NotifyFrameLimit(MaxMaxFrame), frameLimit(TypeNotify, MaxMaxFrame))
	// Its largest value still never reads as text (isText).
	require.False(t, isText(binary.LittleEndian.AppendUint64(nil, uint64(NotifyFrameLimit(MaxMaxFrame)))))
}
