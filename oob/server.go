package oob

import (
	"context"
	"errors"

	"github.com/twosided/twosided/reactor"
)

var errMetadataNotServed = errors.New("metadata exchange (type 1) is not served by twosided")

// serveFrame handles one request on an accepted connection.
func (c *conn) serveFrame(t MsgType, body []byte) {
	n := c.n
	c.frames++
	if !c.persistent && c.frames > 1 {
		return // classic: one request per connection, as Mooncake's daemon reads
	}
	switch t {
	case TypeProbe:
		hello, m, key, err := probeDecode(body, n.key)
		n.key = key
		if err != nil {
			c.reject(t, m, err)
			return
		}
		n.st.probeServed.Add(1)
		if c.frames == 1 && hello >= helloVersion {
			c.persistent = true
			n.out = appendProbe(n.out[:0], m, true)
		} else {
			n.out = appendProbe(n.out[:0], m, false)
		}
		c.send(n.out)
		if !c.persistent {
			c.drain()
		}
	case TypeNotify:
		req, m, err := n.nd.decode(body)
		if err != nil {
			c.reject(t, m, err)
			return
		}
		n.st.notifyServed.Add(1)
		// Msg is the Handler's to keep (it is delivered to the application as is); the
		// request struct and its strings come from the reused decoder.
		if len(req.Msg) > 0 {
			req.Msg = append([]byte(nil), req.Msg...)
		} else {
			req.Msg = nil
		}
		seq := c.openRequest()
		n.h.HandleNotify(req, func(err error) {
			if n.loop.InLoop() {
				c.replyNotify(seq, m, err)
				return
			}
			n.submitReply(func() { c.replyNotify(seq, m, err) })
		})
	case TypeConnection:
		d, m, err := decodeHandshake(body)
		if err != nil {
			c.reject(t, m, err)
			return
		}
		n.st.handshakeServed.Add(1)
		seq := c.openRequest()
		n.h.HandleHandshake(d, func(resp *HandshakeDesc, err error) {
			if n.loop.InLoop() {
				c.replyHandshake(seq, m, resp, err)
				return
			}
			n.submitReply(func() { c.replyHandshake(seq, m, resp, err) })
		})
	default: // TypeMetadata; the parser already refused unknown types
		c.reject(t, reqMeta{}, errMetadataNotServed)
	}
}

// submitReply runs a Handler's reply given off the loop on the loop, waiting for queue
// room up to RequestTimeout when the queue is full.
func (n *Node) submitReply(f func()) {
	if err := n.loop.Submit(f); errors.Is(err, reactor.ErrQueueFull) {
		ctx, cancel := context.WithTimeout(context.Background(), n.cfg.RequestTimeout)
		_ = n.loop.SubmitWait(ctx, f)
		cancel()
	}
}

// openRequest notes a request handed to the Handler; its reply closes it, once.
func (c *conn) openRequest() uint64 {
	if c.open == nil {
		c.open = make(map[uint64]struct{}, 1)
	}
	c.reqSeq++
	c.open[c.reqSeq] = struct{}{}
	return c.reqSeq
}

// replyDone reports whether the reply for request seq should be written: the first reply
// to a request still open on a connection still serving.
func (c *conn) replyDone(seq uint64) bool {
	if _, ok := c.open[seq]; !ok {
		return false
	}
	delete(c.open, seq)
	return c.state != stateClosed && c.state != stateDraining
}

func (c *conn) replyNotify(seq uint64, m reqMeta, err error) {
	if !c.replyDone(seq) {
		return
	}
	n := c.n
	if err != nil {
		n.out = appendNotifyReply(n.out[:0], m, err.Error(), true)
	} else {
		n.out = appendNotifyReply(n.out[:0], m, "", false)
	}
	c.send(n.out)
	if !c.persistent {
		c.drain()
	}
}

func (c *conn) replyHandshake(seq uint64, m reqMeta, resp *HandshakeDesc, err error) {
	if !c.replyDone(seq) {
		return
	}
	n := c.n
	var d HandshakeDesc
	if resp != nil {
		d = *resp
	}
	if err != nil {
		d.ReplyMsg = err.Error()
		if d.ReplyMsg == "" {
			d.ReplyMsg = "rejected"
		}
	}
	if !m.twosided {
		// A Mooncake peer gets Mooncake's members and the ctrl-channel additions only.
		d.MTU, d.PSN, d.Session, d.Epoch, d.BufSize, d.Extensions, d.PeerName = 0, 0, 0, 0, 0, false, ""
	}
	n.out = appendHandshake(n.out[:0], &d, m)
	c.send(n.out)
	if !c.persistent {
		c.drain()
	}
}
