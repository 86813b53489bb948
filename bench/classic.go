package bench

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
)

// classicClient sends notifies as Mooncake's classic notify does: one TCP connection per
// notify (connect, write one daemon frame, read the reply, close). The frame is a u64
// little-endian length counting the type byte, type 2 (Notify), then
// {"name":...,"notify_msg":...}; the reply is framed the same way and says
// {"name":"","notify_msg":"success"}. Bench messages are printable ASCII, so notify_msg
// needs no escaping. Use from one goroutine.
type classicClient struct {
	peers []*unix.SockaddrInet4
	name  string
	buf   []byte
	reply []byte
}

const (
	classicNotifyType = 2
	classicMaxReply   = 4096
)

var classicSuccess = []byte(`"notify_msg":"success"`)

func newClassicClient(name string, peers []string) (*classicClient, error) {
	c := &classicClient{name: name, reply: make([]byte, classicMaxReply)}
	for _, p := range peers {
		sa, err := sockaddr(p)
		if err != nil {
			return nil, err
		}
		c.peers = append(c.peers, sa)
	}
	return c, nil
}

func (c *classicClient) lockThread() bool { return false }

func (c *classicClient) close() {}

func (c *classicClient) send(_ context.Context, p int, msg []byte) error {
	b := append(c.buf[:0], 0, 0, 0, 0, 0, 0, 0, 0, classicNotifyType)
	b = append(b, `{"name":"`...)
	b = append(b, c.name...)
	b = append(b, `","notify_msg":"`...)
	b = append(b, msg...)
	b = append(b, `"}`...)
	binary.LittleEndian.PutUint64(b, uint64(len(b)-8))
	c.buf = b

	fd, err := tcpConnect(c.peers[p])
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := writeAll(fd, b, false); err != nil {
		return fmt.Errorf("bench: classic notify write: %w", err)
	}
	var hdr [9]byte
	if err := readFull(fd, hdr[:], false); err != nil {
		return fmt.Errorf("bench: classic notify reply: %w", err)
	}
	n := binary.LittleEndian.Uint64(hdr[:8])
	if n < 1 || n-1 > classicMaxReply {
		return fmt.Errorf("bench: classic notify reply: length %d out of range 1..%d", n, classicMaxReply+1)
	}
	body := c.reply[:n-1]
	if err := readFull(fd, body, false); err != nil {
		return fmt.Errorf("bench: classic notify reply: %w", err)
	}
	if !bytes.Contains(body, classicSuccess) {
		return fmt.Errorf("bench: classic notify rejected by the peer")
	}
	return nil
}
