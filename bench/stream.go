package bench

import (
	"context"
	"encoding/binary"
	"runtime"

	"golang.org/x/sys/unix"
)

// floor-stream is the pipelined floor: one TCP connection, the sender on a locked thread
// keeps up to window messages in flight (writing every message the window allows in one
// write), the receiver on a locked thread reads what the socket holds, delivers every
// complete message and acknowledges each with one byte, all the acks of a read in one write.
// It is what TCP carries with the burst scenario's message size and window when every
// message is acknowledged, the reference of burst's ×floor.

// streamConn serves one floor-stream connection.
func (n *floorNode) streamConn(fd int) {
	defer n.connWG.Done()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	buf := make([]byte, 1<<18)
	acks := make([]byte, 0, 1<<12)
	w := 0
	for {
		k, err := unix.Read(fd, buf[w:])
		if err == unix.EINTR || err == unix.EAGAIN {
			continue // EAGAIN: the receive timeout of an idle connection
		}
		if err != nil || k == 0 {
			return
		}
		w += k
		r := 0
		acks = acks[:0]
		for w-r >= floorHdr {
			size := int(binary.LittleEndian.Uint32(buf[r:]))
			if floorHdr+size > len(buf) {
				nb := make([]byte, 2*(floorHdr+size))
				w = copy(nb, buf[r:w])
				buf, r = nb, 0
			}
			if w-r < floorHdr+size {
				break
			}
			n.sink.deliver(buf[r+floorHdr : r+floorHdr+size])
			acks = append(acks, 1)
			r += floorHdr + size
		}
		w = copy(buf, buf[r:w])
		if len(acks) > 0 && writeAll(fd, acks, false) != nil {
			return
		}
	}
}

// stream sends count messages of size bytes to peer 0 with up to window unacknowledged,
// on the caller's goroutine (locked to its thread by the caller). Nothing is allocated per
// message.
func (c *floorClient) stream(ctx context.Context, count int64, size, window int, deadline int64) *pumpResult {
	res := &pumpResult{call: NewHist()}
	fd := c.fds[0]
	if fd < 0 {
		var err error
		if fd, err = tcpConnect(c.peers[0]); err != nil {
			res.firstErr, res.errors = err, 1
			return res
		}
		c.fds[0] = fd
	}
	msg := newMsg(size)
	frame := len(msg) + floorHdr
	out := make([]byte, 0, window*frame)
	acks := make([]byte, window)
	inflight := 0
	var next int64
	stop := false
	for {
		if !stop && (ctx.Err() != nil || (deadline > 0 && nanotime() > deadline)) {
			stop = true
		}
		out = out[:0]
		for !stop && inflight < window && next < count {
			putSeq(msg, uint64(next))
			out = binary.LittleEndian.AppendUint32(out, uint32(len(msg)))
			out = append(out, msg...)
			inflight++
			next++
		}
		if len(out) > 0 {
			if err := writeAll(fd, out, false); err != nil {
				res.firstErr, res.errors = err, 1
				return res
			}
		}
		if inflight == 0 {
			return res
		}
		k, err := unix.Read(fd, acks[:inflight])
		if err == unix.EINTR {
			continue
		}
		if err != nil || k == 0 {
			if err == nil {
				err = errEOF
			}
			res.firstErr, res.errors = err, 1
			return res
		}
		inflight -= k
		res.sent += int64(k)
		res.bytes += int64(k) * int64(len(msg))
	}
}

// stream is the burst scenario over floor-stream: one client, the window in one connection.
func (r *run) stream() (*Result, error) {
	if err := r.setup(1, 1, childSpec{}); err != nil {
		return nil, err
	}
	fc, err := newFloorClient(false, r.peers[:1])
	if err != nil {
		return nil, err
	}
	return r.runStream(fc)
}

// streamer is a floor client that also pipelines: floor-stream's and the verbs floors'.
type streamer interface {
	send(ctx context.Context, peer int, msg []byte) error
	stream(ctx context.Context, count int64, size, window int, deadline int64) *pumpResult
	close()
}

// runStream warms c up one message at a time, then streams the run's count to peer 0 on
// this goroutine, locked to its thread. It closes c.
func (r *run) runStream(c streamer) (*Result, error) {
	defer c.close()
	s := r.spec
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	msg := newMsg(s.Size)
	var warm int64
	for range s.Warmup {
		putSeq(msg, uint64(s.Count)+uint64(warm)) // outside the measured sequence numbers
		if err := c.send(r.ctx, 0, msg); err != nil {
			return nil, err
		}
		warm++
	}
	if err := r.begin(); err != nil {
		return nil, err
	}
	p := c.stream(r.ctx, int64(s.Count), s.Size, s.Window, r.deadline())
	res := r.result()
	res.Notifies, res.Errors = p.sent, p.errors
	setErr(res, p.firstErr)
	err := r.end(res, warm+p.sent, p.bytes)
	return res, err
}
